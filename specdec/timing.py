"""Phase timers for the decode loop: CUDA events on GPU (no host sync inside a round), perf_counter on CPU."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager

import torch

__all__ = ["PhaseTimer"]


class PhaseTimer:
    """Accumulates wall time per named phase; ``totals_ms()`` resolves pending CUDA events once at the end."""

    def __init__(self, device: torch.device | str) -> None:
        self._cuda = torch.device(device).type == "cuda"
        # the stream the events are recorded on, asked once (asking costs more host time than recording an event)
        self.stream = torch.cuda.current_stream(device) if self._cuda else None
        self._cpu_ms: dict[str, float] = defaultdict(float)
        self._events: list[tuple[str, object, object]] = []

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        if self._cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(self.stream)
            try:
                yield
            finally:
                end.record(self.stream)
                self._events.append((phase, start, end))
        else:
            t0 = time.perf_counter()
            try:
                yield
            finally:
                self._cpu_ms[phase] += (time.perf_counter() - t0) * 1e3

    def totals_ms(self) -> dict[str, float]:
        totals = dict(self._cpu_ms)
        if self._events:
            torch.cuda.synchronize()
            for phase, start, end in self._events:
                totals[phase] = totals.get(phase, 0.0) + start.elapsed_time(end)
        return totals
