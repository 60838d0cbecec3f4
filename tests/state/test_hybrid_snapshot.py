"""Snapshot / restore of whole HF hybrid caches."""

from __future__ import annotations

import pytest
import torch
from hybrid_harness import VOCAB, next_logits, prefill, random_tree, state_tensors, tiny_hybrid, tree_forward

from specdec.state import restore, snapshot
from specdec.state.hybrid import cache_kwarg


@torch.no_grad()
def _run(model, cache, tokens: torch.Tensor, start: int) -> torch.Tensor:
    positions = torch.arange(start, start + tokens.shape[1])[None]
    return model(input_ids=tokens, position_ids=positions, **{cache_kwarg(model): cache}, use_cache=True).logits[0]


@pytest.mark.parametrize("family", ["qwen3_5", "zamba2", "falcon_h1"])
@pytest.mark.parametrize("attention", ["clone", "length"])
def test_restore_is_bitwise_and_in_place(family, attention):
    model = tiny_hybrid(family)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, VOCAB, (1, 16), generator=gen)
    cache = prefill(model, tokens[:, :10])
    before = {k: v.clone() for k, v in state_tensors(cache).items()}
    recurrent = ("conv_states", "recurrent_states")
    addresses = {k: v.data_ptr() for k, v in state_tensors(cache).items() if k[1] in recurrent}
    snap = snapshot(cache, attention=attention)
    assert snap.nbytes > 0
    for _ in range(2):  # a snapshot can be restored any number of times
        _run(model, cache, tokens[:, 10:], 10)
        restore(cache, snap)
        after = state_tensors(cache)
        assert after.keys() == before.keys()
        assert all(torch.equal(after[k], before[k]) for k in before)
        assert all(after[k].data_ptr() == ptr for k, ptr in addresses.items())  # static addresses kept


@pytest.mark.parametrize("family", ["qwen3_next", "bamba"])
def test_restore_then_replay_equals_running_straight(family):
    """Snapshot, run a flattened tree (state polluted), restore, replay 3 accepted tokens: equals a causal run."""
    model = tiny_hybrid(family)
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, VOCAB, (1, 9), generator=gen)
    cache = prefill(model, prompt)
    snap = snapshot(cache)
    tree = random_tree(gen, 7, "bush")
    tree_forward(model, cache, tree, 9)
    restore(cache, snap)
    accepted = tree.tokens[[0, 3]][None]
    _run(model, cache, accepted, 9)
    got = next_logits(model, cache, 5, 11)
    with torch.no_grad():
        want = model(input_ids=torch.cat([prompt, accepted, torch.tensor([[5]])], dim=1)).logits[0, -1]
    assert (got - want).abs().max() <= 1e-5


def test_snapshot_rejects_unknown_attention_mode():
    cache = prefill(tiny_hybrid("qwen3_5"), torch.arange(4)[None])
    with pytest.raises(ValueError, match="attention="):
        snapshot(cache, attention="shallow")
