"""The multi-token-prediction (MTP) head of Qwen3-Next / Qwen3.5 checkpoints, built from the target's own HF classes.

A checkpoint's ``mtp.*`` tensors (which transformers drops on load) form one extra decoder step:

    e = pre_fc_norm_embedding(embed(x[t+1]))     # the target's embedding
    g = pre_fc_norm_hidden(h[t])                 # h[t]: the target's last hidden state (after its final norm)
    y = layers[0](fc(concat(e, g)))              # fc: [2H] -> [H], the embedding first; a full-attention layer
    out = norm(y)                                # fed back as the next h when drafting deeper
    logits = lm_head(out)                        # the target's LM head

Row ``t`` sits at position ``t``. The decoder layer is an instance of the target's own decoder-layer class, built
from the target's config as a full-attention layer (gated attention with partial RoPE and the MoE or dense MLP of
Qwen3-Next / Qwen3.5); the norms are instances of the target's RMSNorm class (``x * (1 + w)`` for those
families). Checkpoint layout and names: ``docs/mtp.md``.
"""

from __future__ import annotations

import copy
import inspect

import torch
from torch import nn

from specdec.attention import KV_FLAT, KV_LENGTHS
from specdec.drafters.checkpoints import hf_causal_lm as hf_model
from specdec.kernels.rms_norm.routing import norm_cat_routed

__all__ = ["MTPModule", "attention_layer_ids", "from_checkpoint_names", "hf_model", "text_model", "to_checkpoint_names"]


def text_model(hf) -> nn.Module:
    """The decoder stack of ``hf`` (``hf.model``, or its ``language_model`` for a vision-language checkpoint)."""
    inner = getattr(hf, "model", None)
    if inner is None or not hasattr(inner, "layers") and not hasattr(inner, "language_model"):
        raise TypeError(f"{type(hf).__name__} has no decoder stack at .model.layers; MTP needs a decoder-only LM.")
    return getattr(inner, "language_model", inner)


# attributes of decoder layers that also hold a recurrent mixer (Mamba, Gated DeltaNet): not an MTP layer's class
_RECURRENT = ("mamba", "linear_attn", "mixer", "ssm")


def attention_layer_ids(stack: nn.Module, config) -> list[int]:
    """Indices of the full-attention decoder layers of ``stack`` (no recurrent mixer; ``layer_types`` agrees)."""
    types = getattr(config, "layer_types", None)
    return [
        i
        for i, layer in enumerate(stack.layers)
        if hasattr(layer, "self_attn")
        and not any(hasattr(layer, name) for name in _RECURRENT)
        and (types is None or types[i] == "full_attention")
    ]


def _attention_layer(stack: nn.Module, config) -> nn.Module:
    """The first full-attention decoder layer of ``stack`` (its class builds the MTP layer)."""
    ids = attention_layer_ids(stack, config)
    if ids:
        return stack.layers[ids[0]]
    raise ValueError(
        f"{type(stack).__name__} has no full-attention decoder layer to build the MTP layer from; MTP heads come "
        "with Qwen3-Next / Qwen3.5 targets."
    )


class MTPModule(nn.Module):
    """The MTP head's own weights (``fc``, ``pre_fc_norm_embedding``, ``pre_fc_norm_hidden``, ``layers``, ``norm``);
    its ``state_dict`` names are the checkpoint's ``mtp.*`` names without the prefix (experts fused as the
    target's classes hold them: :func:`from_checkpoint_names`).

    Args:
        target: HF causal LM (or ``TargetModel``) whose decoder-layer and RMSNorm classes and config it takes.
        num_layers (int): MTP layers (the checkpoint's ``num_nextn_predict_layers`` / ``mtp_num_hidden_layers``).
            Default 1.
    """

    def __init__(self, target, num_layers: int = 1) -> None:
        super().__init__()
        hf = hf_model(target)
        stack = text_model(hf)
        base = stack.config
        source = _attention_layer(stack, base)
        config = copy.deepcopy(base)
        config.num_hidden_layers = num_layers
        if getattr(config, "layer_types", None) is not None:
            config.layer_types = ["full_attention"] * num_layers
        if config._attn_implementation not in ("eager", "sdpa"):
            config._attn_implementation = "sdpa"  # the round passes explicit additive masks
        self.config = config
        width, eps = config.hidden_size, getattr(config, "rms_norm_eps", 1e-6)
        norm = type(stack.norm)
        self.fc = nn.Linear(2 * width, width, bias=False)
        self.pre_fc_norm_embedding = norm(width, eps=eps)
        self.pre_fc_norm_hidden = norm(width, eps=eps)
        self.layers = nn.ModuleList(type(source)(config, i) for i in range(num_layers))
        self.norm = norm(width, eps=eps)
        params = inspect.signature(self.layers[0].forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"  # the name differs across releases
        # a layer whose forward takes keyword arguments passes them to its attention function (the extent to read)
        self._passes_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        weight = next(stack.parameters())
        self.to(device=weight.device, dtype=weight.dtype)

    def combine(self, embeds: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """``fc(concat(norm_e(embeds), norm_h(hidden)))``: the layer input ``[..., H]`` of rows whose next token
        embeds as ``embeds`` and whose target hidden state is ``hidden`` (both ``[..., H]``)."""
        x = norm_cat_routed(self.pre_fc_norm_embedding, embeds, self.pre_fc_norm_hidden, hidden)  # routed: one launch
        if x is None:
            x = torch.cat((self.pre_fc_norm_embedding(embeds), self.pre_fc_norm_hidden(hidden)), dim=-1)
        return self.fc(x)

    def forward(
        self, embeds, hidden, position_embeddings, attention_mask, position_ids, cache, layer: int = 0, extent=None
    ):
        """One pass of MTP layer ``layer`` over rows ``[B, N]``; returns the normalised output ``[B, N, H]`` (its
        logits are the target's LM head of it, and it is the next step's ``hidden``). ``extent``: ``(lengths,
        flat)`` (``[B]`` each) for the round's attention kernel, the slots each sequence reads and its flat prefix
        (``specdec.attention.KV_LENGTHS`` / ``KV_FLAT``), passed where the layer passes keyword arguments down."""
        x = self.combine(embeds, hidden)
        kwargs = {self._cache_kw: cache}
        if extent is not None and self._passes_kwargs:
            kwargs[KV_LENGTHS], kwargs[KV_FLAT] = extent
        x = self.layers[layer](
            x,
            position_embeddings=position_embeddings,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=cache is not None,
            **kwargs,
        )
        return self.norm(x[0] if isinstance(x, tuple) else x)


_FUSED = ("experts.gate_up_proj", "experts.down_proj")


def from_checkpoint_names(module: MTPModule, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A checkpoint's ``mtp.*`` tensors (prefix already removed) -> ``module``'s state-dict names.

    Per-expert tensors (``mlp.experts.{e}.gate_proj.weight`` ``[I, H]``, ``up_proj``, ``down_proj`` ``[H, I]``, the
    published layout) are stacked into the fused parameters the target's classes hold (``experts.gate_up_proj``
    ``[E, 2I, H]``: gate rows first; ``experts.down_proj`` ``[E, H, I]``); tensors already in that layout pass.
    """
    out = dict(tensors)
    for name, param in module.state_dict().items():
        if not name.endswith(_FUSED) or name in out:
            continue
        stem = name.rsplit(".", 1)[0]  # "...mlp.experts"
        count = param.shape[0]
        if name.endswith("gate_up_proj"):
            keys = [(f"{stem}.{e}.gate_proj.weight", f"{stem}.{e}.up_proj.weight") for e in range(count)]
            if all(k in out for pair in keys for k in pair):
                out[name] = torch.stack([torch.cat((out.pop(g), out.pop(u))) for g, u in keys])
        else:
            keys = [f"{stem}.{e}.down_proj.weight" for e in range(count)]
            if all(k in out for k in keys):
                out[name] = torch.stack([out.pop(k) for k in keys])
    return out


def to_checkpoint_names(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inverse of :func:`from_checkpoint_names`: fused expert parameters split per expert (published layout)."""
    out: dict[str, torch.Tensor] = {}
    for name, value in state.items():
        stem = name.rsplit(".", 1)[0]
        if name.endswith("experts.gate_up_proj") and value.dim() == 3:
            gate, up = value.chunk(2, dim=1)
            for e in range(value.shape[0]):
                out[f"{stem}.{e}.gate_proj.weight"] = gate[e]
                out[f"{stem}.{e}.up_proj.weight"] = up[e]
        elif name.endswith("experts.down_proj") and value.dim() == 3:
            for e in range(value.shape[0]):
                out[f"{stem}.{e}.down_proj.weight"] = value[e]
        else:
            out[name] = value
    return out
