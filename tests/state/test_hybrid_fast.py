"""Hybrid targets on the fast path (device-side round, CPU without capture): token-identical to the target's own
greedy ``generate`` and to the eager path's acceptance (Gated DeltaNet and Mamba2 families); the snapshot mode
falls back with a reason."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from hybrid_harness import VOCAB
from test_hybrid_generate import _bigram_drafter, _target

import specdec
from specdec.drafters.dflash import DFlashDrafter

TREES = [specdec.Chain(k=4), specdec.DDTree(budget=8), specdec.DDTree(budget=20, topk=3)]


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_next", "nemotron_h", "mamba2"])
def test_hybrid_fast_round_matches_target_generate(family):
    target = _target(family)
    drafter = _bigram_drafter(target)
    gen = torch.Generator().manual_seed(0)
    accepted = 0
    for _ in range(2):
        input_ids = torch.randint(0, VOCAB, (1, 8), generator=gen)
        want = target.generate(input_ids, max_new_tokens=40, do_sample=False)
        plain = specdec.generate(target, input_ids, max_new_tokens=40, cuda_graphs=True)
        assert plain.stats.path == "fast" and torch.equal(plain.sequences, want)
        for tree in TREES:
            fast = specdec.generate(target, input_ids, drafter=drafter, tree=tree, max_new_tokens=40, cuda_graphs=True)
            eager = specdec.generate(
                target, input_ids, drafter=drafter, tree=tree, max_new_tokens=40, cuda_graphs=False
            )
            assert fast.stats.path == "fast" and torch.equal(fast.sequences, want), tree
            assert fast.stats.accept_hist == eager.stats.accept_hist
            accepted += fast.stats.new_tokens - fast.stats.rounds
    assert accepted > 0  # multi-token commits of the recurrent state were exercised


def test_zoo_hybrid_fast_round_matches_greedy(zoo):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = AutoModelForCausalLM.from_pretrained(zoo / "target-hybrid", dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(zoo / "tokenizer")
    drafter = DFlashDrafter.from_pretrained("assets/drafters/zoo-hybrid", target=target)
    rows = [json.loads(line) for line in (zoo / "prompts_dev.jsonl").read_text().splitlines()]
    taus = []
    for row in rows[:2]:
        ids = tok(row["prompt"], return_tensors="pt").input_ids
        want = target.generate(ids, max_new_tokens=32, do_sample=False)
        for tree in (specdec.Chain(k=15), specdec.DDTree(budget=32, topk=8)):
            fast = specdec.generate(target, ids, drafter=drafter, tree=tree, max_new_tokens=32, cuda_graphs=True)
            assert fast.stats.path == "fast" and torch.equal(fast.sequences, want)
            taus.append(fast.stats.tau)
    assert max(taus) > 2.5  # long accepted paths: deep recurrent commits


def test_snapshot_mode_falls_back_with_a_reason(caplog):
    target = _target("qwen3_5")
    input_ids = torch.randint(0, VOCAB, (1, 8), generator=torch.Generator().manual_seed(0))
    want = target.generate(input_ids, max_new_tokens=12, do_sample=False)
    model = specdec.SpeculativeModel(target, hybrid_mode="snapshot")
    with caplog.at_level(logging.WARNING, logger="specdec.generate"):
        out = model.generate(input_ids, max_new_tokens=12, cuda_graphs=True, return_dict_in_generate=True)
    assert out.stats.path == "eager" and torch.equal(out.sequences, want)
    assert "snapshot" in caplog.text


@torch.no_grad()
def test_warmup_runs_are_undone_before_capture():
    """Capture runs the round twice before recording it and must undo each run, recurrent states included;
    otherwise the first captured round of a call would decode from a state the warm-up already advanced."""
    from specdec.fast.engine import FastEngine
    from specdec.target import TargetModel

    target = _target("qwen3_5")
    drafter = _bigram_drafter(target)
    ids = torch.randint(0, VOCAB, (1, 8), generator=torch.Generator().manual_seed(3))
    specdec.generate(target, ids, drafter=drafter, tree=specdec.DDTree(budget=8), max_new_tokens=8, cuda_graphs=True)
    engine = FastEngine.for_target(TargetModel.wrap(target), capacity=1)
    (rnd,) = [r for r in engine._rounds.values() if r.drafter is drafter]

    def start():
        logits, _ = engine.prefill(ids, drafter)
        engine.set_root(logits.argmax().view(1))

    def state():
        rec = [
            t.clone() for layer in engine.target.recurrent.values() for t in (layer.conv_states, layer.recurrent_states)
        ]
        return [engine.prefix.clone(), engine.root.clone(), rnd.out.clone(), *rec]

    start()
    rnd.captured.fn()
    once = state()
    start()
    restore = rnd._snapshot()
    rnd.captured.fn()  # a warm-up run, undone
    restore()
    rnd.captured.fn()
    assert len(once) > 3 and all(torch.equal(a, b) for a, b in zip(once, state(), strict=True))
