"""N-gram (prompt lookup) drafter: propose what followed earlier occurrences of the latest n tokens.

No model: each round searches the committed tokens (a static buffer) with tensor ops. It proposes drafted paths:
a chain takes the continuation of the most recent match; a DDTree merges the continuations of several matches
into a trie under the node budget.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec.trees import Chain
from specdec.types import Accept, Proposal

__all__ = ["NGramDrafter", "NGramDrafterConfig", "NGramState"]


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
        for name in ("max_ngram", "min_ngram", "max_matches"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"NGramDrafter: {name}={value!r} must be a Python int >= 1 (e.g. {name}=3).")
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

    def validate(self, target, tree) -> None:
        pass

    def reset(self) -> None:
        pass

    @property
    def provides(self) -> tuple[str, ...]:
        return ("paths",)

    def draft_depth(self, tree) -> int:
        """Tokens per continuation: the policy's depth."""
        return tree.max_depth

    def window(self, tree) -> int:
        return 1

    def forwards_per_round(self, tree) -> int:
        return 0

    def attach(self, target, capacity: int, batch: int = 1) -> NGramState:
        return NGramState(self.config, capacity, target.device, batch)


class NGramState:
    """The committed tokens in a static buffer and the lookup as tensor ops (no host reads).

    Args:
        config (NGramDrafterConfig): the lookup settings.
        capacity (int): positions held.
        device: of the buffer.
    """

    def __init__(self, config: NGramDrafterConfig, capacity: int, device, batch: int = 1) -> None:
        self.config = config
        self.history = torch.zeros(batch, capacity, dtype=torch.long, device=device)  # committed tokens per sequence
        self.rows = torch.arange(batch, device=device)[:, None]

    def refresh(self) -> None:
        return None

    def prefill(self, input_ids: torch.Tensor, hidden: torch.Tensor | None) -> None:
        self.history[:, : input_ids.shape[1]] = input_ids

    def resume(self, input_ids: torch.Tensor, hidden: torch.Tensor | None, start: int) -> None:
        """A continued prompt: its tokens from position ``start`` on."""
        self.history[:, start : start + input_ids.shape[1]] = input_ids

    def commit(self, accept: Accept, hidden: torch.Tensor | None, prefix: torch.Tensor) -> None:
        """Record the committed tokens after each row's old root (rows past the path land where the next round's
        root and commit overwrite them before any lookup reads them)."""
        tokens = accept.tokens  # [B, P]
        positions = prefix[:, None] + 1 + torch.arange(tokens.shape[1], device=tokens.device)
        self.history[self.rows, positions.clamp(max=self.history.shape[1] - 1)] = tokens

    def propose(self, root: torch.Tensor, prefix: torch.Tensor, depth: int, span: int) -> Proposal:
        """Continuations ``[B, M, depth]`` of the longest suffix (``max_ngram`` .. ``min_ngram`` tokens) that occurred
        before, most recent match first, distinct; ``M = max_matches``."""
        self.history[self.rows[:, 0], prefix] = root
        rows = [self._lookup(self.history[b], p, depth, span) for b, p in enumerate(prefix)]
        return Proposal(paths=torch.stack([r[0] for r in rows]), path_lengths=torch.stack([r[1] for r in rows]))

    def _lookup(self, history: torch.Tensor, prefix: torch.Tensor, depth: int, span: int):
        """One sequence's lookup over its ``history [capacity]`` (the root already at ``prefix``)."""
        cfg, device = self.config, history.device
        span = min(span, history.numel())
        ids = history[:span]
        total = prefix + 1  # committed tokens, the root included
        starts = torch.arange(span, device=device)
        best_hits = torch.zeros(span, dtype=torch.bool, device=device)
        best_n = torch.zeros((), dtype=torch.long, device=device)
        for n in range(cfg.min_ngram, cfg.max_ngram + 1):  # longer suffixes win where they match
            if n >= span:
                break
            suffix = ids[(total - n + torch.arange(n, device=device)).clamp(min=0)]
            windows = ids.unfold(0, n, 1)  # [span - n + 1, n]: window s = ids[s : s + n]
            hits = (windows == suffix).all(-1) & (starts[: windows.shape[0]] + n <= total - 1) & (total - 1 >= n)
            hits = torch.nn.functional.pad(hits, (0, span - hits.numel()))
            found = hits.any()
            best_hits = torch.where(found, hits, best_hits)
            best_n = torch.where(found, n, best_n)
        count = min(4 * cfg.max_matches, span)  # most recent candidates looked at
        score, start = torch.where(best_hits, starts + 1, 0).topk(count)  # latest first; 0 = no match
        first = start + best_n  # where each continuation begins
        steps = torch.arange(depth, device=device)
        length = torch.where(score > 0, (total - first).clamp(min=0, max=depth), 0)  # [C]
        cont = ids[(first[:, None] + steps).clamp(max=span - 1)]  # [C, depth]
        masked = torch.where(steps < length[:, None], cont, -1)
        same = (masked[:, None] == masked[None]).all(-1)  # [C, C]
        earlier = torch.arange(count, device=device)
        dup = (same & (earlier[None] < earlier[:, None]) & (length[None] > 0)).any(-1)
        keep = (length > 0) & ~dup
        order = torch.sort((~keep).long(), stable=True).indices[: cfg.max_matches]  # kept ones first, in order
        kept = keep[order]
        return cont[order], torch.where(kept, length[order], 0)
