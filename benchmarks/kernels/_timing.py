"""Timing shared by the kernel benchmarks: (median, 20th, 80th percentile) ms per call."""

from __future__ import annotations

import time

import torch

QUANTILES = [0.5, 0.2, 0.8]


def time_call(fn, device: torch.device, *, graph: bool = False, rep: int = 50) -> tuple[float, float, float]:
    """Quantiles of ``fn()``'s time in ms after a warm-up: on CUDA Triton's ``do_bench`` (``graph``: replayed in a
    CUDA graph, no launch overhead) for about ``rep`` ms; elsewhere wall time of 15 calls."""
    if device.type != "cuda":
        for _ in range(2):
            fn()
        times = []
        for _ in range(15):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
        return tuple(torch.tensor(times).quantile(torch.tensor(QUANTILES)).tolist())
    import triton.testing

    if graph:
        return tuple(triton.testing.do_bench_cudagraph(fn, rep=rep, quantiles=QUANTILES))
    return tuple(triton.testing.do_bench(fn, warmup=rep // 5, rep=rep, quantiles=QUANTILES))
