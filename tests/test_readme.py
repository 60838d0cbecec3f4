"""The README's Python snippet runs as written (from the project folder) and is lossless."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]


def test_readme_snippet_runs_and_equals_hf_generate(zoo, monkeypatch):
    text = (REPO / "README.md").read_text()
    snippet = re.search(r"```python\n(.*?)```", text, flags=re.S).group(1)
    assert "DFlashDrafter.from_pretrained" in snippet and "DDTree(" in snippet  # leads with DFlash + DDTree
    monkeypatch.chdir(REPO)
    scope: dict = {}
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(snippet, "README.md", "exec"), scope)
    model, ids, out = scope["model"], scope["ids"], scope["out"]
    assert torch.equal(out.sequences, model.generate(ids, do_sample=False, max_new_tokens=128))
    assert out.stats.tau > 1.0


def test_readme_names_the_two_commands_and_no_development_process():
    text = (REPO / "README.md").read_text()
    assert "make demo" in text and "make test" in text
    for word in ("issue", "session", "helper", " AI ", "agent"):
        assert word not in text, word
