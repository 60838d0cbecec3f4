"""An EAGLE-3 head on the zoo targets (fp32, CPU): chain and DDTree greedy output equals the target's own greedy
``generate`` on dev prompts, for the dense (Qwen3) and hybrid (Qwen3.5) targets, with the default fused layers
``[2, N // 2, N - 3]``. The first head is random, sharpened so that it drafts confidently and wrongly: every
round's rejection, bonus token and commit run; the copy head of ``tests/drafters/test_eagle3.py`` covers long
accepted paths. The last test runs the head trained for the dense target (``assets/drafters/zoo-dense-eagle3``)."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import specdec

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


@pytest.mark.slow  # the zoo target over several dev prompts, with a random head for comparison
def test_shipped_head_is_lossless_and_gets_drafts_accepted(zoo):
    """The head trained for the dense target (``assets/drafters/zoo-dense-eagle3``, official layout) loads, keeps
    the output the target's own, and gets more drafts accepted than a random head of the same vocabulary."""
    from pathlib import Path

    folder = Path(__file__).resolve().parents[2] / "assets" / "drafters" / "zoo-dense-eagle3"
    model = AutoModelForCausalLM.from_pretrained(zoo / "target-dense", dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(zoo / "tokenizer")
    prompts = [json.loads(line) for line in (zoo / "prompts_dev.jsonl").read_text().splitlines()][:3]
    trained = specdec.Eagle3Drafter.from_pretrained(folder, target=model)
    assert trained.config.draft_vocab_size == 2048 and trained.hidden_state_ids == (2, 4, 5)
    random = specdec.Eagle3Drafter.for_target(model, draft_vocab_size=2048, seed=1)
    random.model.d2t.copy_(trained.model.d2t)
    random.model.t2d.copy_(trained.model.t2d)
    tau = {}
    for name, drafter in (("trained", trained), ("random", random)):
        lengths = []
        for row in prompts:
            ids = tok(row["prompt"], return_tensors="pt").input_ids[:, -256:]
            want = model.generate(ids, do_sample=False, max_new_tokens=48)
            for tree in (specdec.Chain(k=4), specdec.DDTree(budget=15)):
                out = specdec.generate(model, ids, drafter=drafter, tree=tree, max_new_tokens=48)
                assert torch.equal(out.sequences, want), (name, row["id"], tree)
                lengths += out.stats.accept_lengths
        tau[name] = sum(lengths) / len(lengths)
    assert tau["trained"] > tau["random"] + 0.1, tau
