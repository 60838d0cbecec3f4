"""Fixed-shape storage and forwards of a ``DFlashDrafter`` for the round (static context K/V).

The context keys/values of the committed tokens live in one preallocated tensor ``[L, 2, B, H_kv, capacity, D]``
(``B`` sequences) at slot = position. The block ``[root, MASK x (S-1)]`` at position ``prefix`` writes its own
keys/values into slots ``prefix .. prefix + S - 1`` of the same tensor (rows no committed token holds yet; the
next ``ingest`` rewrites them with the accepted tokens' context), so each layer attends over one tensor with a mask
that shows the slots below ``prefix + S``: no concatenation, and grouped-query heads share their key/value head
without a copy. Shapes never change, so the forwards can be captured in a CUDA graph. Same maths as
the drafter's training forward (``docs/dflash.md``), checked against an independent dynamic-cache forward in
``tests/drafters/test_dflash_static.py``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from specdec import attention
from specdec.backends import env_default
from specdec.kernels.grouped_linear.routing import gate_up_silu
from specdec.kernels.kv_write import kv_write
from specdec.kernels.rms_norm import add_rms_norm, rms_norm
from specdec.kernels.rotary import fits_triton as rotary_fits
from specdec.kernels.rotary import rotary
from specdec.kernels.rotary.routing import rotary_kernel_for
from specdec.kernels.row_gather import embed
from specdec.kernels.tree_attention import tree_attention
from specdec.state.storage import mask_values
from specdec.target import weights_state
from specdec.types import Accept, Proposal

__all__ = ["DFlashStatic"]

# The drafter's RMSNorms in the round: "auto" (default: ``specdec.kernels.rms_norm``, one Triton launch per
# norm on CUDA, the module's own ops elsewhere), "triton" (always the kernel) or "torch" (the module's own ops,
# about eight kernels per norm on CUDA).
_NORM_IMPL = env_default("dflash_norm")


def _tensors(*values) -> list[torch.Tensor]:
    """The tensors in ``values`` (tensors, None, tuples, lists and dicts of them), in order."""
    out = []
    for value in values:
        if isinstance(value, torch.Tensor):
            out.append(value)
        elif isinstance(value, (tuple, list)):
            out.extend(_tensors(*value))
        elif isinstance(value, dict):
            out.extend(_tensors(*value.values()))
    return out


class DFlashStatic:
    """Static context of one ``DFlashDrafter`` for sequences of up to ``capacity`` tokens.

    The context projection of all layers runs as one matrix product over a stacked copy of the layers' key and
    value weights. In the block forward each layer's ``q_proj`` / ``k_proj`` / ``v_proj`` run as one product, and
    so do ``gate_proj`` / ``up_proj``, over stacked copies too (``packed``: the drafter's attention and MLP
    input weights once more, e.g. 1.26 GB for a 5-layer drafter of the Qwen3-8B shape in bf16); the query and key
    norms of a layer are one launch over the product's head rows. :meth:`sync_weights` refreshes every copy in place
    when the drafter's weights change.

    Args:
        drafter (DFlashDrafter): bound to its target (``validate`` was called).
        capacity (int): context slots per sequence (>= prompt + new tokens + block size).
        batch (int): sequences. Default 1.
        norm_impl (str | None): the RMSNorms: ``"torch"`` (the modules' own ops), ``"auto"`` or ``"triton"``
            (``specdec.kernels.rms_norm``); None = ``SPECDEC_DFLASH_NORM`` (default ``"auto"``: the kernel on CUDA).
    """

    def __init__(self, drafter, capacity: int, batch: int = 1, *, norm_impl: str | None = None) -> None:
        cfg, model = drafter.config, drafter.model
        self.norm_impl = _NORM_IMPL if norm_impl is None else norm_impl
        if self.norm_impl not in ("torch", "auto", "triton"):
            raise ValueError(f"norm_impl={self.norm_impl!r}: choose 'torch', 'auto' or 'triton' (SPECDEC_DFLASH_NORM).")
        device, dtype = model.fc.weight.device, model.fc.weight.dtype
        self.drafter, self.capacity = drafter, capacity
        self.kv = torch.zeros(
            cfg.num_hidden_layers, 2, batch, cfg.num_key_value_heads, capacity, cfg.head_dim, dtype=dtype, device=device
        )
        self.rows = torch.arange(batch, device=device)[:, None]
        self.slots = torch.arange(capacity, device=device)
        self.offsets = torch.arange(cfg.block_size, device=device)
        self.masks = torch.full((cfg.block_size - 1,), cfg.mask_token_id, dtype=torch.long, device=device)
        self.rep = cfg.num_attention_heads // cfg.num_key_value_heads
        # RoPE tables by position (computed as the model does, once).
        cos, sin = model.rope(torch.arange(capacity + cfg.block_size, device=device)[None], dtype)
        # [positions, 2, R]: a row's cos and sin side by side, so that one gather takes both (``_table``)
        self.rope_table = torch.stack((cos[0, 0], sin[0, 0]), dim=1)
        self.cos, self.sin = self.rope_table.unbind(1)  # [positions, R] views
        self.visible = torch.ones((1, 1, 1, 1), dtype=torch.bool, device=device)  # a mask that hides nothing
        self._weight, self._bias, self._k_norm, self.packed = self._stacked()
        self._versions = self._weights_key()

    def _weights_key(self) -> tuple:
        """Where the stacked weights' sources are and how often they were written (``weights_state``)."""
        return weights_state([m for layer in self.drafter.model.layers for m in (layer.self_attn, layer.mlp)])

    @torch.no_grad()
    def _stacked(self) -> tuple:
        """``(context key/value weight, its bias or None, key norms [L, D], packed)``: the context projection of all
        layers stacked, and per layer ``packed[i]`` = ``{"qkv": (weight, bias or None), "qk_norm": [H + H_kv, D]
        (the query norm's weight for each query head, then the key norm's for each key head), "gate_up": weight}``.
        """
        cfg = self.drafter.config
        attn = [layer.self_attn for layer in self.drafter.model.layers]
        weight = torch.cat([a.k_proj.weight for a in attn] + [a.v_proj.weight for a in attn])
        bias = None
        if cfg.attention_bias:
            bias = torch.cat([a.k_proj.bias for a in attn] + [a.v_proj.bias for a in attn])
        k_norm = torch.stack([a.k_norm.weight for a in attn])  # [L, D]
        packed = []
        for layer in self.drafter.model.layers:
            a, mlp = layer.self_attn, layer.mlp
            heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
            packed.append({
                "qkv": (torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]),
                        torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias]) if cfg.attention_bias else None),
                "qk_norm": torch.cat([a.q_norm.weight.expand(heads, -1), a.k_norm.weight.expand(kv_heads, -1)]),
                "gate_up": torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]),
            })  # fmt: skip
        return weight, bias, k_norm, packed

    def sync_weights(self) -> None:
        """Refresh the stacked weights in place (a captured round reads them by address) if the drafter's were
        changed or replaced since they were stacked (outside any graph)."""
        key = self._weights_key()
        if key == self._versions:
            return
        with torch.no_grad():
            for old, new in zip(_tensors(self._weight, self._bias, self._k_norm, self.packed),
                                _tensors(*self._stacked()), strict=True):  # fmt: skip
                old.copy_(new)
        self._versions = key

    def _norm(self, module, x: torch.Tensor) -> torch.Tensor:
        """One of the drafter's ``_RMSNorm`` modules applied to ``x``, by ``norm_impl`` (``"torch"``: the reference,
        the module's own ops bit for bit)."""
        return rms_norm(x, module.weight, module.eps, impl=self.norm_impl)

    def _add_norm(self, module, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(residual + x, module's norm of it)``: a layer's residual add and the norm after it, one launch where
        the norms take the kernel (``add_rms_norm``), else the tensor add and :meth:`_norm`, bit for bit."""
        return add_rms_norm(x, residual, module.weight, module.eps, impl=self.norm_impl)

    def _table(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The rotary ``(cos, sin)`` rows of ``positions`` (``[*P, R]`` each): one gather for both."""
        return self.rope_table[positions].unbind(-2)

    def _rope(self, x: torch.Tensor, positions: torch.Tensor, table: tuple | None = None) -> torch.Tensor:
        """``x [*P, ..., D]`` rotated at ``positions [*P]`` (the position axes first); ``table``: the ``(cos, sin)``
        rows of ``positions``, when the caller already gathered them."""
        shape = positions.shape + (1,) * (x.dim() - positions.dim() - 1) + (-1,)
        cos, sin = table if table is not None else self._table(positions)
        cos, sin = cos.view(shape), sin.view(shape)
        rot = cos.shape[-1]
        x_rot = x[..., :rot]
        half = rot // 2
        rotated = x_rot * cos + torch.cat((-x_rot[..., half:], x_rot[..., :half]), dim=-1) * sin
        return rotated if rot == x.shape[-1] else torch.cat((rotated, x[..., rot:]), dim=-1)

    def _rope_qk(self, q: torch.Tensor | None, k: torch.Tensor, positions: torch.Tensor, table: tuple) -> tuple:
        """Queries ``[B, S, H, D]`` (or None: keys alone) and keys ``[B, S, H_kv, D]`` rotated: one
        ``specdec.kernels.rotary`` launch for both where the target's rotary embedding takes the kernel
        (``Backends.target_rotary``, uncompiled) and the call fits it (bf16; the whole head or, for partial rotary, its
        first dims rotated: the same products and sums, bit for bit), else :meth:`_rope` for each."""
        cos, sin = table
        both = k if q is None else q  # keys alone: the launch rotates them as its queries too
        if (
            not torch.compiler.is_compiling()
            and rotary_kernel_for(k.device)
            and rotary_fits(both.transpose(1, 2), k.transpose(1, 2), cos, sin)
        ):
            q, k = rotary(both.transpose(1, 2), k.transpose(1, 2), cos, sin)
            return q.transpose(1, 2), k.transpose(1, 2)
        return None if q is None else self._rope(q, positions, table), self._rope(k, positions, table)

    def ingest(self, hidden: torch.Tensor, first: torch.Tensor | int) -> None:
        """Project target features ``[B, R, K*H]`` of the tokens at positions ``first[b] .. first[b] + R - 1`` of each
        sequence (``first``: ``[B]`` or an int) into slots.

        All layers at once: one product with the stacked key/value weights, one key norm and one rotation over a
        ``[B, R, L, H_kv, D]`` tensor, one write into the storage.
        """
        model, cfg = self.drafter.model, self.drafter.config
        batch, rows = hidden.shape[:2]
        if isinstance(first, torch.Tensor):  # (an int stays a Python int: no host-to-device copy in a graph)
            first = first.reshape(-1, 1)
        positions = (self.slots[:rows] + first).expand(batch, -1)  # [B, R]
        ctx = self._norm(model.hidden_norm, model.fc(hidden.to(device=self.slots.device, dtype=model.fc.weight.dtype)))
        kv = F.linear(ctx, self._weight, self._bias).view(
            batch, rows, 2, cfg.num_hidden_layers, cfg.num_key_value_heads, -1
        )
        k, v = kv[:, :, 0], kv[:, :, 1]  # [B, R, L, H_kv, D]
        # row (b, r, layer, head) takes its layer's key-norm weight: period = heads
        k = rms_norm(k, self._k_norm, cfg.rms_norm_eps, period=k.shape[3], impl=self.norm_impl)
        table = self._table(positions)  # [B, R, rot] each
        flat = k.reshape(batch, rows, -1, k.shape[-1])  # [B, R, L * H_kv, D]: every layer's heads at one position
        _, rotated = self._rope_qk(None, flat, positions, table)
        k = rotated.view(k.shape)
        src = torch.stack((k, v), dim=3).to(self.kv.dtype)  # [B, R, L, 2, H_kv, D]
        if batch == 1:
            self.kv.index_copy_(4, positions[0], src[0].permute(1, 2, 3, 0, 4)[:, :, None])
        else:
            self.kv[:, :, self.rows, :, positions] = src

    def _bias_mask(self, prefix: torch.Tensor, window: int | None, dtype, span: int, stacked: bool = True):
        """Additive mask over the first ``span`` storage slots: ``[B, 1, 1, span]``, or ``[B, 1, rep*S, span]`` when
        rows differ (causal or sliding-window layers; ``S`` = block size). ``stacked=False`` (the attention
        kernel's layout): ``[B, 1, S, span]``, one row per block row for all heads."""
        cfg = self.drafter.config
        slots = self.slots[:span]
        keep = (slots < prefix[:, None] + cfg.block_size)[:, None]  # [B, 1, span]: the context and the block
        if cfg.causal or window:
            rel = (prefix[:, None] + self.offsets)[:, :, None] - slots  # [B, S, span]
            keep = keep & (rel >= 0) if cfg.causal else keep.expand(-1, rel.shape[1], -1)
            if window:
                keep = keep & (rel < window)
            if stacked:
                keep = keep.repeat(1, self.rep, 1)  # row r*S + q: query q of the r-th head sharing a key/value head
        elif not stacked:
            keep = keep.expand(-1, self.offsets.shape[0], -1)  # a view: every block row reads the one row
        return torch.where(keep, *mask_values(dtype, keep.device))[:, None]  # one kernel

    def logq(self, root: torch.Tensor, prefix: torch.Tensor, depth: int, span: int | None = None) -> torch.Tensor:
        """Per-depth log-probabilities ``[B, depth, V]`` (fp32) of each block ``[root, MASK x (S-1)]`` at ``prefix``.

        Args:
            root (torch.Tensor): ``[B]`` int64, each sequence's last committed token (not yet in the context).
            prefix (torch.Tensor): ``[B]`` int64, its position (= number of context rows held).
            depth (int): rows wanted (block slots 1..depth).
            span (int | None): slots attended over, ``[0, span)``, at least ``prefix + S``; None = the capacity.
        """
        span = span or self.capacity
        drafter, model, cfg = self.drafter, self.drafter.model, self.drafter.config
        size, heads, kv_heads, head_dim = cfg.block_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        batch = root.shape[0]
        positions = prefix[:, None] + self.offsets  # [B, S]
        block = torch.cat([root[:, None], self.masks.expand(batch, -1)], dim=1)
        x = embed(drafter._embed, block).to(model.fc.weight.dtype)  # [B, S, H]: one row_gather launch on CUDA
        biases: dict = {}
        # the split-K/V kernel where the target's attention would take it (one mask row per block row, the
        # sequence's length as data), else SDPA on the stacked rows
        kernel = attention.triton_kernel_for(x.device, torch.compiler.is_compiling(), x.dtype, head_dim)
        lengths = prefix + size if kernel else None  # (the kernel reads int64 lengths as they are)
        table = self._table(positions)  # [B, S, R] each: the block's rotary rows, for every layer
        pending = None  # the last MLP's output, added to x with the next norm (one launch on CUDA: add_rms_norm)
        for i, (layer, window) in enumerate(zip(model.layers, cfg.sliding_windows, strict=True)):
            if window not in biases and kernel and not cfg.causal and not window:
                # every block row sees the context and the block, i.e. the slots below ``lengths``: the kernel's flat
                # prefix covers them all, reading one mask value per row (a view that hides nothing)
                biases[window] = (self.visible.expand(1, 1, size, span), lengths)
            elif window not in biases:
                biases[window] = (self._bias_mask(prefix, window, x.dtype, span, stacked=not kernel), None)
            mask, flat = biases[window]
            if pending is None:
                h = self._norm(layer.input_layernorm, x)
            else:
                x, h = self._add_norm(layer.input_layernorm, pending, x)
            attn, packed = layer.self_attn, self.packed[i]
            # q / k / v in one product; the query and key heads' norms in one launch over its head rows
            qkv = F.linear(h, *packed["qkv"]).view(batch, size, heads + 2 * kv_heads, head_dim)
            qk = rms_norm(qkv[:, :, : heads + kv_heads], packed["qk_norm"], attn.q_norm.eps, impl=self.norm_impl)
            q, k = self._rope_qk(qk[:, :, :heads], qk[:, :, heads:], positions, table)
            v = qkv[:, :, heads + kv_heads :]
            # the block's keys / values at slots prefix .. prefix + S - 1: one launch on CUDA (kv_write)
            kv_write(self.kv[i, 0], self.kv[i, 1], positions, k.transpose(1, 2), v.transpose(1, 2))
            keys, values = self.kv[i, 0, :, :, :span], self.kv[i, 1, :, :, :span]
            if kernel:  # each sequence reads its context and block once, nothing of the storage past them
                impl = attention.kernel_impl()
                scale = head_dim**-0.5
                out = tree_attention(q.transpose(1, 2), keys, values, mask, scale, lengths, impl=impl, flat=flat)
                out = out.reshape(batch, size, -1)
            else:
                # Heads g*rep .. g*rep+rep-1 share key/value head g: stack them along the query axis.
                q = q.transpose(1, 2).reshape(batch, kv_heads, self.rep * size, head_dim)
                out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=head_dim**-0.5)
                out = out.reshape(batch, heads, size, head_dim).transpose(1, 2).reshape(batch, size, -1)
            x, h = self._add_norm(layer.post_attention_layernorm, attn.o_proj(out), x)
            mlp = layer.mlp
            # gate, up and SiLU·mul in one launch on CUDA (gated_linear), else one product and silu_mul
            pending = mlp.down_proj(gate_up_silu(h, packed["gate_up"]))
        _, last = self._add_norm(model.norm, pending, x)
        return drafter.block_logq(last, depth)

    # -- the drafter's part of the round (``specdec.drafters.base.DraftState``) ---------------------------------
    def refresh(self) -> None:
        """Before a call that reuses this storage: pick up changed weights."""
        self.sync_weights()

    def prefill(self, input_ids: torch.Tensor, hidden: torch.Tensor | None) -> None:
        """The prompt's tapped target features ``[1, T, K*H]`` into context slots ``0 .. T-1``."""
        self.ingest(hidden, 0)

    def resume(self, input_ids: torch.Tensor, hidden: torch.Tensor | None, start: int) -> None:
        """A continued prompt: the tapped features ``[1, n, K*H]`` of its tokens from position ``start`` on (the
        slots before hold the earlier call's context)."""
        self.ingest(hidden, start)

    def propose(self, root: torch.Tensor, prefix: torch.Tensor, depth: int, span: int) -> Proposal:
        """One block forward for the batch: ``logq [B, depth, V]``."""
        return Proposal(logq=self.logq(root, prefix, depth, span))

    def commit(self, accept: Accept, hidden: torch.Tensor | None, prefix: torch.Tensor) -> None:
        """The accepted path's tapped features into the context slots from each row's old root position."""
        path = accept.path[..., None].expand(-1, -1, hidden.shape[-1])
        self.ingest(hidden.gather(1, path), prefix)
