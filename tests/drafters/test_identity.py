"""Drafter identity: a DFlash checkpoint records its target; another target warns, ``strict=True`` refuses."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from models import tiny_model
from transformers import AutoModelForCausalLM

import specdec
from specdec.drafters.dflash import DFlashDrafter
from specdec.drafters.identity import embedding_fingerprint, fingerprint_distance

ASSETS = Path(__file__).resolve().parents[2] / "assets" / "drafters"
MASK = 3


def make(target) -> DFlashDrafter:
    return DFlashDrafter.for_target(target, mask_token_id=MASK, num_layers=1, block_size=4, target_layer_ids=(0, 1))


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_fingerprint_follows_the_documented_rule_and_survives_casts():
    weight = tiny_model("qwen3").get_input_embeddings().weight.detach()  # [128, 64]
    rows = [int((j + 0.5) * 128 / 16) for j in range(16)]
    cols = [int((k + 0.5) * 64 / 16) for k in range(16)]
    bits = "".join("1" if float(weight[r, c]) > 0 else "0" for r in rows for c in cols)
    assert embedding_fingerprint(weight) == f"{int(bits, 2):064x}"
    for dtype in (torch.bfloat16, torch.float16):
        assert embedding_fingerprint(weight.to(dtype)) == embedding_fingerprint(weight)
    other = tiny_model("qwen3", seed=5).get_input_embeddings().weight
    assert fingerprint_distance(embedding_fingerprint(other), embedding_fingerprint(weight)) > 0.3


def test_save_pretrained_records_the_bound_target(tmp_path):
    target = tiny_model("qwen3", num_hidden_layers=3)
    make(target).save_pretrained(tmp_path)
    record = json.loads((tmp_path / "config.json").read_text())["specdec_target"]
    assert record == {
        "architecture": "Qwen3ForCausalLM",
        "model_type": "qwen3",
        "vocab_size": 128,
        "hidden_size": 64,
        "num_hidden_layers": 3,
        "embedding_fingerprint": embedding_fingerprint(target.get_input_embeddings().weight),
    }
    again = tmp_path / "again"  # an unbound drafter keeps the record it was loaded with
    DFlashDrafter.from_pretrained(tmp_path).save_pretrained(again)
    assert json.loads((again / "config.json").read_text())["specdec_target"] == record


def test_other_target_warns_once_and_strict_refuses(tmp_path, caplog):
    target, other = tiny_model("qwen3", num_hidden_layers=3), tiny_model("llama", seed=3, num_hidden_layers=3)
    make(target).save_pretrained(tmp_path)
    with caplog.at_level(logging.WARNING):
        DFlashDrafter.from_pretrained(tmp_path, target=target)
        assert not warnings_of(caplog)
        drafter = DFlashDrafter.from_pretrained(tmp_path, target=other)
    (message,) = warnings_of(caplog)
    assert "architecture 'Qwen3ForCausalLM' (trained for) vs 'LlamaForCausalLM' (this target)" in message
    assert "embedding fingerprint differs" in message and "draft poorly" in message and "strict=True" in message
    caplog.clear()
    ids = torch.randint(4, 128, (1, 8), generator=torch.Generator().manual_seed(0))
    with caplog.at_level(logging.WARNING):
        for _ in range(2):
            out = specdec.generate(other, ids, drafter=drafter, tree=specdec.Chain(3), max_new_tokens=6)
    assert not warnings_of(caplog)  # checked when bound, not on every call
    assert torch.equal(out.sequences, other.generate(ids, do_sample=False, max_new_tokens=6))
    with pytest.raises(ValueError, match="trained for another target: architecture"):
        DFlashDrafter.from_pretrained(tmp_path, target=other, strict=True)
    strict = DFlashDrafter.from_pretrained(tmp_path, strict=True)
    with pytest.raises(ValueError, match="trained for another target"):
        specdec.generate(other, ids, drafter=strict, max_new_tokens=6)


def test_checkpoint_without_record_checks_vocab_and_depth(tmp_path, caplog):
    target = tiny_model("qwen3", num_hidden_layers=3)
    make(target).save_pretrained(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    del raw["specdec_target"]
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with caplog.at_level(logging.WARNING):
        DFlashDrafter.from_pretrained(tmp_path, target=tiny_model("qwen3", seed=4, num_hidden_layers=3))
    assert not warnings_of(caplog)  # nothing recorded that could tell the two apart: loads unchanged
    bigger = tiny_model("qwen3", vocab_size=200, num_hidden_layers=4)
    with pytest.raises(ValueError, match=r"vocab_size 128 \(trained for\) vs 200.*num_hidden_layers 3 \(trained for\)"):
        DFlashDrafter.from_pretrained(tmp_path, target=bigger, strict=True)


@pytest.fixture(scope="module")
def zoo_targets(zoo):
    return {
        n: AutoModelForCausalLM.from_pretrained(zoo / f"target-{n}", dtype=torch.float32) for n in ("dense", "hybrid")
    }


def test_zoo_drafters_record_their_targets(zoo_targets, caplog):
    for name, target in zoo_targets.items():
        with caplog.at_level(logging.WARNING):
            DFlashDrafter.from_pretrained(ASSETS / f"zoo-{name}", target=target, strict=True)
    assert not warnings_of(caplog)
    with caplog.at_level(logging.WARNING):
        DFlashDrafter.from_pretrained(ASSETS / "zoo-dense", target=zoo_targets["hybrid"])
    (message,) = warnings_of(caplog)
    assert "'Qwen3ForCausalLM' (trained for) vs 'Qwen3_5ForCausalLM' (this target)" in message
    with pytest.raises(ValueError, match="trained for another target"):
        DFlashDrafter.from_pretrained(ASSETS / "zoo-dense", target=zoo_targets["hybrid"], strict=True)
