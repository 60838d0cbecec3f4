"""N-gram (prompt lookup) drafter: propose what followed earlier occurrences of the latest n tokens.

No model, no state: each round searches the committed tokens. A chain takes the continuation of the most
recent match; a DDTree spec merges the continuations of several matches into a trie under the node budget.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec.trees import chain_tree, paths_to_tree, root_tree
from specdec.types import Chain, DecodeContext, DraftTree, TreeSpec, VerifyResult

__all__ = ["NGramDrafter", "NGramDrafterConfig"]


@dataclass(frozen=True, kw_only=True)
class NGramDrafterConfig:
    """Args:
    max_ngram (int): longest suffix to match (tried first), >= 1. Default 3.
    min_ngram (int): shortest suffix to match, in [1, max_ngram]. Default 1.
    max_matches (int): matches merged into a tree (DDTree specs), >= 1. Default 8.
    """

    max_ngram: int = 3
    min_ngram: int = 1
    max_matches: int = 8

    def __post_init__(self) -> None:
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise ValueError(f"NGramDrafter: need 1 <= min_ngram ({self.min_ngram}) <= max_ngram ({self.max_ngram}).")
        if self.max_matches < 1:
            raise ValueError(f"NGramDrafter: max_matches={self.max_matches} must be >= 1.")


class NGramDrafter:
    """Prompt-lookup drafter. ``NGramDrafter(max_ngram=3, min_ngram=1)``; the draft length ``k`` comes from the
    tree spec (``Chain(k)``: up to k tokens; ``DDTree(budget)``: up to ``budget`` nodes over several matches).
    """

    target_layer_ids = None

    def __init__(self, config: NGramDrafterConfig | None = None, **kwargs) -> None:
        self.config = config or NGramDrafterConfig(**kwargs)
        self.num_forwards = 0
        self.default_tree = Chain(k=4)

    def validate(self, target, tree: TreeSpec) -> None:
        pass

    def reset(self) -> None:
        pass

    def prefill(self, ctx: DecodeContext) -> None:
        pass

    def commit(self, ctx: DecodeContext, result: VerifyResult) -> None:
        pass

    def _continuations(self, ids: torch.Tensor, length: int, max_matches: int) -> list[list[int]]:
        """Continuations (most recent match first) of the longest suffix that occurred before."""
        total = ids.numel()
        for n in range(min(self.config.max_ngram, total - 1), self.config.min_ngram - 1, -1):
            windows = ids[: total - 1].unfold(0, n, 1)  # [total-n, n]; excludes the suffix itself
            hits = (windows == ids[total - n :]).all(dim=1).nonzero().squeeze(-1).flip(0)
            found, seen = [], set()
            for start in hits.tolist():
                cont = ids[start + n : start + n + length].tolist()
                if cont and tuple(cont) not in seen:
                    seen.add(tuple(cont))
                    found.append(cont)
                if len(found) >= max_matches:
                    break
            if found:
                return found
        return []

    def propose(self, ctx: DecodeContext, tree: TreeSpec) -> DraftTree:
        ids = ctx.input_ids[0].cpu()
        root = int(ids[-1])
        device = ctx.input_ids.device
        if isinstance(tree, Chain):
            conts = self._continuations(ids, tree.k, 1)
            return chain_tree(root, conts[0], device) if conts else root_tree(root, device)
        conts = self._continuations(ids, tree.budget, self.config.max_matches)
        return paths_to_tree(root, conts, budget=tree.budget, device=device) if conts else root_tree(root, device)
