"""Aggregate benchmark rows per (method, temperature) and write them as JSONL, a markdown report and a plot.

Rows come from ``specdec.bench.harness.run_bench`` (or ``load_rows`` on its ``results.jsonl``). Speedups are
against the AR rows (no drafter) of the same temperature; throughput pools tokens and seconds over prompts and
timed passes. ``compare_runs`` compares the tokens of two finished runs.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

__all__ = [
    "aggregate",
    "compare_runs",
    "describe_run",
    "environment",
    "format_header",
    "format_notes",
    "format_table",
    "load_rows",
    "method_colors",
    "plot_summary",
    "series_label",
    "summary_table",
    "write_report",
]

# Per-round phases in loop order; any other phase the loop reports follows, sorted by name.
_PHASE_ORDER = ("draft", "build", "verify", "accept", "commit", "round")

# One colour per plotted series (tab10, then the light half of tab20): assigned in order of first appearance.
PALETTE = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
    "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94", "#f7b6d2", "#c7c7c7", "#dbdb8d", "#9edae5",
)  # fmt: skip


def load_rows(path: str | os.PathLike) -> list[dict]:
    """Read the rows of a ``results.jsonl`` (or of the ``results.jsonl`` inside a run folder)."""
    path = Path(path)
    if path.is_dir():
        path = path / "results.jsonl"
    with path.open() as f:
        return [json.loads(line) for line in f if line.strip()]


def _phases(rows: Sequence[dict]) -> list[str]:
    return sorted({name for r in rows for name in r["phase_ms"] if name != "prefill"}, key=_phase_key)


def _share(values: Iterable) -> float | None:
    checked = [v for v in values if v is not None]
    return sum(checked) / len(checked) if checked else None


def cost_points(summaries: Sequence[Mapping]) -> list[tuple[int, int, float]]:
    """``(B, slots, round ms)`` of the greedy AR (1 slot) and DDTree (budget + 1 slots) summaries, per batch round:
    the points ``specdec.budget.CostModel`` fits."""
    points = []
    for s in summaries:
        ms = s.get("phase_ms_per_round", {}).get("round") or s.get("ms_per_round")
        if s["temperature"] != 0 or not ms or s["tree"] not in ("ar", "ddtree") or not isinstance(s["budget"], int):
            continue
        points.append((s.get("batch_size", 1), 1 if s["tree"] == "ar" else s["budget"] + 1, ms))
    return points


def _cost_model_lines(summaries: Sequence[Mapping]) -> list[str]:
    """The round-cost model (``specdec.budget.CostModel``'s least-squares ``a + b·B + c·B·n``) checked by leaving
    each measured point out: its prediction from the other points beside the measurement. Needs several batch
    sizes and tree sizes; empty otherwise."""
    from specdec.budget import CostModel

    points = cost_points(summaries)
    if len({b for b, _, _ in points}) < 2 or len({n for _, n, _ in points}) < 2 or len(points) < 5:
        return []
    cells, worst = [], 0.0
    for i, (b, n, ms) in enumerate(points):
        predicted = CostModel(points[:i] + points[i + 1 :]).linear(b, n)
        error = 100 * (predicted - ms) / ms
        worst = max(worst, abs(error))
        cells.append(f"B={b} n={n}: {ms:.3f} ms, predicted {predicted:.3f} ({error:+.1f} %)")
    full = CostModel(points)
    fit = " + ".join(f"{c:.4g}·{f}" for c, f in zip(full.coefficients, full.features, strict=True))
    return [f"- round cost model (least squares {fit}, ms), each point predicted from the others (largest error "
            f"{worst:.1f} %): " + "; ".join(cells)]  # fmt: skip


def aggregate(rows: Sequence[dict]) -> list[dict]:
    """One summary per (method, temperature, batch size), by temperature, then in order of first appearance.

    Args:
        rows (Sequence[dict]): benchmark rows (every timed pass of every prompt).

    Returns:
        list[dict]: each with ``method, series, drafter, tree, budget, topk, temperature, prompts, passes,
        new_tokens, decode_tokens, decode_s``, ``tau`` (mean over all rounds of all prompts: a prompt that stops at
        its first token adds no round), ``tau_reference`` (mean of the rows' reference-style τ, None without),
        ``tok_s`` (sum decode tokens / sum decode seconds), ``tok_s_passes`` (the same per timed pass),
        ``ms_per_round`` (decode wall ms per round: per token for plain decoding), ``speedup`` (over the AR
        summary of the same temperature, None without one), ``phase_ms_per_round`` (phase -> summed ms / summed
        rounds, prefill excluded), ``prefill_ms`` (mean per call), ``identical_share`` / ``identical_hf_share`` /
        ``identical_eager_share`` / ``identical_run_share`` (share of rows equal to AR / to HF ``generate`` / to
        the eager path / to the compared run, None when not checked), ``warmup_s`` (the method's untimed warm-up),
        ``capture_ms`` and ``compile_ms`` (CUDA-graph capture and compilation, warm-up and timed calls together),
        ``cold_ms`` (capture and compilation inside timed calls only: 0 when the warm-up covered every shape),
        ``compile_fallbacks`` (the most compiled rounds one call ran uncompiled because compiling them failed),
        ``depth_accept`` (per depth d = 1, 2, ...: the share of rounds that accepted at least d drafts, from the
        rows' ``accept_hist``; empty when no round accepted one) and ``path``. Batches (rows of one call share its
        wall time evenly): ``batch_size`` (B; 1 for rows without one), ``tau`` pooled over every (row, round) pair
        (the batch τ), ``tau_rows`` (the mean of the rows' own τ), ``tok_s`` all the pass's decode tokens over its
        decode wall time, ``ms_per_round`` and the phases per batch round (a call's rounds), ``prefill_ms`` per
        prompt, ``speedup`` over AR at the same B, ``identical_b1_share`` (share of greedy rows equal to the same
        method's batch-1 tokens, None when not checked).
    """
    groups: dict[tuple[str, float, int], list[dict]] = {}
    for r in sorted(rows, key=lambda r: r["temperature"]):
        groups.setdefault((r["method"], r["temperature"], r.get("batch_size", 1)), []).append(r)
    phases = _phases(rows)
    summaries = []
    for (method, temperature, batch_size), group in groups.items():
        first = group[0]
        decode_tokens = sum(r["decode_tokens"] for r in group)
        decode_s = sum(r["decode_s"] for r in group)
        rounds = sum(r["rounds"] for r in group if r["tau"] is not None)
        timed_rounds = sum(_round_share(r) for r in group if r["tau"] is not None)  # batch rounds: a call's
        timed = any(name != "prefill" for r in group for name in r["phase_ms"])  # HF rows have no phases
        passes: dict[int, list[dict]] = {}
        for r in group:
            passes.setdefault(r.get("pass", 0), []).append(r)
        per_pass = []
        for p in sorted(passes):
            seconds = sum(r["decode_s"] for r in passes[p])
            per_pass.append(sum(r["decode_tokens"] for r in passes[p]) / seconds if seconds > 0 else None)
        all_rounds = sum(_round_share(r) for r in group)
        hist: list[int] = []
        for r in group:
            for i, count in enumerate(r.get("accept_hist") or ()):
                hist.extend([0] * (i + 1 - len(hist)))
                hist[i] += int(count)
        counted = sum(hist)
        depth_accept = [sum(hist[d:]) / counted for d in range(1, len(hist))] if counted else []
        summaries.append(
            {
                "method": method,
                "series": first.get("series") or method,
                "drafter": first["drafter"],
                "tree": first["tree"],
                "budget": first["budget"],
                "topk": first["topk"],
                "temperature": temperature,
                "batch_size": batch_size,
                "prompts": len(passes[min(passes)]),
                "passes": len(passes),
                "new_tokens": sum(r["new_tokens"] for r in group),
                "decode_tokens": decode_tokens,
                "decode_s": decode_s,
                "tau": sum(r["tau"] * r["rounds"] for r in group if r["tau"] is not None) / rounds if rounds else None,
                "tau_rows": _mean(r["tau"] for r in group if r["rounds"] and r["tau"] is not None),
                "tau_reference": _mean(r.get("tau_reference") for r in group),
                "tok_s": decode_tokens / decode_s if decode_s > 0 else None,
                "tok_s_passes": per_pass,
                "ms_per_round": 1e3 * decode_s / all_rounds if all_rounds and decode_s > 0 else None,
                "speedup": None,
                "phase_ms_per_round": {
                    p: sum(r["phase_ms"].get(p, 0.0) for r in group) / timed_rounds if timed_rounds and timed else None
                    for p in phases
                },
                "prefill_ms": sum(r["phase_ms"].get("prefill", 1e3 * r.get("prefill_s", 0.0)) for r in group)
                / len(group),
                "identical_share": _share(r.get("identical_to_ar") for r in group),
                "identical_hf_share": _share(r.get("identical_to_hf") for r in group),
                "identical_eager_share": _share(r.get("identical_to_eager") for r in group),
                "identical_run_share": _share(r.get("identical_to_run") for r in group),
                "identical_b1_share": _share(r.get("identical_to_b1") for r in group),
                "warmup_s": first.get("warmup_s", 0.0),
                "capture_ms": first.get("warmup_capture_ms", 0.0) + sum(r.get("capture_ms", 0.0) for r in group),
                "compile_ms": first.get("warmup_compile_ms", 0.0) + sum(r.get("compile_ms", 0.0) for r in group),
                "cold_ms": sum(r.get("capture_ms", 0.0) + r.get("compile_ms", 0.0) for r in group),
                "compile_fallbacks": max((r.get("compile_fallbacks", 0) for r in group), default=0),
                "depth_accept": depth_accept,
                "path": first.get("path"),
            }
        )
    baseline = {}
    for s in summaries:
        if s["tree"] == "ar":
            baseline.setdefault((s["temperature"], s["batch_size"]), s["tok_s"])
    for s in summaries:
        base = baseline.get((s["temperature"], s["batch_size"]))
        if base and s["tok_s"] is not None:
            s["speedup"] = s["tok_s"] / base
    return summaries


def _round_share(row: Mapping) -> float:
    """The row's share of its call's rounds (a batched call's rounds split over its rows; else its rounds)."""
    if row.get("call_rounds") is None:
        return row["rounds"]
    return row["call_rounds"] / row.get("batch_rows", 1)


def _batched(summaries: Sequence[Mapping]) -> bool:
    """Whether the run decoded in batches (some batch size other than 1): the tables show B and τ rows then."""
    return any(s.get("batch_size", 1) != 1 for s in summaries)


def _mean(values: Iterable) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


def _fmt(value, spec: str, none: str = "–") -> str:
    return none if value is None else format(value, spec)


# Columns shown only when some summary has a value: (key, heading, formatter).
_OPTIONAL = (
    ("tau_reference", "τ (whole rounds)", lambda v: _fmt(v, ".2f")),
    ("identical_eager_share", "= eager", lambda v: _pct(v)),
    ("identical_run_share", "= other run", lambda v: _pct(v)),
    ("identical_b1_share", "= B1", lambda v: _pct(v)),
)


DEPTH_COLUMNS = 8  # depths shown in the ``accepted ≥ d`` column


def _depth_cell(shares: Sequence[float] | None) -> str:
    """``accepted ≥ d`` for d = 1 .. ``DEPTH_COLUMNS`` (``…`` when deeper rounds accepted too)."""
    if not shares:
        return "–"
    cell = " ".join(f"{x:.2f}" for x in shares[:DEPTH_COLUMNS])
    return cell + (" …" if len(shares) > DEPTH_COLUMNS else "")


def format_table(summaries: Sequence[dict]) -> str:
    """Markdown table of ``aggregate`` output: one line per (method, temperature), phase ms per round.

    tok/s is measured warm (after the untimed warm-up passes); warm-up, capture and compile are reported apart.
    ``τ (whole rounds)``, ``= eager`` and ``= other run`` appear when a row has them; ``accepted ≥ d`` (the share
    of rounds that accepted at least d drafts, d = 1, 2, ...) when some round accepted a draft. A run in batches
    adds ``B`` (the batch size) and ``τ rows`` (the mean of the rows' own τ; ``τ`` pools every (row, round) pair:
    the batch τ), and ``= B1`` (greedy rows equal to the same method's batch-1 tokens) when checked."""
    phases = sorted({p for s in summaries for p in s["phase_ms_per_round"]}, key=_phase_key)
    optional = [c for c in _OPTIONAL if any(s.get(c[0]) is not None for s in summaries)]
    depths = any(s.get("depth_accept") for s in summaries)
    batched = _batched(summaries)
    head = [
        "method",
        "T",
        *(["B"] if batched else []),
        "budget",
        "topk",
        "τ",
        *(["τ rows"] if batched else []),
        *[c[1] for c in optional[:1] if c[0] == "tau_reference"],
        *(["accepted ≥ d (d = 1, 2, …)"] if depths else []),
        "tok/s (warm)",
        "speedup",
        "ms/round",
        "prefill ms",
        "= AR",
        "= HF",
        *[c[1] for c in optional if c[0] != "tau_reference"],
        "warm-up s",
        "capture ms",
        "compile ms",
        *[f"{p} ms" for p in phases],
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in summaries:
        topk = {"ar": "–", "hf": "–", "chain": "1", "sampled-chain": "1"}.get(s["tree"]) or (
            str(s["topk"]) if s["topk"] is not None else "budget" if "ddtree" in s["tree"] else "–"
        )
        cells = [
            s["method"],
            f"{s['temperature']:g}",
            *([str(s.get("batch_size", 1))] if batched else []),
            str(s["budget"]) if s["tree"] not in ("ar", "hf") else "–",
            topk,
            _fmt(s["tau"], ".2f"),
            *([_fmt(s.get("tau_rows"), ".2f")] if batched else []),
            *[fmt(s.get(key)) for key, _, fmt in optional[:1] if key == "tau_reference"],
            *([_depth_cell(s.get("depth_accept"))] if depths else []),
            _fmt(s["tok_s"], ".1f"),
            _fmt(s["speedup"], ".2f") + ("×" if s["speedup"] is not None else ""),
            _fmt(s.get("ms_per_round"), ".3f"),
            _fmt(s.get("prefill_ms"), ".2f"),
            _pct(s["identical_share"]),
            _pct(s.get("identical_hf_share")),
            *[fmt(s.get(key)) for key, _, fmt in optional if key != "tau_reference"],
            _fmt(s.get("warmup_s"), ".1f"),
            _fmt(s.get("capture_ms"), ".0f"),
            _fmt(s.get("compile_ms"), ".0f") + _fallbacks(s.get("compile_fallbacks", 0)),
            *[_fmt(s["phase_ms_per_round"].get(p), ".3f") for p in phases],
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _fallbacks(count: int) -> str:
    """A compile cell's mark for rounds that failed to compile and ran uncompiled."""
    return f" ({count} uncompiled)" if count else ""


def _pct(share: float | None) -> str:
    return "–" if share is None else f"{100 * share:.0f}%"


def _phase_key(phase: str) -> tuple[int, str]:
    return (_PHASE_ORDER.index(phase) if phase in _PHASE_ORDER else len(_PHASE_ORDER), phase)


def format_notes(summaries: Sequence[dict], meta: Mapping | None = None) -> str:
    """The markdown bullets below the table: pass-by-pass tok/s, the best DDTree against the chain and HF's static
    cache, AR against the graph floor, rows that captured or compiled while timed, the memory check, the
    profile and the compared run. Empty when there is nothing to say."""
    meta = meta or {}
    lines = []
    for s in summaries:
        passes = [p for p in s.get("tok_s_passes", []) if p]
        if len(passes) > 1:
            spread = 100 * (max(passes) - min(passes)) / min(passes)
            batch = f" B={s['batch_size']}" if _batched(summaries) else ""
            lines.append(f"- {s['method']} T={s['temperature']:g}{batch}: passes "
                         + " / ".join(f"{p:.1f}" for p in passes) + f" tok/s (spread {spread:.1f} %)")  # fmt: skip
    for temperature, batch in sorted({(s["temperature"], s.get("batch_size", 1)) for s in summaries}):
        group = [s for s in summaries if (s["temperature"], s.get("batch_size", 1)) == (temperature, batch)
                 and s["tok_s"] is not None]  # fmt: skip
        trees = [s for s in group if s["tree"] == "ddtree"]
        if not trees:
            continue
        best = max(trees, key=lambda s: s["tok_s"])
        versus = []
        for kind, label in (("chain", "the best chain"), ("hf-static", "hf-static")):
            others = [s for s in group if (s["tree"] == "chain" if kind == "chain" else s["method"] == kind)]
            if others:
                other = max(others, key=lambda s: s["tok_s"])
                ratio = f"{best['tok_s'] / other['tok_s']:.2f}× {label} ({other['method']})"
                per_pass = [b / o for b, o in zip(best["tok_s_passes"], other["tok_s_passes"], strict=False) if b and o]
                if len(per_pass) > 1:
                    ratio += "; per pass " + " / ".join(f"{x:.2f}" for x in per_pass)
                versus.append(ratio)
        if versus:
            at = f"T={temperature:g}" + (f", B={batch}" if _batched(summaries) else "")
            lines.append(f"- best DDTree at {at}: {best['method']}, " + ", ".join(versus))
    floor = meta.get("graph_floor_ms")
    ar = next((s for s in summaries if s["tree"] == "ar" and s.get("ms_per_round") and s.get("batch_size", 1) == 1),
              None)  # fmt: skip
    if floor and ar:
        lines.append(f"- AR ms per token / graph floor: {ar['ms_per_round'] / floor:.2f}")
    for s in summaries:
        if s.get("cold_ms"):
            lines.append(f"- WARNING {s['method']}: {s['cold_ms']:.0f} ms of capture or compilation inside the timed "
                         "calls (a shape the warm-up missed): its tok/s is not warm")  # fmt: skip
    memory = meta.get("memory")
    if memory:
        lines.append(
            f"- memory: {memory['before_mib']:.1f} MiB allocated before, {memory['after_mib']:.1f} MiB after "
            f"{memory['rounds']} more rounds of {memory['method']}"
        )
    lines += _cost_model_lines(summaries)
    if meta.get("batch_sizes"):
        lines.append("- B: prompts per call (left-padded); tok/s = all decode tokens of a pass over its decode wall "
                     "time; τ pools every (row, round) pair, τ rows is the mean of the rows' own τ; ms/round is per "
                     "batch round; = B1: greedy tokens equal to the same method's at B = 1")  # fmt: skip
    if meta.get("eager_compare"):
        lines.append("- = eager: greedy tokens equal to the same method decoded again with cuda_graphs=False")
    if meta.get("compare_to"):
        against = f" ({meta['compare_against']} rows)" if meta.get("compare_against") else " (same method)"
        lines.append(f"- = other run: tokens equal to those of {meta['compare_to']}{against}")
    if meta.get("profile"):
        lines.append("- profile: profile.md (per method: kernels, device and host time of one call), traces in "
                     "profile/ (open in Perfetto or chrome://tracing)")  # fmt: skip
    return "\n".join(lines) + ("\n" if lines else "")


def environment(device) -> dict:
    """Date, commit (``$SPECDEC_COMMIT`` when set, else ``_git_commit``), library versions and the device name of
    a run."""
    import platform
    import time

    import torch
    import transformers

    commit = os.environ.get("SPECDEC_COMMIT") or _git_commit()
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


def _git_commit() -> str | None:
    """The short commit of the checkout holding the library, ``+dirty`` when its ``specdec`` folder differs from it;
    None where the library is not in a checkout of its own (a copy or an installed package, also one inside some
    other repository, whose commit says nothing about this code)."""
    import subprocess

    package = Path(__file__).resolve().parents[1]
    try:
        top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=package, capture_output=True, text=True)
        if top.returncode != 0 or Path(top.stdout.strip()).resolve() != package.parent:
            return None
        tracked = subprocess.run(["git", "ls-files", "--error-unmatch", "specdec/__init__.py"], cwd=package.parent,
                                 capture_output=True)  # fmt: skip
        if tracked.returncode != 0:
            return None
        sha = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=package, capture_output=True, text=True)
        if sha.returncode != 0 or not sha.stdout.strip():
            return None
        diff = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "."], cwd=package, capture_output=True)
    except OSError:
        return None
    return sha.stdout.strip() + ("+dirty" if diff.returncode == 1 else "")


def describe_run(meta: Mapping) -> str:
    """One line with what every report states: target, prompts, max_new_tokens, device, dtype, commit and date."""
    parts = [
        f"target {meta.get('target_name') or meta.get('target') or '?'}",
        f"prompts {meta.get('prompts', '?')}",
        f"max_new_tokens {meta.get('max_new_tokens', '?')}",
        *([f"batch sizes {', '.join(map(str, meta['batch_sizes']))}"] if meta.get("batch_sizes") else []),
        f"{meta.get('device', '?')}",
        f"{meta.get('dtype', '?')}",
        f"commit {meta.get('commit') or '?'}",
        f"{meta.get('date', '?')}",
    ]
    return " · ".join(parts)


def _floor_line(meta: Mapping) -> str:
    if "graph_floor_ms" not in meta:
        return "graph-floor: not measured (graph_floor=false)"
    floor = meta["graph_floor_ms"]
    if floor is None:
        return "graph-floor: n/a (needs a CUDA device)"
    line = (
        f"graph-floor: {floor:.3f} ms per 1-token target forward (CUDA graph, static cache) ≈ {1e3 / floor:.0f} tok/s"
    )
    hbm = meta.get("hbm_floor_ms")
    if hbm is not None:
        line += (
            f"; HBM floor {hbm:.3f} ms (target weights {meta['weights_gb']:.2f} GB at the copy bandwidth "
            f"{meta['copy_tb_s']:.2f} TB/s)"
        )
    return line


def format_header(meta: Mapping) -> str:
    """The markdown lines above the table: the title, run facts, the warm-measurement statement, the graph floor."""
    warm = meta.get("warmup", 0)
    how = (
        f"measured warm: every method first decoded all prompts {warm}× untimed; warm-up, CUDA-graph capture "
        "and compile times are reported in their own columns"
        if warm
        else "measured cold (warmup=0): first-use costs are inside the timed rows"
    )
    repeat = meta.get("repeat", 1)
    if repeat and repeat > 1:
        order = "pass p of every method before pass p + 1 of any" if meta.get("interleave") else "method by method"
        how += f"; {repeat} timed passes, {order}"
    title = f"Benchmark: {meta['title']}" if meta.get("title") else "Benchmark"
    return f"# {title} ({'warm' if warm else 'cold'})\n\n{describe_run(meta)}\n\n{how}; {_floor_line(meta)}.\n\n"


def _on_budget_axis(summary: Mapping) -> bool:
    """Rows plotted as lines over the tree budget: DDTrees and the other branching trees of a fixed budget (not AR,
    HF, chains or ``budget="auto"``, which are drawn as flat lines)."""
    return summary["tree"] not in ("ar", "hf", "chain", "sampled-chain") and isinstance(summary["budget"], int)


def series_label(summary: Mapping) -> str:
    """The plotted series a summary belongs to: DDTree methods of one spec share a line over their budgets (their
    ``series``; so do the other branching trees of one spec and kind), every other method is its own series."""
    batch = f" B={summary['batch_size']}" if summary.get("batch_size", 1) != 1 else ""
    if summary["tree"] == "ddtree":
        return (summary.get("series") or f"{summary['drafter']} topk={summary['topk'] or 'budget'}") + batch
    if _on_budget_axis(summary):
        return (summary.get("series") or summary["method"]) + batch
    return summary["method"] + batch


def method_colors(labels: Iterable[str]) -> dict[str, str]:
    """One colour per distinct label, in order of first appearance (the same label keeps its colour in every
    panel); the palette repeats past 20 labels."""
    order = list(dict.fromkeys(labels))
    return {label: PALETTE[i % len(PALETTE)] for i, label in enumerate(order)}


_PANELS = (
    ("tau", "τ (tokens per target forward)"),
    ("tok_s", "decode tok/s (warm)"),
    ("ms_per_round", "decode ms per round"),
)


def plot_summary(summaries: Sequence[dict], path: str | os.PathLike | None = None, *, meta: Mapping | None = None):
    """Plot τ, decode tok/s and ms per round against the DDTree budget: one line per DDTree series, horizontal
    lines for the other methods; or, when the run decoded at several batch sizes, against the batch size, one line
    per method; one row of panels per temperature; one colour per series across every panel;
    every y axis starts at 0; the title states the run (``describe_run``). Writes a PNG to ``path`` when given.

    Returns:
        matplotlib.figure.Figure: the figure.
    """
    from matplotlib.figure import Figure  # imported here: only the report needs matplotlib

    temperatures = sorted({s["temperature"] for s in summaries})
    by_batch = len({s.get("batch_size", 1) for s in summaries}) > 1
    colors = method_colors(s["method"] if by_batch else series_label(s) for s in summaries)
    fig = Figure(figsize=(15, 3.8 * len(temperatures) + 0.5), layout="constrained")
    if meta:
        title = describe_run(meta)
        fig.suptitle(f"{meta['title']}: {title}" if meta.get("title") else title, fontsize=9)
    axes = fig.subplots(len(temperatures), len(_PANELS), squeeze=False)
    for row, temperature in zip(axes, temperatures, strict=True):
        group = [s for s in summaries if s["temperature"] == temperature]
        for ax, (metric, title) in zip(row, _PANELS, strict=True):
            (_plot_batch_panel if by_batch else _plot_panel)(ax, group, metric, colors)
            ax.set_ylim(bottom=0)
            ax.set_title(f"{title}, T={temperature:g}")
    if path is not None:
        fig.savefig(path, dpi=110)
    return fig


def _plot_panel(ax, group: Sequence[dict], metric: str, colors: Mapping[str, str]) -> None:
    lines: dict[str, list[dict]] = {}
    for s in group:
        if _on_budget_axis(s):
            lines.setdefault(series_label(s), []).append(s)
    budgets = sorted({s["budget"] for s in group if _on_budget_axis(s)})
    for label, points in lines.items():
        points = sorted((p for p in points if p.get(metric) is not None), key=lambda p: p["budget"])
        if points:
            xs, ys = [p["budget"] for p in points], [p[metric] for p in points]
            ax.plot(xs, ys, marker="o", label=label, color=colors[label])
    for s in group:
        if not _on_budget_axis(s) and s.get(metric) is not None:
            label = series_label(s)
            ax.axhline(s[metric], linestyle="--", color=colors[label], label=label)
    _finish_axes(ax, budgets, "tree budget (non-root nodes)")


def _finish_axes(ax, ticks: Sequence[int], label: str) -> None:
    """The x axis at ``ticks`` (log 2 where they span a factor of 4 or more from a positive start), its label, the
    grid and the legend."""
    if len(ticks) > 1 and ticks[0] > 0 and ticks[-1] >= 4 * ticks[0]:
        ax.set_xscale("log", base=2)
    if ticks:
        ax.set_xticks(ticks, [str(b) for b in ticks])
        ax.minorticks_off()
    ax.set_xlabel(label)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)


def _plot_batch_panel(ax, group: Sequence[dict], metric: str, colors: Mapping[str, str]) -> None:
    """One line per method over the batch sizes it ran at."""
    lines: dict[str, list[dict]] = {}
    for s in group:
        if s.get(metric) is not None:
            lines.setdefault(s["method"], []).append(s)
    sizes = sorted({s.get("batch_size", 1) for s in group})
    for label, points in lines.items():
        points = sorted(points, key=lambda p: p.get("batch_size", 1))
        ax.plot([p.get("batch_size", 1) for p in points], [p[metric] for p in points], marker="o", label=label,
                color=colors[label])  # fmt: skip
    _finish_axes(ax, sizes, "batch size B")


def summary_table(summaries: Sequence[dict], *, title: str | None = None):
    """A ``rich.table.Table`` of the main figures (what the bench prints at the end); method names are never cut."""
    from rich.table import Table

    optional = [
        ("tau_reference", "τ whole", lambda v: _fmt(v, ".2f")),
        ("identical_eager_share", "= eager", _pct),
        ("identical_run_share", "= other run", _pct),
        ("identical_b1_share", "= B1", _pct),
    ]
    optional = [c for c in optional if any(s.get(c[0]) is not None for s in summaries)]
    batched = _batched(summaries)
    table = Table(title=title)
    width = max((len(s["method"]) for s in summaries), default=6)
    table.add_column("method", no_wrap=True, min_width=width)
    for col in ["T", *(["B"] if batched else []), "τ", *(["τ rows"] if batched else []),
                *[c[1] for c in optional[:1] if c[0] == "tau_reference"], "tok/s", "speedup", "ms/round",
                "= AR", "= HF", *[c[1] for c in optional if c[0] != "tau_reference"]]:  # fmt: skip
        table.add_column(col, justify="right")
    for s in summaries:
        cells = [s["method"], f"{s['temperature']:g}", *([str(s.get("batch_size", 1))] if batched else []),
                 _fmt(s["tau"], ".2f"), *([_fmt(s.get("tau_rows"), ".2f")] if batched else [])]  # fmt: skip
        cells += [fmt(s.get(key)) for key, _, fmt in optional[:1] if key == "tau_reference"]
        cells += [
            _fmt(s["tok_s"], ".1f"),
            _fmt(s["speedup"], ".2f"),
            _fmt(s.get("ms_per_round"), ".3f"),
            _pct(s["identical_share"]),
            _pct(s.get("identical_hf_share")),
        ]
        cells += [fmt(s.get(key)) for key, _, fmt in optional if key != "tau_reference"]
        table.add_row(*cells)
    return table


def write_report(rows: Sequence[dict], out_dir: str | os.PathLike, *, meta: Mapping | None = None) -> list[dict]:
    """Write ``results.jsonl`` (rows), ``results.md`` (header, table and notes), ``plot.png`` and, with ``meta``,
    ``meta.json`` into ``out_dir``.

    Args:
        rows (Sequence[dict]): benchmark rows.
        out_dir (str | PathLike): output folder (created).
        meta (Mapping | None): run facts (``target, prompts, max_new_tokens, device, dtype, commit, date, warmup,
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
    notes = format_notes(summaries, meta)
    (out / "results.md").write_text(header + format_table(summaries) + ("\n" + notes if notes else ""))
    plot_summary(summaries, out / "plot.png", meta=meta)
    if meta:
        (out / "meta.json").write_text(json.dumps(dict(meta), indent=2, default=str) + "\n")
    return summaries


def _first_difference(a: Sequence[int], b: Sequence[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def _tokens_by_method(rows: Sequence[dict]) -> dict[str, dict[tuple[float, str], list[int]]]:
    """method -> (temperature, prompt id) -> the tokens of its first timed pass."""
    out: dict[str, dict] = {}
    for r in rows:
        if r.get("tokens") is None or r.get("pass", 0) != 0:
            continue
        method = r["method"] + (f" B={r['batch_size']}" if r.get("batch_size", 1) != 1 else "")
        out.setdefault(method, {})[(r["temperature"], str(r["prompt_id"]))] = r["tokens"]
    return out


def compare_runs(run_a: str | os.PathLike, run_b: str | os.PathLike, *, against: str | None = None) -> str:
    """How often two finished runs decoded the same tokens, method by method (no decoding, no device).

    Args:
        run_a, run_b: run folders (or their ``results.jsonl``).
        against (str | None): compare every method of ``run_b`` with this method of ``run_a`` (e.g.
            ``"hf-generate"``: how often each row equals HF's greedy tokens) instead of the same method.

    Returns:
        str: a markdown table ``| method | identical | first differing token of the others |`` and a line naming
        the methods only one run has.

    Raises:
        ValueError: a run without tokens, or ``against`` not among run_a's methods.
    """
    a, b = (_tokens_by_method(load_rows(run)) for run in (run_a, run_b))
    for run, tokens in ((run_a, a), (run_b, b)):
        if not tokens:
            raise ValueError(f"{run} has no tokens in its rows: run the bench again to record them.")
    if against is not None:
        if against not in a:
            raise ValueError(f"{run_a} has no {against!r} row; it has {', '.join(a)}.")
        a = dict.fromkeys(b, a[against])
    lines = [
        f"# identical outputs, {run_b} against {run_a}" + (f" ({against})" if against else " (method by method)"),
        "",
        "| method | identical | first differing token of the others |",
        "|---|---|---|",
    ]
    for method in [m for m in a if m in b]:
        cases = [c for c in a[method] if c in b[method]]
        same = [c for c in cases if a[method][c] == b[method][c]]
        parts = sorted(_first_difference(a[method][c], b[method][c]) for c in cases if c not in same)
        lines.append(f"| {method} | {len(same)}/{len(cases)} | {', '.join(map(str, parts)) or '-'} |")
    alone = sorted(set(a) ^ set(b))
    if alone:
        lines += ["", f"- not in both runs, not compared: {', '.join(alone)}"]
    return "\n".join(lines) + "\n"
