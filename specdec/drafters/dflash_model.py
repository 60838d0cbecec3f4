"""DFlash drafter network and config: Qwen3-style layers with KV injection of the target's features.

``DFlashConfig`` holds the z-lab ``config.json`` fields; ``DFlashDraftModel`` is the network (no embedding and
no LM head of its own). The drafter protocol around it lives in ``dflash.py``; maths in ``docs/dflash.md``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["DFlashConfig", "DFlashDraftModel", "default_target_layer_ids"]

logger = logging.getLogger(__name__)


def default_target_layer_ids(num_target_layers: int, num_taps: int) -> tuple[int, ...]:
    """The z-lab default taps: ``[N // 2]`` for one tap, else ``round(1 + i (N - 4) / (K - 1))``, i < K."""
    if num_taps == 1:
        return (num_target_layers // 2,)
    return tuple(round(1 + i * (num_target_layers - 4) / (num_taps - 1)) for i in range(num_taps))


@dataclass(frozen=True, kw_only=True)
class DFlashConfig:
    """Shape and conditioning of a DFlash drafter (the parsed ``config.json``).

    Args:
        hidden_size (int): drafter width H; equals the target's embedding width (the block is embedded by it).
        intermediate_size (int): SwiGLU width I.
        num_hidden_layers (int): drafter layers.
        num_attention_heads (int), num_key_value_heads (int), head_dim (int): attention shape (GQA).
        block_size (int): B, the block length (root + B-1 masks); drafts at most B-1 tokens per forward.
        mask_token_id (int): id of the mask token, a row of the target's embedding.
        target_layer_ids (tuple[int, ...]): target layers tapped (``hidden_states[i + 1]``), in order.
        target_hidden_size (int | None): target width if it differs from ``hidden_size``; default H.
        num_target_layers (int | None): depth of the target the drafter was made for (informational).
        rms_norm_eps (float): RMSNorm epsilon. Default 1e-6.
        rope_theta (float): RoPE base. Default 10000.
        rope_scaling (dict | None): HF rope parameters for a non-default rope type (yarn, linear, ...).
        partial_rotary_factor (float): share of head_dim that is rotated. Default 1.0.
        max_position_embeddings (int): Default 40960.
        attention_bias (bool): bias on q/k/v/o projections. Default False.
        sliding_windows (tuple[int | None, ...]): per layer, window of visible positions or None (full).
        causal (bool): block queries see only earlier block slots (some later checkpoints). Default False.
        vocab_size (int | None): target vocabulary (informational; written to config.json).
        extra (dict): other config.json keys, written back unchanged.
    """

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    block_size: int
    mask_token_id: int
    target_layer_ids: tuple[int, ...]
    target_hidden_size: int | None = None
    num_target_layers: int | None = None
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    partial_rotary_factor: float = 1.0
    max_position_embeddings: int = 40960
    attention_bias: bool = False
    sliding_windows: tuple[int | None, ...] = ()
    causal: bool = False
    vocab_size: int | None = None
    extra: dict = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if self.block_size < 2:
            raise ValueError(f"block_size={self.block_size}: a DFlash block needs the root plus >= 1 mask slot.")
        if not self.target_layer_ids:
            raise ValueError("target_layer_ids is empty: the drafter needs at least one tapped target layer.")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}."
            )
        windows = tuple(self.sliding_windows) or (None,) * self.num_hidden_layers
        if len(windows) != self.num_hidden_layers:
            raise ValueError(
                f"layer_types/sliding_windows has {len(windows)} entries for num_hidden_layers="
                f"{self.num_hidden_layers}: the config is inconsistent."
            )
        object.__setattr__(self, "sliding_windows", windows)
        object.__setattr__(self, "target_layer_ids", tuple(int(i) for i in self.target_layer_ids))

    @property
    def context_size(self) -> int:
        """Width of one tapped target layer (input width of ``fc`` is ``len(target_layer_ids)`` times it)."""
        return self.target_hidden_size or self.hidden_size

    @classmethod
    def from_dict(cls, raw: dict, **overrides) -> DFlashConfig:
        """Parse a z-lab ``config.json`` (2026-04 or June-2026 layout, aliases of ``docs/dflash.md``)."""
        dflash = raw.get("dflash_config") or {}
        for key in _UNSUPPORTED_KEYS:
            if raw.get(key) or dflash.get(key):
                raise NotImplementedError(
                    f"config.json sets {key!r}, a variant this drafter does not implement; refusing to load it "
                    "rather than drafting with different maths."
                )
        if raw.get("draft_vocab_size") not in (None, raw.get("vocab_size")):
            raise NotImplementedError("reduced draft vocabularies (draft_vocab_size < vocab_size) are not supported.")
        block_size = raw.get("block_size", dflash.get("block_size"))
        if block_size is None and "block_size" not in overrides:
            raise ValueError("config.json has no block_size (top level or dflash_config.block_size); pass block_size=.")
        num_layers = raw["num_hidden_layers"]
        ids = dflash.get("target_layer_ids", raw.get("target_layer_ids"))
        if ids is None:
            if raw.get("num_target_layers") is None:
                raise ValueError("config.json has neither target_layer_ids nor num_target_layers to derive them.")
            ids = default_target_layer_ids(raw["num_target_layers"], num_layers)
        mask_id = dflash.get("mask_token_id", raw.get("mask_token_id"))
        if mask_id is None and "mask_token_id" not in overrides:
            raise ValueError("config.json has no mask_token_id; pass mask_token_id= (the target's mask token id).")
        rope = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
        theta = raw.get("rope_theta", rope.get("rope_theta", 10000.0))
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        scaling = {k: v for k, v in rope.items() if k != "rope_theta"} if rope_type != "default" else None
        partial = raw.get("partial_rotary_factor", rope.get("partial_rotary_factor", 1.0))
        head_dim = raw.get("head_dim") or raw["hidden_size"] // raw["num_attention_heads"]
        kwargs = dict(
            hidden_size=raw["hidden_size"],
            intermediate_size=raw["intermediate_size"],
            num_hidden_layers=num_layers,
            num_attention_heads=raw["num_attention_heads"],
            num_key_value_heads=raw.get("num_key_value_heads") or raw["num_attention_heads"],
            head_dim=head_dim,
            block_size=block_size,
            mask_token_id=mask_id,
            target_layer_ids=tuple(ids),
            target_hidden_size=raw.get("target_hidden_size"),
            num_target_layers=raw.get("num_target_layers"),
            rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
            rope_theta=float(theta),
            rope_scaling=scaling,
            partial_rotary_factor=float(partial),
            max_position_embeddings=raw.get("max_position_embeddings", 40960),
            attention_bias=bool(raw.get("attention_bias", False)),
            sliding_windows=_sliding_windows(raw, num_layers),
            causal=bool(dflash.get("causal", raw.get("causal", False))),
            vocab_size=raw.get("vocab_size"),
            extra={k: v for k, v in raw.items() if k not in _KNOWN_KEYS},
        )
        kwargs.update(overrides)
        return cls(**kwargs)

    def to_dict(self) -> dict:
        """The z-lab ``config.json`` (2026-04 layout: ``block_size`` at the top level)."""
        windows = self.sliding_windows
        dflash = {"mask_token_id": self.mask_token_id, "target_layer_ids": list(self.target_layer_ids)}
        if self.causal:
            dflash["causal"] = True
        raw = {
            "architectures": ["DFlashDraftModel"],
            "model_type": "qwen3",
            "block_size": self.block_size,
            "num_target_layers": self.num_target_layers,
            "dflash_config": dflash,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling,
            "max_position_embeddings": self.max_position_embeddings,
            "vocab_size": self.vocab_size,
            "layer_types": ["sliding_attention" if w else "full_attention" for w in windows],
            "max_window_layers": self.num_hidden_layers,
            "use_sliding_window": any(windows),
            "sliding_window": next((w for w in windows if w), None),
            "attention_bias": self.attention_bias,
            "attention_dropout": 0.0,
            "tie_word_embeddings": False,
        }
        if self.partial_rotary_factor != 1.0:
            raw["partial_rotary_factor"] = self.partial_rotary_factor
        if self.target_hidden_size not in (None, self.hidden_size):
            raw["target_hidden_size"] = self.target_hidden_size
        return {**self.extra, **raw}


_UNSUPPORTED_KEYS = ("attention_sink_bias", "attention_value_scale", "d2t")
# fmt: off
_KNOWN_KEYS = {
    "architectures", "model_type", "auto_map", "block_size", "num_target_layers", "dflash_config",
    "target_layer_ids", "mask_token_id", "hidden_size", "intermediate_size", "num_hidden_layers",
    "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_act", "rms_norm_eps", "rope_theta",
    "rope_scaling", "rope_parameters", "partial_rotary_factor", "max_position_embeddings", "vocab_size",
    "layer_types", "max_window_layers", "use_sliding_window", "sliding_window", "use_swa", "swa_window_size",
    "attention_bias", "attention_dropout", "tie_word_embeddings", "dtype", "torch_dtype", "target_hidden_size",
    "causal",
}
# fmt: on


def _sliding_windows(raw: dict, num_layers: int) -> tuple[int | None, ...]:
    window = raw.get("sliding_window") or raw.get("swa_window_size")
    types = raw.get("layer_types")
    if types:
        return tuple(window if t == "sliding_attention" else None for t in types)
    if window and (raw.get("use_sliding_window") or raw.get("use_swa")):
        return (window,) * num_layers
    return (None,) * num_layers


class _RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x [B, H, L, D]``, ``cos/sin [B, 1, L, R]`` with R <= D rotated dims (the rest pass through)."""
    rot = cos.shape[-1]
    if rot == x.shape[-1]:
        return x * cos + _rotate_half(x) * sin
    x_rot, x_pass = x[..., :rot], x[..., rot:]
    return torch.cat((x_rot * cos + _rotate_half(x_rot) * sin, x_pass), dim=-1)


class DFlashAttention(nn.Module):
    """GQA attention whose keys/values are ``[context ; block]``; queries come from the block only."""

    def __init__(self, cfg: DFlashConfig) -> None:
        super().__init__()
        h, d, bias = cfg.hidden_size, cfg.head_dim, cfg.attention_bias
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, d
        self.q_proj = nn.Linear(h, self.num_heads * d, bias=bias)
        self.k_proj = nn.Linear(h, self.num_kv_heads * d, bias=bias)
        self.v_proj = nn.Linear(h, self.num_kv_heads * d, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * d, h, bias=bias)
        self.q_norm = _RMSNorm(d, cfg.rms_norm_eps)
        self.k_norm = _RMSNorm(d, cfg.rms_norm_eps)

    def key_values(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``x [B, L, H]`` -> rotated keys and values, each ``[B, H_kv, L, D]``."""
        b, n, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(b, n, self.num_kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(b, n, self.num_kv_heads, self.head_dim).transpose(1, 2)
        return _apply_rope(k, cos, sin), v

    def forward(self, x, cos, sin, ctx_k, ctx_v, bias):
        b, n, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, n, self.num_heads, self.head_dim)).transpose(1, 2)
        q = _apply_rope(q, cos, sin)
        k, v = self.key_values(x, cos, sin)
        if ctx_k is not None:
            k, v = torch.cat([ctx_k.to(k.dtype), k], dim=2), torch.cat([ctx_v.to(v.dtype), v], dim=2)
        rep = self.num_heads // self.num_kv_heads
        if rep > 1:
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=self.head_dim**-0.5)
        return self.o_proj(out.transpose(1, 2).reshape(b, n, -1))


class DFlashMLP(nn.Module):
    def __init__(self, cfg: DFlashConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DFlashDecoderLayer(nn.Module):
    def __init__(self, cfg: DFlashConfig) -> None:
        super().__init__()
        self.input_layernorm = _RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = DFlashAttention(cfg)
        self.post_attention_layernorm = _RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = DFlashMLP(cfg)

    def forward(self, x, cos, sin, ctx_k, ctx_v, bias):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, ctx_k, ctx_v, bias)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashDraftModel(nn.Module):
    """The drafter's own weights (z-lab tensor names): ``fc``, ``hidden_norm``, ``layers.*``, ``norm``.

    ``embed_tokens``/``lm_head`` exist only when a checkpoint ships its own; otherwise the target's are used.
    """

    def __init__(self, cfg: DFlashConfig) -> None:
        super().__init__()
        self.config = cfg
        self.fc = nn.Linear(len(cfg.target_layer_ids) * cfg.context_size, cfg.hidden_size, bias=False)
        self.hidden_norm = _RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.layers = nn.ModuleList(DFlashDecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = _RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        # Kept out of the buffers so that casting the module to bf16 never rounds the frequencies.
        self._inv_freq, self.rope_scale = _rope_inv_freq(cfg)
        self._inv_freq_on: dict[torch.device, torch.Tensor] = {}

    def rope(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """``positions [B, L]`` -> ``cos, sin [B, 1, L, R]`` in ``dtype`` (computed in fp32)."""
        inv_freq = self._inv_freq_on.get(positions.device)
        if inv_freq is None:
            inv_freq = self._inv_freq_on.setdefault(positions.device, self._inv_freq.to(positions.device))
        freqs = positions[..., None].float() * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * self.rope_scale).to(dtype)[:, None], (emb.sin() * self.rope_scale).to(dtype)[:, None]

    def project_context(self, target_hidden: torch.Tensor, positions: torch.Tensor) -> list[tuple]:
        """Context keys/values of every layer for tapped target features.

        Args:
            target_hidden (torch.Tensor): ``[B, C, K*H_t]`` concatenated target layer outputs.
            positions (torch.Tensor): ``[B, C]`` absolute positions of those tokens.

        Returns:
            list[tuple[Tensor, Tensor]]: per layer ``(k, v)``, each ``[B, H_kv, C, D]`` (keys rotated).
        """
        ctx = self.hidden_norm(self.fc(target_hidden.to(self.fc.weight.dtype)))
        cos, sin = self.rope(positions, ctx.dtype)
        return [layer.self_attn.key_values(ctx, cos, sin) for layer in self.layers]

    def forward(
        self,
        block_embeds: torch.Tensor,
        positions: torch.Tensor,
        context_kv: list[tuple],
        context_positions: torch.Tensor,
        allowed: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Run the block through the layers.

        Args:
            block_embeds (torch.Tensor): ``[B, Q, H]`` target embeddings of the block tokens.
            positions (torch.Tensor): ``[B, Q]`` absolute positions of the block tokens.
            context_kv (list): per layer ``(k, v)`` ``[B, H_kv, C, D]`` from :meth:`project_context`.
            context_positions (torch.Tensor): ``[B, C]`` positions of the context keys.
            allowed (torch.Tensor | None): ``[B, Q, C + Q]`` bool, True where a query may see a key (training
                packs many blocks into one row); None = every query sees every key.

        Returns:
            torch.Tensor: ``[B, Q, H]`` final-normed hidden states (apply the target's LM head).
        """
        x = block_embeds.to(self.fc.weight.dtype)
        cos, sin = self.rope(positions, x.dtype)
        key_pos = torch.cat([context_positions, positions], dim=1)
        biases: dict[int | None, torch.Tensor | None] = {}
        for layer, window, (ctx_k, ctx_v) in zip(self.layers, self.config.sliding_windows, context_kv, strict=True):
            if window not in biases:
                biases[window] = _attention_bias(allowed, positions, key_pos, window, self.config.causal, x)
            x = layer(x, cos, sin, ctx_k, ctx_v, biases[window])
        return self.norm(x)


def _attention_bias(allowed, q_pos, k_pos, window, causal, x) -> torch.Tensor | None:
    """Additive float mask ``[B, 1, Q, K]`` (0 = visible, dtype min = hidden), or None when all is visible."""
    if causal or window:
        rel = q_pos[:, :, None] - k_pos[:, None, :]  # [B, Q, K]
        keep = rel >= 0 if causal else torch.ones_like(rel, dtype=torch.bool)
        if window:
            keep = keep & (rel < window)
        allowed = keep if allowed is None else allowed & keep
    if allowed is None:
        return None
    bias = torch.zeros(allowed.shape, dtype=x.dtype, device=x.device)
    return bias.masked_fill_(~allowed, torch.finfo(x.dtype).min)[:, None]


def _rope_inv_freq(cfg: DFlashConfig) -> tuple[torch.Tensor, float]:
    rot = int(cfg.head_dim * cfg.partial_rotary_factor)
    if cfg.rope_scaling is None:
        exponent = torch.arange(0, rot, 2, dtype=torch.int64, device="cpu").float() / rot
        return 1.0 / (cfg.rope_theta**exponent), 1.0
    from transformers import Qwen3Config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    params = {**cfg.rope_scaling, "rope_theta": cfg.rope_theta, "partial_rotary_factor": cfg.partial_rotary_factor}
    params.setdefault("rope_type", params.pop("type", "default"))
    hf_cfg = Qwen3Config(
        hidden_size=cfg.hidden_size,
        num_attention_heads=cfg.num_attention_heads,
        head_dim=cfg.head_dim,
        max_position_embeddings=cfg.max_position_embeddings,
        rope_parameters=params,
    )
    inv_freq, scale = ROPE_INIT_FUNCTIONS[params["rope_type"]](hf_cfg, torch.device("cpu"))
    return inv_freq.float(), float(scale)
