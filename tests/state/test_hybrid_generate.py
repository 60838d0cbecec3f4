"""Greedy speculative decoding on hybrid targets is token-identical to the target's own greedy ``generate``."""

from __future__ import annotations

import json

import pytest
import torch
import transformers as tf
from hybrid_harness import VOCAB, tiny_hybrid

import specdec

TREES = [specdec.Chain(k=4), specdec.DDTree(budget=8)]
# Scale of the residual-branch outputs of the tiny targets: small enough that the bigram drafter below agrees
# with the target often (all accept lengths occur), large enough that the recurrent layers matter.
ALPHA = {"qwen3_5": 0.3, "qwen3_next": 0.3, "nemotron_h": 0.1, "mamba2": 0.1}


def _target(family: str):
    model = tiny_hybrid(family)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if any(k in name for k in ("out_proj", "o_proj", "down_proj")):
                p.mul_(ALPHA[family])
    return model


def _bigram_drafter(target) -> specdec.ModelDrafter:
    """A one-layer Llama that is the identity except the target's own embedding and LM head."""
    torch.manual_seed(0)
    config = tf.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=None,
        pad_token_id=0,
    )
    draft = tf.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        draft.get_input_embeddings().weight.copy_(target.get_input_embeddings().weight)
        draft.get_output_embeddings().weight.copy_(target.get_output_embeddings().weight)
        for name, p in draft.named_parameters():
            if "o_proj" in name or "down_proj" in name:
                p.zero_()
    return specdec.ModelDrafter(draft)


@pytest.mark.parametrize("tree", TREES, ids=str)
@pytest.mark.parametrize("family", list(ALPHA))
def test_generate_greedy_matches_target_generate(family, tree):
    target = _target(family)
    drafter = _bigram_drafter(target)
    gen = torch.Generator().manual_seed(0)
    accepted = 0
    for _ in range(2):
        input_ids = torch.randint(0, VOCAB, (1, 8), generator=gen)
        want = target.generate(input_ids, max_new_tokens=40, do_sample=False)
        out = specdec.generate(target, input_ids, drafter=drafter, tree=tree, max_new_tokens=40, do_sample=False)
        assert torch.equal(out.sequences, want)
        accepted += out.stats.new_tokens - out.stats.rounds
    assert accepted > 0  # drafts were accepted, so multi-token commits were exercised


def test_generate_greedy_matches_on_zoo_hybrid(zoo):
    target = tf.AutoModelForCausalLM.from_pretrained(zoo / "target-hybrid", dtype=torch.float32).eval()
    draft = tf.AutoModelForCausalLM.from_pretrained(zoo / "target-dense", dtype=torch.float32).eval()
    tokenizer = tf.AutoTokenizer.from_pretrained(zoo / "tokenizer")
    with open(zoo / "prompts_dev.jsonl") as f:
        prompt = json.loads(f.readline())["prompt"]
    input_ids = tokenizer(prompt, return_tensors="pt").input_ids[:, -96:]
    want = target.generate(input_ids, max_new_tokens=32, do_sample=False)
    for tree in TREES:
        out = specdec.generate(
            target, input_ids, drafter=specdec.ModelDrafter(draft), tree=tree, max_new_tokens=32, do_sample=False
        )
        assert torch.equal(out.sequences, want), f"{tree}: speculative output differs from target.generate"
        assert out.stats.tau > 1.5
