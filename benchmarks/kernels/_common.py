"""Shared by the kernel benchmarks: timing ((median, 20th, 80th percentile) ms per call), table and CSV output."""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path
from pathlib import Path as _Path

import torch

# The host references the benchmarks compare against are test oracles (tests/oracles), never library code.
sys.path.insert(0, str(_Path(__file__).resolve().parents[2] / "tests"))

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


def print_table(rows: list[dict], header: list[str]) -> None:
    def fmt(x) -> str:
        return f"{x:.4f}" if isinstance(x, float) and x < 100 else (f"{x:.0f}" if isinstance(x, float) else str(x))

    cells = [header] + [[fmt(row[h]) for h in header] for row in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(header))]
    for line in cells:
        print("  ".join(c.rjust(w) for c, w in zip(line, widths, strict=True)))


def write_csv(path: Path, rows: list[dict], header: list[str]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=header)
        writer.writeheader()
        writer.writerows(rows)


def bench_args(description: str, extra=None) -> tuple[argparse.Namespace, torch.device, str]:
    """The kernel benchmarks' command line (``--device``, ``--out``, and what ``extra(parser)`` adds): parsed args,
    the device, its name."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--device", default=None, help="torch device; default: the current accelerator, else cpu")
    parser.add_argument("--out", default="bench_out/kernels", help="folder for the CSV (ignored by git)")
    if extra is not None:
        extra(parser)
    args = parser.parse_args()
    accel = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    device = torch.device(args.device or (accel.type if accel is not None else "cpu"))
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return args, device, name


def cuda_bench_args(description: str, extra=None) -> tuple[argparse.Namespace, torch.device, str]:
    """``bench_args`` for a benchmark that only times CUDA graphs: refuses to run without a CUDA device."""
    args, device, name = bench_args(description, extra)
    if device.type != "cuda":
        raise SystemExit("this benchmark times CUDA graphs: run it on a CUDA device")
    return args, device, name


def report(rows: list[dict], columns: list[str], out: str, filename: str, device: torch.device) -> None:
    """Print ``columns`` of ``rows`` (after a note when there is no CUDA device) and write every column as CSV."""
    if device.type != "cuda":
        print("no CUDA device: only the eager torch reference runs (graph and Triton columns are nan)")
    print_table(rows, columns)
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    write_csv(folder / filename, rows, list(rows[0]))
    print(f"CSV: {folder / filename}")


def time_providers(row: dict, providers: list[str], make_call, device: torch.device) -> dict:
    """Fill ``row[provider]`` (median ms) and ``_p20`` / ``_p80`` for each provider; ``make_call(provider)`` returns
    the function to time or None (not available here: nan). Providers ending in ``-graph`` replay a CUDA graph."""
    for provider in providers:
        fn = make_call(provider)
        ms = (float("nan"),) * 3 if fn is None else time_call(fn, device, graph=provider.endswith("-graph"), rep=100)
        row[provider], row[f"{provider}_p20"], row[f"{provider}_p80"] = ms
    return row


IMPL_PROVIDERS = ["torch", "torch-graph", "triton", "triton-graph"]
"""The providers of a kernel with a reference and a Triton version: the reference eager and replayed, Triton eager
and replayed."""


def time_impls(row: dict, op, args: tuple, device: torch.device) -> dict:
    """:func:`time_providers` over ``IMPL_PROVIDERS`` for ``op(*args, impl=...)`` (all but ``torch`` need CUDA), then
    ``row["graph speedup"]``: the replayed reference's time over the replayed Triton's."""

    def make_call(provider: str):
        if provider != "torch" and device.type != "cuda":
            return None
        impl = "torch" if provider.startswith("torch") else "triton"
        return lambda: op(*args, impl=impl)

    time_providers(row, IMPL_PROVIDERS, make_call, device)
    if row.get("triton-graph"):
        row["graph speedup"] = row["torch-graph"] / row["triton-graph"]
    return row
