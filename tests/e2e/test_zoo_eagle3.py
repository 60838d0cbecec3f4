"""An EAGLE-3 head on the zoo targets (fp32, CPU): chain and DDTree greedy output equals the target's own greedy
``generate`` on dev prompts, for the dense (Qwen3) and hybrid (Qwen3.5) targets, with the default fused layers
``[2, N // 2, N - 3]``. The first head is random, sharpened so that it drafts confidently and wrongly: every
round's rejection, bonus token and commit run; the copy head of ``tests/drafters/test_eagle3.py`` covers long
accepted paths. The last tests run the heads trained for the two targets (``assets/drafters/zoo-dense-eagle3``,
``assets/drafters/zoo-hybrid-eagle3``) under ``Chain``, ``DDTree`` and ``DynamicTree``."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import specdec
from specdec.loading import asset_path

TREES = {"chain": specdec.Chain(k=4), "ddtree16": specdec.DDTree(budget=16, topk=4)}


@pytest.mark.parametrize("tree", sorted(TREES))
@pytest.mark.parametrize("name", ["dense", "hybrid"])
def test_zoo_eagle3_matches_greedy(zoo, name, tree):
    model = AutoModelForCausalLM.from_pretrained(zoo / f"target-{name}", dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(zoo / "tokenizer")
    prompts = [json.loads(line) for line in (zoo / "prompts_dev.jsonl").read_text().splitlines()][:2]
    drafter = specdec.Eagle3Drafter.for_target(model, draft_vocab_size=2048, seed=1)
    with torch.no_grad():
        for p in drafter.model.parameters():
            if p.dim() == 2:
                p.mul_(8.0)
    assert drafter.target_layer_ids == (1, 3, 4)  # hidden_states 2, 4, 5 of the 8-layer targets
    for row in prompts:
        ids = tok(row["prompt"], return_tensors="pt").input_ids[:, -256:]
        want = model.generate(ids, do_sample=False, max_new_tokens=24)
        out = specdec.generate(model, ids, drafter=drafter, tree=TREES[tree], max_new_tokens=24)
        assert torch.equal(out.sequences, want), row["id"]


HEADS = asset_path("drafters")  # the shipped drafters (the checkout's assets/, or the installed package's)


def shipped_trees():
    return {"chain4": specdec.Chain(k=4), "ddtree15": specdec.DDTree(budget=15),
            "dynamic16": specdec.DynamicTree(depth=5, topk=4, total_tokens=16)}  # fmt: skip


def test_shipped_hybrid_head_is_lossless_and_gets_drafts_accepted(zoo):
    """The head trained for the hybrid target (``assets/drafters/zoo-hybrid-eagle3``, 1145 steps on an H200) loads
    with the default fused layers, keeps the output the target's own under ``Chain``, ``DDTree`` and
    ``DynamicTree``, and gets drafts accepted. On this test's settings (2 dev prompts, last 128 prompt tokens, 32 new
    tokens, fp32 CPU) it reached τ 2.14 with ``Chain(4)``, 2.38 with ``DDTree(15)`` and 2.58 with
    ``DynamicTree(5, 4, 16)``, and an untrained head of the same vocabulary 1.00 with each; the threshold leaves a
    margin (the slow test below runs both heads on more prompts)."""
    model = AutoModelForCausalLM.from_pretrained(zoo / "target-hybrid", dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(zoo / "tokenizer")
    prompts = [json.loads(line) for line in (zoo / "prompts_dev.jsonl").read_text().splitlines()][:2]
    drafter = specdec.Eagle3Drafter.from_pretrained(HEADS / "zoo-hybrid-eagle3", target=model)
    assert drafter.config.draft_vocab_size == 2048 and drafter.hidden_state_ids == (2, 4, 5)
    lengths = {tree: [] for tree in shipped_trees()}
    for row in prompts:
        ids = tok(row["prompt"], return_tensors="pt").input_ids[:, -128:]
        want = model.generate(ids, do_sample=False, max_new_tokens=32)
        for tree_name, tree in shipped_trees().items():
            out = specdec.generate(model, ids, drafter=drafter, tree=tree, max_new_tokens=32)
            assert torch.equal(out.sequences, want), (row["id"], tree_name)
            lengths[tree_name] += out.stats.accept_lengths
    tau = {tree: sum(v) / len(v) for tree, v in lengths.items()}
    assert min(tau.values()) > 1.5, tau


@pytest.mark.slow  # the zoo target over several dev prompts, with a random head for comparison
@pytest.mark.parametrize("name", ["dense", "hybrid"])
def test_shipped_head_is_lossless_and_gets_drafts_accepted(zoo, name):
    """The head trained for each target (``assets/drafters/zoo-{name}-eagle3``, official layout) loads, keeps the
    output the target's own under ``Chain``, ``DDTree`` and ``DynamicTree``, and gets more drafts accepted than a
    random head of the same vocabulary (3 dev prompts, 48 new tokens)."""
    model = AutoModelForCausalLM.from_pretrained(zoo / f"target-{name}", dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(zoo / "tokenizer")
    prompts = [json.loads(line) for line in (zoo / "prompts_dev.jsonl").read_text().splitlines()][:3]
    trained = specdec.Eagle3Drafter.from_pretrained(HEADS / f"zoo-{name}-eagle3", target=model)
    assert trained.config.draft_vocab_size == 2048 and trained.hidden_state_ids == (2, 4, 5)
    random = specdec.Eagle3Drafter.for_target(model, draft_vocab_size=2048, seed=1)
    random.model.d2t.copy_(trained.model.d2t)
    random.model.t2d.copy_(trained.model.t2d)
    tau = {}
    for kind, drafter in (("trained", trained), ("random", random)):
        for row in prompts:
            ids = tok(row["prompt"], return_tensors="pt").input_ids[:, -256:]
            want = model.generate(ids, do_sample=False, max_new_tokens=48)
            for tree_name, tree in shipped_trees().items():
                out = specdec.generate(model, ids, drafter=drafter, tree=tree, max_new_tokens=48)
                assert torch.equal(out.sequences, want), (kind, row["id"], tree_name)
                tau.setdefault((kind, tree_name), []).extend(out.stats.accept_lengths)
    tau = {key: sum(v) / len(v) for key, v in tau.items()}
    for tree_name in shipped_trees():
        assert tau["trained", tree_name] > tau["random", tree_name] + 0.5, tau
