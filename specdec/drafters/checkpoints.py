"""What the drafters that load checkpoints share: finding the target's HF model, its text config, renaming
published weight names, and resolving a checkpoint folder or hub id; and the per-round bookkeeping of drafters
that draft ``D`` greedy steps into per-depth log-probabilities."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from torch import nn

from specdec.paths import is_local_path, resolve_path

__all__ = ["GreedySteps", "hf_causal_lm", "load_exact", "rename", "resolve_checkpoint", "text_config"]


def hf_causal_lm(target) -> nn.Module:
    """The HF causal LM behind ``target`` (an HF ``*ForCausalLM`` or a ``specdec.target.TargetModel``)."""
    own = isinstance(target, nn.Module) and callable(getattr(target, "get_output_embeddings", None))
    if own and target.get_output_embeddings() is not None:
        return target
    inner = getattr(target, "model", None)
    if isinstance(inner, nn.Module) and callable(getattr(inner, "get_output_embeddings", None)):
        return inner
    raise TypeError(f"Expected an HF causal LM or a specdec TargetModel, got {type(target).__name__}.")


def text_config(hf_model):
    """The text part of an HF model's config (multimodal configs nest it)."""
    cfg = hf_model.config
    return cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg


def rename(name: str, aliases: Sequence[tuple[str, str]]) -> str:
    """``name`` with each ``(old, new)`` prefix of ``aliases`` replaced, in order."""
    for old, new in aliases:
        if name.startswith(old):
            name = new + name[len(old) :]
    return name


def resolve_checkpoint(path: str | os.PathLike, *, what: str, patterns: Sequence[str]) -> Path:
    """A local checkpoint folder holding a config.json (found wherever the working directory is), or a hub id
    ``owner/name`` (only the files matching ``patterns`` downloaded)."""
    if is_local_path(path) or Path(path).exists():
        folder = resolve_path(path, what=what)
        if not (folder / "config.json").is_file():
            raise FileNotFoundError(f"{folder} has no config.json: not a {what}.")
        return folder
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(str(path), allow_patterns=list(patterns)))


def load_exact(model: nn.Module, state: dict, *, folder, layout: str, doc: str) -> None:
    """Load ``state`` into ``model`` (built on the meta device: the tensors are assigned), refusing a checkpoint whose
    tensor names differ from the model's, with the first of each difference and where the names are documented."""
    expected = set(model.state_dict())
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unexpected:
        raise ValueError(
            f"{folder} does not match the {layout} layout of its config.json: missing {missing[:8]}, unexpected "
            f"{unexpected[:8]} (tensor names are those of {doc})."
        )
    model.load_state_dict(state, strict=True, assign=True)


class GreedySteps:
    """Round bookkeeping of drafters that draft ``D`` greedy steps into ``logq [B, D, V]`` (small LM, EAGLE-3 and
    MTP heads): ``D`` is the policy's depth, capped at ``tree_depth`` for branching policies; a round writes the
    ``D + 1`` slots of its path. Subclasses set ``tree_depth``."""

    tree_depth: int
    provides: tuple[str, ...] = ("logq",)

    def reset(self) -> None:
        """Nothing to forget: the per-sequence state lives in the round's static storage."""

    def draft_depth(self, tree) -> int:
        """Greedy steps per round: the policy's depth, capped at ``tree_depth`` for branching policies."""
        return min(tree.max_depth, self.tree_depth) if tree.branching else tree.max_depth

    def window(self, tree) -> int:
        """Slots past the root a round writes (the path's rows)."""
        return self.draft_depth(tree) + 1
