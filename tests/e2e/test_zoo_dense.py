"""The zoo dense target (fp32, CPU): speculative greedy output equals the target's own greedy generate.

``make test`` keeps one identity decode here (the 2-layer model drafter with a DDTree); the chain and n-gram
variants repeat what the tiny-model tests of ``tests/unit`` check and run in the ``slow`` tier."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import specdec


@pytest.fixture(scope="module")
def dense(zoo):
    model = AutoModelForCausalLM.from_pretrained(zoo / "target-dense", dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(zoo / "tokenizer")
    prompts = [json.loads(line) for line in (zoo / "prompts_dev.jsonl").read_text().splitlines()]
    return model, tok, prompts


_REFERENCE: dict[tuple, torch.Tensor] = {}  # target greedy outputs, shared by every drafter and tree


def check_prompts(dense, rows, drafter, tree, max_new_tokens):
    model, tok, _ = dense
    mismatched, taus = [], []
    for row in rows:
        ids = tok(row["prompt"], return_tensors="pt").input_ids
        key = (row["id"], max_new_tokens)
        if key not in _REFERENCE:
            _REFERENCE[key] = model.generate(ids, do_sample=False, max_new_tokens=max_new_tokens)
        ref = _REFERENCE[key]
        out = specdec.generate(model, ids, drafter=drafter, tree=tree, max_new_tokens=max_new_tokens)
        if not torch.equal(out.sequences, ref):
            mismatched.append(row["id"])
        taus.append(out.stats.tau)
    assert not mismatched, f"outputs differ from target greedy on {mismatched}"
    return sum(taus) / len(taus)


@pytest.mark.parametrize(
    "tree",
    [
        pytest.param(specdec.Chain(k=4), marks=pytest.mark.slow, id="chain"),
        pytest.param(specdec.DDTree(budget=12, topk=4), id="ddtree"),
    ],
)
def test_zoo_dense_model_drafter_matches_greedy_quick(dense, tree):
    drafter = specdec.ModelDrafter.from_target_layers(dense[0], 2)
    tau = check_prompts(dense, dense[2][:3], drafter, tree, 48)
    assert tau > 1.2  # a 2-layer truncation of the target agrees often


@pytest.mark.slow
def test_zoo_dense_ngram_matches_greedy_quick(dense):
    check_prompts(dense, dense[2][3:6], specdec.NGramDrafter(), specdec.DDTree(budget=8), 48)


@pytest.mark.slow
def test_zoo_dense_all_dev_prompts_128_tokens(dense):
    """All 80 dev prompts x 128 new tokens, model drafter (the target's first 2 layers) drafting 4 deep with a
    DDTree (its accepted paths stay shorter than that: on the first four prompts the same tau as drafting 8 deep,
    at 3/4 of the time)."""
    drafter = specdec.ModelDrafter.from_target_layers(dense[0], 2, tree_depth=4)
    assert len(dense[2]) == 80
    check_prompts(dense, dense[2], drafter, specdec.DDTree(budget=12, topk=4), 128)
