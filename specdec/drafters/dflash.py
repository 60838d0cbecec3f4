"""DFlash block drafter: a few Qwen3-style layers that draft a whole block in one non-causal forward.

The drafter has no embedding and no LM head of its own: it embeds the block ``[root, MASK x (B-1)]`` with the
target's embedding, conditions every layer on ``hidden_norm(fc(concat(target layer outputs)))`` of the
committed tokens (extra keys/values, "KV injection") and reads the block through the target's LM head.
Checkpoints use the z-lab layout unchanged. Maths, notation and format: ``docs/dflash.md``.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import fields
from pathlib import Path

import torch
from torch import nn

from specdec.distributed import replicated
from specdec.drafters.checkpoints import hf_causal_lm, load_exact, rename, resolve_checkpoint, text_config
from specdec.drafters.dflash_model import (
    DFlashConfig,
    DFlashDraftModel,
    default_target_layer_ids,
)
from specdec.drafters.follow import note_target
from specdec.drafters.identity import RECORD_KEY, check_identity, identity_differences, target_identity
from specdec.trees import Chain

__all__ = ["DFlashConfig", "DFlashDraftModel", "DFlashDrafter", "default_target_layer_ids"]

logger = logging.getLogger(__name__)


# Third-party names of the same tensors (prefixes are rewritten in order).
_ALIASES = (
    ("model.", ""),
    ("midlayer.", "layers.0."),
    ("encoder.fc.", "fc."),
    ("encoder.output_norm_enc.", "hidden_norm."),
    ("context_proj.", "fc."),
    ("context_norm.", "hidden_norm."),
    ("final_norm.", "norm."),
)


def _rope_theta_of(text_cfg) -> float:
    params = getattr(text_cfg, "rope_parameters", None) or {}
    return float(params.get("rope_theta") or getattr(text_cfg, "rope_theta", None) or 10000.0)


class DFlashDrafter:
    """DFlash drafter (Drafter protocol): one non-causal forward over ``[root, MASK x (B-1)]`` per round.

    Its round code (``dflash_static.py``) keeps the context keys/values of the committed tokens in static storage
    (the target's tapped features of each accepted path are projected as they arrive); block keys/values are
    recomputed each round.

    Args:
        model (DFlashDraftModel): the drafter's own weights.
        target: HF causal LM (or ``TargetModel``) whose embedding and LM head are borrowed; can be bound later
            with :meth:`bind` (``validate`` binds the target it is given).
        strict (bool): refuse (``ValueError``) a target other than the one the drafter was trained for; by
            default a warning is logged. Default False.
        target_record (dict | None): the identity record of the target it was trained for (``docs/dflash.md``).

    Examples:
        >>> drafter = DFlashDrafter.from_pretrained("assets/drafters/zoo-dense", target=model)
        >>> out = specdec.generate(model, ids, drafter=drafter, tree=specdec.DDTree(budget=32), max_new_tokens=128)
    """

    def __init__(
        self, model: DFlashDraftModel, *, target=None, strict: bool = False, target_record: dict | None = None
    ) -> None:
        self.model = model.eval()
        self.strict = strict
        self.target_record = target_record
        self._bound: tuple[int, dict] | None = None  # (id of the bound HF model, its identity record)
        self.config: DFlashConfig = model.config
        self.target_layer_ids: tuple[int, ...] = self.config.target_layer_ids
        self.default_tree = Chain(k=self.config.block_size - 1)
        self.num_forwards = 0
        self._embed: nn.Module | None = getattr(model, "embed_tokens", None)
        self._lm_head: nn.Module | None = getattr(model, "lm_head", None)
        if target is not None:
            self.bind(target)
        self.reset()

    # -- construction ------------------------------------------------------------------------------------
    @classmethod
    def for_target(
        cls,
        target,
        *,
        mask_token_id: int,
        num_layers: int = 1,
        block_size: int = 16,
        target_layer_ids: tuple[int, ...] | list[int] | None = None,
        num_taps: int | None = None,
        intermediate_size: int | None = None,
        num_attention_heads: int | None = None,
        num_key_value_heads: int | None = None,
        head_dim: int | None = None,
        rope_theta: float | None = None,
        seed: int = 0,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> DFlashDrafter:
        """A freshly initialised drafter shaped for ``target`` (width = the target's embedding width).

        Args:
            target: HF causal LM (or ``TargetModel``).
            mask_token_id (int): mask token id (a row of the target's embedding, e.g. the tokenizer's mask).
            num_layers (int): drafter layers. Default 1.
            block_size (int): B. Default 16.
            target_layer_ids (sequence[int] | None): tapped layers; None = the z-lab default rule with
                ``num_taps`` (default ``num_layers``) taps.
            intermediate_size, num_attention_heads, num_key_value_heads, head_dim, rope_theta: default to the
                target's values.
            seed (int): initialisation seed. Default 0.
            dtype (torch.dtype): weight dtype. Default fp32 (for training).
            device: default the target's device.
        """
        hf = hf_causal_lm(target)
        tc = text_config(hf)
        heads = num_attention_heads or tc.num_attention_heads
        depth = tc.num_hidden_layers
        ids = tuple(target_layer_ids) if target_layer_ids is not None else None
        cfg = DFlashConfig(
            hidden_size=tc.hidden_size,
            intermediate_size=intermediate_size or tc.intermediate_size,
            num_hidden_layers=num_layers,
            num_attention_heads=heads,
            num_key_value_heads=num_key_value_heads or getattr(tc, "num_key_value_heads", None) or heads,
            head_dim=head_dim or getattr(tc, "head_dim", None) or tc.hidden_size // heads,
            block_size=block_size,
            mask_token_id=mask_token_id,
            target_layer_ids=ids or default_target_layer_ids(depth, num_taps or num_layers),
            num_target_layers=depth,
            rms_norm_eps=getattr(tc, "rms_norm_eps", 1e-6),
            rope_theta=rope_theta or _rope_theta_of(tc),
            max_position_embeddings=getattr(tc, "max_position_embeddings", None) or 40960,
            vocab_size=hf.get_output_embeddings().weight.shape[0],
        )
        model = DFlashDraftModel(cfg)
        gen = torch.Generator().manual_seed(seed)
        std = getattr(tc, "initializer_range", 0.02)
        with torch.no_grad():
            for module in model.modules():
                if isinstance(module, nn.Linear):
                    module.weight.normal_(0.0, std, generator=gen)
                    if module.bias is not None:
                        module.bias.zero_()
        device = device if device is not None else hf.get_input_embeddings().weight.device
        drafter = cls(model.to(device=device, dtype=dtype), target=target)
        drafter.validate(target, Chain(k=block_size - 1))
        return drafter

    @classmethod
    def from_pretrained(
        cls,
        path: str | os.PathLike,
        *,
        target=None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        strict: bool = False,
        **overrides,
    ) -> DFlashDrafter:
        """Load a z-lab DFlash checkpoint (``config.json`` + ``*.safetensors``), unchanged.

        Args:
            path: a local folder, or a hub repo id (``owner/name``, downloaded with ``huggingface_hub``).
            target: HF causal LM (or ``TargetModel``) to borrow the embedding and LM head from.
            device: default the target's device (else CPU).
            dtype: default the target's dtype (else the checkpoint's).
            strict (bool): raise ``ValueError`` if ``target`` (or a later one) is not the target the checkpoint
                was trained for; by default a warning is logged. Default False.
            **overrides: ``DFlashConfig`` fields that replace the config's (e.g. ``mask_token_id=``).
        """
        from safetensors.torch import load_file

        folder = resolve_checkpoint(path, what="DFlash checkpoint folder", patterns=["config.json", "*.safetensors"])
        raw = json.loads((folder / "config.json").read_text())
        record = raw.pop(RECORD_KEY, None)
        state: dict[str, torch.Tensor] = {}
        for file in sorted(folder.glob("*.safetensors")):
            state.update({rename(k, _ALIASES): v for k, v in load_file(str(file)).items()})
        if not state:
            raise FileNotFoundError(f"{folder} holds no *.safetensors weights.")
        if "d2t" in state and not raw.get("dflash_config") and "block_size" not in raw:
            raise ValueError(
                f"{folder} is an EAGLE-3 head (a 'd2t' map, no DFlash block settings), not a DFlash drafter: load it "
                "with Eagle3Drafter.from_pretrained(path, target=model) (on the command line drafter=eagle3)."
            )
        for name in ("d2t", "t2d"):
            if name in state:
                raise NotImplementedError(
                    f"{folder}: reduced draft vocabularies ({name!r} map) are not supported; use a drafter that "
                    "predicts over the target's full vocabulary."
                )
        cfg = DFlashConfig.from_dict(raw, **overrides)
        fc = state.get("fc.weight")
        if fc is not None and fc.shape[1] != len(cfg.target_layer_ids) * cfg.context_size:
            width, rem = divmod(fc.shape[1], len(cfg.target_layer_ids))
            if rem:
                raise ValueError(
                    f"{folder}: fc.weight has {fc.shape[1]} input features, not a multiple of the "
                    f"{len(cfg.target_layer_ids)} target_layer_ids {cfg.target_layer_ids}; the config does not match "
                    "the weights."
                )
            cfg = DFlashConfig(**{**{f.name: getattr(cfg, f.name) for f in fields(cfg)}, "target_hidden_size": width})
        with torch.device("meta"):
            model = DFlashDraftModel(cfg)
            if "embed_tokens.weight" in state:
                model.embed_tokens = nn.Embedding(*state["embed_tokens.weight"].shape)
            if "lm_head.weight" in state:
                model.lm_head = nn.Linear(
                    state["lm_head.weight"].shape[1], state["lm_head.weight"].shape[0], bias=False
                )
        load_exact(model, state, folder=folder, layout="DFlash", doc="docs/dflash.md")
        if target is not None:
            emb = hf_causal_lm(target).get_input_embeddings().weight
            device = emb.device if device is None else device
            dtype = emb.dtype if dtype is None else dtype
        model.to(device=device or "cpu", dtype=dtype)
        return cls(model, target=target, strict=strict, target_record=record)

    def save_pretrained(self, path: str | os.PathLike, *, dtype: torch.dtype | None = None) -> None:
        """Write ``config.json`` + ``model.safetensors`` in the z-lab layout (borrowed modules not included).

        ``config.json`` also records the target the drafter is bound to (else the one it was loaded for) under
        ``specdec_target`` (``docs/dflash.md``); z-lab loaders ignore the extra key.

        Args:
            path: output folder (created).
            dtype (torch.dtype | None): cast the weights on save (e.g. ``torch.bfloat16``); default as held.
        """
        from safetensors.torch import save_file

        folder = Path(path)
        folder.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().to(dtype or v.dtype).contiguous().cpu() for k, v in self.model.state_dict().items()}
        raw = self.config.to_dict()
        raw["dtype"] = str(next(iter(state.values())).dtype).removeprefix("torch.")
        record = self._bound[1] if self._bound is not None else self.target_record
        if record is not None:
            raw[RECORD_KEY] = record
        save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
        (folder / "config.json").write_text(json.dumps(raw, indent=2) + "\n")

    def bind(self, target) -> DFlashDrafter:
        """Borrow ``target``'s input embedding and LM head (unless the checkpoint ships its own).

        The first time a target is bound it is compared with the one the drafter was trained for: a difference
        is logged as a warning, or raises ``ValueError`` when ``strict``.
        """
        hf = hf_causal_lm(target)
        if self._bound is None or self._bound[0] != id(hf):
            identity = target_identity(hf)
            cfg = self.config
            diffs = identity_differences(
                self.target_record, identity, vocab_size=cfg.vocab_size, num_target_layers=cfg.num_target_layers
            )
            check_identity(diffs, name="This DFlash drafter", strict=self.strict)
            self._bound = (id(hf), identity)
            note_target(self, hf)  # a later cast or move of the target moves the drafter too (drafters/follow.py)
        # a target sharded by a tensor-parallel plan lends whole copies (the drafter is replicated on every rank)
        if getattr(self.model, "embed_tokens", None) is None:
            self._embed = replicated(hf.get_input_embeddings())
        if getattr(self.model, "lm_head", None) is None:
            self._lm_head = replicated(hf.get_output_embeddings())
        return self

    def to(self, device=None, dtype: torch.dtype | None = None) -> DFlashDrafter:
        """Move the drafter's own weights (the borrowed modules stay with the target). ``generate`` calls it when the
        target was cast or moved since the drafter last ran with it (``specdec.drafters.follow``)."""
        self.model.to(device=device, dtype=dtype)
        self.reset()
        return self

    # -- Drafter protocol --------------------------------------------------------------------------------
    def validate(self, target, tree) -> None:
        """Check that this drafter fits ``target`` and ``tree``, and bind the target's embedding and LM head."""
        hf = hf_causal_lm(target)
        tc = text_config(hf)
        cfg, depth = self.config, tc.num_hidden_layers
        bad = [i for i in cfg.target_layer_ids if not 0 <= i < depth]
        if bad:
            raise ValueError(
                f"DFlash target_layer_ids {cfg.target_layer_ids} name layers {bad} but the target has {depth} layers "
                f"(0..{depth - 1}): this drafter was made for another target; use one trained for this target."
            )
        want = len(cfg.target_layer_ids) * tc.hidden_size
        if self.model.fc.in_features != want:
            raise ValueError(
                f"DFlash fc takes {self.model.fc.in_features} features but {len(cfg.target_layer_ids)} taps of this "
                f"target (hidden {tc.hidden_size}) give {want}: the drafter was made for a target of another width; "
                "use one trained for this target."
            )
        self.bind(hf)
        width, rows = self._embed.weight.shape[1], self._embed.weight.shape[0]
        if width != cfg.hidden_size or self._lm_head.weight.shape[1] != cfg.hidden_size:
            raise ValueError(
                f"DFlash hidden size {cfg.hidden_size} differs from the target's embedding/LM-head width {width}: "
                "the drafter must have the target's width."
            )
        if not 0 <= cfg.mask_token_id < rows:
            raise ValueError(
                f"DFlash mask_token_id {cfg.mask_token_id} is outside the target's embedding ({rows} rows): load the "
                "drafter with mask_token_id=<a valid id, e.g. tokenizer.mask_token_id>."
            )
        if self.model.fc.weight.device != self._embed.weight.device:
            raise ValueError(
                f"The drafter is on {self.model.fc.weight.device} but the target on {self._embed.weight.device}: "
                "call drafter.to(target.device)."
            )
        if not tree.branching and tree.max_depth > cfg.block_size - 1:
            raise ValueError(
                f"{tree!r} drafts more tokens than a DFlash block of block_size={cfg.block_size} yields: "
                f"use k <= {cfg.block_size - 1}."
            )

    def reset(self) -> None:
        """Nothing to forget: the per-sequence context lives in the round's static storage."""

    @property
    def provides(self) -> tuple[str, ...]:
        return ("logq",)

    def draft_depth(self, tree) -> int:
        """Rows of the proposal: the block's draft slots, no deeper than the policy builds."""
        return min(tree.max_depth, self.config.block_size - 1)

    def window(self, tree) -> int:
        """Storage slots a round writes past its root: the block."""
        return self.config.block_size

    def forwards_per_round(self, tree) -> int:
        return 1

    def attach(self, target, capacity: int, batch: int = 1):
        """The drafter's static storage and round code for sequences of up to ``capacity`` tokens."""
        from specdec.drafters.dflash_static import DFlashStatic

        return DFlashStatic(self, capacity, batch)

    def block_logq(self, hidden: torch.Tensor, depth: int) -> torch.Tensor:
        """fp32 log-softmax ``[B, depth, V]`` of the target's LM head on block slots ``1 .. depth`` of ``hidden``
        ``[B, block, H]``."""
        head = self._lm_head
        return torch.log_softmax(head(hidden[:, 1 : 1 + depth].to(head.weight.dtype)), dim=-1, dtype=torch.float32)
