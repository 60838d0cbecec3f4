"""Test helper: a ``TreeRow`` from Python lists (real nodes, then padding slots)."""

from __future__ import annotations

import torch

from specdec.types import TreeRow


def padded_tree(tokens: list[int], parents: list[int], num_slots: int) -> TreeRow:
    """``tokens``/``parents`` of the real nodes, padded to ``num_slots`` as the device builders pad."""
    depth = [0]
    for p in parents[1:]:
        depth.append(depth[p] + 1)
    pad = num_slots - len(tokens)
    return TreeRow(
        tokens=torch.tensor(tokens + [tokens[0]] * pad),
        parents=torch.tensor(parents + [-1] * pad),
        depth=torch.tensor(depth + [0] * pad),
        valid=torch.arange(num_slots) < len(tokens),
        num_nodes=torch.tensor(len(tokens)),
    )
