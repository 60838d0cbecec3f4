"""Building the pieces of a run from plain settings: target, tokenizer, drafter, tree, prompts.

Shared by the CLI and the benchmark harness; takes plain values (no hydra here).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import torch

from specdec.types import Chain, DDTree, TreeSpec

__all__ = ["build_drafter", "build_tree", "load_prompts", "load_target", "resolve_device", "zoo_dir"]

logger = logging.getLogger(__name__)


def zoo_dir() -> Path:
    """The zoo of trained fixtures: ``$SPECDEC_ZOO``, else ``../shared/zoo`` relative to the repository root."""
    env = os.environ.get("SPECDEC_ZOO")
    return Path(env) if env else Path(__file__).resolve().parents[1].parent / "shared" / "zoo"


def resolve_device(device: str = "auto", dtype: str = "auto") -> tuple[torch.device, torch.dtype]:
    """``"auto"`` = the current accelerator if there is one, else CPU; ``"auto"`` dtype = bf16 on an
    accelerator, fp32 on CPU."""
    if device == "auto":
        accelerator = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
        device = accelerator if accelerator is not None else "cpu"
    dev = torch.device(device)
    if dtype == "auto":
        return dev, torch.float32 if dev.type == "cpu" else torch.bfloat16
    return dev, getattr(torch, dtype)


def load_target(path: str | Path, *, device: torch.device, dtype: torch.dtype, attn_implementation: str = "sdpa"):
    """An HF causal LM from a local folder, in eval mode."""
    from transformers import AutoModelForCausalLM

    if not Path(path).is_dir():
        raise FileNotFoundError(f"No model folder at {path}; set SPECDEC_ZOO or target.path to a local checkpoint.")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation=attn_implementation)
    return model.to(device).eval()


def load_prompts(path: str | Path | None = None, *, limit: int | None = None, text: str | None = None) -> list[dict]:
    """Prompts as ``{"id", "prompt", ...}`` dicts from a JSONL file (default the zoo's dev prompts), or one
    literal ``text``; ``limit`` keeps the first prompts."""
    if text is not None:
        return [{"id": "text", "prompt": text}]
    path = zoo_dir() / "prompts_dev.jsonl" if path is None else path
    if path is None or not Path(path).is_file():
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
    """A drafter by name: ``none``, ``ngram``, ``model`` (``path`` or ``truncate_layers``) or ``dflash`` (``path``)."""
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

        return DFlashDrafter.from_pretrained(kw["path"], target=target)
    raise ValueError(f"Unknown drafter {name!r}; choose none, ngram, model or dflash.")
