"""The target decoded eagerly over an HF dynamic cache: prefill, one forward over a draft tree, commit, rollback.

``EagerTarget`` is a :class:`specdec.target.TargetModel` that keeps its own ``DynamicCache`` holding exactly the
committed tokens but the last (the root of the next tree) and verifies host trees (``DraftTree``) through the
eager state managers of ``oracles.eager_state`` (K/V gathers for attention, the recurrent adapters' verify scope
and commit for hybrids). It is the independent reference of the round's static storage in the hybrid state tests.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import DynamicCache

from oracles.eager_state import EagerHybridState, eager_manager
from specdec.state.hybrid import hybrid_prefill
from specdec.target import TargetModel
from specdec.trees import tree_attention_bias, tree_position_ids
from specdec.types import DraftTree

__all__ = ["EagerTarget"]


class EagerTarget(TargetModel):
    """A ``TargetModel`` with an eager, dynamic-cache decode (batch of one sequence)."""

    def __init__(self, model, **kwargs) -> None:
        super().__init__(model, **kwargs)
        self.state = eager_manager(self.state)  # the library's adapters and mode, the eager commit

    @torch.no_grad()
    def prefill(self, input_ids: torch.Tensor, taps: Sequence[int] | None = None):
        """Run the prompt ``[1, T]`` into a fresh cache (hybrids in exact mode: as ``SPECDEC_HYBRID_PREFILL``
        says, ``specdec.state.hybrid_prefill``).

        Returns:
            (logits ``[V]`` at the last prompt position, taps ``[1, T, L*H]`` or None).
        """
        state = self.state
        exact_hybrid = isinstance(state, EagerHybridState) and state.mode == "exact"
        scan = exact_hybrid and hybrid_prefill(self.device, input_ids.shape[-1]) == "scan"
        self.cache = DynamicCache(config=self.config)
        self.length = 0
        if scan:
            return self._prefill_scan(input_ids, taps)
        logits, hidden = self.forward(input_ids, taps=taps, last_only=True)
        self.length = input_ids.shape[-1]
        return logits[-1], hidden

    def _prefill_scan(self, input_ids: torch.Tensor, taps: Sequence[int] | None):
        """The ``"scan"`` hybrid prefill, eagerly: the prompt as a chain tree from the empty state through the
        adapters and tree scans, then each recurrent layer's path replay.

        The cache's layers are created by one token through the model's own forward, then emptied
        (``EagerHybridState.clear``), so no layer of the result comes from that forward."""
        from specdec.state.recurrent import commit_recurrent  # the round's commit: one replay per layer

        self.forward(input_ids[:, :1], last_only=True)
        self.state.clear(self.cache)
        n, device = input_ids.shape[-1], self.device
        parents = torch.arange(-1, n - 1)
        tree = DraftTree(tokens=input_ids[0], parents=parents)  # parents on the host (the topology), tokens stay
        mask = tree_attention_bias(tree.parents, 0, dtype=self.dtype, device=device)
        positions = torch.arange(n, device=device)[None]
        with self.state.verify_scope(self.model, self.cache, tree, 0, prompt=True):
            logits, hidden = self.forward(input_ids, position_ids=positions, attention_mask=mask, taps=taps,
                                          last_only=True)  # fmt: skip
        rnd = self.state.take_round(self.cache, 0)  # the attention rows are already the prompt's, in order
        path = torch.arange(n, device=device)
        for adapter in self.state.adapters:
            commit_recurrent(adapter, rnd, path, torch.tensor(n, device=device))
        self.length = n
        return logits[-1], hidden

    @torch.no_grad()
    def verify(self, tree: DraftTree, taps: Sequence[int] | None = None):
        """One forward over all tree nodes on top of the committed prefix.

        Returns:
            (logits ``[N, V]``, taps ``[1, N, L*H]`` or None). The cache holds the N node entries until
            ``commit`` or ``rollback``.
        """
        prefix = self.length
        device = self.device
        input_ids = tree.tokens.to(device).unsqueeze(0)
        position_ids = tree_position_ids(tree.depth, prefix, device)
        mask = tree_attention_bias(tree.parents, prefix, dtype=self.dtype, device=device)
        try:
            with self.state.verify_scope(self.model, self.cache, tree, prefix):
                return self.forward(input_ids, position_ids=position_ids, attention_mask=mask, taps=taps)
        except BaseException:
            self.state.rollback(self.cache, prefix)
            raise

    def commit(self, path: Sequence[int]) -> None:
        """Keep the accepted nodes (``path``, root first) as if they had been run causally."""
        self.state.commit(self.cache, self.length, path)
        self.length += len(path)

    def rollback(self) -> None:
        """Drop the entries of a verify forward that will not be committed."""
        self.state.rollback(self.cache, self.length)

    def truncate(self, length: int) -> None:
        """Forget committed tokens past ``length`` (attention-only caches)."""
        self.state.rollback(self.cache, length)
        self.length = length
