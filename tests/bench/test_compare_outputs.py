"""benchmarks/e2e/compare_outputs.py: the share of identical outputs between two fast_path.py runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "e2e" / "compare_outputs.py"


def _run_dir(tmp_path: Path, name: str, outputs) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "results.json").write_text(json.dumps({"rows": [], "outputs": outputs}))
    return folder


def _compare(*folders) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, SCRIPT, *map(str, folders)], capture_output=True, text=True, cwd=REPO)


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
    done = _compare(a, b)
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ") and "method" not in line]
    assert rows == ["| ar | 1/3 | 1, 1 |", "| ddtree-b32-k8 | 2/2 | - |"]
    assert "- not in both runs, not compared: only-in-a" in done.stdout


def test_against_compares_every_row_of_the_second_run_with_one_row_of_the_first(tmp_path):
    a = _run_dir(tmp_path, "a", {"hf-generate": {"p1": [1, 2], "p2": [3, 4]}, "ar": {"p1": [0], "p2": [0]}})
    b = _run_dir(tmp_path, "b", {"ar": {"p1": [1, 2], "p2": [3, 5]}, "ddtree-b16-k8": {"p1": [1, 2], "p2": [3, 4]}})
    done = _compare(a, b, "--against", "hf-generate")
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ") and "method" not in line]
    assert rows == ["| ar | 1/2 | 1 |", "| ddtree-b16-k8 | 2/2 | - |"]
    assert "not compared" not in done.stdout
    done = _compare(a, b, "--against", "hf-static")
    assert done.returncode != 0 and "no 'hf-static' row" in done.stderr


def test_a_run_without_outputs_is_refused_with_the_fix(tmp_path):
    old = tmp_path / "old"
    old.mkdir()
    (old / "results.json").write_text(json.dumps({"rows": []}))
    done = _compare(old, old)
    assert done.returncode != 0 and "no outputs" in done.stderr and "run it again" in done.stderr
    done = _compare(tmp_path / "missing", old)
    assert done.returncode != 0 and "not found" in done.stderr
