"""EAGLE-3 draft network and config: one Llama-style decoder layer over concat(token embedding, fused hidden).

``Eagle3Config`` parses the three published ``config.json`` layouts (``docs/eagle3.md``); ``Eagle3Model`` is the
network: ``fc`` fuses the concatenated target states (``K * H_t -> H``), the decoder layer's attention reads
``concat(input_layernorm(embed), hidden_norm(hidden))`` (width ``2H``) for queries, keys and values, then the MLP,
the final norm and the draft-vocabulary ``lm_head``. ``d2t`` maps draft ids to target ids (``t = d + d2t[d]``);
``t2d`` marks the target ids in the draft vocabulary. The norms, rotary embedding and MLP are HF Llama modules.
The drafter protocol around it lives in ``eagle3.py``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import (
    LlamaMLP,
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
    repeat_kv,
)

from specdec.kernels.grouped_linear.routing import gate_up_silu
from specdec.kernels.tree_conv import activation_kind

__all__ = ["Eagle3Config", "Eagle3Model", "fused_layers"]

LAYOUTS = ("official", "specforge", "speculators")


def _module_norm(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """An RMSNorm module applied as itself (HF's ops)."""
    return module(x)


def fused_layers(ids, num_target_layers: int) -> tuple[int, ...]:
    """The target states an EAGLE-3 head fuses, as indices of HF's ``hidden_states`` (0 = the embedding output,
    ``i`` = the output of decoder layer ``i - 1``).

    ``ids`` None: ``[2, N // 2, N - 3]``. Ids whose first entry is 1 count layer outputs (``[1, N//2 - 1, N - 4]``
    is the same default): each is shifted by one. Other ids are ``hidden_states`` indices already.
    """
    n = num_target_layers
    if ids is None:
        return (2, n // 2, n - 3)
    ids = tuple(int(i) for i in ids)
    if ids and ids[0] == 1:
        return tuple(i + 1 for i in ids)
    return ids


@dataclass(frozen=True, kw_only=True)
class Eagle3Config:
    """Shape and variant flags of an EAGLE-3 head (the parsed ``config.json`` of any of the three layouts).

    Args:
        hidden_size (int): H, the draft width.
        intermediate_size (int): MLP width.
        num_attention_heads (int), num_key_value_heads (int), head_dim (int): attention shape.
        vocab_size (int): the target vocabulary V.
        draft_vocab_size (int): Vd, rows of ``lm_head``; ``== vocab_size`` when the head drafts over the full one.
        target_hidden_size (int | None): width of one fused target state; default H.
        aux_layer_ids (tuple[int, ...] | None): the config's fused-layer ids as written (see :func:`fused_layers`).
        num_aux (int): fused target states K (``fc`` takes ``K * target_hidden_size``). Default 3.
        rms_norm_eps (float), hidden_act (str), rope_theta (float), rope_scaling (dict | None),
            max_position_embeddings (int), attention_bias (bool), mlp_bias (bool): as in a Llama config.
        norm_before_residual (bool): the residual is ``hidden_norm(hidden)`` instead of ``hidden``.
        norm_before_fc (bool): one RMSNorm (``input_norm``, width ``K * H_t``) before ``fc``.
        fc_norm (bool): one RMSNorm per fused state (``fc_norm.{i}``) before ``fc``.
        norm_output (bool): the state fed back at the next depth is the final-normed one.
        qk_norm (bool): per-head RMSNorms on queries and keys before the rotation (``self_attn.q_norm`` /
            ``k_norm``), as a Qwen3 decoder layer has (speculators heads whose layer config is Qwen3's).
        layout (str): the layout it was read from (``official``, ``specforge``, ``speculators``).
        extra (dict): other keys, written back on save.
    """

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    draft_vocab_size: int
    target_hidden_size: int | None = None
    aux_layer_ids: tuple[int, ...] | None = None
    num_aux: int = 3
    rms_norm_eps: float = 1e-6
    hidden_act: str = "silu"
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    max_position_embeddings: int = 2048
    attention_bias: bool = False
    mlp_bias: bool = False
    norm_before_residual: bool = False
    norm_before_fc: bool = False
    fc_norm: bool = False
    norm_output: bool = False
    qk_norm: bool = False
    layout: str = "official"
    extra: dict = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of num_key_value_heads="
                f"{self.num_key_value_heads}: the config is inconsistent."
            )
        if not 0 < self.draft_vocab_size <= self.vocab_size:
            raise ValueError(
                f"draft_vocab_size={self.draft_vocab_size} must be in [1, vocab_size={self.vocab_size}]: the config "
                "is inconsistent."
            )
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout={self.layout!r}: choose one of {LAYOUTS}.")
        if self.aux_layer_ids is not None:
            object.__setattr__(self, "aux_layer_ids", tuple(int(i) for i in self.aux_layer_ids))
            object.__setattr__(self, "num_aux", len(self.aux_layer_ids))

    @property
    def context_size(self) -> int:
        """Width of one fused target state."""
        return self.target_hidden_size or self.hidden_size

    def llama_config(self) -> LlamaConfig:
        """The HF ``LlamaConfig`` of the decoder layer (for the HF norm, rotary and MLP modules)."""
        rope = {"rope_type": "default", **(self.rope_scaling or {}), "rope_theta": self.rope_theta}
        rope["rope_type"] = rope.pop("type", rope["rope_type"])
        return LlamaConfig(
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=1,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            rms_norm_eps=self.rms_norm_eps,
            hidden_act=self.hidden_act,
            max_position_embeddings=self.max_position_embeddings,  # as the checkpoint's (yarn reads it)
            rope_parameters=rope,
            mlp_bias=self.mlp_bias,
            vocab_size=self.vocab_size,
        )

    @classmethod
    def from_dict(cls, raw: dict) -> Eagle3Config:
        """Parse an official (``LlamaForCausalLM`` + ``draft_vocab_size``), SpecForge (``LlamaForCausalLMEagle3``,
        ``eagle_config``) or speculators (``Eagle3Speculator``, ``transformer_layer_config``) ``config.json``."""
        arch = (raw.get("architectures") or [""])[0]
        if "dflash_config" in raw or arch == "DFlashDraftModel":
            raise ValueError(
                "config.json is a DFlash drafter's, not an EAGLE-3 head's: load it with "
                "DFlashDrafter.from_pretrained(path, target=model) (on the command line drafter=dflash)."
            )
        if raw.get("speculators_model_type") == "eagle3" or "transformer_layer_config" in raw:
            layout, layer = "speculators", dict(raw.get("transformer_layer_config") or {})
            if not layer:
                raise ValueError("speculators config.json has no transformer_layer_config: not an EAGLE-3 layout.")
            ids = raw.get("eagle_aux_hidden_state_layer_ids")
        else:
            layout = "specforge" if arch == "LlamaForCausalLMEagle3" else "official"
            layer = raw
            ids = (raw.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
            ids = raw.get("eagle_aux_hidden_state_layer_ids", ids)
        if layer.get("num_hidden_layers", 1) != 1:
            raise NotImplementedError(
                f"config.json has num_hidden_layers={layer['num_hidden_layers']}: only one-layer EAGLE-3 heads are "
                "supported."
            )
        needed = ("hidden_size", "intermediate_size", "num_attention_heads", "vocab_size")
        missing = [k for k in needed if k not in layer]
        if missing:
            raise ValueError(f"config.json lacks {missing}: not an EAGLE-3 head config.")
        heads = layer["num_attention_heads"]
        rope = dict(layer.get("rope_parameters") or layer.get("rope_scaling") or {})
        theta = layer.get("rope_theta", rope.get("rope_theta", 10000.0))
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        scaling = {k: v for k, v in rope.items() if k != "rope_theta"} if rope_type != "default" else None
        flags = {
            k: bool(raw.get(k, layer.get(k, False)))
            for k in ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output", "qk_norm")
        }
        flags["qk_norm"] |= layout == "speculators" and layer.get("model_type") == "qwen3"
        known = _LAYER_KEYS | _TOP_KEYS
        return cls(
            hidden_size=layer["hidden_size"],
            intermediate_size=layer["intermediate_size"],
            num_attention_heads=heads,
            num_key_value_heads=layer.get("num_key_value_heads") or heads,
            head_dim=layer.get("head_dim") or layer["hidden_size"] // heads,
            vocab_size=layer["vocab_size"],
            draft_vocab_size=raw.get("draft_vocab_size") or layer.get("draft_vocab_size") or layer["vocab_size"],
            target_hidden_size=raw.get("target_hidden_size", layer.get("target_hidden_size")),
            aux_layer_ids=tuple(ids) if ids is not None else None,
            rms_norm_eps=layer.get("rms_norm_eps", 1e-6),
            hidden_act=layer.get("hidden_act", "silu"),
            rope_theta=float(theta),
            rope_scaling=scaling,
            max_position_embeddings=layer.get("max_position_embeddings", 2048),
            attention_bias=bool(layer.get("attention_bias", False)),
            mlp_bias=bool(layer.get("mlp_bias", False)),
            layout=layout,
            extra={k: v for k, v in raw.items() if k not in known},
            **flags,
        )

    def to_dict(self) -> dict:
        """The official layout's ``config.json`` (``LlamaForCausalLM`` + ``draft_vocab_size``); fused-layer ids and
        variant flags are written only when set."""
        raw = {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "num_hidden_layers": 1,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "vocab_size": self.vocab_size,
            "draft_vocab_size": self.draft_vocab_size,
            "rms_norm_eps": self.rms_norm_eps,
            "hidden_act": self.hidden_act,
            "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling,
            "max_position_embeddings": self.max_position_embeddings,
            "attention_bias": self.attention_bias,
            "mlp_bias": self.mlp_bias,
            "tie_word_embeddings": False,
        }
        if self.target_hidden_size not in (None, self.hidden_size):
            raw["target_hidden_size"] = self.target_hidden_size
        if self.aux_layer_ids is not None:
            raw["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(self.aux_layer_ids)}
        for key in ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output", "qk_norm"):
            if getattr(self, key):
                raw[key] = True
        return {**self.extra, **raw}

    def replace(self, **changes) -> Eagle3Config:
        return Eagle3Config(**{**asdict(self), **changes})


# fmt: off
_LAYER_KEYS = {
    "architectures", "model_type", "num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
    "num_key_value_heads", "head_dim", "vocab_size", "draft_vocab_size", "rms_norm_eps", "hidden_act", "rope_theta",
    "rope_scaling", "rope_parameters", "max_position_embeddings", "attention_bias", "mlp_bias", "tie_word_embeddings",
    "target_hidden_size", "torch_dtype", "dtype",
}
_TOP_KEYS = {
    "eagle_config", "eagle_aux_hidden_state_layer_ids", "norm_before_residual", "norm_before_fc", "fc_norm",
    "norm_output", "qk_norm", "transformer_layer_config", "speculators_model_type", "speculators_config",
    "speculators_version",
}
# fmt: on


class Eagle3Layer(nn.Module):
    """The draft decoder layer: attention over ``concat(embed, hidden)`` (width 2H), then the Llama MLP."""

    def __init__(self, cfg: Eagle3Config, llama: LlamaConfig) -> None:
        super().__init__()
        h, d, bias = cfg.hidden_size, cfg.head_dim, cfg.attention_bias
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, d
        self.hidden_norm = LlamaRMSNorm(h, eps=cfg.rms_norm_eps)
        self.input_layernorm = LlamaRMSNorm(h, eps=cfg.rms_norm_eps)
        self.self_attn = nn.Module()
        self.self_attn.q_proj = nn.Linear(2 * h, self.num_heads * d, bias=bias)
        self.self_attn.k_proj = nn.Linear(2 * h, self.num_kv_heads * d, bias=bias)
        self.self_attn.v_proj = nn.Linear(2 * h, self.num_kv_heads * d, bias=bias)
        self.self_attn.o_proj = nn.Linear(self.num_heads * d, h, bias=bias)
        if cfg.qk_norm:
            self.self_attn.q_norm = LlamaRMSNorm(d, eps=cfg.rms_norm_eps)
            self.self_attn.k_norm = LlamaRMSNorm(d, eps=cfg.rms_norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(h, eps=cfg.rms_norm_eps)
        self.mlp = LlamaMLP(llama)


class Eagle3Model(nn.Module):
    """The EAGLE-3 head. Tensor names are those of the official layout (``docs/eagle3.md``).

    ``embed_tokens`` is None unless the checkpoint ships one (the drafter then borrows the target's).
    """

    def __init__(self, cfg: Eagle3Config) -> None:
        super().__init__()
        self.config = cfg
        llama = cfg.llama_config()
        width = cfg.num_aux * cfg.context_size
        if cfg.norm_before_fc:
            self.input_norm = LlamaRMSNorm(width, eps=cfg.rms_norm_eps)
        if cfg.fc_norm:
            self.fc_norm = nn.ModuleList(
                LlamaRMSNorm(cfg.context_size, eps=cfg.rms_norm_eps) for _ in range(cfg.num_aux)
            )
        self.fc = nn.Linear(width, cfg.hidden_size, bias=False)
        self.midlayer = Eagle3Layer(cfg, llama)
        self.norm = LlamaRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False)
        self.embed_tokens: nn.Embedding | None = None
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.ones(cfg.vocab_size, dtype=torch.bool))
        # built on first use and kept out of the module (a cast of the head never rounds its frequencies)
        self._rotary: tuple[LlamaRotaryEmbedding, ...] = ()

    # -- pieces (the round's static code uses them one by one) -------------------------------------------------
    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """Concatenated target states ``[..., K * H_t]`` -> the fused hidden ``[..., H]``."""
        cfg = self.config
        x = features.to(self.fc.weight.dtype)
        if cfg.fc_norm:
            parts = x.split(cfg.context_size, -1)
            x = torch.cat([norm(part) for norm, part in zip(self.fc_norm, parts, strict=True)], -1)
        if cfg.norm_before_fc:
            x = self.input_norm(x)
        return self.fc(x)

    def layer_input(
        self, embeds: torch.Tensor, hidden: torch.Tensor, norm=None, norm_cat=None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(residual [.., H], attention input [.., 2H])`` from token embeddings and the hidden (fused or fed
        back). ``norm(module, x)``: how an RMSNorm module is applied (None: the module itself; the round passes
        one launch per norm); ``norm_cat(module_a, a, module_b, b)``: both norms written side by side (the round
        passes one launch for the two and the concatenation, ``rms_norm_cat``), the same values as
        ``torch.cat([norm(module_a, a), norm(module_b, b)], -1)``."""
        layer = self.midlayer
        embeds = embeds.to(hidden.dtype)
        if norm_cat is not None:
            x = norm_cat(layer.input_layernorm, embeds, layer.hidden_norm, hidden)
        else:
            norm = norm or _module_norm
            x = torch.cat([norm(layer.input_layernorm, embeds), norm(layer.hidden_norm, hidden)], dim=-1)
        return self.residual(x, hidden), x

    def residual(self, x: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """The layer's residual stream from its attention input ``x [.., 2H]`` (:meth:`layer_input`'s) and the
        hidden ``[.., H]``: the hidden's norm (x's second half) with ``norm_before_residual``, else the hidden."""
        return x[..., hidden.shape[-1] :] if self.config.norm_before_residual else hidden

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, norm=None, rope=None, packed=None):
        """Attention input ``[B, L, 2H]`` -> rotated ``q [B, H_q, L, D]``, ``k``/``v`` ``[B, H_kv, L, D]``.
        ``norm`` as :meth:`layer_input`; ``rope(q, k, cos, sin)``: the rotation (None: HF's
        ``apply_rotary_pos_emb``); ``packed``: the three projections as one (:meth:`packed_weights`' ``qkv``),
        one product instead of three."""
        norm, rope = norm or _module_norm, rope or apply_rotary_pos_emb
        attn, layer = self.midlayer.self_attn, self.midlayer
        b, n, _ = x.shape
        heads, kv_heads, dim = layer.num_heads, layer.num_kv_heads, layer.head_dim
        if packed is None:
            q, k, v = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)
        else:
            q, k, v = F.linear(x, *packed).split((heads * dim, kv_heads * dim, kv_heads * dim), dim=-1)
        q, k = q.view(b, n, heads, dim), k.view(b, n, kv_heads, dim)
        if self.config.qk_norm:
            q, k = norm(attn.q_norm, q), norm(attn.k_norm, k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = v.view(b, n, kv_heads, dim).transpose(1, 2)
        q, k = rope(q, k, cos, sin)
        return q, k, v

    def finish(self, residual: torch.Tensor, attn_out: torch.Tensor, norm=None, packed=None) -> torch.Tensor:
        """Residual + ``o_proj`` of the attention output ``[B, L, H_q * D]``, then the MLP block: the layer's
        (pre-norm) output. ``norm`` as :meth:`layer_input`; ``packed``: the MLP's gate and up projections as one
        (:meth:`packed_weights`' ``gate_up``)."""
        norm = norm or _module_norm
        layer = self.midlayer
        x = residual + layer.self_attn.o_proj(attn_out)
        normed = norm(layer.post_attention_layernorm, x)
        if packed is None:
            return x + layer.mlp(normed)
        if activation_kind(layer.mlp.act_fn) == "silu":  # one launch on CUDA (gated_linear)
            return x + layer.mlp.down_proj(gate_up_silu(normed, *packed))
        gate, up = F.linear(normed, *packed).chunk(2, dim=-1)
        return x + layer.mlp.down_proj(layer.mlp.act_fn(gate) * up)

    def finish_head(self, residual: torch.Tensor, attn_out: torch.Tensor, add_norm, packed=None):
        """:meth:`finish` then :meth:`head`, each residual add done with the norm after it: ``add_norm(module, x,
        residual) -> (residual + x, module's norm of it)`` (the round passes one launch for both, ``add_rms_norm``);
        the same values as ``head(finish(...))`` with those norms. ``packed`` as :meth:`finish`."""
        layer = self.midlayer
        x, normed = add_norm(layer.post_attention_layernorm, layer.self_attn.o_proj(attn_out), residual)
        if packed is None:
            mlp = layer.mlp(normed)
        else:
            if activation_kind(layer.mlp.act_fn) == "silu":  # one launch on CUDA (gated_linear)
                act = gate_up_silu(normed, *packed)
            else:
                gate, up = F.linear(normed, *packed).chunk(2, dim=-1)
                act = layer.mlp.act_fn(gate) * up
            mlp = layer.mlp.down_proj(act)
        x, normed = add_norm(self.norm, mlp, x)
        return self.lm_head(normed), normed if self.config.norm_output else x

    def packed_weights(self, out: dict | None = None) -> dict[str, tuple[torch.Tensor, torch.Tensor | None]]:
        """The layer's projections that read the same input, stacked: ``qkv`` (``q_proj``, ``k_proj``, ``v_proj``)
        and ``gate_up`` (the MLP's ``gate_proj``, ``up_proj``), each ``(weight, bias or None)``: a copy of the
        layer's weights (the module keeps its own). ``out``: an earlier result whose tensors are written in place
        (a captured round reads them by address)."""
        attn, mlp = self.midlayer.self_attn, self.midlayer.mlp
        groups = {"qkv": (attn.q_proj, attn.k_proj, attn.v_proj), "gate_up": (mlp.gate_proj, mlp.up_proj)}
        result = {}
        with torch.no_grad():
            for name, linears in groups.items():
                weight = torch.cat([m.weight for m in linears])
                bias = None if linears[0].bias is None else torch.cat([m.bias for m in linears])
                if out is not None:
                    out[name][0].copy_(weight)
                    if bias is not None:
                        out[name][1].copy_(bias)
                    weight, bias = out[name]
                result[name] = (weight, bias)
        return result

    def head(self, x: torch.Tensor, norm=None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(draft-vocabulary logits [.., Vd], the hidden fed back at the next depth)`` of the layer output.
        ``norm`` as :meth:`layer_input`."""
        normed = (norm or _module_norm)(self.norm, x)
        return self.lm_head(normed), normed if self.config.norm_output else x

    def rope(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """``positions [B, L]`` -> ``cos, sin [B, L, D]`` (HF's Llama rotary embedding)."""
        if not self._rotary:
            with torch.device("cpu"):
                self._rotary = (LlamaRotaryEmbedding(self.config.llama_config()),)
        probe = torch.empty(0, dtype=dtype, device=positions.device)
        return self._rotary[0](probe, positions)

    def target_ids(self) -> torch.Tensor:
        """``[Vd]`` target id of each draft id: ``d + d2t[d]``."""
        return torch.arange(self.d2t.shape[0], device=self.d2t.device) + self.d2t

    # -- a plain forward (training-style; tests and eager use) --------------------------------------------------
    def forward(self, embeds, hidden, positions, past=None):
        """One causal block over new rows.

        Args:
            embeds (torch.Tensor): ``[B, L, H]`` token embeddings (row t: the token at position t + 1).
            hidden (torch.Tensor): ``[B, L, H]`` fused target hidden (:meth:`fuse`) or fed-back hidden.
            positions (torch.Tensor): ``[B, L]`` rotary positions.
            past (tuple | None): ``(k, v)`` ``[B, H_kv, C, D]`` of earlier rows, all visible.

        Returns:
            (logits ``[B, L, Vd]``, fed-back hidden ``[B, L, H]``, ``(k, v)`` including the new rows).
        """
        residual, x = self.layer_input(embeds, hidden)
        cos, sin = self.rope(positions, x.dtype)
        q, k, v = self.qkv(x, cos, sin)
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        n, total = q.shape[2], k.shape[2]
        keep = torch.ones(n, total, dtype=torch.bool, device=q.device).tril(total - n)
        rep = self.midlayer.num_heads // self.midlayer.num_kv_heads
        out = F.scaled_dot_product_attention(q, repeat_kv(k, rep), repeat_kv(v, rep), attn_mask=keep)
        out = self.finish(residual, out.transpose(1, 2).reshape(q.shape[0], n, -1))
        logits, fed = self.head(out)
        return logits, fed, (k, v)
