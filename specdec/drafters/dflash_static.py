"""Fixed-shape storage and forwards of a ``DFlashDrafter`` for the round (static context K/V).

The context keys/values of the committed tokens live in one preallocated tensor ``[L, 2, 1, H_kv, capacity, D]``
at slot = position. The block ``[root, MASK x (B-1)]`` at position ``prefix`` writes its own keys/values into
slots ``prefix .. prefix + B - 1`` of the same tensor (rows no committed token holds yet; the next ``ingest``
rewrites them with the accepted tokens' context), so each layer attends over one tensor with a mask that shows
the slots below ``prefix + B``: no concatenation, and grouped-query heads share their key/value head without a
copy. Shapes never change, so the forwards can be captured in a CUDA graph. Same maths as
the drafter's training forward (``docs/dflash.md``), checked against an independent dynamic-cache forward in
``tests/drafters/test_dflash_static.py``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from specdec.backends import env_default
from specdec.kernels.rms_norm import rms_norm
from specdec.types import Accept, Proposal

__all__ = ["DFlashStatic"]

# The drafter's RMSNorms in the round: "auto" (default: ``specdec.kernels.rms_norm``, one Triton launch per
# norm on CUDA, the module's own ops elsewhere), "triton" (always the kernel) or "torch" (the module's own ops,
# about eight kernels per norm on CUDA).
_NORM_IMPL = env_default("dflash_norm")


class DFlashStatic:
    """Static context of one ``DFlashDrafter`` for sequences of up to ``capacity`` tokens.

    The context projection of all layers runs as one matrix product over a stacked copy of the layers' key and
    value weights; :meth:`sync_weights` refreshes that copy in place when the drafter's weights change.

    Args:
        drafter (DFlashDrafter): bound to its target (``validate`` was called).
        capacity (int): context slots (>= prompt + new tokens + block size).
        norm_impl (str | None): the RMSNorms: ``"torch"`` (the modules' own ops), ``"auto"`` or ``"triton"``
            (``specdec.kernels.rms_norm``); None = ``SPECDEC_DFLASH_NORM`` (default ``"auto"``: the kernel on CUDA).
    """

    def __init__(self, drafter, capacity: int, *, norm_impl: str | None = None) -> None:
        cfg, model = drafter.config, drafter.model
        self.norm_impl = _NORM_IMPL if norm_impl is None else norm_impl
        if self.norm_impl not in ("torch", "auto", "triton"):
            raise ValueError(f"norm_impl={self.norm_impl!r}: choose 'torch', 'auto' or 'triton' (SPECDEC_DFLASH_NORM).")
        device, dtype = model.fc.weight.device, model.fc.weight.dtype
        self.drafter, self.capacity = drafter, capacity
        self.kv = torch.zeros(
            cfg.num_hidden_layers, 2, 1, cfg.num_key_value_heads, capacity, cfg.head_dim, dtype=dtype, device=device
        )
        self.slots = torch.arange(capacity, device=device)
        self.offsets = torch.arange(cfg.block_size, device=device)
        self.masks = torch.full((cfg.block_size - 1,), cfg.mask_token_id, dtype=torch.long, device=device)
        self.rep = cfg.num_attention_heads // cfg.num_key_value_heads
        # RoPE tables by position (computed as the model does, once).
        cos, sin = model.rope(torch.arange(capacity + cfg.block_size, device=device)[None], dtype)
        self.cos, self.sin = cos[0, 0], sin[0, 0]  # [positions, R]
        attn = [layer.self_attn for layer in model.layers]
        self._params = [p for a in attn for m in (a.k_proj, a.v_proj, a.k_norm) for p in m.parameters()]
        self._weight = torch.cat([a.k_proj.weight for a in attn] + [a.v_proj.weight for a in attn])
        self._bias = None
        if cfg.attention_bias:
            self._bias = torch.cat([a.k_proj.bias for a in attn] + [a.v_proj.bias for a in attn])
        self._k_norm = torch.stack([a.k_norm.weight for a in attn])  # [L, D]
        self._versions = self._weight_versions()

    def _weight_versions(self) -> tuple:
        return tuple((id(p), p._version) for p in self._params)

    def sync_weights(self) -> None:
        """Refresh the stacked key/value weights if the drafter's were changed in place (outside any graph)."""
        if self._weight_versions() == self._versions:
            return
        attn = [layer.self_attn for layer in self.drafter.model.layers]
        with torch.no_grad():
            self._weight.copy_(torch.cat([a.k_proj.weight for a in attn] + [a.v_proj.weight for a in attn]))
            if self._bias is not None:
                self._bias.copy_(torch.cat([a.k_proj.bias for a in attn] + [a.v_proj.bias for a in attn]))
            self._k_norm.copy_(torch.stack([a.k_norm.weight for a in attn]))
        self._versions = self._weight_versions()

    def _norm(self, module, x: torch.Tensor) -> torch.Tensor:
        """One of the drafter's ``_RMSNorm`` modules applied to ``x``, by ``norm_impl`` (``"torch"``: the reference,
        the module's own ops bit for bit)."""
        return rms_norm(x, module.weight, module.eps, impl=self.norm_impl)

    def _rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """``x [N, ..., D]`` rotated at ``positions [N]`` (the position axis first)."""
        shape = (positions.shape[0],) + (1,) * (x.dim() - 2) + (-1,)
        cos, sin = self.cos[positions].view(shape), self.sin[positions].view(shape)
        rot = cos.shape[-1]
        x_rot = x[..., :rot]
        half = rot // 2
        rotated = x_rot * cos + torch.cat((-x_rot[..., half:], x_rot[..., :half]), dim=-1) * sin
        return rotated if rot == x.shape[-1] else torch.cat((rotated, x[..., rot:]), dim=-1)

    def ingest(self, hidden: torch.Tensor, first: torch.Tensor | int) -> None:
        """Project target features ``[1, R, K*H]`` of the tokens at positions ``first .. first + R - 1`` into slots.

        All layers at once: one product with the stacked key/value weights, one key norm and one rotation over a
        ``[R, L, H_kv, D]`` tensor, one ``index_copy_`` into the storage.
        """
        model, cfg = self.drafter.model, self.drafter.config
        rows = hidden.shape[1]
        positions = torch.arange(rows, device=self.slots.device) + first
        ctx = self._norm(
            model.hidden_norm, model.fc(hidden[0].to(device=self.slots.device, dtype=model.fc.weight.dtype))
        )
        kv = F.linear(ctx, self._weight, self._bias).view(rows, 2, cfg.num_hidden_layers, cfg.num_key_value_heads, -1)
        k, v = kv[:, 0], kv[:, 1]  # [R, L, H_kv, D]
        # row (r, layer, head) takes its layer's key-norm weight: period = heads
        k = rms_norm(k, self._k_norm, cfg.rms_norm_eps, period=k.shape[2], impl=self.norm_impl)
        k = self._rope(k, positions)
        src = torch.stack((k, v)).permute(2, 0, 3, 1, 4)  # [L, 2, H_kv, R, D]
        self.kv.index_copy_(4, positions, src[:, :, None].to(self.kv.dtype))

    def _bias_mask(self, prefix: torch.Tensor, window: int | None, dtype, span: int) -> torch.Tensor:
        """Additive mask over the first ``span`` storage slots: ``[1, 1, 1, span]``, or ``[1, 1, rep*B, span]`` when
        rows differ (causal or sliding-window layers)."""
        cfg = self.drafter.config
        slots = self.slots[:span]
        keep = (slots < prefix + cfg.block_size)[None]  # [1, span]: the context and the block
        if cfg.causal or window:
            rel = (prefix + self.offsets)[:, None] - slots[None]  # [B, span]
            keep = keep & (rel >= 0) if cfg.causal else keep.expand(rel.shape[0], -1)
            if window:
                keep = keep & (rel < window)
            keep = keep.repeat(self.rep, 1)  # row r*B + q: query q of the r-th head sharing a key/value head
        bias = torch.zeros(keep.shape, dtype=dtype, device=keep.device)
        return bias.masked_fill_(~keep, torch.finfo(dtype).min)[None, None]

    def logq(self, root: torch.Tensor, prefix: torch.Tensor, depth: int, span: int | None = None) -> torch.Tensor:
        """Per-depth log-probabilities ``[depth, V]`` (fp32) of the block ``[root, MASK x (B-1)]`` at ``prefix``.

        Args:
            root (torch.Tensor): ``[1]`` int64, the last committed token (not yet in the context).
            prefix (torch.Tensor): 0-d int64, its position (= number of context rows held).
            depth (int): rows wanted (block slots 1..depth).
            span (int | None): slots attended over, ``[0, span)``, at least ``prefix + B``; None = the capacity.
        """
        span = span or self.capacity
        drafter, model, cfg = self.drafter, self.drafter.model, self.drafter.config
        size, heads, kv_heads, head_dim = cfg.block_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        positions = prefix + self.offsets  # [B]
        x = drafter._embed(torch.cat([root.view(1), self.masks])).to(model.fc.weight.dtype)  # [B, H]
        biases: dict = {}
        for i, (layer, window) in enumerate(zip(model.layers, cfg.sliding_windows, strict=True)):
            if window not in biases:
                biases[window] = self._bias_mask(prefix, window, x.dtype, span)
            attn, h = layer.self_attn, self._norm(layer.input_layernorm, x)
            q = self._rope(self._norm(attn.q_norm, attn.q_proj(h).view(size, heads, head_dim)), positions)
            k = self._rope(self._norm(attn.k_norm, attn.k_proj(h).view(size, kv_heads, head_dim)), positions)
            v = attn.v_proj(h).view(size, kv_heads, head_dim)
            self.kv[i].index_copy_(3, positions, torch.stack((k, v)).transpose(1, 2)[:, None].to(self.kv.dtype))
            # Heads g*rep .. g*rep+rep-1 share key/value head g: stack them along the query axis.
            q = q.transpose(0, 1).reshape(1, kv_heads, self.rep * size, head_dim)
            keys, values = self.kv[i, 0, :, :, :span], self.kv[i, 1, :, :, :span]
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=biases[window], scale=head_dim**-0.5)
            x = x + attn.o_proj(out.reshape(heads, size, head_dim).transpose(0, 1).reshape(size, -1))
            x = x + layer.mlp(self._norm(layer.post_attention_layernorm, x))
        return drafter.block_logq(self._norm(model.norm, x)[None], depth)

    # -- the drafter's part of the round (``specdec.drafters.base.DraftState``) ---------------------------------
    def refresh(self) -> None:
        """Before a call that reuses this storage: pick up changed weights."""
        self.sync_weights()

    def prefill(self, input_ids: torch.Tensor, hidden: torch.Tensor | None) -> None:
        """The prompt's tapped target features ``[1, T, K*H]`` into context slots ``0 .. T-1``."""
        self.ingest(hidden, 0)

    def propose(self, root: torch.Tensor, prefix: torch.Tensor, depth: int, span: int) -> Proposal:
        """One block forward per row: ``logq [B, depth, V]``."""
        rows = [self.logq(r.view(1), p, depth, span) for r, p in zip(root, prefix, strict=True)]
        return Proposal(logq=torch.stack(rows))

    def commit(self, accept: Accept, hidden: torch.Tensor | None, prefix: torch.Tensor) -> None:
        """The accepted path's tapped features into the context slots from each row's old root position."""
        self.ingest(hidden.index_select(1, accept.path[0]), prefix[0])
