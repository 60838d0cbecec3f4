"""MTP drafter: the multi-token-prediction head that Qwen3-Next / Qwen3.5 checkpoints ship (``mtp.*`` tensors).

The head (``mtp_model.py``) reads the target's last hidden state (after its final norm; tapped from the target's
own verify forward as ``hidden_states[num_layers]``) and the next token's embedding, and predicts the token after
that. Drafting ``D`` deep reuses its one layer ``D`` times greedily, each step feeding back its own normalised
output and the token it drafted (``mtp_static.py``), into per-depth log-probabilities for ``Chain`` and ``DDTree``.
Checkpoint layout and what is read: ``docs/mtp.md``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from pathlib import Path

import torch

from specdec.distributed import replicated
from specdec.drafters.checkpoints import GreedySteps, resolve_checkpoint
from specdec.drafters.follow import note_target
from specdec.drafters.mtp_model import MTPModule, from_checkpoint_names, hf_model, text_model, to_checkpoint_names
from specdec.paths import resolve_path
from specdec.trees import Chain

__all__ = ["MTPDrafter", "mtp_layer_count", "read_mtp_tensors", "with_mtp_head", "write_mtp_head"]

logger = logging.getLogger(__name__)

PREFIX = "mtp."
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
SHARD = "model-mtp.safetensors"  # where save_pretrained puts the head in a sharded checkpoint
_COUNT_KEYS = ("num_nextn_predict_layers", "mtp_num_hidden_layers")


def _configs(raw: dict) -> list[dict]:
    """``config.json`` and its text config (vision-language checkpoints nest the LM's settings)."""
    text = raw.get("text_config")
    return [raw] + ([text] if isinstance(text, dict) else [])


def mtp_layer_count(raw: dict) -> int | None:
    """MTP layers a ``config.json`` declares (``num_nextn_predict_layers`` or ``mtp_num_hidden_layers``), or None."""
    for cfg in _configs(raw):
        for key in _COUNT_KEYS:
            if cfg.get(key) is not None:
                return int(cfg[key])
    return None


def read_mtp_tensors(folder: Path) -> dict[str, torch.Tensor]:
    """Every ``mtp.*`` tensor of the checkpoint in ``folder`` (the files ``model.safetensors.index.json`` names, else
    every ``*.safetensors``), names unchanged."""
    from safetensors import safe_open

    index = folder / INDEX
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        files: dict[str, list[str]] = {}
        for name, file in weight_map.items():
            if name.startswith(PREFIX):
                files.setdefault(file, []).append(name)
        plan = [(folder / file, names) for file, names in sorted(files.items())]
    else:
        plan = [(file, None) for file in sorted(folder.glob("*.safetensors"))]
    out: dict[str, torch.Tensor] = {}
    for file, names in plan:
        with safe_open(str(file), framework="pt") as f:
            wanted = names if names is not None else [k for k in f.keys() if k.startswith(PREFIX)]  # noqa: SIM118
            for name in wanted:
                out[name] = f.get_tensor(name)
    return out


def _shape(hf) -> tuple:
    """What a head must match in a target: its class, width, depth and vocabulary."""
    cfg = text_model(hf).config
    return (type(hf).__name__, cfg.hidden_size, cfg.num_hidden_layers, hf.get_output_embeddings().weight.shape[0])


class MTPDrafter(GreedySteps):
    """Drafts with the target checkpoint's own MTP head (Drafter protocol).

    Args:
        module (MTPModule): the head's weights, built for ``target``.
        target: the HF causal LM (or ``TargetModel``) whose embedding and LM head the head shares.
        tree_depth (int): drafted depth for branching policies (``DDTree``): greedy steps whose distributions
            feed the builder. Default 8.

    Examples:
        >>> model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen3-Next-80B-A3B-Instruct")
        >>> drafter = specdec.MTPDrafter.from_pretrained("Qwen/Qwen3-Next-80B-A3B-Instruct", target=model)
        >>> out = specdec.generate(model, ids, drafter=drafter, tree=specdec.Chain(k=3), max_new_tokens=128)
    """

    def __init__(self, module: MTPModule, target, *, tree_depth: int = 8) -> None:
        if isinstance(tree_depth, bool) or not isinstance(tree_depth, int):
            raise TypeError(f"MTPDrafter: tree_depth={tree_depth!r} must be a Python int >= 1.")
        if tree_depth < 1:
            raise ValueError(f"MTPDrafter: tree_depth={tree_depth} must be >= 1.")
        if not isinstance(module, MTPModule):
            raise TypeError(
                f"MTPDrafter takes an MTPModule, got {type(module).__name__}; use MTPDrafter.from_pretrained."
            )
        if len(module.layers) != 1:
            raise NotImplementedError(
                f"This MTP head has {len(module.layers)} layers; MTPDrafter drafts with one MTP layer (the published "
                "Qwen3-Next / Qwen3.5 heads)."
            )
        self.model = module.eval()
        self.tree_depth = tree_depth
        self.num_forwards = 0
        self.default_tree = Chain(k=3)
        self.bind(target)

    @classmethod
    def from_pretrained(
        cls, path: str | os.PathLike, *, target, tree_depth: int = 8, dtype: torch.dtype | None = None
    ) -> MTPDrafter:
        """The MTP head of the checkpoint at ``path`` (a folder or hub id; the target's own checkpoint), built for
        ``target`` (on its device; in its dtype unless ``dtype``)."""
        folder = resolve_checkpoint(path, what="checkpoint folder", patterns=["*.json", "*.safetensors"])
        raw = json.loads((folder / "config.json").read_text())
        if any(cfg.get("mtp_use_dedicated_embeddings") for cfg in _configs(raw)):
            raise NotImplementedError(
                f"{folder}: mtp_use_dedicated_embeddings is set; MTPDrafter shares the target's embedding (the "
                "published heads do)."
            )
        tensors = read_mtp_tensors(folder)
        if not tensors:
            raise ValueError(
                f"{folder} holds no mtp.* tensors (config: {dict.fromkeys(_COUNT_KEYS)} -> "
                f"{mtp_layer_count(raw)}). transformers drops the MTP head on load, so a folder written by "
                "model.save_pretrained() has none: load the head from the original checkpoint (its hub id or "
                "download folder), or write one into the folder with MTPDrafter.save_pretrained(folder)."
            )
        layers = {int(m.group(1)) for name in tensors if (m := re.match(r"mtp\.layers\.(\d+)\.", name))}
        count = mtp_layer_count(raw) or len(layers)
        if count != 1 or layers != {0}:
            raise NotImplementedError(
                f"{folder}: the MTP head has {count} layer(s) (tensors for layers {sorted(layers)}); MTPDrafter drafts "
                "with one MTP layer."
            )
        hf = hf_model(target)
        module = MTPModule(hf, num_layers=1)
        state = from_checkpoint_names(module, {name[len(PREFIX) :]: t for name, t in tensors.items()})
        expected = module.state_dict()
        missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
        if missing or unexpected:
            raise ValueError(
                f"{folder}: the mtp.* tensors do not match an MTP head of {type(hf).__name__}: missing "
                f"{[PREFIX + k for k in missing[:6]]}, unexpected {[PREFIX + k for k in unexpected[:6]]} (the layout "
                "of docs/mtp.md); is this checkpoint the target's own?"
            )
        bad = [k for k, v in state.items() if tuple(v.shape) != tuple(expected[k].shape)]
        if bad:
            k = bad[0]
            raise ValueError(
                f"{folder}: {PREFIX}{k} has shape {tuple(state[k].shape)}, the target's MTP head needs "
                f"{tuple(expected[k].shape)}: the checkpoint is not the target's own."
            )
        module.load_state_dict(state, strict=True)
        if dtype is not None:
            module.to(dtype=dtype)
        return cls(module, hf, tree_depth=tree_depth)

    @classmethod
    def random(
        cls, target, *, seed: int = 0, std: float | None = None, tree_depth: int = 8, dtype: torch.dtype | None = None
    ) -> MTPDrafter:
        """A randomly initialised head for ``target`` (tests and benchmarks; it drafts poorly): every matrix drawn
        from N(0, std), ``std`` default the target's ``initializer_range``; norms as their class builds them."""
        hf = hf_model(target)
        model = MTPModule(hf, num_layers=1)
        std = std if std is not None else getattr(text_model(hf).config, "initializer_range", 0.02)
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for param in model.parameters():
                if param.dim() >= 2:
                    param.copy_(torch.randn(param.shape, generator=gen) * std)
        if dtype is not None:
            model.to(dtype=dtype)
        return cls(model, hf, tree_depth=tree_depth)

    def save_pretrained(self, path: str | os.PathLike, *, checkpoint: str | os.PathLike | None = None) -> None:
        """Write the head as ``mtp.*`` tensors (the published layout) into the checkpoint folder ``path``.

        Args:
            path: a checkpoint folder (e.g. written by ``model.save_pretrained(path)``, which drops the head); with
                ``checkpoint``, created as a copy of that folder first.
            checkpoint: a checkpoint folder to copy into ``path`` before writing. Default None.

        A single-file checkpoint gets the tensors added to ``model.safetensors``; a sharded one gets them in
        ``model-mtp.safetensors`` and its index. ``config.json`` gets the layer count if it had none.
        """
        folder = Path(path)
        if checkpoint is not None:
            _copy_checkpoint(resolve_path(checkpoint, what="checkpoint folder"), folder)
        _add_tensors(folder, _head_tensors(self), len(self.model.layers))

    def bind(self, target) -> MTPDrafter:
        """Share ``target``'s embedding, LM head and rotary embedding; tap its last layer."""
        hf = hf_model(target)
        stack = text_model(hf)
        # a target sharded by a tensor-parallel plan lends whole copies (the head is replicated on every rank)
        self._embed = replicated(hf.get_input_embeddings())
        self._lm_head = replicated(hf.get_output_embeddings())
        self._rotary = stack.rotary_emb
        self._hf_id = id(hf)
        self._shape = _shape(hf)
        # hidden_states[num_layers] of an HF forward: the last layer's output after the final norm
        self.target_layer_ids: tuple[int, ...] = (stack.config.num_hidden_layers - 1,)
        note_target(self, hf)
        return self

    def to(self, device=None, dtype: torch.dtype | None = None) -> MTPDrafter:
        """Move the head's own weights (the shared modules stay with the target)."""
        self.model.to(device=device, dtype=dtype)
        return self

    # -- Drafter protocol --------------------------------------------------------------------------------
    def validate(self, target, tree) -> None:
        """Check that the head fits ``target`` (the model it was built for, or one of the same class and shape,
        which it then binds) and sits on its device."""
        hf = hf_model(target)
        if id(hf) != self._hf_id:
            if _shape(hf) != self._shape:
                raise ValueError(
                    f"This MTP head was built for a {self._shape[0]} of hidden size {self._shape[1]}, "
                    f"{self._shape[2]} layers and vocabulary {self._shape[3]}, not this {_shape(hf)}: load the "
                    "head of this target's checkpoint with MTPDrafter.from_pretrained(checkpoint, target=model)."
                )
            self.bind(hf)
        weight = self.model.fc.weight
        if weight.device != self._embed.weight.device:
            raise ValueError(
                f"The MTP head is on {weight.device} but the target on {self._embed.weight.device}: call "
                "drafter.to(target.device)."
            )

    def forwards_per_round(self, tree) -> int:
        """``D`` draft steps and the commit's pass over the accepted path."""
        return self.draft_depth(tree) + 1

    def attach(self, target, capacity: int, batch: int = 1):
        """The head's static K/V and round code for ``batch`` sequences of up to ``capacity`` tokens."""
        from specdec.drafters.mtp_static import MTPStatic

        return MTPStatic(self, capacity, batch)

    def logq(self, out: torch.Tensor) -> torch.Tensor:
        """fp32 log-softmax of the target's LM head on the head's normalised output ``out [..., H]``."""
        head = self._lm_head
        return torch.log_softmax(head(out.to(head.weight.dtype)), dim=-1, dtype=torch.float32)


def _copy_checkpoint(source: Path, folder: Path) -> None:
    """Copy the checkpoint folder ``source`` to ``folder``, the copy writable by its owner (a read-only source, such
    as a shared model store, keeps its mode bits in a plain ``copytree``)."""
    shutil.copytree(source, folder, dirs_exist_ok=True)
    for path in (folder, *folder.rglob("*")):
        path.chmod(path.stat().st_mode | (0o700 if path.is_dir() else 0o600))


def _head_tensors(drafter: MTPDrafter, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """The head's ``mtp.*`` tensors in the published layout (on the CPU; floating ones cast to ``dtype``)."""
    state = to_checkpoint_names(drafter.model.state_dict())
    cast = {k: v.to(dtype) if dtype is not None and v.is_floating_point() else v for k, v in state.items()}
    return {PREFIX + k: v.detach().contiguous().cpu() for k, v in cast.items()}


def _add_tensors(folder: Path, tensors: dict[str, torch.Tensor], layers: int) -> None:
    """Write ``tensors`` into the checkpoint ``folder``: a sharded one gets them in ``model-mtp.safetensors`` and its
    index, a single-file one in ``model.safetensors`` (replacing any ``mtp.*`` there); ``config.json`` gets the
    layer count if it had none."""
    from safetensors.torch import load_file, save_file

    if not (folder / "config.json").is_file():
        raise FileNotFoundError(
            f"{folder} has no config.json: save the target there first (model.save_pretrained(folder)) or pass "
            "checkpoint=<its folder>."
        )
    index = folder / INDEX
    if index.is_file():
        data = json.loads(index.read_text())
        data["weight_map"] = {k: v for k, v in data["weight_map"].items() if not k.startswith(PREFIX)}
        data["weight_map"].update(dict.fromkeys(tensors, SHARD))
        save_file(tensors, str(folder / SHARD), metadata={"format": "pt"})
        index.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    elif (folder / SINGLE).is_file():
        base = {k: v for k, v in load_file(str(folder / SINGLE)).items() if not k.startswith(PREFIX)}
        save_file({**base, **tensors}, str(folder / SINGLE), metadata={"format": "pt"})
    else:
        raise FileNotFoundError(f"{folder} has neither {INDEX} nor {SINGLE}: not a safetensors checkpoint.")
    raw = json.loads((folder / "config.json").read_text())
    if mtp_layer_count(raw) is None:
        key = "num_nextn_predict_layers" if raw.get("model_type") == "qwen3_next" else "mtp_num_hidden_layers"
        raw[key] = layers
        (folder / "config.json").write_text(json.dumps(raw, indent=2) + "\n")


def write_mtp_head(drafter: MTPDrafter, path: str | os.PathLike, *, dtype: torch.dtype | None = None) -> Path:
    """Write only the head: ``path/model-mtp.safetensors`` with its ``mtp.*`` tensors (published names; floating
    tensors cast to ``dtype`` if given). :func:`with_mtp_head` puts them into a copy of the target's checkpoint."""
    from safetensors.torch import save_file

    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(_head_tensors(drafter, dtype), str(folder / SHARD), metadata={"format": "pt"})
    return folder / SHARD


def with_mtp_head(checkpoint: str | os.PathLike, head: str | os.PathLike, out: str | os.PathLike) -> Path:
    """A copy of the target checkpoint folder ``checkpoint`` at ``out`` with the ``mtp.*`` tensors of ``head`` added
    (a folder of safetensors files, e.g. one written by :func:`write_mtp_head` or a shipped head such as
    ``assets/drafters/zoo-hybrid-mtp``): in ``model-mtp.safetensors`` and the index of a sharded checkpoint, the
    layout of a published Qwen3.5 checkpoint, so ``MTPDrafter.from_pretrained(out, target=model)`` reads it as
    it reads one. ``config.json`` gets the layer count. Returns ``out``.

    Examples:
        >>> folder = with_mtp_head(zoo / "target-hybrid", "assets/drafters/zoo-hybrid-mtp", "runs/hybrid-mtp")
        >>> drafter = MTPDrafter.from_pretrained(folder, target=model)
    """
    source = resolve_path(checkpoint, what="checkpoint folder")
    head_dir = resolve_path(head, what="MTP head folder")
    tensors = read_mtp_tensors(head_dir)
    if not tensors:
        raise ValueError(
            f"{head_dir} holds no mtp.* tensors: give the folder a training run wrote (model-mtp.safetensors) or a "
            "checkpoint with an MTP head."
        )
    layers = {int(m.group(1)) for name in tensors if (m := re.match(r"mtp\.layers\.(\d+)\.", name))}
    folder = Path(out)
    if folder.resolve() == source.resolve():
        raise ValueError(f"out={folder} is the checkpoint itself: give another folder for the copy.")
    _copy_checkpoint(source, folder)
    _add_tensors(folder, tensors, len(layers) or 1)
    return folder
