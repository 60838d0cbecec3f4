"""The auto budget against plain decoding and the best fixed budget, per batch size, from bench runs.

    python scripts/auto_budget_table.py RUN_DIR [RUN_DIR ...]

Each RUN_DIR is a bench output folder (``results.jsonl``) of a run that holds AR, fixed DDTree budgets and
``DDTree(budget="auto")`` rows (``+experiment=batch`` or ``scripts/gpu_trust.sh``). Per run and batch size B it
prints tok/s of AR, of the best fixed budget (named) and of auto, the two ratios the auto budget is held to
(auto / best fixed >= 0.97, auto / AR >= 1), auto's ms per round against the fixed rows', the share of auto's rounds
per budget (0 = plain decoding), the controller's round cost per option after the last call, the auto rounds' own
times per budget split by what ran before them (``steady``: a round of the same budget; ``switch``: another budget;
medians with their counts, from the bench's ``budget_rounds``), the capture ms auto spent inside timed calls (0 when
warm-up covered every graph), and each method's wall time per round (the host time between two round reads, the
bench's ``round_wall_ms``; medians): every auto row's per budget beside the fixed rows', each with the median time
its reads waited for the device (``round_wait_ms``: near zero where the device waits for the host) and the host
time of its launches (``round_launch_ms``). A run with
several auto methods (say ``clock: [device, wall]``) gives one line per auto method, each named.

With several timed passes (``repeat``), best fixed is the fixed budget of the highest pooled tok/s, and the ratios are
also given per pass (auto's pass p over that budget's pass p) with their median: run with ``interleave=true`` so
that pass p of every method runs before pass p + 1 of any, and the host's slow spells, which last several calls,
fall on every method alike instead of on whichever ran then.
"""

from __future__ import annotations

import statistics
import sys
from collections import Counter
from pathlib import Path

from specdec.bench.report import aggregate, load_rows


def _table(run: Path) -> list[str]:
    rows = load_rows(run)
    # keyed by (auto method, B)
    mix: dict[tuple[str, int], Counter] = {}
    costs: dict[tuple[str, int], dict] = {}  # the controller's cost per option after the last call
    timed: dict[tuple[str, int], dict[tuple[int, str], list[float]]] = {}  # (budget, steady|switch) -> rounds' ms
    walls: dict[tuple[str, int], dict[int | None, list[float]]] = {}  # (method, B) -> budget (None: all) -> wall ms
    waits: dict[tuple[str, int], list[float]] = {}  # (method, B) -> each round's read wait, ms
    launches: dict[tuple[str, int], list[float]] = {}  # (method, B) -> each round's launch, host ms
    seen = set()
    for r in rows:
        key = (r["method"], r.get("batch_size", 1))
        if "call_budgets" in r:  # a batched call: every row holds the call's facts, count them once
            call = (r["method"], r.get("pass"), r["batch_size"], r["batch_index"])
            if call in seen:
                continue
            seen.add(call)
        rounds = r.get("call_budget_rounds", r.get("budget_rounds")) or []
        wall = r.get("call_round_wall_ms", r.get("round_wall_ms")) or []
        waits.setdefault(key, []).extend(r.get("call_round_wait_ms", r.get("round_wait_ms")) or [])
        launches.setdefault(key, []).extend(r.get("call_round_launch_ms", r.get("round_launch_ms")) or [])
        sizes = [int(b) for b, _ in rounds] if rounds else [None] * len(wall)
        for size, ms in zip(sizes, wall, strict=False):
            if ms is not None:
                walls.setdefault(key, {}).setdefault(None, []).append(ms)
                if size is not None:
                    walls[key].setdefault(size, []).append(ms)
        if r["budget"] == "auto":
            split = timed.setdefault(key, {})
            for (size, ms), before in _after(rounds):
                if ms is not None:
                    split.setdefault((size, "steady" if before == size else "switch"), []).append(ms)
            counts = r.get("call_budgets", r.get("budgets")) or {}
            costs[key] = r.get("call_budget_costs", r.get("budget_costs")) or {}
            mix.setdefault(key, Counter()).update({int(k): v for k, v in counts.items()})
    summaries = [s for s in aggregate(rows) if s["temperature"] == 0.0 or len({x["temperature"] for x in rows}) == 1]
    by_b: dict[int, list[dict]] = {}
    for s in summaries:
        by_b.setdefault(s["batch_size"], []).append(s)
    head = (
        "| B | AR tok/s | best fixed | auto tok/s | auto / best | auto / best per pass (median) | auto / AR "
        "| ms/round auto (fixed) | auto's budgets (share of rounds) | controller's ms per option "
        "| auto's ms per budget, steady / switch (rounds) | auto capture ms in timed calls "
        "| wall ms/round: auto per budget (fixed) |"
    )
    out = [f"## {run}", "", head, "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for b in sorted(by_b):
        group = by_b[b]
        ar = next((s for s in group if s["tree"] == "ar"), None)
        autos = [s for s in group if s["budget"] == "auto"]
        fixed = [s for s in group if s["tree"] != "ar" and s["budget"] != "auto" and s["tok_s"]]
        best = max(fixed, key=lambda s: s["tok_s"], default=None)
        if ar is None or not autos or best is None:
            continue
        fixed_ms = ", ".join(f"b{s['budget']} {s['ms_per_round']:.3f}" for s in fixed if s["ms_per_round"])
        fixed_wall = ", ".join(
            f"b{s['budget']} {_median(walls.get((s['method'], b), {}).get(None))}"
            f" wait {_median(waits.get((s['method'], b)))} launch {_median(launches.get((s['method'], b)))}"
            for s in fixed
        )
        for auto in autos:
            key = (auto["method"], b)
            counts = mix.get(key, Counter())
            total = sum(counts.values()) or 1
            shares = ", ".join(f"{k}: {v / total:.0%}" for k, v in sorted(counts.items()))
            model = ", ".join(f"{k}: {v:.3f}" for k, v in sorted(costs.get(key, {}).items(), key=lambda kv: int(kv[0])))
            own = walls.get(key, {})
            auto_wall = ", ".join(
                f"{'all' if k is None else k}: {_median(v)}"
                for k, v in sorted(own.items(), key=lambda kv: (kv[0] is not None, kv[0] or 0))
            )
            auto_wall += f", wait {_median(waits.get(key))} launch {_median(launches.get(key))}"
            name = f"{auto['method']} " if len(autos) > 1 else ""
            out.append(
                f"| {b} | {ar['tok_s']:.0f} | {best['method']} {best['tok_s']:.0f} | {name}{auto['tok_s']:.0f} "
                f"| {auto['tok_s'] / best['tok_s']:.2f} | {_per_pass(auto, best)} | {auto['tok_s'] / ar['tok_s']:.2f} "
                f"| {auto['ms_per_round']:.3f} ({fixed_ms}) | {shares} | {model} | {_split(timed.get(key, {}))} "
                f"| {auto['cold_ms']:.0f} | {auto_wall} ({fixed_wall}) |"
            )
    return out


def _median(values: list[float] | None) -> str:
    """The median to 3 decimals, "–" for none."""
    return f"{statistics.median(values):.3f}" if values else "–"


def _after(rounds: list) -> list[tuple[tuple[int, float | None], int | None]]:
    """Each ``[budget, ms]`` of a call's rounds with the budget of the round before it in that call (None first)."""
    return [((int(b), ms), None if i == 0 else int(rounds[i - 1][0])) for i, (b, ms, *_) in enumerate(rounds)]


def _split(timed: dict[tuple[int, str], list[float]]) -> str:
    """``budget: steady median / switch median (n steady / n switch)`` per budget, "–" where a side has no round."""
    cells = []
    for size in sorted({size for size, _ in timed}):
        steady, switch = timed.get((size, "steady"), []), timed.get((size, "switch"), [])
        med = lambda xs: f"{statistics.median(xs):.3f}" if xs else "–"  # noqa: E731
        cells.append(f"{size}: {med(steady)} / {med(switch)} ({len(steady)} / {len(switch)})")
    return ", ".join(cells) or "–"


def _per_pass(auto: dict, best: dict) -> str:
    """auto / best per timed pass, "median (each)"; "–" with one pass."""
    a, f = auto.get("tok_s_passes") or [], best.get("tok_s_passes") or []
    ratios = [x / y for x, y in zip(a, f, strict=False) if x and y]
    if len(ratios) < 2:
        return "–"
    return f"{statistics.median(ratios):.2f} ({' '.join(f'{r:.2f}' for r in ratios)})"


def main(argv: list[str]) -> int:
    if not argv:
        sys.stderr.write(__doc__)
        return 2
    for arg in argv:
        sys.stdout.write("\n".join(_table(Path(arg))) + "\n\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
