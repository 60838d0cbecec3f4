"""Greedy verification: follow the target's argmax from the root while a child carries it."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specdec.types import DraftTree, VerifyResult

__all__ = ["verify_greedy", "walk_tree"]


def walk_tree(tree: DraftTree, choices: Sequence[int]) -> VerifyResult:
    """Walk from the root: at node i move to the child whose token is ``choices[i]``, else stop.

    Args:
        tree (DraftTree): the verified tree (N nodes).
        choices (Sequence[int]): the target's token at each node (argmax or a sample), length N.

    Returns:
        VerifyResult: the accepted path (root first) and the new tokens (accepted drafts + bonus).
    """
    tokens = tree.tokens.tolist()
    children: dict[tuple[int, int], int] = {}
    for i, p in enumerate(tree.parents.tolist()[1:], start=1):
        children.setdefault((p, tokens[i]), i)  # first child wins if a builder emitted duplicates
    path = [0]
    node = 0
    while (nxt := children.get((node, int(choices[node])))) is not None:
        path.append(nxt)
        node = nxt
    new_tokens = [tokens[i] for i in path[1:]] + [int(choices[node])]
    return VerifyResult(path=tuple(path), tokens=tuple(new_tokens))


def verify_greedy(tree: DraftTree, target_logits: torch.Tensor) -> VerifyResult:
    """Greedy rule. ``target_logits`` ``[N, V]``: the target's logits at each node."""
    return walk_tree(tree, target_logits.argmax(dim=-1).tolist())
