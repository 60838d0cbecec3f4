"""Spies on every way a tensor value reaches the host, inside the round functions only."""

from __future__ import annotations

import traceback

import torch

READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__")


def spy_round_reads(monkeypatch, *, exempt: tuple[str, ...] = (), everywhere: bool = False) -> list[str]:
    """Patch ``torch.Tensor``'s host reads and ``Round._round`` / ``_ar_round``; returns the list that collects
    ``"name at file:line"`` of each read made while a round function runs (``everywhere``: of every read), except
    reads with a frame of a file whose path contains one of ``exempt`` on the stack."""
    import specdec.engine as engine

    reads: list[str] = []
    inside = [everywhere]
    for name in READS:
        original = getattr(torch.Tensor, name)

        def spy(self, *args, _original=original, _name=name, **kwargs):
            if inside[0]:
                stack = traceback.extract_stack()[:-1]
                if not any(part in frame.filename for frame in stack for part in exempt):
                    reads.append(f"{_name} at {stack[-1].filename}:{stack[-1].lineno}")
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, spy)
    for fn in ("_round", "_ar_round"):
        original = getattr(engine.Round, fn)

        def traced(self, _original=original):
            inside[0] = True
            try:
                return _original(self)
            finally:
                inside[0] = everywhere

        monkeypatch.setattr(engine.Round, fn, traced)
    return reads
