"""The graph floor: the time of one CUDA-graph-captured single-token forward of the target.

No decoding loop that runs the target once per token can beat it, so the bench prints it next to the tok/s
rows, with the bandwidth floor (the target's weight bytes over the device's copy bandwidth). The forward runs
through HF's own ``StaticCache`` at the last position of a ``context_len`` window.
"""

from __future__ import annotations

import statistics
import time

import torch

__all__ = ["bandwidth_floor", "graph_floor_ms", "median_ms"]


def graph_floor_ms(model, *, context_len: int, replays: int = 50, warmup: int = 3) -> float | None:
    """Median time of one graph-captured 1-token forward of ``model`` with a static KV cache.

    The cache is HF's ``StaticCache`` sized for ``context_len`` tokens; the captured forward takes one token at
    ``cache_position = context_len - 1`` (attending over the whole window), and is replayed ``replays`` times
    after ``warmup`` eager runs on a side stream and ``warmup`` untimed replays.

    Args:
        model: an HF causal LM (``model.model`` wrapped by ``specdec.target.TargetModel`` is accepted too).
        context_len (int): cache length, e.g. the longest prompt plus ``max_new_tokens``.
        replays (int): timed replays; the median is returned. Default 50.
        warmup (int): eager runs before capture, and untimed replays before timing. Default 3.

    Returns:
        float | None: milliseconds per forward, or None when the model is not on a CUDA device.

    Examples:
        >>> graph_floor_ms(model, context_len=prompt_len + max_new_tokens)
        0.93
    """
    from transformers import StaticCache

    model = getattr(model, "model", model) if not hasattr(model, "generate") else model
    device = model.get_input_embeddings().weight.device
    if device.type != "cuda":
        return None
    if context_len < 1:
        raise ValueError(f"context_len={context_len} must be >= 1.")
    cache = StaticCache(config=model.config, max_cache_len=context_len)
    ids = torch.zeros(1, 1, dtype=torch.long, device=device)
    position = torch.full((1,), context_len - 1, dtype=torch.long, device=device)
    inputs = dict(
        input_ids=ids, past_key_values=cache, cache_position=position, position_ids=position[None], use_cache=True
    )
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.no_grad(), torch.cuda.stream(stream):
        for _ in range(warmup):
            model(**inputs)
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        model(**inputs)
    for _ in range(warmup):
        graph.replay()
    return median_ms(graph.replay, device, iters=replays)


def median_ms(fn, device: torch.device, *, iters: int = 30) -> float:
    """Median milliseconds of ``fn()`` over ``iters`` calls: CUDA events around each call on a CUDA ``device``
    (the device's time for the work ``fn`` enqueues), wall time elsewhere. ``fn`` should be warm."""
    times = []
    for _ in range(iters):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t = time.perf_counter()
            fn()
            times.append(1e3 * (time.perf_counter() - t))
    return statistics.median(times)


def bandwidth_floor(model, *, copy_mib: int = 1024) -> dict:
    """The weights' bandwidth floor of one forward: ``weights_gb`` (the target's parameter bytes), ``copy_tb_s``
    (median device-to-device copy bandwidth, bytes read + written) and ``hbm_floor_ms`` (weights / bandwidth: no
    forward that reads every weight once can be faster). An empty dict off CUDA.
    """
    device = next(model.parameters()).device
    if device.type != "cuda":
        return {}
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    x = torch.empty(copy_mib * 2**20, dtype=torch.uint8, device=device)
    y = torch.empty_like(x)
    y.copy_(x)
    ms = median_ms(lambda: y.copy_(x), device, iters=20)
    bytes_per_s = 2 * copy_mib * 2**20 / (ms / 1e3)
    return {"weights_gb": weights / 1e9, "copy_tb_s": bytes_per_s / 1e12, "hbm_floor_ms": 1e3 * weights / bytes_per_s}
