"""Every example script and the tour notebook run to completion with small settings (``pytest -m examples``).

Deselected by default (a few minutes on 2 CPU cores); ``.ci/run`` runs them beside the slow tier. Each script
checks its own claim (output identical to ``model.generate``) and exits non-zero otherwise.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"

pytestmark = pytest.mark.examples

SMALL = {
    "quickstart.py": ["--max-new-tokens", "32", "--budget", "8"],
    "drop_in.py": ["--max-new-tokens", "24"],
    "hybrid_target.py": ["--max-new-tokens", "24", "--budget", "8"],
    "sweep_budgets.py": ["--budgets", "4", "16", "--num-prompts", "2", "--max-new-tokens", "24", "--out", "{tmp}/s"],
    "train_drafter.py": ["--max-steps", "4", "--out", "{tmp}/drafter"],
    "custom_policy.py": ["--max-new-tokens", "24", "--prompts", "1"],
}
LONGER = {"custom_policy.py": 160}  # a whole tree policy and verification rule
NEEDS = {"hybrid_target.py": "target-hybrid"}  # zoo items that do not ship with the project


def test_every_example_is_listed_and_short():
    scripts = sorted(p.name for p in EXAMPLES.glob("*.py"))
    assert scripts == sorted(SMALL)
    for name in scripts:
        assert len((EXAMPLES / name).read_text().splitlines()) < LONGER.get(name, 100), name


@pytest.mark.parametrize("script", sorted(SMALL))
def test_example_runs(script, tmp_path, zoo):
    if script in NEEDS:
        zoo / NEEDS[script]  # skips, as every test of the zoo's hybrid target, where only the shipped zoo is here
    args = [a.format(tmp=tmp_path) for a in SMALL[script]]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, str(EXAMPLES / script), *args], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=600)  # fmt: skip
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    if script == "sweep_budgets.py":
        assert (tmp_path / "s" / "budgets.png").is_file()


def test_tour_notebook_runs_and_its_stored_outputs_are_complete(zoo):
    import nbformat  # the dev extras bring nbformat, nbclient and ipykernel
    from nbclient import NotebookClient

    stored = nbformat.read(EXAMPLES / "tour.ipynb", as_version=4)
    code = [c for c in stored.cells if c.cell_type == "code"]
    assert code and all(c.execution_count for c in code), "commit the notebook executed, with its outputs"
    assert _text(stored).count("identical to model.generate: True") == 2
    assert any(o.output_type == "display_data" and "image/png" in o.data for o in code[-1].outputs)
    fresh = nbformat.read(EXAMPLES / "tour.ipynb", as_version=4)
    NotebookClient(fresh, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(EXAMPLES)}}).execute()
    assert _text(fresh).count("identical to model.generate: True") == 2


def _text(notebook) -> str:
    return "".join(o.get("text", "") for c in notebook.cells if c.cell_type == "code" for o in c.outputs)
