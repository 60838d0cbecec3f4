"""An MTP head in the zoo's hybrid checkpoint (Qwen3.5 text, sharded, tied embeddings; fp32, CPU): a random head
written into a copy of the checkpoint in the published layout loads back from its index, transformers still loads
the model from that folder, and greedy output over dev prompts equals the target's own ``generate`` for a chain and
a DDTree (the head is random, so this checks exactness, not acceptance); the trained head shipped for this target
(``assets/drafters/zoo-hybrid-mtp``) loads through a copy of the checkpoint and decodes as HF does."""

import json
import shutil
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import specdec
from specdec.drafters.mtp import MTPDrafter, with_mtp_head


def test_zoo_hybrid_with_an_mtp_head(zoo, tmp_path):
    folder = tmp_path / "target-hybrid-mtp"
    shutil.copytree(zoo / "target-hybrid", folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    MTPDrafter.random(model, seed=0, std=0.1).save_pretrained(folder)
    index = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    assert index["mtp.fc.weight"] == "model-mtp.safetensors"
    assert json.loads((folder / "config.json").read_text())["mtp_num_hidden_layers"] == 1
    reloaded = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    for a, b in zip(model.state_dict().values(), reloaded.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    drafter = MTPDrafter.from_pretrained(folder, target=reloaded)
    tok = AutoTokenizer.from_pretrained(zoo / "tokenizer")
    rows = [json.loads(line) for line in (zoo / "prompts_dev.jsonl").read_text().splitlines()][:2]
    for row in rows:
        ids = tok(row["prompt"], return_tensors="pt").input_ids[:, -256:]
        ref = reloaded.generate(ids, do_sample=False, max_new_tokens=24)
        for tree in (specdec.Chain(k=3), specdec.DDTree(budget=8, topk=4)):
            out = specdec.generate(reloaded, ids, drafter=drafter, tree=tree, max_new_tokens=24)
            assert torch.equal(out.sequences, ref), (row["id"], tree)


SHIPPED = Path(__file__).resolve().parents[2] / "assets" / "drafters" / "zoo-hybrid-mtp"


def test_shipped_head_loads_through_a_checkpoint_copy_and_decodes_as_hf(zoo, tmp_path):
    """The trained head of ``assets/drafters/zoo-hybrid-mtp`` (only its ``mtp.*`` tensors) added to a copy of the zoo's
    hybrid checkpoint loads as a Qwen3.5 checkpoint's own head does; greedy output over dev prompts equals the
    target's own ``generate`` (a dev prompt, ``Chain(3)`` and ``DDTree(8)``), and its drafts get accepted (a trained
    head, not a random one): on these settings the head trained on an H200 (1790 steps) reached τ 2.09 with
    ``Chain(3)`` and 2.56 with ``DDTree(8)``, 2.3 over both; the threshold leaves a margin."""
    assert {p.name for p in SHIPPED.iterdir()} == {"model-mtp.safetensors", "train_log.jsonl", "TRAINING.md"}
    folder = with_mtp_head(zoo / "target-hybrid", SHIPPED, tmp_path / "target-hybrid-mtp")
    assert json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]["mtp.fc.weight"] == (
        "model-mtp.safetensors"
    )
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    drafter = MTPDrafter.from_pretrained(folder, target=model)
    tok = AutoTokenizer.from_pretrained(zoo / "tokenizer")
    rows = [json.loads(line) for line in (zoo / "prompts_dev.jsonl").read_text().splitlines()][:1]
    lengths = []
    for row in rows:
        ids = tok(row["prompt"], return_tensors="pt").input_ids[:, -96:]
        ref = model.generate(ids, do_sample=False, max_new_tokens=24)
        for tree in (specdec.Chain(k=3), specdec.DDTree(budget=8)):
            out = specdec.generate(model, ids, drafter=drafter, tree=tree, max_new_tokens=24)
            assert torch.equal(out.sequences, ref), (row["id"], tree)
            lengths += out.stats.accept_lengths
    assert sum(lengths) / len(lengths) > 1.8
