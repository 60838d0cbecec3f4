"""Grouped-query attention for the round without expanding K/V per query head.

HF's ``sdpa`` attention repeats every grouped K/V head once per query head that shares it whenever a mask is
passed (``repeat_kv``): SDPA's own GQA mode drops to the math kernel with a mask on CUDA. The round always
passes a mask (tree masks, and the static storage's unused slots), so every layer of every round copied its K/V
span ``num_attention_heads / num_key_value_heads`` times. ``grouped_sdpa`` instead stacks the query heads of a
group along the query axis, ``[B, H, Q, D] -> [B, H_kv, (H / H_kv) * Q, D]`` (row ``r * Q + q`` holds query
``q`` of head ``g * rep + r``), repeats the mask the same way and attends over the K/V as stored. Each row's
scores, softmax and weighted sum are the ones HF computes; only the batching differs.

The function is registered in transformers' ``AttentionInterface`` under ``NAME``; :class:`AttentionScope`
switches the ``sdpa`` configs of the models it is given to it while the round runs their forwards (graph
capture, compilation, uncaptured calls) and restores them afterwards, so the user's model is left as it was.
Anything it does not cover (no mask, a per-head mask, dropout, soft-capping, attention sinks, position biases)
goes to HF's ``sdpa_attention_forward`` unchanged. ``SPECDEC_GROUPED_ATTENTION`` says where it is used
(:func:`grouped_for`): ``auto`` (default: every forward where the grouped case runs the Triton kernel, uncompiled
forwards where it runs SDPA), ``1`` (all) or ``0`` (none). ``SPECDEC_ATTENTION_KERNEL`` picks the grouped case's
kernel (:func:`triton_kernel_for`): ``auto`` (default: ``specdec.kernels.tree_attention``'s split-K/V Triton kernel
on CUDA, compiled or not, where Triton is importable and the dtype and head dim fit, SDPA on the stacked rows
otherwise), ``triton`` (``tree_attention`` always: its torch reference off CUDA) or ``sdpa``. The kernel also takes
each sequence's readable length (``KV_LENGTHS``, handed down by the round's forwards), so a decode step at a 32 k
context reads the committed K / V once and nothing of the storage past it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import AttentionInterface, PretrainedConfig
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface, sdpa_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from specdec.backends import env_default

__all__ = [
    "KERNEL",
    "KV_FLAT",
    "KV_LENGTHS",
    "MODE",
    "NAME",
    "AttentionScope",
    "grouped_for",
    "grouped_sdpa",
    "triton_kernel_for",
]

NAME = "specdec_grouped_sdpa"
# The most query rows per sequence the split-K/V kernel takes (a decode step, a draft tree, a DFlash block); a
# prompt's chunk of more rows goes to SDPA, whose tiles are made for many rows (at a 32 k prompt of the 8 B shape
# the kernel took 7.2 s for the prefill against SDPA's 3.2 s).
MAX_KERNEL_QUERIES = 128
# The forward keyword argument through which the round hands the attention layers each sequence's readable slots
# (``[B]`` int32 or int64: committed prefix + this forward's rows, ``StaticModel.forward``); HF's models pass unknown
# keyword arguments of their forward down to the attention function.
KV_LENGTHS = "specdec_kv_lengths"
# Likewise each sequence's flat prefix (``[B]`` int32 or int64: the committed slots, which every query row of the
# forward sees, or does not see, whole): the kernel reads no mask there (``tree_attention``'s ``flat``). Passed only
# where every attention layer gets the one mask (no sliding-window layers).
KV_FLAT = "specdec_kv_flat"
# Keyword arguments that change what attention computes; any of them set sends the call to HF's sdpa.
_HF_ONLY = ("softcap", "s_aux", "sinks", "position_bias")
# Where the round uses grouped_sdpa: "auto" (uncompiled forwards, and compiled ones where the grouped case runs
# the Triton kernel), "1" (all) or "0" (never). Read when a scope is built (rounds and prefills build theirs once);
# benchmarks set it to compare.
MODE = env_default("grouped_attention")
_MODES = ("auto", "1", "0")


# The kernel of the grouped case: "auto" (the split-K/V Triton kernel of specdec.kernels.tree_attention in compiled
# forwards on CUDA where it is importable and fits, SDPA on the stacked rows otherwise), "triton" (tree_attention
# always) or "sdpa".
KERNEL = env_default("attention_kernel")
_KERNELS = ("auto", "triton", "sdpa")


def triton_kernel_for(
    device: torch.device | str, compiled: bool, dtype: torch.dtype | None = None, head_dim: int | None = None
) -> bool:
    """Whether the grouped case of forwards on ``device`` (``compiled`` or not; with query ``dtype`` / ``head_dim``
    where known) runs ``specdec.kernels.tree_attention`` under the current ``KERNEL``.

    "auto" takes the Triton kernel on CUDA, compiled or not, where it is importable and fits: it reads each K / V
    row of a sequence once per call and only the sequence's slots in use (``KV_LENGTHS``), where SDPA with a mask
    reads the whole span of every query head. Measured (H200, bf16): ``docs/kernels.md`` and ``docs/results.md``.
    Its sums are associated differently from the SDPA kernels of HF's own forward, so in bf16 a near-tied token
    can differ from ``model.generate``'s (the share is reported with the results); ``sdpa`` keeps SDPA.
    """
    if KERNEL not in _KERNELS:
        raise ValueError(f"SPECDEC_ATTENTION_KERNEL={KERNEL!r}: use 'auto', 'triton' or 'sdpa'.")
    if KERNEL != "auto":
        return KERNEL == "triton"
    from specdec.kernels.tree_attention import triton_picked

    return triton_picked(torch.device(device), dtype, head_dim)


def kernel_impl() -> str:
    """The ``impl`` to pass ``tree_attention`` once :func:`triton_kernel_for` said yes: "auto" has already picked
    the Triton version (no second dispatch); "triton" lets the call pick (its reference off CUDA)."""
    return "triton" if KERNEL == "auto" else "auto"


def grouped_for(
    compiled: bool, device: torch.device | str = "cpu", dtype: torch.dtype | None = None, head_dim: int | None = None
) -> bool:
    """Whether forwards on ``device`` (``compiled`` or not; the model's ``dtype`` / attention ``head_dim`` where
    known) run :func:`grouped_sdpa` under the current ``MODE``.

    "auto" groups every forward whose grouped case runs the Triton kernel (:func:`triton_kernel_for`), and only
    uncompiled ones where it would run SDPA: at the Qwen3-8B shape on an H200 the compiled AR step measured the
    same with HF's attention and grouped SDPA (6.48 ms with HF's repeated K/V, 6.53 grouped; docs/kernels.md):
    SDPA then runs 8 grouped heads of 4 stacked rows instead of 32 heads of one row, and its kernel for that shape
    took 0.88 ms against 0.30 ms, eating the 0.47 ms of K/V copies saved. Uncompiled, grouped saved 0.38 ms of 9.60.
    """
    if MODE not in _MODES:
        raise ValueError(f"SPECDEC_GROUPED_ATTENTION={MODE!r}: use 'auto', '1' or '0'")
    return MODE == "1" or (MODE == "auto" and (not compiled or triton_kernel_for(device, compiled, dtype, head_dim)))


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
    lengths = kwargs.pop(KV_LENGTHS, None)
    flat = kwargs.pop(KV_FLAT, None)
    plain = (
        heads % kv_heads
        or attention_mask is None
        or attention_mask.dim() != 4
        or attention_mask.shape[1] != 1
        or dropout
        or any(kwargs.get(k) is not None for k in _HF_ONLY)
    )
    batch, _, q_len, head_dim = query.shape
    kernel = (
        not plain
        and q_len <= MAX_KERNEL_QUERIES
        and attention_mask.shape[0] in (1, batch)
        and attention_mask.shape[2] == q_len
        and triton_kernel_for(query.device, torch.compiler.is_compiling(), query.dtype, head_dim)
    )
    if kernel:
        from specdec.kernels.tree_attention import tree_attention

        impl = kernel_impl()
        scale = head_dim**-0.5 if scaling is None else scaling
        if lengths is not None and (lengths.shape != (batch,) or lengths.device != query.device):
            lengths = None  # not this forward's sequences (e.g. a model inside another's forward): read the span
        if flat is not None and (flat.shape != (batch,) or flat.device != query.device):
            flat = None
        return tree_attention(query, key, value, attention_mask, scale, lengths, impl=impl, flat=flat), None
    if plain or heads == kv_heads:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
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
    are left alone, and so is every model when ``grouped`` is False. With ``linear`` the scope also routes the
    models' ``nn.Linear`` layers through ``specdec.kernels.skinny_linear.routing.skinny_forward``
    while active (the engine's whole forward scope, ``Backends.linear_kernel``), and with ``norms`` their RMSNorm
    layers through ``specdec.kernels.rms_norm.routing.norm_forward`` (``Backends.target_norm``), and with ``rotary``
    their modeling modules' ``apply_rotary_pos_emb`` through ``specdec.kernels.rotary`` (``Backends.target_rotary``),
    and with ``mlps`` their gated MLPs' activation and product through ``specdec.kernels.silu_mul``
    (``Backends.silu_mul``), and with ``projections`` their projection groups (q / k / v, a Gated DeltaNet layer's
    input projections) and gated MLPs' input side through ``specdec.kernels.grouped_linear``
    (``Backends.grouped_linear``; the MLPs then take this route instead of ``mlps``').

    Args:
        models: HF models (None entries are skipped).
        grouped (bool): switch to grouped attention (False: the scope does nothing for attention). Default True.
        linear (bool): route the linear layers as well. Default False.
        norms (bool): route the RMSNorm layers as well. Default False.
        rotary (bool): route the rotary embedding as well. Default False.
        mlps (bool): route the gated MLPs as well. Default False.
        projections (bool): route the projection groups and the gated MLPs' input side as well. Default False.
        forwards (list): ``(module, forward)`` pairs routed while active (``swapped_forwards``), e.g. the rotary
            tables' lookups (``specdec.state.rope.RopeTables.forwards``). Default none.
    """

    def __init__(self, *models, grouped: bool = True, linear: bool = False, norms: bool = False,
                 rotary: bool = False, mlps: bool = False, projections: bool = False,
                 forwards: list | None = None) -> None:  # fmt: skip
        from specdec.kernels.rms_norm.routing import norm_modules
        from specdec.kernels.rotary.routing import rotary_modules
        from specdec.kernels.silu_mul import mlp_modules
        from specdec.kernels.skinny_linear.routing import linear_modules

        self.linears = linear_modules(*models) if linear else []
        self.norms = norm_modules(*models) if norms else []
        self.rotary = rotary_modules(*models) if rotary else []
        self.mlps = mlp_modules(*models) if mlps or projections else []
        if projections:
            from specdec.kernels.grouped_linear.routing import projection_groups

            self.projections = projection_groups(*models)
        else:
            self.projections = None
        self._projection_routing = None
        self._mlp_routing = None
        self._rotary_routing = None
        self.forwards = list(forwards or ())
        self._forward_routing = None
        self._routing = None
        self._norm_routing = None
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
            from specdec.kernels.skinny_linear.routing import routed

            self._switched = [c for c in self.configs if getattr(c, "_attn_implementation_internal", None) == "sdpa"]
            for config in self._switched:
                config._attn_implementation_internal = NAME
            if self.linears:
                self._routing = routed(self.linears)
                self._routing.__enter__()
            if self.norms:
                from specdec.kernels.rms_norm.routing import routed as routed_norms

                self._norm_routing = routed_norms(self.norms)
                self._norm_routing.__enter__()
            if self.rotary:
                from specdec.kernels.rotary.routing import routed as routed_rotary

                self._rotary_routing = routed_rotary(self.rotary)
                self._rotary_routing.__enter__()
            if self.projections is not None:
                from specdec.kernels.grouped_linear.routing import routed as routed_groups

                self._projection_routing = routed_groups(self.projections, self.mlps)
                self._projection_routing.__enter__()
            elif self.mlps:
                from specdec.kernels.silu_mul import routed as routed_mlps

                self._mlp_routing = routed_mlps(self.mlps)
                self._mlp_routing.__enter__()
            if self.forwards:
                from specdec.state.forwards import swapped_forwards

                self._forward_routing = swapped_forwards(self.forwards)
                self._forward_routing.__enter__()
        self._depth += 1
        return self

    def __exit__(self, *exc) -> None:
        self._depth -= 1
        if self._depth == 0:
            for config in self._switched:
                config._attn_implementation_internal = "sdpa"
            self._switched = []
            if self._routing is not None:
                routing, self._routing = self._routing, None
                routing.__exit__(*exc)
            if self._norm_routing is not None:
                routing, self._norm_routing = self._norm_routing, None
                routing.__exit__(*exc)
            if self._rotary_routing is not None:
                routing, self._rotary_routing = self._rotary_routing, None
                routing.__exit__(*exc)
            if self._mlp_routing is not None:
                routing, self._mlp_routing = self._mlp_routing, None
                routing.__exit__(*exc)
            if self._projection_routing is not None:
                routing, self._projection_routing = self._projection_routing, None
                routing.__exit__(*exc)
            if self._forward_routing is not None:
                routing, self._forward_routing = self._forward_routing, None
                routing.__exit__(*exc)
