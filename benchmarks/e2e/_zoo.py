"""Shared by the end-to-end benchmarks: a zoo target with its drafter, and the dev prompts that decode anything."""

from __future__ import annotations

import torch
from transformers import AutoTokenizer

from specdec.drafters.dflash import DFlashDrafter
from specdec.loading import load_prompts, load_target, zoo_dir


def add_pair_args(ap, *, kind: str = "dense") -> None:
    """The arguments every zoo benchmark takes: ``--target`` and ``--drafter`` (the zoo's ``kind`` pair by
    default), ``--device`` and ``--dtype`` (``auto``: ``specdec.loading.resolve_device``)."""
    ap.add_argument("--target", default=f"target-{kind}")
    ap.add_argument("--drafter", default=f"assets/drafters/zoo-{kind}", help="DFlash checkpoint folder")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto")


def zoo_pair(target: str, drafter: str, device: torch.device, dtype: torch.dtype):
    """(model, tokenizer, DFlash drafter) for a zoo target folder name and a drafter checkpoint path."""
    model = load_target(zoo_dir() / target, device=device, dtype=dtype)
    tok = AutoTokenizer.from_pretrained(zoo_dir() / "tokenizer")
    return model, tok, DFlashDrafter.from_pretrained(drafter, target=model)


@torch.no_grad()
def decodable_prompts(model, tok, num_prompts: int) -> list[tuple[str, torch.Tensor]]:
    """The first ``num_prompts`` dev prompts whose first greedy token is not EOS, as ``(id, input_ids)``."""
    eos = model.generation_config.eos_token_id
    prompts = []
    for p in load_prompts():
        ids = tok(p["prompt"], return_tensors="pt").input_ids.to(model.device)
        if int(model(ids).logits[0, -1].argmax()) != eos:
            prompts.append((p["id"], ids))
        if len(prompts) == num_prompts:
            break
    return prompts
