"""Host walks of a draft tree (the oracles of ``specdec.verify``'s rules): follow the target's argmax (greedy) or
one multinomial sample per node of HF's processed distribution (sample-and-match) from the root while a child
carries it."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from oracles import hf_probs
from specdec.types import DraftTree, SamplingParams, VerifyResult

__all__ = ["sample_tokens", "verify_greedy", "verify_sample", "walk_tree"]


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


def sample_tokens(
    target_logits: torch.Tensor, sampling: SamplingParams, generator: torch.Generator | None
) -> torch.Tensor:
    """One token per row (``[N]``): the argmax if ``not sampling.do_sample``, else a multinomial sample of HF's
    processed distribution (``oracles.hf_probs``: HF's own warpers in ``generate``'s order)."""
    if not sampling.do_sample:
        return target_logits.argmax(dim=-1)
    probs = hf_probs(target_logits, sampling.temperature, sampling.top_k, sampling.top_p)
    return torch.multinomial(probs.float(), 1, generator=generator).squeeze(-1)


def verify_sample(
    tree: DraftTree, target_logits: torch.Tensor, sampling: SamplingParams, generator: torch.Generator | None
) -> VerifyResult:
    """Sample-and-match. ``target_logits`` ``[N, V]``: one sample per node, then the walk along the samples."""
    return walk_tree(tree, sample_tokens(target_logits, sampling, generator).tolist())
