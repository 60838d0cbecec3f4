"""Multi-turn conversations: each turn's prompt is the previous turn's whole sequence plus a new message, decoded
with prefix reuse on (the default: only the new tokens are prefilled) and off (``reuse_prefix=False``), side by
side in one run. Conversation c is built from prompts ``c * turns .. c * turns + turns - 1``: turn t appends the
last ``turn_tokens`` tokens of prompt ``c * turns + t``. Reports the prefill ms of every turn, the end-to-end tok/s
of whole conversations (prefill included) and whether the outputs with and without reuse are identical.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path

import torch

import specdec
from specdec.bench.harness import Method

__all__ = ["conversations", "multi_turn_table", "run_multi_turn"]

logger = logging.getLogger(__name__)


def conversations(
    tokenizer, prompts: Sequence[dict], *, turns: int, turn_tokens: int, device
) -> list[list[torch.Tensor]]:
    """``len(prompts) // turns`` conversations of ``turns`` messages ``[1, n]`` each (token ids on ``device``)."""
    if turns < 1 or turn_tokens < 1:
        raise ValueError(f"multi_turn: turns={turns} and turn_tokens={turn_tokens} must be >= 1.")
    count = len(prompts) // turns
    if count < 1:
        raise ValueError(
            f"multi_turn: {len(prompts)} prompts make no conversation of {turns} turns; raise num_prompts."
        )
    out = []
    for c in range(count):
        messages = []
        for row in prompts[c * turns : (c + 1) * turns]:
            ids = tokenizer(row["prompt"], return_tensors="pt").input_ids[:, -turn_tokens:]
            messages.append(ids.to(device))
        out.append(messages)
    return out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_multi_turn(
    model,
    tokenizer,
    prompts: Sequence[dict],
    methods: Sequence[Method],
    *,
    turns: int = 4,
    turn_tokens: int = 64,
    max_new_tokens: int = 128,
    warmup: int = 1,
    out_dir: str | os.PathLike | None = None,
) -> list[dict]:
    """Decode every conversation with each method, prefix reuse on and off; returns one row per (method, reuse,
    conversation, turn) of the timed pass (``prefill_ms``, ``reused_tokens``, ``new_tokens``, ``wall_s``,
    ``prompt_tokens``, ``tokens``) and writes ``multi_turn.jsonl`` / ``multi_turn.md`` to ``out_dir``."""
    device = next(model.parameters()).device
    chats = conversations(tokenizer, prompts, turns=turns, turn_tokens=turn_tokens, device=device)
    rows: list[dict] = []
    for method in methods:
        if method.hf is not None:
            logger.warning("multi_turn: skipping %s (HF rows have no prefix reuse to compare)", method.name)
            continue
        drafter = method.make_drafter()
        tree = (method.tree or getattr(drafter, "default_tree", None) or specdec.Chain(k=4)) if drafter else None
        kwargs = {"max_new_tokens": max_new_tokens, **(method.generation or {})}
        for reuse in (True, False):
            for timed in [False] * warmup + [True]:
                for c, messages in enumerate(chats):
                    ids = messages[0]
                    for t in range(turns):
                        _sync(device)
                        start = time.perf_counter()
                        out = specdec.generate(model, ids, drafter=drafter, tree=tree, verifier=method.verifier,
                                               attention_mask=torch.ones_like(ids), reuse_prefix=reuse,
                                               **kwargs)  # fmt: skip
                        _sync(device)
                        wall = time.perf_counter() - start
                        if timed:
                            rows.append({
                                "method": method.name, "reuse": reuse, "conversation": c, "turn": t,
                                "prompt_tokens": ids.shape[1], "reused_tokens": out.stats.reused_tokens,
                                "prefill_ms": out.stats.phase_ms.get("prefill", 0.0),
                                "new_tokens": out.stats.new_tokens, "wall_s": wall,
                                "tokens": out.sequences[0, ids.shape[1] :].tolist(),
                            })  # fmt: skip
                        if t + 1 < turns:
                            new = out.sequences[:, : ids.shape[1] + out.stats.new_tokens]
                            ids = torch.cat([new, messages[t + 1]], 1)
    table = multi_turn_table(rows, turns=turns)
    if out_dir is not None:
        path = Path(out_dir)
        path.mkdir(parents=True, exist_ok=True)
        (path / "multi_turn.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (path / "multi_turn.md").write_text(table + "\n")
    return rows


def multi_turn_table(rows: Sequence[dict], *, turns: int) -> str:
    """Markdown: per method and reuse setting, the mean prefill ms of each turn and its mean prompt length, the
    prefill of turns 2+ against the same turns without reuse, end-to-end tok/s of the conversations and its ratio,
    and the share of turns whose tokens equal those decoded without reuse."""
    head = ["method", "reuse", *[f"turn {t + 1} prefill ms (prompt)" for t in range(turns)],
            "prefill turns 2+ / without reuse", "tok/s (end to end)", "tok/s / without reuse",
            "= without reuse"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    methods = list(dict.fromkeys(r["method"] for r in rows))

    def pick(method, reuse, turn=None):
        return [
            r for r in rows if r["method"] == method and r["reuse"] == reuse and (turn is None or r["turn"] == turn)
        ]

    for method in methods:
        off_rows = {(r["conversation"], r["turn"]): r for r in pick(method, False)}
        later_off = [r["prefill_ms"] for r in pick(method, False) if r["turn"] > 0]
        total_off = sum(r["new_tokens"] for r in pick(method, False)) / max(
            sum(r["wall_s"] for r in pick(method, False)), 1e-9
        )
        for reuse in (True, False):
            sel = pick(method, reuse)
            cells = [method, "on" if reuse else "off"]
            for t in range(turns):
                at = pick(method, reuse, t)
                ms = sum(r["prefill_ms"] for r in at) / max(len(at), 1)
                length = sum(r["prompt_tokens"] for r in at) / max(len(at), 1)
                cells.append(f"{ms:.2f} ({length:.0f})")
            later = [r["prefill_ms"] for r in sel if r["turn"] > 0]
            ratio = (sum(later) / len(later)) / (sum(later_off) / len(later_off)) if later and later_off else None
            tok_s = sum(r["new_tokens"] for r in sel) / max(sum(r["wall_s"] for r in sel), 1e-9)
            same = [r["tokens"] == off_rows[(r["conversation"], r["turn"])]["tokens"] for r in sel
                    if (r["conversation"], r["turn"]) in off_rows]  # fmt: skip
            cells += [
                "–" if ratio is None else f"{ratio:.2f}×",
                f"{tok_s:.1f}",
                f"{tok_s / total_off:.2f}×" if total_off else "–",
                f"{100 * sum(same) / len(same):.0f}%" if same else "–",
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
