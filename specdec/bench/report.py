"""Aggregate benchmark rows per (method, temperature) and write them as JSONL, a markdown table and a plot.

Rows come from ``specdec.bench.harness.run_bench`` (or ``load_rows`` on its ``results.jsonl``). Speedups are
against the AR rows (no drafter) of the same temperature; throughput pools tokens and seconds over prompts.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

__all__ = ["aggregate", "format_table", "load_rows", "plot_summary", "write_report"]

# Per-round phases in loop order; any other phase the loop reports follows, sorted by name.
_PHASE_ORDER = ("draft", "build", "verify", "accept", "commit")


def load_rows(path: str | os.PathLike) -> list[dict]:
    """Read the rows of a ``results.jsonl``."""
    with Path(path).open() as f:
        return [json.loads(line) for line in f if line.strip()]


def _phases(rows: Sequence[dict]) -> list[str]:
    return sorted({name for r in rows for name in r["phase_ms"] if name != "prefill"}, key=_phase_key)


def aggregate(rows: Sequence[dict]) -> list[dict]:
    """One summary per (method, temperature), by temperature, then in order of first appearance.

    Args:
        rows (Sequence[dict]): benchmark rows.

    Returns:
        list[dict]: each with ``method, drafter, tree, budget, topk, temperature, prompts, new_tokens,
        decode_tokens, decode_s``, ``tau`` (mean over all rounds of all prompts: a prompt that stops at its
        first token adds no round), ``tok_s`` (sum decode tokens / sum decode
        seconds), ``speedup`` (over the AR summary of the same temperature, None without one),
        ``phase_ms_per_round`` (phase -> summed ms / summed rounds, prefill excluded), ``prefill_ms``
        (mean per prompt) and ``identical_share`` (share of temperature-0 rows equal to AR, None otherwise).
    """
    groups: dict[tuple[str, float], list[dict]] = {}
    for r in sorted(rows, key=lambda r: r["temperature"]):
        groups.setdefault((r["method"], r["temperature"]), []).append(r)
    phases = _phases(rows)
    summaries = []
    for (method, temperature), group in groups.items():
        first = group[0]
        decode_tokens = sum(r["decode_tokens"] for r in group)
        decode_s = sum(r["decode_s"] for r in group)
        rounds = sum(r["rounds"] for r in group)
        checked = [r["identical_to_ar"] for r in group if r.get("identical_to_ar") is not None]
        checked_hf = [r["identical_to_hf"] for r in group if r.get("identical_to_hf") is not None]
        summaries.append(
            {
                "method": method,
                "drafter": first["drafter"],
                "tree": first["tree"],
                "budget": first["budget"],
                "topk": first["topk"],
                "temperature": temperature,
                "prompts": len(group),
                "new_tokens": sum(r["new_tokens"] for r in group),
                "decode_tokens": decode_tokens,
                "decode_s": decode_s,
                "tau": sum(r["tau"] * r["rounds"] for r in group) / rounds if rounds else None,
                "tok_s": decode_tokens / decode_s if decode_s > 0 else None,
                "speedup": None,
                "phase_ms_per_round": {
                    p: sum(r["phase_ms"].get(p, 0.0) for r in group) / rounds if rounds else None for p in phases
                },
                "prefill_ms": sum(r["phase_ms"].get("prefill", 0.0) for r in group) / len(group),
                "identical_share": sum(checked) / len(checked) if checked else None,
                "identical_hf_share": sum(checked_hf) / len(checked_hf) if checked_hf else None,
            }
        )
    baseline = {}
    for s in summaries:
        if s["tree"] == "ar":
            baseline.setdefault(s["temperature"], s["tok_s"])
    for s in summaries:
        base = baseline.get(s["temperature"])
        if base and s["tok_s"] is not None:
            s["speedup"] = s["tok_s"] / base
    return summaries


def _fmt(value, spec: str, none: str = "–") -> str:
    return none if value is None else format(value, spec)


def format_table(summaries: Sequence[dict]) -> str:
    """Markdown table of ``aggregate`` output: one line per (method, temperature), phase ms per round."""
    phases = sorted({p for s in summaries for p in s["phase_ms_per_round"]}, key=_phase_key)
    head = ["method", "T", "budget", "topk", "τ", "tok/s", "speedup", "= AR", "= HF", *[f"{p} ms" for p in phases]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in summaries:
        topk = {"ar": "–", "hf": "–", "chain": "1"}.get(s["tree"]) or (
            "budget" if s["topk"] is None else str(s["topk"])
        )
        cells = [
            s["method"],
            f"{s['temperature']:g}",
            str(s["budget"]) if s["tree"] not in ("ar", "hf") else "–",
            topk,
            _fmt(s["tau"], ".2f"),
            _fmt(s["tok_s"], ".1f"),
            _fmt(s["speedup"], ".2f") + ("×" if s["speedup"] is not None else ""),
            _fmt(None if s["identical_share"] is None else 100 * s["identical_share"], ".0f")
            + ("%" if s["identical_share"] is not None else ""),
            _fmt(None if s.get("identical_hf_share") is None else 100 * s["identical_hf_share"], ".0f")
            + ("%" if s.get("identical_hf_share") is not None else ""),
            *[_fmt(s["phase_ms_per_round"].get(p), ".2f") for p in phases],
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _phase_key(phase: str) -> tuple[int, str]:
    return (_PHASE_ORDER.index(phase) if phase in _PHASE_ORDER else len(_PHASE_ORDER), phase)


def plot_summary(summaries: Sequence[dict], path: str | os.PathLike) -> None:
    """Plot τ and decode tok/s against budget: one line per (drafter, topk) of DDTree methods, horizontal
    lines for chains and AR; one row of panels per temperature. Writes a PNG to ``path``."""
    from matplotlib.figure import Figure  # imported here: only the report needs matplotlib

    temperatures = sorted({s["temperature"] for s in summaries})
    fig = Figure(figsize=(11, 3.8 * len(temperatures)), layout="constrained")
    axes = fig.subplots(len(temperatures), 2, squeeze=False)
    for row, temperature in zip(axes, temperatures, strict=True):
        group = [s for s in summaries if s["temperature"] == temperature]
        lines: dict[str, list[dict]] = {}
        for s in group:
            if s["tree"] == "ddtree":
                label = f"{s['drafter']} topk={'budget' if s['topk'] is None else s['topk']}"
                lines.setdefault(label, []).append(s)
        budgets = sorted({s["budget"] for s in group if s["tree"] == "ddtree"})
        for ax, metric, title in zip(
            row, ("tau", "tok_s"), ("τ (tokens per target forward)", "decode tok/s"), strict=True
        ):
            for label, points in lines.items():
                points = sorted((p for p in points if p[metric] is not None), key=lambda p: p["budget"])
                ax.plot([p["budget"] for p in points], [p[metric] for p in points], marker="o", label=label)
            for i, s in enumerate(p for p in group if p["tree"] != "ddtree" and p[metric] is not None):
                ax.axhline(s[metric], linestyle="--", color=f"C{(len(lines) + i) % 10}", label=s["method"])
            if len(budgets) > 1 and budgets[0] > 0 and budgets[-1] >= 4 * budgets[0]:
                ax.set_xscale("log", base=2)
            ax.set_xlabel("budget (non-root nodes)")
            ax.set_title(f"{title}, T={temperature:g}")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    fig.savefig(path, dpi=120)


def write_report(rows: Sequence[dict], out_dir: str | os.PathLike) -> list[dict]:
    """Write ``results.jsonl`` (rows), ``results.md`` (table) and ``plot.png`` into ``out_dir``.

    Returns:
        list[dict]: the ``aggregate`` summaries.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with (out / "results.jsonl").open("w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    summaries = aggregate(rows)
    (out / "results.md").write_text(format_table(summaries))
    plot_summary(summaries, out / "plot.png")
    return summaries
