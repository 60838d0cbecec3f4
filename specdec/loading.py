"""Building the pieces of a run from plain settings: target, tokenizer, drafter, tree, prompts.

Shared by the CLI and the benchmark harness; takes plain values (no hydra here). Local paths resolve
independently of the working directory (``specdec.paths``); only an ``owner/name`` id reaches the hub.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from specdec.paths import is_local_path, resolve_path, zoo_dir
from specdec.types import Chain, DDTree, TreeSpec

__all__ = [
    "build_drafter",
    "build_tree",
    "load_prompts",
    "load_target",
    "load_tokenizer",
    "resolve_device",
    "resolve_model_path",
    "zoo_dir",
]

logger = logging.getLogger(__name__)


def resolve_model_path(path: str | Path, *, what: str = "model folder") -> str:
    """A local folder (resolved wherever the working directory is) or a hub id ``owner/name``, as a string.

    A local-looking path (``./x``, ``/x``, ``x/y/z``, an existing parent folder, ...) that does not exist raises
    ``FileNotFoundError`` naming the paths tried; it is never sent to the hub.
    """
    if is_local_path(path) or Path(path).exists():
        return str(resolve_path(path, what=what))
    return str(path)


def resolve_device(device: str | None = "auto", dtype: str | None = "auto") -> tuple[torch.device, torch.dtype]:
    """``"auto"`` (or ``None``) = the current accelerator if there is one, else CPU; ``"auto"`` (or ``None``)
    dtype = bf16 on an accelerator, fp32 on CPU."""
    if device in (None, "auto"):
        accelerator = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
        device = accelerator if accelerator is not None else "cpu"
    dev = torch.device(device)
    if dtype in (None, "auto"):
        return dev, torch.float32 if dev.type == "cpu" else torch.bfloat16
    return dev, getattr(torch, dtype)


def load_target(path: str | Path, *, device: torch.device, dtype: torch.dtype, attn_implementation: str = "sdpa"):
    """An HF causal LM from a local folder (see :func:`resolve_model_path`) or a hub id, in eval mode."""
    from transformers import AutoModelForCausalLM

    path = resolve_model_path(path, what="model folder")
    if Path(path).exists() and not Path(path).is_dir():
        raise FileNotFoundError(f"{path} is a file; target.path must be a model folder (config.json + weights).")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation=attn_implementation)
    return model.to(device).eval()


def load_tokenizer(path: str | Path):
    """An HF tokenizer from a local folder (see :func:`resolve_model_path`) or a hub id."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_model_path(path, what="tokenizer folder"))


def load_prompts(path: str | Path | None = None, *, limit: int | None = None, text: str | None = None) -> list[dict]:
    """Prompts as ``{"id", "prompt", ...}`` dicts from a JSONL file (default the zoo's dev prompts), or one
    literal ``text``; ``limit`` keeps the first prompts."""
    if text is not None:
        return [{"id": "text", "prompt": text}]
    path = zoo_dir() / "prompts_dev.jsonl" if path is None else resolve_path(path, what="prompts file")
    if not Path(path).is_file():
        raise FileNotFoundError(f"No prompts file at {path}; give prompts.path (JSONL with a 'prompt' field).")
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    for i, row in enumerate(rows):
        row.setdefault("id", str(i))
        if "prompt" not in row:
            raise ValueError(f"{path}: line {i + 1} has no 'prompt' field.")
    return rows[:limit] if limit else rows


def build_tree(name: str, **kw) -> TreeSpec:
    if name == "chain":
        return Chain(k=int(kw.get("k", 4)))
    if name == "ddtree":
        topk = kw.get("topk")
        return DDTree(budget=int(kw.get("budget", 15)), topk=None if topk is None else int(topk))
    raise ValueError(f"Unknown tree {name!r}; choose 'chain' or 'ddtree'.")


def build_drafter(name: str, target, **kw):
    """A drafter by name: ``none``, ``ngram``, ``model`` (``path`` or ``truncate_layers``) or ``dflash`` (``path``,
    ``strict``). Paths resolve as in :func:`resolve_model_path` (``assets/drafters/zoo-dense`` from any folder)."""
    if name == "none":
        return None
    if name == "ngram":
        from specdec.drafters.ngram import NGramDrafter

        return NGramDrafter(**{k: int(v) for k, v in kw.items() if k in ("max_ngram", "min_ngram", "max_matches")})
    if name == "model":
        from specdec.drafters.model import ModelDrafter

        depth = int(kw.get("tree_depth", 8))
        if kw.get("path"):
            device, dtype = target.device, target.dtype
            draft = load_target(kw["path"], device=device, dtype=dtype, attn_implementation="sdpa")
            return ModelDrafter(draft, tree_depth=depth)
        return ModelDrafter.from_target_layers(target, int(kw.get("truncate_layers", 2)), tree_depth=depth)
    if name == "dflash":
        from specdec.drafters.dflash import DFlashDrafter

        if not kw.get("path"):
            raise ValueError("drafter=dflash needs a checkpoint: drafter.path=<folder or hub id owner/name>.")
        path = resolve_model_path(kw["path"], what="DFlash checkpoint folder")
        return DFlashDrafter.from_pretrained(path, target=target, strict=bool(kw.get("strict", False)))
    raise ValueError(f"Unknown drafter {name!r}; choose none, ngram, model or dflash.")
