"""Adapter over an HF causal LM: prefill, one forward over a draft tree, hidden-state taps, state commit.

Works with any HF causal LM whose layers are attention (``sdpa`` or ``eager``) through an additive float 4D
mask and explicit position ids; recurrent layers go through the state manager of ``specdec.state``. The
target's cache always holds exactly the committed tokens except the last one (the root of the next tree).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Sequence

import torch
from transformers import DynamicCache

from specdec.state import cache_kwarg, manager_for
from specdec.state.hybrid import HybridState, hybrid_prefill
from specdec.trees import tree_attention_bias, tree_position_ids
from specdec.types import DraftTree

__all__ = ["TargetModel"]

logger = logging.getLogger(__name__)

_TREE_ATTN = ("sdpa", "eager")


class TargetModel:
    """Wraps an HF ``*ForCausalLM`` for speculative verification (batch of one sequence).

    Args:
        model: the HF causal LM (eval mode is set by the caller; weights are never modified).
        hybrid_mode (str): ``"exact"`` (default) or ``"snapshot"``, passed to ``specdec.state.manager_for``.
    """

    def __init__(self, model, *, hybrid_mode: str = "exact") -> None:
        self.model = model
        self.config = model.config
        text_cfg = self.config.get_text_config() if hasattr(self.config, "get_text_config") else self.config
        self.text_config = text_cfg
        impl = getattr(self.config, "_attn_implementation", None) or "eager"
        if impl not in _TREE_ATTN:
            raise ValueError(
                f"Target attention implementation {impl!r} cannot take a tree mask; load the target with "
                'attn_implementation="sdpa" (or "eager").'
            )
        self.state = manager_for(model, hybrid_mode=hybrid_mode)
        params = inspect.signature(type(model).forward).parameters
        self._cache_kw = cache_kwarg(model)
        self._has_logits_to_keep = "logits_to_keep" in params
        self.cache = None
        self.length = 0  # tokens held in the cache

    @classmethod
    def wrap(cls, target, **kwargs) -> TargetModel:
        return target if isinstance(target, TargetModel) else cls(target, **kwargs)

    # -- model facts -------------------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self.model.get_input_embeddings().weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.get_input_embeddings().weight.dtype

    @property
    def vocab_size(self) -> int:
        return self.model.get_output_embeddings().weight.shape[0]

    @property
    def num_layers(self) -> int:
        return self.text_config.num_hidden_layers

    @property
    def hidden_size(self) -> int:
        return self.text_config.hidden_size

    @property
    def max_length(self) -> int | None:
        """Longest sequence the target can position (``max_position_embeddings``; sliding window if smaller)."""
        limits = [getattr(self.text_config, "max_position_embeddings", None)]
        if self._sliding_window_layers():
            limits.append(self.text_config.sliding_window)
        limits = [x for x in limits if x]
        return min(limits) if limits else None

    def _sliding_window_layers(self) -> bool:
        window = getattr(self.text_config, "sliding_window", None)
        if not window:
            return False
        types = getattr(self.text_config, "layer_types", None)
        return types is None or any("sliding" in t for t in types)

    # -- forwards ----------------------------------------------------------------------------------------
    def _forward(
        self, input_ids, *, position_ids=None, attention_mask=None, taps=None, last_only=False, cache=None, rows=None
    ):
        """One forward on ``cache`` (default this wrapper's); returns (logits ``[N, V]``, taps or None).

        ``last_only`` keeps the last row's logits, ``rows`` (a ``[R]`` int64 device tensor) the logits of those
        rows (``[R, V]``; graph-safe: no host read).
        """
        kwargs = {self._cache_kw: self.cache if cache is None else cache, "use_cache": True}
        if taps:
            kwargs["output_hidden_states"] = True
        if rows is not None and self._has_logits_to_keep:
            kwargs["logits_to_keep"] = rows
        elif last_only and self._has_logits_to_keep:
            kwargs["logits_to_keep"] = 1
        out = self.model(input_ids=input_ids, position_ids=position_ids, attention_mask=attention_mask, **kwargs)
        hidden = None
        if taps:
            hidden = torch.cat([out.hidden_states[i + 1] for i in taps], dim=-1)  # [1, N, L*H]
        logits = out.logits[0]
        if rows is not None and not self._has_logits_to_keep:
            logits = logits.index_select(0, rows)
        return logits, hidden

    @torch.no_grad()
    def prefill(self, input_ids: torch.Tensor, taps: Sequence[int] | None = None):
        """Run the prompt ``[1, T]`` into a fresh cache (hybrids in exact mode: as ``SPECDEC_HYBRID_PREFILL``
        says, ``specdec.state.hybrid_prefill``).

        Returns:
            (logits ``[V]`` at the last prompt position, taps ``[1, T, L*H]`` or None).
        """
        state = self.state
        exact_hybrid = isinstance(state, HybridState) and state.mode == "exact"
        scan = exact_hybrid and hybrid_prefill(self.device, input_ids.shape[-1]) == "scan"
        self.cache = DynamicCache(config=self.config)
        self.length = 0
        if scan:
            return self._prefill_scan(input_ids, taps)
        logits, hidden = self._forward(input_ids, taps=taps, last_only=True)
        self.length = input_ids.shape[-1]
        return logits[-1], hidden

    def _prefill_scan(self, input_ids: torch.Tensor, taps: Sequence[int] | None):
        """Hybrid prefill as the fast path's ``"scan"`` prefill runs it, eagerly: the prompt as a chain tree from
        the empty state through the adapters and tree scans, then each recurrent layer's path replay.

        The cache's layers are created by one token through the model's own forward, then emptied
        (``HybridState.clear``), so no layer of the result comes from that forward."""
        from specdec.state.recurrent import commit_recurrent  # the fast path's commit: one replay per layer

        self._forward(input_ids[:, :1], last_only=True)
        self.state.clear(self.cache)
        n, device = input_ids.shape[-1], self.device
        parents = torch.arange(-1, n - 1)
        tree = DraftTree(tokens=input_ids[0], parents=parents)  # parents on the host (the topology), tokens stay
        mask = tree_attention_bias(tree.parents, 0, dtype=self.dtype, device=device)
        positions = torch.arange(n, device=device)[None]
        with self.state.verify_scope(self.model, self.cache, tree, 0, prompt=True):
            logits, hidden = self._forward(input_ids, position_ids=positions, attention_mask=mask, taps=taps,
                                           last_only=True)  # fmt: skip
        rnd = self.state.take_round(self.cache, 0)  # the attention rows are already the prompt's, in order
        path = torch.arange(n, device=device)
        for adapter in self.state.adapters:
            commit_recurrent(adapter, rnd, path, torch.tensor(n, device=device))
        self.length = n
        return logits[-1], hidden

    @torch.no_grad()
    def prefill_into(self, cache, input_ids: torch.Tensor, taps: Sequence[int] | None = None):
        """Run the prompt into ``cache`` (an empty HF cache) with the model's own forward; this wrapper's cache is
        left alone. Returns (logits ``[V]`` at the last position, taps ``[1, T, L*H]`` or None)."""
        logits, hidden = self._forward(input_ids, taps=taps, last_only=True, cache=cache)
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
                return self._forward(input_ids, position_ids=position_ids, attention_mask=mask, taps=taps)
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
        """Forget committed tokens past ``length`` (attention-only caches; used by model drafters)."""
        self.state.rollback(self.cache, length)
        self.length = length
