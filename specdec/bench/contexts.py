"""The long-context table: decode ms per round at each prompt length beside the bytes floor of one step.

The floor of a decode step is the bytes it must read over the device's copy bandwidth: every weight once, and the
attention layers' K / V of the context it attends over (``2 * layers * H_kv * D * T`` elements; the recurrent
layers' states of a hybrid are a few MB and left out). A tree round reads the same bytes as a step (its nodes share
every weight and K / V row), so its floor is the step's; its ratio to the AR step of the same run is what decides
whether a tree pays (``τ / (round / step)``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from specdec.bench.floor import bandwidth_floor
from specdec.bench.report import aggregate

__all__ = ["context_table", "kv_bytes"]


def kv_bytes(config, context: int, itemsize: int) -> int:
    """Bytes of K and V one forward reads at ``context`` slots: full-attention layers (``layer_types`` where the
    config has them) x 2 x ``H_kv`` x head dim x ``context`` x ``itemsize``."""
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    types = getattr(config, "layer_types", None)
    layers = sum(t == "full_attention" for t in types) if types else config.num_hidden_layers
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return 2 * layers * kv_heads * head_dim * context * itemsize


def context_table(
    model,
    results: Sequence[tuple[int, list[dict]]],
    *,
    max_new_tokens: int,
    compiled: bool,
    out_dir: str | Path | None = None,
) -> str:
    """A markdown table, one line per (context, method): decode ms per round, its ratio to the AR step of the same
    context, the prefill ms, the step's bytes floor and the AR step's ratio to it. Written to
    ``out_dir/long_context.md`` as well.

    Args:
        model: the target (its config and weights give the bytes).
        results: ``(prompt tokens, bench rows)`` per context.
        max_new_tokens (int): tokens decoded per call (the floor takes the mean context of the decode).
        compiled (bool): whether the rounds were compiled (stated in the table).
    """
    floor = bandwidth_floor(model) if torch.cuda.is_available() else None
    itemsize = next(model.parameters()).element_size()
    mode = "compiled" if compiled else "default"
    lines = [
        f"| context | method | {mode} ms/round | × AR step | prefill ms | bytes floor ms | × floor |",
        "|---|---|---|---|---|---|---|",
    ]
    for context, rows in results:
        summaries = [s for s in aggregate(rows) if s.get("ms_per_round")]
        ar = next((s["ms_per_round"] for s in summaries if s["tree"] == "ar"), None)
        floor_ms = None
        if floor is not None:
            read = floor["weights_gb"] * 1e9 + kv_bytes(model.config, context + max_new_tokens // 2, itemsize)
            floor_ms = 1e3 * read / (floor["copy_tb_s"] * 1e12)
        for s in summaries:
            ms = s["ms_per_round"]
            lines.append(
                f"| {context} | {s['method']} | {ms:.2f} | {ms / ar:.2f} | {s['prefill_ms']:.1f} | "
                + (f"{floor_ms:.2f} | {ms / floor_ms:.2f} |" if floor_ms else "– | – |")
                if ar
                else f"| {context} | {s['method']} | {ms:.2f} | – | {s['prefill_ms']:.1f} | – | – |"
            )
    table = "\n".join(lines)
    if out_dir is not None:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        (Path(out_dir) / "long_context.md").write_text(table + "\n")
    return table
