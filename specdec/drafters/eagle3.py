"""EAGLE-3 drafter: a one-layer head over three fused target states drafts greedily, feeding back its own hidden.

Each round it drafts D steps from the root: the first row pairs the target's fused state of the last committed
position with the root's embedding (the depth-1 distribution); each next row pairs the head's own output with the
token it just drafted. The per-depth distributions over the draft vocabulary are mapped to the target's vocabulary
(ids outside the draft vocabulary get probability 0), so ``Chain`` takes the greedy draft and ``DDTree`` builds its
tree from them. The head keeps its own keys/values per committed position, written from the target's states of the
accepted tokens (``eagle3_static.py``). Checkpoints of the official, SpecForge and speculators layouts load
unchanged. Format, fused layers and drafting: ``docs/eagle3.md``.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import torch
from torch import nn

from specdec.distributed import replicated
from specdec.drafters.checkpoints import (
    GreedySteps,
    hf_causal_lm,
    load_exact,
    rename,
    resolve_checkpoint,
    text_config,
)
from specdec.drafters.eagle3_model import Eagle3Config, Eagle3Model, fused_layers
from specdec.drafters.follow import note_target
from specdec.trees import Chain

__all__ = ["Eagle3Config", "Eagle3Drafter", "Eagle3Model", "fused_layers"]

logger = logging.getLogger(__name__)

# Third-party prefixes of the same tensors (the speculators layout stores the decoder layer as ``layers.0``).
_ALIASES = (("model.", ""), ("layers.0.", "midlayer."))


# The target's final norm and LM head, kept by some training exports to compute targets; not part of the head.
_TARGET_COPIES = ("verifier_norm.", "verifier_lm_head.")


class Eagle3Drafter(GreedySteps):
    """EAGLE-3 drafter (Drafter protocol): D greedy one-row forwards of the head per round.

    Args:
        model (Eagle3Model): the head's weights.
        target: HF causal LM (or ``TargetModel``) it drafts for: fixes the fused layers (the default rule needs
            the target's depth) and lends its embedding when the checkpoint has none.
        tree_depth (int): drafted depth for branching policies (``DDTree``): ``min(budget, tree_depth)``. Default 8.
            ``DynamicTree`` drafts its own ``depth + 1`` levels.

    For a policy that reads ``candidates`` (``DynamicTree``, ``DDTree(candidates=True)``) it drafts EAGLE-2's
    candidate tree instead of the greedy chain (``docs/eagle3.md``).

    Examples:
        >>> drafter = Eagle3Drafter.from_pretrained("path/to/eagle3-head", target=model)
        >>> out = specdec.generate(model, ids, drafter=drafter, tree=specdec.Chain(k=4), max_new_tokens=128)
    """

    provides = ("logq", "candidates")

    def __init__(self, model: Eagle3Model, *, target, tree_depth: int = 8) -> None:
        if isinstance(tree_depth, bool) or not isinstance(tree_depth, int) or tree_depth < 1:
            raise ValueError(f"Eagle3Drafter: tree_depth={tree_depth!r} must be a Python int >= 1.")
        self.model = model.eval()
        self.config: Eagle3Config = model.config
        self.tree_depth = tree_depth
        self.default_tree = Chain(k=4)
        self.num_forwards = 0
        self._embed: nn.Module | None = model.embed_tokens
        self.bind(target)

    # -- construction ------------------------------------------------------------------------------------
    @classmethod
    def for_target(
        cls,
        target,
        *,
        layer_ids: tuple[int, ...] | list[int] | None = None,
        draft_vocab_size: int | None = None,
        intermediate_size: int | None = None,
        seed: int = 0,
        dtype: torch.dtype | None = None,
        **kwargs,
    ) -> Eagle3Drafter:
        """A freshly initialised head shaped for ``target`` (its width, heads and rotary settings).

        Args:
            target: HF causal LM (or ``TargetModel``).
            layer_ids (sequence[int] | None): fused layers as the config would declare them (:func:`fused_layers`);
                None = the default ``[2, N // 2, N - 3]``.
            draft_vocab_size (int | None): a draft vocabulary of that many target ids (a random sorted subset,
                with ``d2t``/``t2d``); None = the full vocabulary.
            intermediate_size (int | None): MLP width; default the target's.
            seed (int): initialisation seed. Default 0.
            dtype: default the target's.
            **kwargs: for the drafter (``tree_depth``).
        """
        hf = hf_causal_lm(target)
        tc = text_config(hf)
        emb = hf.get_input_embeddings().weight
        vocab, width = emb.shape
        heads = tc.num_attention_heads
        # the MLP width: GPT-2-style configs name it n_inner (None: 4 x the width)
        mlp = getattr(tc, "intermediate_size", None) or getattr(tc, "n_inner", None) or 4 * width
        rope = dict(getattr(tc, "rope_parameters", None) or {})
        cfg = Eagle3Config(
            hidden_size=width,
            intermediate_size=intermediate_size or mlp,
            num_attention_heads=heads,
            num_key_value_heads=getattr(tc, "num_key_value_heads", None) or heads,
            head_dim=getattr(tc, "head_dim", None) or width // heads,
            vocab_size=vocab,
            draft_vocab_size=draft_vocab_size or vocab,
            aux_layer_ids=tuple(layer_ids) if layer_ids is not None else None,
            rms_norm_eps=getattr(tc, "rms_norm_eps", 1e-6),
            rope_theta=float(rope.get("rope_theta") or getattr(tc, "rope_theta", None) or 10000.0),
            max_position_embeddings=getattr(tc, "max_position_embeddings", None) or 2048,
        )
        model = Eagle3Model(cfg)
        gen = torch.Generator().manual_seed(seed)
        std = getattr(tc, "initializer_range", 0.02)
        with torch.no_grad():
            for module in model.modules():
                if isinstance(module, nn.Linear):
                    module.weight.normal_(0.0, std, generator=gen)
            if cfg.draft_vocab_size < vocab:
                used = torch.randperm(vocab, generator=gen)[: cfg.draft_vocab_size].sort().values
                model.d2t.copy_(used - torch.arange(cfg.draft_vocab_size))
                model.t2d.zero_()
                model.t2d[used] = True
        model.to(device=emb.device, dtype=dtype or emb.dtype)
        return cls(model, target=target, **kwargs)

    @classmethod
    def from_pretrained(
        cls,
        path: str | os.PathLike,
        *,
        target,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        **kwargs,
    ) -> Eagle3Drafter:
        """Load an EAGLE-3 checkpoint (``config.json`` + ``*.safetensors`` or ``pytorch_model.bin``) of the official,
        SpecForge or speculators layout, unchanged.

        Args:
            path: a local folder, or a hub repo id (``owner/name``, downloaded with ``huggingface_hub``).
            target: the HF causal LM (or ``TargetModel``) it drafts for.
            device, dtype: default the target's.
            **kwargs: for the drafter (``tree_depth``).
        """
        if target is None:
            raise ValueError(
                "Eagle3Drafter.from_pretrained needs target=<the model it drafts for>: the fused layers and the "
                "embedding come from it."
            )
        folder = resolve_checkpoint(path, what="EAGLE-3 checkpoint folder",
                                    patterns=["config.json", "*.safetensors", "pytorch_model*.bin"])
        cfg = Eagle3Config.from_dict(json.loads((folder / "config.json").read_text()))
        state = {rename(k, _ALIASES): v for k, v in _read_weights(folder).items() if not k.startswith(_TARGET_COPIES)}
        fc = state.get("fc.weight")
        if fc is not None and fc.shape[1] != cfg.num_aux * cfg.context_size:
            width, rem = divmod(fc.shape[1], cfg.num_aux)
            if rem:
                raise ValueError(
                    f"{folder}: fc.weight has {fc.shape[1]} input features, not a multiple of the {cfg.num_aux} fused "
                    "target states: the config does not match the weights."
                )
            cfg = cfg.replace(target_hidden_size=width)
        if cfg.draft_vocab_size == cfg.vocab_size:  # the official layout drops identity maps
            state.setdefault("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
            state.setdefault("t2d", torch.ones(cfg.vocab_size, dtype=torch.bool))
        for name in ("d2t", "t2d"):
            if name not in state:
                raise ValueError(
                    f"{folder}: draft_vocab_size={cfg.draft_vocab_size} < vocab_size={cfg.vocab_size} but the weights "
                    f"have no {name!r} map between the vocabularies: the checkpoint is incomplete."
                )
        state["d2t"], state["t2d"] = state["d2t"].long(), state["t2d"].bool()
        _check_vocab_maps(folder, state["d2t"], state["t2d"], cfg)
        with torch.device("meta"):
            model = Eagle3Model(cfg)
            if "embed_tokens.weight" in state:
                model.embed_tokens = nn.Embedding(*state["embed_tokens.weight"].shape)
        load_exact(model, state, folder=folder, layout=f"EAGLE-3 ({cfg.layout})", doc="docs/eagle3.md")
        emb = hf_causal_lm(target).get_input_embeddings().weight
        model.to(device=device or emb.device, dtype=dtype or emb.dtype)
        return cls(model, target=target, **kwargs)

    def save_pretrained(self, path: str | os.PathLike, *, dtype: torch.dtype | None = None) -> None:
        """Write ``config.json`` + ``model.safetensors`` in the official layout (``midlayer.*``; ``d2t``/``t2d`` only
        for a reduced draft vocabulary; ``embed_tokens`` only if the head has its own).

        Args:
            path: output folder (created).
            dtype (torch.dtype | None): cast the floating-point weights on save; default as held.
        """
        from safetensors.torch import save_file

        folder = Path(path)
        folder.mkdir(parents=True, exist_ok=True)
        cfg = self.config
        state = {}
        for k, v in self.model.state_dict().items():
            if k in ("d2t", "t2d") and cfg.draft_vocab_size == cfg.vocab_size:
                continue
            v = v.detach()
            state[k] = (v.to(dtype) if dtype is not None and v.is_floating_point() else v).contiguous().cpu()
        raw = cfg.to_dict()
        raw["torch_dtype"] = str(self.model.fc.weight.dtype if dtype is None else dtype).removeprefix("torch.")
        save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
        (folder / "config.json").write_text(json.dumps(raw, indent=2) + "\n")

    def bind(self, target) -> Eagle3Drafter:
        """Fix the fused layers for ``target`` and borrow its input embedding (unless the head has its own)."""
        hf = hf_causal_lm(target)
        depth = text_config(hf).num_hidden_layers
        layers = fused_layers(self.config.aux_layer_ids, depth)
        bad = [i for i in layers if not 1 <= i <= depth]
        if bad:
            raise ValueError(
                f"EAGLE-3 fuses target hidden_states {layers} (config ids {self.config.aux_layer_ids}) but {bad} are "
                f"not outputs of this target's {depth} layers (1..{depth}): use a head made for this target, or a "
                "target deep enough for the default [2, N//2, N-3]."
            )
        self.hidden_state_ids = layers
        self.target_layer_ids: tuple[int, ...] = tuple(i - 1 for i in layers)  # the protocol counts layer outputs
        if self.model.embed_tokens is None:
            self._embed = replicated(hf.get_input_embeddings())
        note_target(self, hf)  # a later cast or move of the target moves the head too (drafters/follow.py)
        self._bound = id(hf)  # (not the module: the drafter holds no reference to the target)
        return self

    def to(self, device=None, dtype: torch.dtype | None = None) -> Eagle3Drafter:
        """Move the head's own weights (a borrowed embedding stays with the target). ``generate`` calls it when the
        target was cast or moved since the drafter last ran with it (``specdec.drafters.follow``)."""
        self.model.to(device=device, dtype=dtype)
        return self

    # -- Drafter protocol --------------------------------------------------------------------------------
    def validate(self, target, tree) -> None:
        """Check that this head fits ``target`` (fused widths, vocabulary, device); binds it."""
        hf = hf_causal_lm(target)
        if id(hf) != self._bound:
            self.bind(hf)
        tc, cfg = text_config(hf), self.config
        want = cfg.num_aux * tc.hidden_size
        if self.model.fc.in_features != want:
            raise ValueError(
                f"EAGLE-3 fc takes {self.model.fc.in_features} features but {cfg.num_aux} states of this target "
                f"(hidden {tc.hidden_size}) give {want}: the head was made for a target of another width."
            )
        rows, width = self._embed.weight.shape
        if rows != cfg.vocab_size or width != cfg.hidden_size:
            raise ValueError(
                f"EAGLE-3 head expects an embedding of {cfg.vocab_size} x {cfg.hidden_size} (vocab_size x "
                f"hidden_size) but the target's is {rows} x {width}: use a head made for this target's tokenizer."
            )
        topk = getattr(tree, "candidate_topk", None)
        if topk is not None and topk > cfg.draft_vocab_size:
            raise ValueError(
                f"{tree!r} expands {topk} candidates per node but this EAGLE-3 head drafts over {cfg.draft_vocab_size} "
                f"tokens: pass topk <= {cfg.draft_vocab_size}."
            )
        if self.model.fc.weight.device != self._embed.weight.device:
            raise ValueError(
                f"The EAGLE-3 head is on {self.model.fc.weight.device} but the target on {self._embed.weight.device}: "
                "call drafter.to(target.device)."
            )

    def draft_depth(self, tree) -> int:
        """Greedy steps per round (``GreedySteps``), or the levels of the candidate tree a policy that reads
        ``candidates`` asks for (``DynamicTree``: its own; ``DDTree(candidates=True)``: ``min(budget, tree_depth)``)."""
        if getattr(tree, "candidate_topk", None) is not None and getattr(tree, "levels", None) is not None:
            return tree.levels
        return super().draft_depth(tree)

    def forwards_per_round(self, tree) -> int:
        """The draft steps plus the one forward over the accepted tokens."""
        return self.draft_depth(tree) + 1

    def attach(self, target, capacity: int, batch: int = 1):
        """The head's static storage and round code for sequences of up to ``capacity`` tokens."""
        from specdec.drafters.eagle3_static import Eagle3Static

        return Eagle3Static(self, capacity, batch)


def _check_vocab_maps(folder: Path, d2t: torch.Tensor, t2d: torch.Tensor, cfg: Eagle3Config) -> None:
    """``d2t [Vd]`` must send every draft id into the target vocabulary; ``t2d [V]`` should mark exactly those ids."""
    if d2t.shape != (cfg.draft_vocab_size,) or t2d.shape != (cfg.vocab_size,):
        raise ValueError(
            f"{folder}: d2t {tuple(d2t.shape)} / t2d {tuple(t2d.shape)} do not match draft_vocab_size="
            f"{cfg.draft_vocab_size} / vocab_size={cfg.vocab_size}: the config does not match the weights."
        )
    ids = torch.arange(cfg.draft_vocab_size) + d2t
    if bool(((ids < 0) | (ids >= cfg.vocab_size)).any()):
        raise ValueError(
            f"{folder}: d2t sends draft ids outside the target vocabulary [0, {cfg.vocab_size}): target id = draft id "
            "+ d2t[draft id] must be a valid target id; the map is corrupt or meant for another target."
        )
    marked = torch.zeros(cfg.vocab_size, dtype=torch.bool).index_fill(0, ids, True)
    if not torch.equal(marked, t2d):
        logger.warning(
            "%s: t2d marks %d target ids but d2t maps to %d others; drafting follows d2t.",
            folder, int(t2d.sum()), int((marked & ~t2d).sum()),
        )  # fmt: skip


def _read_weights(folder: Path) -> dict[str, torch.Tensor]:
    files = sorted(folder.glob("*.safetensors"))
    if files:
        from safetensors.torch import load_file

        state: dict[str, torch.Tensor] = {}
        for file in files:
            state.update(load_file(str(file)))
        return state
    bins = sorted(folder.glob("pytorch_model*.bin"))
    if not bins:
        raise FileNotFoundError(f"{folder} holds neither *.safetensors nor pytorch_model.bin weights.")
    state = {}
    for file in bins:
        state.update(torch.load(file, map_location="cpu", weights_only=True))
    return state
