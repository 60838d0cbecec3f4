"""``scripts/auto_budget_table.py`` on hand-made bench rows: the pooled ratios, and the per-pass ratios of an
interleaved run against tok/s worked out by hand from each pass's decode tokens and seconds."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from auto_budget_table import _table  # noqa: E402

# (method, budget) -> decode seconds of pass 0, 1, 2 (each pass: two prompts of 60 decode tokens, B = 1)
SECONDS = {
    ("ar", 0): (0.060, 0.060, 0.060),
    ("ddtree-b15-k8", 15): (0.030, 0.040, 0.030),
    ("ddtree-b31-k8", 31): (0.025, 0.030, 0.026),
    ("ddtree-auto", "auto"): (0.026, 0.027, 0.030),
}


def _row(method, budget, p, seconds):
    tree = "ar" if budget == 0 else "ddtree"
    return {"method": method, "series": method, "drafter": "none" if budget == 0 else "DFlashDrafter",
            "tree": tree, "budget": budget, "topk": None if budget == 0 else 8, "verifier": None,
            "temperature": 0.0, "prompt_id": f"dev-{p}", "prompt_tokens": 10, "new_tokens": 61,
            "decode_tokens": 60, "tau": 1.0 if budget == 0 else 3.0, "rounds": 20, "target_forwards": 21,
            "draft_forwards": 0, "tree_nodes": 20, "total_s": seconds + 0.001, "prefill_s": 0.001,
            "decode_s": seconds, "decode_tok_s": 60 / seconds, "phase_ms": {"prefill": 1.0, "round": 10.0},
            "accept_hist": [], "depth_accept": [], "capture_ms": 0.0, "compile_ms": 0.0, "compile_fallbacks": 0,
            "captures": 0, "path": "graph", "identical_to_ar": True, "identical_to_hf": None, "batch_size": 1,
            "budgets": {"31": 20} if budget == "auto" else {}, "budget_costs": {}}  # fmt: skip


def test_per_pass_ratios_and_median(tmp_path):
    rows = []
    for (method, budget), per_pass in SECONDS.items():
        for number, seconds in enumerate(per_pass):
            for prompt in range(2):
                row = _row(method, budget, prompt, seconds)
                row["pass"] = number
                rows.append(row)
    (tmp_path / "results.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    line = next(x for x in _table(tmp_path) if x.startswith("| 1 |"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    # pooled tok/s: all decode tokens over all decode seconds; b31 is the best fixed budget
    pooled = {m: 6 * 60 / (2 * sum(s)) for m, s in SECONDS.items()}
    best = ("ddtree-b31-k8", 31)
    assert cells[2] == f"ddtree-b31-k8 {pooled[best]:.0f}"
    assert cells[4] == f"{pooled[('ddtree-auto', 'auto')] / pooled[best]:.2f}"
    ratios = [b / a for a, b in zip(SECONDS[("ddtree-auto", "auto")], SECONDS[best], strict=True)]
    assert cells[5] == f"{statistics.median(ratios):.2f} ({' '.join(f'{r:.2f}' for r in ratios)})"
    assert cells[6] == f"{pooled[('ddtree-auto', 'auto')] / pooled[('ar', 0)]:.2f}"


def test_one_pass_has_no_per_pass_ratio(tmp_path):
    rows = [dict(_row(m, b, p, s[0]), **{"pass": 0}) for (m, b), s in SECONDS.items() for p in range(2)]
    (tmp_path / "results.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    line = next(x for x in _table(tmp_path) if x.startswith("| 1 |"))
    assert [c.strip() for c in line.strip("|").split("|")][5] == "–"


def test_auto_rounds_split_by_the_budget_before_them(tmp_path):
    # two calls' rounds as [budget, ms]; a call's first round follows no round (a switch), None is not timed
    calls = [
        [[15, 0.50], [15, 0.40], [31, 0.70], [31, 0.60], [15, 0.48]],
        [[31, 0.66], [31, None], [31, 0.62], [15, 0.52]],
    ]
    rows = [dict(_row(m, b, p, s[0]), **{"pass": 0}) for (m, b), s in SECONDS.items() for p in range(2)
            if b != "auto"]  # fmt: skip
    for p, rounds in enumerate(calls):
        rows.append(dict(_row("ddtree-auto", "auto", p, 0.027), **{"pass": 0, "budget_rounds": rounds}))
    (tmp_path / "results.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    line = next(x for x in _table(tmp_path) if x.startswith("| 1 |"))
    cell = [c.strip() for c in line.strip("|").split("|")][10]
    # by hand: 15 steady [0.40], switch [0.50, 0.48, 0.52]; 31 steady [0.60, 0.62], switch [0.70, 0.66]
    assert cell == "15: 0.400 / 0.500 (1 / 3), 31: 0.610 / 0.680 (2 / 2)"


def test_wall_times_per_budget_and_one_line_per_auto_method(tmp_path):
    # fixed rows: their rounds' wall times; two auto methods (device and wall clocks), each with its rounds' budgets
    rows = []
    walls = {("ddtree-b15-k8", 15): [None, 0.80, 0.70, 0.90], ("ddtree-b31-k8", 31): [None, 1.00, 1.20]}
    for (m, b), s in SECONDS.items():
        if b == "auto":
            continue
        for p in range(2):
            rows.append(dict(_row(m, b, p, s[0]), **{"pass": 0, "round_wall_ms": walls.get((m, b), []),
                                                     "round_wait_ms": [0.1 * p, 0.2, 0.4]}))  # fmt: skip
    autos = {
        "ddtree-auto": ([[15, 0.5], [31, 0.6], [31, 0.6], [15, 0.5]], [None, 1.10, 1.30, 0.60]),
        "ddtree-auto-wall": ([[0, 0.3], [15, 0.8], [15, 0.7]], [None, 0.80, 0.70]),
    }
    for m, (rounds, wall) in autos.items():
        rows.append(dict(_row(m, "auto", 0, 0.027), **{"pass": 0, "budget_rounds": rounds, "round_wall_ms": wall,
                                                       "round_launch_ms": [0.04, 0.05, 0.06]}))  # fmt: skip
    (tmp_path / "results.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    lines = [x for x in _table(tmp_path) if x.startswith("| 1 |")]
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines]
    assert [c[3].split()[0] for c in cells] == ["ddtree-auto", "ddtree-auto-wall"]
    # by hand: medians over both prompts' rounds; auto's over all its timed rounds, then per budget
    # the waits: [0.0, 0.2, 0.4] and [0.1, 0.2, 0.4] per fixed method (median 0.2), none for auto, none for AR
    fixed = "b15 0.800 wait 0.200 launch –, b31 1.100 wait 0.200 launch –"
    assert cells[0][12] == f"all: 1.100, 15: 0.600, 31: 1.200, wait – launch 0.050 ({fixed})"
    assert cells[1][12] == f"all: 0.750, 15: 0.750, wait – launch 0.050 ({fixed})"
