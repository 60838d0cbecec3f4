"""Speed of ``tree_mamba2`` (one layer's SSD recurrence over a draft tree).

Providers: ``tree_scan`` (the adapter's former path: ``tree_scan`` + ``mamba2_step``, level-synchronous, then the
D skip), ``reference`` (``tree_mamba2_reference``, level-synchronous), ``compiled`` (the reference with its
per-depth step under ``torch.compile``), ``triton`` (one fused launch) and ``triton-graph`` (the same launch
replayed in a CUDA graph: kernel time without the host's launch overhead). The Triton providers need a CUDA
device (elsewhere they print ``nan``). Shapes: the test suite's tiny Mamba2 layer, a Nemotron-H-8B layer and a
Falcon-H1-like layer (one group, state size 256); trees: a chain and a random tree (uniform random parents),
N = 1 .. 128 nodes.

    python benchmarks/kernels/bench_tree_mamba2.py [--device cuda] [--shapes nemotron-h-8b] [--out bench_out/kernels]

Prints a table (median ms per layer, speedup of Triton over ``tree_scan``, Triton's GB/s over its minimal
traffic) and, on CUDA, a sweep of launch configurations; writes both as CSV under ``--out`` (an ignored folder).
"""

from __future__ import annotations

import argparse
import datetime
import functools
import math
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.testing
from _common import print_table, time_call, write_csv  # benchmarks/kernels, beside this script
from oracles.eager_state import TreeTopology, tree_scan

from specdec.kernels.tree_mamba2.reference import level_scan, mamba2_update, tree_mamba2_reference
from specdec.state.mamba2 import mamba2_step
from specdec.types import DraftTree

REPO = Path(__file__).resolve().parents[2]
PROVIDERS = ["tree_scan", "reference", "compiled", "triton", "triton-graph"]
NODES = [1, 16, 32, 64, 128]
TREES = ["chain", "random"]
SHAPES = {  # heads H, head dim P, state size S, groups G
    "tiny": {"h": 8, "p": 16, "s": 16, "g": 2},
    "nemotron-h-8b": {"h": 128, "p": 64, "s": 128, "g": 8},
    "falcon-h1-like": {"h": 24, "p": 128, "s": 256, "g": 1},
}


def make_inputs(shape: dict[str, int], n: int, tree: str, device: torch.device, seed: int = 0) -> dict:
    gen = torch.Generator().manual_seed(seed)
    h, p, s, g = shape["h"], shape["p"], shape["s"], shape["g"]
    parents = [-1] + [i - 1 if tree == "chain" else int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, n)]
    inputs = dict(
        init_state=torch.randn(h, p, s, generator=gen),
        x=torch.randn(n, h, p, generator=gen).to(torch.bfloat16),
        B=torch.randn(n, g, s, generator=gen).to(torch.bfloat16),
        C=torch.randn(n, g, s, generator=gen).to(torch.bfloat16),
        dt=F.softplus(torch.randn(n, h, generator=gen) - 1.0),
        A=-torch.exp(torch.randn(h, generator=gen) * 0.5),
        D=torch.randn(h, generator=gen),
        parents=torch.tensor(parents, dtype=torch.long),
    )
    return {name: t.to(device) for name, t in inputs.items()}


def tree_scan_fn(inputs: dict):
    """The adapter's former path, as it ran: ``tree_scan`` over a prebuilt topology, ``mamba2_step`` per depth."""
    x, dt, A, D = inputs["x"], inputs["dt"], inputs["A"], inputs["D"]
    rep = x.shape[1] // inputs["B"].shape[1]
    B, C = inputs["B"], inputs["C"].float().repeat_interleave(rep, dim=1)
    parents = inputs["parents"].cpu()
    topo = TreeTopology.from_tree(DraftTree(tokens=torch.zeros_like(parents), parents=parents), x.device)
    init = inputs["init_state"][None]

    def step(parent_states, nodes):
        states = mamba2_step(
            parent_states,
            x.index_select(0, nodes).float(),
            dt.index_select(0, nodes),
            B.index_select(0, nodes).float().repeat_interleave(rep, dim=1),
            A,
        )
        return states, (states * C.index_select(0, nodes)[:, :, None, :]).sum(-1)

    return lambda: tree_scan(init, topo, step) + D.float()[:, None] * x.float()


class Runner:
    def __init__(self, device: torch.device, shapes: dict[str, dict[str, int]]) -> None:
        self.device = device
        self.shapes = shapes
        self.compiled_step = torch.compile(mamba2_update, dynamic=True)
        self.results: dict[tuple, float] = {}

    def fn(self, provider: str, inputs: dict):
        if provider == "tree_scan":
            return tree_scan_fn(inputs)
        if provider == "reference":
            return lambda: tree_mamba2_reference(**inputs)
        if provider == "compiled":
            return lambda: level_scan(**inputs, step=self.compiled_step)
        if self.device.type != "cuda":
            return None
        from specdec.kernels.tree_mamba2.triton import tree_mamba2_triton

        return lambda: tree_mamba2_triton(**inputs)

    def bench(self, n: int, provider: str, shape_name: str, tree: str) -> tuple[float, float, float]:
        inputs = make_inputs(self.shapes[shape_name], n, tree, self.device)
        fn = self.fn(provider, inputs)
        try:
            ms = (
                time_call(fn, self.device, graph=provider == "triton-graph", rep=50)
                if fn is not None
                else (math.nan,) * 3
            )
        except Exception as exc:  # an optional provider that fails (e.g. no compiler) leaves a gap, not a crash
            print(f"  {provider} {shape_name} {tree} N={n}: {type(exc).__name__}: {str(exc)[:120]}")
            ms = (math.nan,) * 3
        self.results[(shape_name, tree, n, provider)] = ms[0]
        return ms


def min_bytes(shape: dict[str, int], n: int) -> int:
    """Compulsory traffic: the committed state, per-node x, B, C (bf16), dt, parent, outputs; A and D."""
    h, p, s, g = shape["h"], shape["p"], shape["s"], shape["g"]
    return 4 * h * p * s + 8 * h + n * (2 * h * p + 4 * g * s + 4 * h + 8 + 4 * h * p)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else torch.device("cpu")
    parser.add_argument("--device", default=str(default))
    parser.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    parser.add_argument("--out", default=str(REPO / "bench_out" / "kernels"))
    args = parser.parse_args()
    device = torch.device(args.device)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    runner = Runner(device, {name: SHAPES[name] for name in args.shapes})
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"tree_mamba2 | {name} | torch {torch.__version__} | triton {triton.__version__} | {datetime.date.today()}")

    for shape_name in runner.shapes:  # a plain loop: triton's perf_report would need pandas
        for tree in TREES:
            for n in NODES:
                for provider in PROVIDERS:
                    runner.bench(n, provider, shape_name, tree)

    rows = []
    for shape_name, shape in runner.shapes.items():
        for tree in TREES:
            for n in NODES:
                ms = {p: runner.results[(shape_name, tree, n, p)] for p in PROVIDERS}
                gbps = min_bytes(shape, n) / (ms["triton"] * 1e-3) / 1e9
                rows.append(
                    {"shape": shape_name, "tree": tree, "n": n, **ms, "speedup": ms["tree_scan"] / ms["triton"]}
                    | {"triton_gbps": gbps}
                )
    header = ["shape", "tree", "n", *PROVIDERS, "speedup", "triton_gbps"]
    print_table(rows, header)
    write_csv(out_dir / "tree_mamba2.csv", rows, header)
    if device.type == "cuda":
        sweep = _sweep(runner)
        print_table(sweep, list(sweep[0]))
        write_csv(out_dir / "tree_mamba2_configs.csv", sweep, list(sweep[0]))
    print(f"CSV under {out_dir}")


def _sweep(runner: Runner) -> list[dict]:
    """Launch configurations of the kernel at N = 64 (random tree): channel block x warps."""
    from specdec.kernels.tree_mamba2.triton import _launch_config, _tree_mamba2

    rows = []
    for shape_name, shape in runner.shapes.items():
        inputs = make_inputs(shape, 64, "random", runner.device)
        default = _launch_config(shape["p"], shape["s"])
        for block_p in (4, 8, 16, 32):
            for num_warps in (1, 2, 4):
                fn = functools.partial(_tree_mamba2, **inputs, block_p=block_p, num_warps=num_warps)
                ms = time_call(fn, runner.device)[0]
                rows.append(
                    {"shape": shape_name, "block_p": block_p, "num_warps": num_warps, "triton": ms}
                    | {"default": "*" if (block_p, num_warps) == default else ""}
                )
    return rows


if __name__ == "__main__":
    main()
