"""Commit on hybrid targets: the exact commit equals snapshot/restore + replay, and decoding on from the committed
cache equals a causal run of every committed token.

The two commits reach the same state through different float operations (stash replay in recurrent form vs the
model's own forward over the accepted tokens, chunked for several tokens), so they agree to fp32 rounding, not
bit for bit: per round (both commits start from the same cache), conv windows, recurrent states and KV agree
within 5e-6 relative to the tensor's magnitude (floor 1); measured over 200 rounds: <= 1.4e-6 (pure Mamba2
states), <= 8e-7 for every other family and tensor.
"""

from __future__ import annotations

import copy

import pytest
import torch
from hybrid_harness import FAMILIES, VOCAB, next_logits, prefill, random_tree, state_tensors, tiny_hybrid, verify
from oracles.eager_state import eager_manager_for

from specdec.types import DraftTree

ROUNDS = {"qwen3_5": 200, "nemotron_h": 200}  # the GDN and the Mamba2 reference families; others fewer
KINDS = ("random", "chain", "deep", "bush")
MAX_LEN = 96


def _assert_caches_close(got, want, where: str) -> None:
    got, want = state_tensors(got), state_tensors(want)
    assert got.keys() == want.keys()
    for key, ref in want.items():
        assert got[key].shape == ref.shape, f"{where}: {key} shape {tuple(got[key].shape)} != {tuple(ref.shape)}"
        tol = 5e-6 * max(1.0, ref.abs().max().item())
        diff = (got[key] - ref).abs().max().item()
        assert diff <= tol, f"{where}: {key} differs by {diff:.2e} (tolerance {tol:.1e})"


def _accepted_path(tree: DraftTree, mode: str, gen: torch.Generator) -> list[int]:
    if mode == "reject_first":
        return [0]
    depth = tree.depth.tolist()
    if mode == "accept_all":
        node = max(range(len(depth)), key=depth.__getitem__)
    else:
        node = int(torch.randint(0, len(depth), (1,), generator=gen))
    parents, path = tree.parents.tolist(), [node]
    while parents[path[-1]] >= 0:
        path.append(parents[path[-1]])
    return path[::-1]


@pytest.mark.parametrize("family", FAMILIES)
def test_commit_matches_snapshot_replay_and_causal(family):
    model = tiny_hybrid(family)
    exact, snap = eager_manager_for(model), eager_manager_for(model, hybrid_mode="snapshot")
    gen = torch.Generator().manual_seed(7)
    rounds = ROUNDS.get(family, 40)
    seq = torch.randint(0, VOCAB, (1, 6), generator=gen)
    cache = prefill(model, seq[:, :-1])
    modes = {"accept_all": 0, "reject_first": 0, "mid_path": 0}
    for r in range(rounds):
        prefix_len = seq.shape[1] - 1
        n = int(torch.randint(1, 10, (1,), generator=gen))
        drafted = random_tree(gen, n, KINDS[r % len(KINDS)])
        tree = DraftTree(tokens=torch.cat([seq[0, -1:], drafted.tokens[1:]]), parents=drafted.parents)
        other = copy.deepcopy(cache)
        logits = verify(model, exact, cache, tree, prefix_len)
        logits_snap = verify(model, snap, other, tree, prefix_len)
        assert (logits - logits_snap).abs().max() <= 1e-5

        mode = tuple(modes)[r % 3]
        path = _accepted_path(tree, mode, gen)
        modes[mode] += 1
        exact.commit(cache, prefix_len, path)
        snap.commit(other, prefix_len, path)
        _assert_caches_close(cache, other, f"{family} round {r} ({mode}, path {path})")

        bonus = int(logits[path[-1]].argmax())
        seq = torch.cat([seq, tree.tokens[path[1:]][None], torch.tensor([[bonus]])], dim=1)
        if r % 20 == 19 or r == rounds - 1:
            probe = copy.deepcopy(cache)
            got = next_logits(model, probe, bonus, seq.shape[1] - 1)
            with torch.no_grad():
                want = model(input_ids=seq).logits[0, -1]
            assert (got - want).abs().max() <= 1e-5, f"{family} round {r}: next-token logits differ"
        if seq.shape[1] > MAX_LEN:
            seq = seq[:, -6:]
            cache = prefill(model, seq[:, :-1])
    assert min(modes.values()) >= rounds // 3


@pytest.mark.parametrize("mode", ["exact", "snapshot"])
@pytest.mark.parametrize("kind", ["chain", "random"])
def test_rollback_restores_the_cache(mode, kind):
    model = tiny_hybrid("qwen3_5")
    manager = eager_manager_for(model, hybrid_mode=mode)
    gen = torch.Generator().manual_seed(2)
    prefix = torch.randint(0, VOCAB, (1, 8), generator=gen)
    cache = prefill(model, prefix)
    before = copy.deepcopy(cache)
    verify(model, manager, cache, random_tree(gen, 6, kind), 8)
    manager.rollback(cache, 8)
    got, want = state_tensors(cache), state_tensors(before)
    assert got.keys() == want.keys()
    assert all(torch.equal(got[k], want[k]) for k in want)


def test_commit_rejects_a_non_path():
    model = tiny_hybrid("nemotron_h")
    manager = eager_manager_for(model)
    gen = torch.Generator().manual_seed(4)
    prefix = torch.randint(0, VOCAB, (1, 8), generator=gen)
    cache = prefill(model, prefix)
    tree = DraftTree(tokens=torch.arange(4), parents=torch.tensor([-1, 0, 0, 1]))
    verify(model, manager, cache, tree, 8)
    with pytest.raises(ValueError, match="root-to-node path"):
        manager.commit(cache, 8, [0, 2, 3])  # 3 is a child of 1, not of 2
    with pytest.raises(RuntimeError, match="without a verify_scope"):
        manager.commit(cache, 8, [0])


def test_hybrid_rollback_of_committed_tokens_is_refused():
    model = tiny_hybrid("qwen3_5")
    manager = eager_manager_for(model)
    cache = prefill(model, torch.arange(10)[None])
    with pytest.raises(ValueError, match="cannot be rewound"):
        manager.rollback(cache, 5)
