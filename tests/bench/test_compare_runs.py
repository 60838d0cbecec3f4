"""specdec.bench.compare_runs: the share of identical outputs between two finished bench runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specdec.bench import compare_runs


def _run_dir(tmp_path: Path, name: str, outputs: dict) -> Path:
    """A run folder whose results.jsonl holds one greedy row per (method, prompt) with its tokens."""
    folder = tmp_path / name
    folder.mkdir()
    rows = [
        {"method": method, "temperature": 0.0, "prompt_id": pid, "pass": 0, "tokens": tokens}
        for method, per_prompt in outputs.items()
        for pid, tokens in per_prompt.items()
    ]
    rows += [dict(r, **{"pass": 1, "tokens": [0]}) for r in rows]  # later passes are not compared
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def _table(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("| ") and "method" not in line]


def test_counts_identical_prompts_and_where_the_others_part(tmp_path):
    a = _run_dir(tmp_path, "a", {
        "ar": {"p1": [5, 6, 7], "p2": [1, 2, 3], "p3": [9, 9]},
        "ddtree-b32-k8": {"p1": [5, 6, 7], "p2": [1, 2, 3]},
        "only-in-a": {"p1": [1]},
    })  # fmt: skip
    b = _run_dir(tmp_path, "b", {
        "ar": {"p1": [5, 6, 7], "p2": [1, 4, 3], "p3": [9]},  # p2 parts at token 1; p3 is a prefix: parts at 1
        "ddtree-b32-k8": {"p1": [5, 6, 7], "p2": [1, 2, 3]},
    })  # fmt: skip
    text = compare_runs(a, b)
    assert _table(text) == ["| ar | 1/3 | 1, 1 |", "| ddtree-b32-k8 | 2/2 | - |"]
    assert "- not in both runs, not compared: only-in-a" in text


def test_against_compares_every_row_of_the_second_run_with_one_row_of_the_first(tmp_path):
    a = _run_dir(tmp_path, "a", {"hf-generate": {"p1": [1, 2], "p2": [3, 4]}, "ar": {"p1": [0], "p2": [0]}})
    b = _run_dir(tmp_path, "b", {"ar": {"p1": [1, 2], "p2": [3, 5]}, "ddtree-b16-k8": {"p1": [1, 2], "p2": [3, 4]}})
    text = compare_runs(a, b / "results.jsonl", against="hf-generate")
    assert _table(text) == ["| ar | 1/2 | 1 |", "| ddtree-b16-k8 | 2/2 | - |"]
    assert "not compared" not in text
    with pytest.raises(ValueError, match="no 'hf-static' row"):
        compare_runs(a, b, against="hf-static")


def test_a_run_without_tokens_is_refused_with_the_fix(tmp_path):
    old = tmp_path / "old"
    old.mkdir()
    (old / "results.jsonl").write_text(json.dumps({"method": "ar", "temperature": 0.0, "prompt_id": "p"}) + "\n")
    with pytest.raises(ValueError, match="no tokens.*run the bench again"):
        compare_runs(old, old)
    with pytest.raises(FileNotFoundError):
        compare_runs(tmp_path / "missing", old)
