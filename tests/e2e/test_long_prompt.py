"""A zoo prompt of over 3 k tokens (fp32, CPU): every drafter (DFlash, EAGLE-3, MTP on the hybrid, n-gram, a small
model) with a chain and a DDTree equals the target's own
greedy ``generate``, on the dense and the hybrid zoo targets, with the default backends and with the attention
kernel's path forced (``attention_kernel="triton"``: its reference on CPU, which reads each sequence only up to
its length, so the lengths handed down by the round are exercised at a long context).

``make test`` runs the dense target with its DFlash drafter and a DDTree (both attention paths); every other
combination runs in the ``slow`` tier. The hybrid target needs ``SPECDEC_ZOO``."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import specdec
from specdec.drafters.mtp import with_mtp_head
from specdec.loading import asset_path

PROMPT_TOKENS = 3200  # the zoo targets position 4096
NEW = 32
_CACHE: dict = {}


def _target(zoo, name: str):
    if name not in _CACHE:
        model = AutoModelForCausalLM.from_pretrained(zoo / f"target-{name}", dtype=torch.float32).eval()
        tok = AutoTokenizer.from_pretrained(zoo / "tokenizer")
        rows = [json.loads(line) for line in (zoo / "prompts_dev.jsonl").read_text().splitlines()]
        text = "\n\n".join(row["prompt"] + row["reference"] for row in rows)
        ids = tok(text, return_tensors="pt").input_ids[:, :PROMPT_TOKENS]
        assert ids.shape[1] == PROMPT_TOKENS
        want = model.generate(ids, do_sample=False, max_new_tokens=NEW)
        _CACHE[name] = (model, ids, want)
    return _CACHE[name]


def _drafter(zoo, name: str, kind: str, model, tmp_path_factory):
    if kind == "dflash":
        return specdec.DFlashDrafter.from_pretrained(asset_path("drafters") / f"zoo-{name}", target=model)
    if kind == "ngram":
        return specdec.NGramDrafter()
    if kind == "eagle3":
        return specdec.Eagle3Drafter.from_pretrained(asset_path("drafters") / f"zoo-{name}-eagle3", target=model)
    if kind == "mtp":  # the head's tensors in a copy of the target's checkpoint, as a Qwen3.5 checkpoint holds them
        if "mtp" not in _CACHE:
            folder = tmp_path_factory.mktemp("mtp") / "target-hybrid-mtp"
            _CACHE["mtp"] = with_mtp_head(zoo / "target-hybrid", asset_path("drafters") / "zoo-hybrid-mtp", folder)
        return specdec.MTPDrafter.from_pretrained(_CACHE["mtp"], target=model)
    small = AutoModelForCausalLM.from_pretrained(zoo / "target-dense", dtype=torch.float32).eval()
    return specdec.ModelDrafter(small)  # the dense target drafts for either (one tokenizer)


TREES = {"chain": lambda: specdec.Chain(k=8), "ddtree": lambda: specdec.DDTree(budget=16, topk=4)}
QUICK = {("dense", "dflash", "ddtree")}
CASES = [
    pytest.param(name, kind, tree, kernel, id=f"{name}-{kind}-{tree}-{kernel}",
                 marks=() if (name, kind, tree) in QUICK else pytest.mark.slow)
    for name in ("dense", "hybrid")
    for kind in ("dflash", "eagle3", "ngram", "model") + (("mtp",) if name == "hybrid" else ())
    for tree in TREES
    for kernel in (("auto",) if kind in ("eagle3", "mtp") else ("auto", "triton"))  # the kernel path: the target's
]  # fmt: skip


@pytest.mark.parametrize("name, kind, tree, kernel", CASES)
def test_a_3k_token_prompt_equals_hf_greedy(zoo, name, kind, tree, kernel, tmp_path_factory):
    model, ids, want = _target(zoo, name)
    drafter = _drafter(zoo, name, kind, model, tmp_path_factory)
    out = specdec.generate(model, ids, drafter=drafter, tree=TREES[tree](), max_new_tokens=NEW,
                           backends={"attention_kernel": kernel})  # fmt: skip
    assert torch.equal(out.sequences, want), (name, kind, tree, kernel)
    assert out.stats.rounds < NEW or kind == "ngram"  # the drafter's tokens are accepted at that context
