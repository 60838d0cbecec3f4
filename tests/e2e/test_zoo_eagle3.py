"""An EAGLE-3 head on the zoo targets (fp32, CPU): chain and DDTree greedy output equals the target's own greedy
``generate`` on dev prompts, for the dense (Qwen3) and hybrid (Qwen3.5) targets, with the default fused layers
``[2, N // 2, N - 3]``. The head is random (no trained EAGLE-3 head ships for the zoo), sharpened so that it drafts
confidently and wrongly: every round's rejection, bonus token and commit run; the copy head of
``tests/drafters/test_eagle3.py`` covers long accepted paths."""

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
