"""``draws.forward_path`` + ``draws.accept_path`` (the walk along each node's accepted child by pointer doubling, as
``recursive_rejection`` builds its ``Accept``) equals ``draws.accept_at`` at the walk's end, every field exactly."""

from __future__ import annotations

import pytest
import torch

from specdec.types import DeviceTree
from specdec.verify.draws import accept_at, accept_path, forward_path


def random_walk(gen: torch.Generator, batch: int, slots: int, max_depth: int):
    """Random trees (``max_depth`` deep at most, padding, ragged sizes) and an ``nxt``: each node's accepted child
    (a random child of it) or itself; returns the tree, ``nxt``, the walk's end from the root and bonus tokens."""
    parents = torch.full((batch, slots), -1)
    depth = torch.zeros(batch, slots, dtype=torch.long)
    sizes = torch.randint(1, slots + 1, (batch,), generator=gen)
    sizes[0] = slots
    nxt = torch.arange(slots).repeat(batch, 1)
    for b in range(batch):
        for j in range(1, int(sizes[b])):
            eligible = [i for i in range(j) if depth[b, i] < max_depth]
            chain = float(torch.rand((), generator=gen)) < 0.6  # the latest open node: deep trees
            parents[b, j] = eligible[-1 if chain else int(torch.randint(len(eligible), (1,), generator=gen))]
            depth[b, j] = depth[b, parents[b, j]] + 1
        for node in range(int(sizes[b])):
            children = [c for c in range(int(sizes[b])) if parents[b, c] == node]
            if children and float(torch.rand((), generator=gen)) < 0.9:
                nxt[b, node] = children[int(torch.randint(len(children), (1,), generator=gen))]
    valid = torch.arange(slots) < sizes[:, None]
    tokens = torch.randint(1, 50, (batch, slots), generator=gen)
    tree = DeviceTree(tokens, parents, depth, valid, sizes)
    end = torch.zeros(batch, dtype=torch.long)
    for _ in range(max_depth):
        end = nxt.gather(1, end[:, None])[:, 0]
    bonus = torch.randint(50, 100, (batch,), generator=gen)
    return tree, nxt, end, bonus


@pytest.mark.parametrize("max_depth", [0, 1, 2, 3, 4, 7, 8, 13])
def test_forward_walk_equals_accept_at(max_depth):
    gen = torch.Generator().manual_seed(max_depth)
    lengths = []
    for batch in (1, 4):
        for slots in (1, 2, 9, 40):
            if max_depth == 0 and slots > 1:
                continue
            for _ in range(6):
                tree, nxt, end, bonus = random_walk(gen, batch, slots, max_depth)
                want = accept_at(tree, end, bonus, max_depth)
                got = accept_path(tree, forward_path(nxt, max_depth), bonus)
                for name in ("path", "num_path", "tokens"):
                    a, b = getattr(want, name), getattr(got, name)
                    assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), (name, a, b)
                lengths.append(want.num_path)
    lengths = torch.cat(lengths)
    assert int(lengths.max()) >= min(max_depth + 1, 6) and (max_depth == 0 or int(lengths.min()) < max_depth + 1)
