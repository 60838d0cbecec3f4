"""``profile: true``: one warm call per method under ``torch.profiler``, around the public ``generate`` call.

For each method and temperature, the first prompt is decoded once more (after the timed passes, so warm) with
the profiler recording host ops and, on CUDA, device kernels (kernels replayed from CUDA graphs included). Each
call's Chrome trace goes to ``profile/<method>[-T<t>].trace.json``; ``profile.md`` holds, per method, the call's
wall time, its rounds, the kernels launched and their summed device time per round (the round's kernel time
without launch gaps: wall ms per round minus it is what the host and the gaps between kernels add), and the
heaviest ops.
"""

from __future__ import annotations

import logging
import re
import time
import warnings
from collections.abc import Sequence
from pathlib import Path

import torch

__all__ = ["profile_methods"]

logger = logging.getLogger(__name__)

_CYCLE_WARNING = ".*Profiler clears events"  # torch: a finished profile keeps one cycle's events (all we record)


def _file_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)


def _device_events(prof) -> list:
    """The device-side events (kernels, memcpys) of a finished profile."""
    from torch.autograd import DeviceType

    return [
        e
        for e in prof.events()
        if e.device_type in (DeviceType.CUDA, DeviceType.PrivateUse1)
        and not getattr(e, "is_user_annotation", False)  # the bench's own range, mirrored on the device timeline
        and not e.name.startswith("bench:")
    ]


def profile_methods(runners: Sequence, cases: Sequence, out_dir: Path, seed: int, *, row_limit: int = 15) -> list[dict]:
    """Profile one call per (method, temperature) of ``runners`` (``specdec.bench.harness._Runner``) on the
    first prompt; write the traces and ``profile.md`` into ``out_dir``.

    Returns:
        list[dict]: per call ``method, temperature, wall_ms, rounds, kernels, kernel_ms, trace`` (``kernels`` and
        ``kernel_ms`` are None off CUDA).
    """
    from torch.profiler import ProfilerActivity, profile, record_function

    folder = out_dir / "profile"
    folder.mkdir(parents=True, exist_ok=True)
    firsts = {}
    for temperature, (i, ids) in cases:
        firsts.setdefault(temperature, (i, ids))
    summaries, sections = [], []
    for run in runners:
        for temperature, (i, ids) in firsts.items():
            cuda = ids.device.type == "cuda"
            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
            with warnings.catch_warnings(), profile(activities=activities) as prof:
                warnings.filterwarnings("ignore", message=_CYCLE_WARNING)
                start = time.perf_counter()
                with record_function(f"bench:{run.name}"):
                    _, row = run(temperature, seed + i, str(i), ids)
                if cuda:
                    torch.cuda.synchronize(ids.device)
                wall_ms = 1e3 * (time.perf_counter() - start)
            suffix = f"-T{temperature:g}" if len(firsts) > 1 else ""
            trace = folder / f"{_file_name(run.name)}{suffix}.trace.json"
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=_CYCLE_WARNING)
                prof.export_chrome_trace(str(trace))
                kernels = _device_events(prof) if cuda else None
                table = prof.key_averages().table(
                    sort_by="self_cuda_time_total" if cuda else "self_cpu_time_total",
                    row_limit=row_limit,
                    max_name_column_width=60,
                )
            kernel_ms = sum(e.time_range.elapsed_us() for e in kernels) / 1e3 if kernels is not None else None
            rounds = int(row.get("rounds") or 0)
            summary = {
                "method": run.name,
                "temperature": temperature,
                "wall_ms": wall_ms,
                "rounds": rounds,
                "kernels": len(kernels) if kernels is not None else None,
                "kernel_ms": kernel_ms,
                "trace": str(trace.relative_to(out_dir)),
            }
            summaries.append(summary)
            sections.append(_section(summary, table))
            logger.info("profiled %s T=%g: %.1f ms, %d rounds", run.name, temperature, wall_ms, rounds)
    lines = [
        "# Profile: one warm call per method (first prompt)",
        "",
        "| method | T | wall ms | rounds | wall ms / round | kernels / round | kernel ms / round | trace |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in summaries:
        per = max(s["rounds"], 1)
        kernels = "–" if s["kernels"] is None else f"{s['kernels'] / per:.0f}"
        kernel_ms = "–" if s["kernel_ms"] is None else f"{s['kernel_ms'] / per:.3f}"
        lines.append(f"| {s['method']} | {s['temperature']:g} | {s['wall_ms']:.1f} | {s['rounds']} | "
                     f"{s['wall_ms'] / per:.3f} | {kernels} | {kernel_ms} | {s['trace']} |")  # fmt: skip
    (out_dir / "profile.md").write_text("\n".join(lines) + "\n\n" + "\n".join(sections))
    return summaries


def _section(summary: dict, table: str) -> str:
    return f"## {summary['method']}, T={summary['temperature']:g}\n\n```\n{table}\n```\n"
