"""Aggregate benchmark rows per (method, temperature) and write them as JSONL, a markdown table and a plot.

Rows come from ``specdec.bench.harness.run_bench`` (or ``load_rows`` on its ``results.jsonl``). Speedups are
against the AR rows (no drafter) of the same temperature; throughput pools tokens and seconds over prompts.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = [
    "aggregate",
    "describe_run",
    "environment",
    "format_header",
    "format_table",
    "load_rows",
    "plot_summary",
    "write_report",
]

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
        (mean per prompt), ``identical_share`` / ``identical_hf_share`` (share of temperature-0 rows equal to AR /
        to HF ``generate``, None otherwise), ``warmup_s`` (the method's untimed warm-up), ``capture_ms`` and
        ``compile_ms`` (CUDA-graph capture and compilation, warm-up and timed calls together),
        ``compile_fallbacks`` (the most compiled rounds one call ran uncompiled because compiling them failed;
        shown in the table's compile cell) and ``path``.
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
        rounds = sum(r["rounds"] for r in group if r["tau"] is not None)
        timed = any(name != "prefill" for r in group for name in r["phase_ms"])  # HF rows have no phases
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
                "tau": sum(r["tau"] * r["rounds"] for r in group if r["tau"] is not None) / rounds if rounds else None,
                "tok_s": decode_tokens / decode_s if decode_s > 0 else None,
                "speedup": None,
                "phase_ms_per_round": {
                    p: sum(r["phase_ms"].get(p, 0.0) for r in group) / rounds if rounds and timed else None
                    for p in phases
                },
                "prefill_ms": sum(r["phase_ms"].get("prefill", 0.0) for r in group) / len(group),
                "identical_share": sum(checked) / len(checked) if checked else None,
                "identical_hf_share": sum(checked_hf) / len(checked_hf) if checked_hf else None,
                "warmup_s": first.get("warmup_s", 0.0),
                "capture_ms": first.get("warmup_capture_ms", 0.0) + sum(r.get("capture_ms", 0.0) for r in group),
                "compile_ms": first.get("warmup_compile_ms", 0.0) + sum(r.get("compile_ms", 0.0) for r in group),
                "compile_fallbacks": max((r.get("compile_fallbacks", 0) for r in group), default=0),
                "path": first.get("path"),
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
    """Markdown table of ``aggregate`` output: one line per (method, temperature), phase ms per round.

    tok/s is measured warm (after the untimed warm-up passes); warm-up, capture and compile are reported apart."""
    phases = sorted({p for s in summaries for p in s["phase_ms_per_round"]}, key=_phase_key)
    head = [
        "method",
        "T",
        "budget",
        "topk",
        "τ",
        "tok/s (warm)",
        "speedup",
        "= AR",
        "= HF",
        "warm-up s",
        "capture ms",
        "compile ms",
        *[f"{p} ms" for p in phases],
    ]
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
            _share(s["identical_share"]),
            _share(s.get("identical_hf_share")),
            _fmt(s.get("warmup_s"), ".1f"),
            _fmt(s.get("capture_ms"), ".0f"),
            _fmt(s.get("compile_ms"), ".0f") + _fallbacks(s.get("compile_fallbacks", 0)),
            *[_fmt(s["phase_ms_per_round"].get(p), ".2f") for p in phases],
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _fallbacks(count: int) -> str:
    """A compile cell's mark for rounds that failed to compile and ran uncompiled."""
    return f" ({count} uncompiled)" if count else ""


def _share(share: float | None) -> str:
    return "–" if share is None else f"{100 * share:.0f}%"


def _phase_key(phase: str) -> tuple[int, str]:
    return (_PHASE_ORDER.index(phase) if phase in _PHASE_ORDER else len(_PHASE_ORDER), phase)


def environment(device) -> dict:
    """Date, commit, library versions and the device name of a run."""
    import platform
    import subprocess
    import time

    import torch
    import transformers

    try:
        repo = Path(__file__).resolve().parent
        sha = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=repo, capture_output=True, text=True)
        commit = sha.stdout.strip() or None
    except OSError:
        commit = None
    device = torch.device(device)
    if device.type == "cuda":
        name = f"cuda: {torch.cuda.get_device_name(device)}"
    else:
        name = f"{device.type}: {platform.processor() or platform.machine()}, {os.cpu_count()} cores"
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "commit": commit,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": name,
        "threads": torch.get_num_threads(),
    }


def describe_run(meta: Mapping) -> str:
    """One line with what every report states: prompts, max_new_tokens, device, dtype, commit and date."""
    parts = [
        f"prompts {meta.get('prompts', '?')}",
        f"max_new_tokens {meta.get('max_new_tokens', '?')}",
        f"{meta.get('device', '?')}",
        f"{meta.get('dtype', '?')}",
        f"commit {meta.get('commit') or '?'}",
        f"{meta.get('date', '?')}",
    ]
    return " · ".join(parts)


def _floor_line(meta: Mapping) -> str:
    floor = meta.get("graph_floor_ms")
    if floor is None:
        return "graph-floor: n/a (needs a CUDA device)"
    return (
        f"graph-floor: {floor:.3f} ms per 1-token target forward (CUDA graph, static cache) ≈ {1e3 / floor:.0f} tok/s"
    )


def format_header(meta: Mapping) -> str:
    """The markdown lines above the table: run facts, the warm-measurement statement, the graph floor."""
    warm = meta.get("warmup", 0)
    how = (
        f"measured warm: every method first decoded all prompts {warm}× untimed; warm-up, CUDA-graph capture "
        "and compile times are reported in their own columns"
        if warm
        else "measured cold (warmup=0): first-use costs are inside the timed rows"
    )
    return f"# Benchmark ({'warm' if warm else 'cold'})\n\n{describe_run(meta)}\n\n{how}; {_floor_line(meta)}.\n\n"


def plot_summary(summaries: Sequence[dict], path: str | os.PathLike | None = None, *, meta: Mapping | None = None):
    """Plot τ and decode tok/s against budget: one line per (drafter, topk) of DDTree methods, horizontal
    lines for the other methods; one row of panels per temperature; tok/s axes start at 0; the title states
    the run (``describe_run``). Writes a PNG to ``path`` when given.

    Returns:
        matplotlib.figure.Figure: the figure.
    """
    from matplotlib.figure import Figure  # imported here: only the report needs matplotlib

    temperatures = sorted({s["temperature"] for s in summaries})
    fig = Figure(figsize=(11, 3.8 * len(temperatures) + 0.4), layout="constrained")
    if meta:
        fig.suptitle(describe_run(meta), fontsize=9)
    axes = fig.subplots(len(temperatures), 2, squeeze=False)
    for row, temperature in zip(axes, temperatures, strict=True):
        group = [s for s in summaries if s["temperature"] == temperature]
        for ax, metric, title in zip(
            row, ("tau", "tok_s"), ("τ (tokens per target forward)", "decode tok/s (warm)"), strict=True
        ):
            _plot_panel(ax, group, metric)
            if metric == "tok_s":
                ax.set_ylim(bottom=0)
            ax.set_title(f"{title}, T={temperature:g}")
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig


def _plot_panel(ax, group: Sequence[dict], metric: str) -> None:
    lines: dict[str, list[dict]] = {}
    for s in group:
        if s["tree"] == "ddtree":
            lines.setdefault(f"{s['drafter']} topk={'budget' if s['topk'] is None else s['topk']}", []).append(s)
    budgets = sorted({s["budget"] for s in group if s["tree"] == "ddtree"})
    for label, points in lines.items():
        points = sorted((p for p in points if p[metric] is not None), key=lambda p: p["budget"])
        ax.plot([p["budget"] for p in points], [p[metric] for p in points], marker="o", label=label)
    for i, s in enumerate(p for p in group if p["tree"] != "ddtree" and p[metric] is not None):
        ax.axhline(s[metric], linestyle="--", color=f"C{(len(lines) + i) % 10}", label=s["method"])
    if len(budgets) > 1 and budgets[0] > 0 and budgets[-1] >= 4 * budgets[0]:
        ax.set_xscale("log", base=2)
    ax.set_xlabel("budget (non-root nodes)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def write_report(rows: Sequence[dict], out_dir: str | os.PathLike, *, meta: Mapping | None = None) -> list[dict]:
    """Write ``results.jsonl`` (rows), ``results.md`` (header and table), ``plot.png`` and, with ``meta``,
    ``meta.json`` into ``out_dir``.

    Args:
        rows (Sequence[dict]): benchmark rows.
        out_dir (str | PathLike): output folder (created).
        meta (Mapping | None): run facts (``prompts, max_new_tokens, device, dtype, commit, date, warmup,
            graph_floor_ms``, ...); stated in results.md and the plot title.

    Returns:
        list[dict]: the ``aggregate`` summaries.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with (out / "results.jsonl").open("w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    summaries = aggregate(rows)
    header = format_header(meta) if meta else ""
    (out / "results.md").write_text(header + format_table(summaries))
    plot_summary(summaries, out / "plot.png", meta=meta)
    if meta:
        (out / "meta.json").write_text(json.dumps(dict(meta), indent=2, default=str) + "\n")
    return summaries
