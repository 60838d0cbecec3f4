"""The trained DFlash drafters on the zoo targets (fp32, CPU): chain and DDTree greedy output equals the
target's own greedy ``generate`` over the dev prompts, and the drafters reach a real acceptance (tau well above
2 on trees, accepted paths of 4+ drafts), so long accepted paths, their commits and bonus tokens are exercised.

Measured tau (first 3 dev prompts x 48 tokens, CPU fp32): dense chain 2.17, ddtree15 2.88, ddtree32 3.00;
hybrid chain 2.20, ddtree15 2.61, ddtree32 3.07; the longest accepted path has 4-5 drafts in each case.

``make test`` runs DDTree budget 32 on each target (the hybrid one needs ``SPECDEC_ZOO``); the chain and budget 15
on the same prompts, and all 80 dev prompts, run in the ``slow`` tier."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import specdec
from specdec.drafters.dflash import DFlashDrafter
from specdec.loading import asset_path

ASSETS = asset_path("drafters")
TREES = {
    "chain": specdec.Chain(k=15),
    "ddtree15": specdec.DDTree(budget=15),
    "ddtree32": specdec.DDTree(budget=32, topk=8),
    "ddtree64": specdec.DDTree(budget=64, topk=8),
}


def load(zoo, name):
    model = AutoModelForCausalLM.from_pretrained(zoo / f"target-{name}", dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(zoo / "tokenizer")
    prompts = [json.loads(line) for line in (zoo / "prompts_dev.jsonl").read_text().splitlines()]
    drafter = DFlashDrafter.from_pretrained(ASSETS / f"zoo-{name}", target=model)
    return model, tok, prompts, drafter


_LOADED: dict[str, tuple] = {}
_REFERENCE: dict[tuple, torch.Tensor] = {}  # target greedy outputs, shared by every tree


def get_pair(zoo, name):
    if name not in _LOADED:
        _LOADED[name] = load(zoo, name)
    return name, _LOADED[name]


def run(pair, rows, tree, max_new_tokens):
    """Check every row against HF greedy; returns (tau over all rounds, longest accepted path in drafts)."""
    name, (model, tok, _, drafter) = pair
    mismatched, committed, rounds, longest = [], 0, 0, 0
    for row in rows:
        ids = tok(row["prompt"], return_tensors="pt").input_ids[:, -384:]
        key = (name, row["id"], max_new_tokens)
        if key not in _REFERENCE:
            _REFERENCE[key] = model.generate(ids, do_sample=False, max_new_tokens=max_new_tokens)
        ref = _REFERENCE[key]
        out = specdec.generate(model, ids, drafter=drafter, tree=tree, max_new_tokens=max_new_tokens)
        if not torch.equal(out.sequences, ref):
            mismatched.append(row["id"])
        committed += out.stats.tau * out.stats.rounds
        rounds += out.stats.rounds
        longest = max(longest, len(out.stats.accept_hist) - 1)
    assert not mismatched, f"outputs differ from target greedy on {mismatched}"
    return committed / max(rounds, 1), longest


QUICK_TAU = {"chain": 2.0, "ddtree15": 2.4, "ddtree32": 2.6}  # a random drafter stays near 1.0
QUICK_CASES = [
    pytest.param(name, tree, id=f"{name}-{tree}", marks=() if tree == "ddtree32" else pytest.mark.slow)
    for name in ("dense", "hybrid")
    for tree in QUICK_TAU
]


@pytest.mark.parametrize("name, tree", QUICK_CASES)
def test_zoo_dflash_matches_greedy_quick(zoo, name, tree):
    pair = get_pair(zoo, name)
    tau, longest = run(pair, pair[1][2][:3], TREES[tree], 48)
    assert tau > QUICK_TAU[tree], f"{pair[0]} {tree}: tau {tau:.2f}"
    assert longest >= 4, f"{pair[0]} {tree}: longest accepted path {longest}"


# measured on all 80 prompts x 32 tokens (CPU fp32): dense chain 2.15, ddtree32 2.89; hybrid chain 1.74,
# ddtree15 2.29, ddtree32 2.50, ddtree64 2.58
SLOW_TAU = {"chain": 1.6, "ddtree15": 2.1, "ddtree32": 2.3, "ddtree64": 2.3}
SLOW_CASES = [("dense", "chain"), ("dense", "ddtree32")] + [("hybrid", t) for t in TREES]


@pytest.mark.slow
@pytest.mark.parametrize("name, tree", SLOW_CASES)
def test_zoo_dflash_matches_greedy_all_dev_prompts(zoo, name, tree):
    """All 80 dev prompts (last 384 prompt tokens) x 32 new tokens: the dense pair with the chain and budget 32,
    the hybrid pair with the chain and budgets 15, 32, 64."""
    pair = get_pair(zoo, name)
    assert len(pair[1][2]) == 80
    tau, longest = run(pair, pair[1][2], TREES[tree], 32)
    assert tau > SLOW_TAU[tree], f"{name} {tree}: tau {tau:.2f}"
    assert longest >= 4, f"{name} {tree}: longest accepted path {longest}"
