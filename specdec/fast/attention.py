"""Grouped-query attention for the fast path without expanding K/V per query head.

HF's ``sdpa`` attention repeats every grouped K/V head once per query head that shares it whenever a mask is
passed (``repeat_kv``): SDPA's own GQA mode drops to the math kernel with a mask on CUDA. The fast path always
passes a mask (tree masks, and the static storage's unused slots), so every layer of every round copied its K/V
span ``num_attention_heads / num_key_value_heads`` times. ``grouped_sdpa`` instead stacks the query heads of a
group along the query axis, ``[B, H, Q, D] -> [B, H_kv, (H / H_kv) * Q, D]`` (row ``r * Q + q`` holds query
``q`` of head ``g * rep + r``), repeats the mask the same way and attends over the K/V as stored. Each row's
scores, softmax and weighted sum are the ones HF computes; only the batching differs.

The function is registered in transformers' ``AttentionInterface`` under ``NAME``; :class:`AttentionScope`
switches the ``sdpa`` configs of the models it is given to it while the fast path runs their forwards (graph
capture, compilation, uncaptured calls) and restores them afterwards, so the user's model is left as it was.
Anything it does not cover (no mask, a per-head mask, dropout, soft-capping, attention sinks, position biases)
goes to HF's ``sdpa_attention_forward`` unchanged. ``SPECDEC_GROUPED_ATTENTION`` says where it is used
(:func:`grouped_for`): ``auto`` (default: forwards that are not compiled), ``1`` (all) or ``0`` (none).
``SPECDEC_ATTENTION_KERNEL=triton`` runs the grouped case through ``specdec.kernels.tree_attention`` instead of
SDPA (split over the key span as well; not the default until it has been timed on a GPU).
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from transformers import AttentionInterface, PretrainedConfig
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface, sdpa_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

__all__ = ["KERNEL", "MODE", "NAME", "AttentionScope", "grouped_for", "grouped_sdpa"]

NAME = "specdec_grouped_sdpa"
# Keyword arguments that change what attention computes; any of them set sends the call to HF's sdpa.
_HF_ONLY = ("softcap", "s_aux", "sinks", "position_bias")
# Where the fast path uses grouped_sdpa: "auto" (uncompiled forwards only), "1" (also compiled ones) or "0"
# (never). Read when a scope is built (rounds and prefills build theirs once); benchmarks set it to compare.
MODE = os.environ.get("SPECDEC_GROUPED_ATTENTION", "auto")
_MODES = ("auto", "1", "0")


# The kernel of the grouped case: "sdpa" (default: PyTorch's SDPA on the stacked rows) or "triton" (the split-K/V
# kernel of specdec.kernels.tree_attention, which also spreads the span over many programs; opt-in until timed).
KERNEL = os.environ.get("SPECDEC_ATTENTION_KERNEL", "sdpa")
if KERNEL not in ("sdpa", "triton"):
    raise ValueError(f"SPECDEC_ATTENTION_KERNEL={KERNEL!r}: use 'sdpa' or 'triton'.")


def grouped_for(compiled: bool) -> bool:
    """Whether forwards (``compiled`` or not) run :func:`grouped_sdpa` under the current ``MODE``.

    "auto" keeps HF's attention under ``torch.compile``: at the Qwen3-8B shape on an H200 the compiled AR step
    measured the same either way (6.48 ms with HF's repeated K/V, 6.53 grouped; docs/performance.md): SDPA then
    runs 8 grouped heads of 4 stacked rows instead of 32 heads of one row, and its kernel for that shape took
    0.88 ms against 0.30 ms, eating the 0.47 ms of K/V copies saved. Uncompiled, grouped saved 0.38 ms of 9.60.
    """
    if MODE not in _MODES:
        raise ValueError(f"SPECDEC_GROUPED_ATTENTION={MODE!r}: use 'auto', '1' or '0'")
    return MODE == "1" or (MODE == "auto" and not compiled)


def grouped_sdpa(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """HF attention-interface function: ``sdpa`` with grouped K/V attended unexpanded (see the module docstring).

    Args:
        module: the attention module (unused here, passed on to HF's fallback).
        query (torch.Tensor): ``[B, H, Q, D]``.
        key, value (torch.Tensor): ``[B, H_kv, K, D]``.
        attention_mask (torch.Tensor | None): ``[B or 1, 1, Q, K]`` additive float or bool (True = visible).

    Returns:
        (``[B, Q, H, D]`` contiguous, None), as HF's attention functions return.
    """
    heads, kv_heads = query.shape[1], key.shape[1]
    plain = (
        heads == kv_heads
        or heads % kv_heads
        or attention_mask is None
        or attention_mask.dim() != 4
        or attention_mask.shape[1] != 1
        or dropout
        or any(kwargs.get(k) is not None for k in _HF_ONLY)
    )
    if plain:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    batch, _, q_len, head_dim = query.shape
    if KERNEL == "triton" and batch == 1 and attention_mask.shape[:3] == (1, 1, q_len):
        from specdec.kernels.tree_attention import tree_attention  # Triton on CUDA, its reference elsewhere

        return tree_attention(query, key, value, attention_mask, head_dim**-0.5 if scaling is None else scaling), None
    rep = heads // kv_heads
    stacked = query.reshape(batch, kv_heads, rep * q_len, head_dim)
    rows, span = attention_mask.shape[0], attention_mask.shape[-1]
    if q_len == 1:
        mask = attention_mask.expand(rows, 1, rep, span)  # a view: every stacked row reads the one mask row
    else:
        mask = attention_mask.expand(rows, rep, q_len, span).reshape(rows, 1, rep * q_len, span)
    out = F.scaled_dot_product_attention(stacked, key, value, attn_mask=mask, scale=scaling)
    return out.reshape(batch, heads, q_len, value.shape[-1]).transpose(1, 2).contiguous(), None


def _register() -> None:
    """Register ``grouped_sdpa`` (once: a function registered under ``NAME`` since is kept)."""
    if NAME not in ALL_ATTENTION_FUNCTIONS:
        AttentionInterface.register(NAME, grouped_sdpa)
    if NAME not in ALL_MASK_ATTENTION_FUNCTIONS:
        AttentionMaskInterface.register(NAME, sdpa_mask)  # masks HF builds itself (e.g. a hybrid's prefill) as sdpa's


class AttentionScope:
    """While active, the models' configs that select ``sdpa`` select :func:`grouped_sdpa` instead.

    Entering and leaving sets one attribute per config object (the model's and any sub-configs its modules hold);
    leaving restores exactly what was there, also after an exception. Models on ``eager`` or any other attention
    are left alone, and so is every model when ``grouped`` is False.

    Args:
        models: HF models (None entries are skipped).
        grouped (bool): switch to grouped attention (False: the scope does nothing). Default True.
    """

    def __init__(self, *models, grouped: bool = True) -> None:
        configs: dict[int, PretrainedConfig] = {}
        if grouped:
            for model in models:
                if model is None:
                    continue
                for module in model.modules():
                    config = getattr(module, "config", None)
                    if isinstance(config, PretrainedConfig):
                        configs[id(config)] = config
            _register()
        self.configs = list(configs.values())
        self._switched: list[PretrainedConfig] = []
        self._depth = 0

    def __enter__(self) -> AttentionScope:
        if self._depth == 0:
            self._switched = [c for c in self.configs if getattr(c, "_attn_implementation_internal", None) == "sdpa"]
            for config in self._switched:
                config._attn_implementation_internal = NAME
        self._depth += 1
        return self

    def __exit__(self, *exc) -> None:
        self._depth -= 1
        if self._depth == 0:
            for config in self._switched:
                config._attn_implementation_internal = "sdpa"
            self._switched = []
