"""Speed of ``tree_gdn`` (one layer's gated delta-rule recurrence over a draft tree).

Providers: ``tree_scan`` (the adapter's former path: ``tree_scan`` + ``gdn_step``, level-synchronous),
``reference`` (``tree_gdn_reference``, level-synchronous), ``compiled`` (the reference with its per-depth step
under ``torch.compile``), ``triton`` (one fused launch) and ``triton-graph`` (the same launch replayed in a CUDA
graph: kernel time without the host's launch overhead). Shapes: the zoo hybrid target's GDN layer and a
Qwen3.5-27B-like layer; trees: a chain and a random tree (uniform random parents), N = 16 .. 128 nodes.

    python benchmarks/kernels/bench_tree_gdn.py [--device cuda] [--out bench_out/kernels]

Prints a table (median ms, speedup of Triton over ``tree_scan``, Triton's GB/s over its minimal traffic) and a
sweep of launch configurations; writes both as CSV under ``--out`` (an ignored folder).
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.testing
from _common import print_table, time_call, write_csv  # benchmarks/kernels, beside this script

from specdec.kernels.tree_gdn.reference import gdn_update, level_scan, tree_gdn_reference
from specdec.state.gdn import gdn_step
from specdec.state.hybrid import TreeTopology, tree_scan
from specdec.types import DraftTree

REPO = Path(__file__).resolve().parents[2]
ZOO_CONFIG = REPO.parent / "shared" / "zoo" / "target-hybrid" / "config.json"
PROVIDERS = ["tree_scan", "reference", "compiled", "triton", "triton-graph"]
NODES = [16, 32, 64, 128]
TREES = ["chain", "random"]


def shapes() -> dict[str, dict[str, int]]:
    zoo = {"hv": 8, "h": 4, "k": 64, "v": 64}  # as in the zoo's config.json, if that is not at hand
    if ZOO_CONFIG.is_file():
        cfg = json.loads(ZOO_CONFIG.read_text())
        zoo = {
            "hv": cfg["linear_num_value_heads"],
            "h": cfg["linear_num_key_heads"],
            "k": cfg["linear_key_head_dim"],
            "v": cfg["linear_value_head_dim"],
        }
    return {"zoo-hybrid": zoo, "qwen3.5-27b": {"hv": 48, "h": 16, "k": 128, "v": 128}}


def make_inputs(shape: dict[str, int], n: int, tree: str, device: torch.device, seed: int = 0) -> dict:
    gen = torch.Generator().manual_seed(seed)
    hv, h, k, v = shape["hv"], shape["h"], shape["k"], shape["v"]
    parents = [-1] + [i - 1 if tree == "chain" else int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, n)]
    inputs = dict(
        init_state=torch.randn(hv, k, v, generator=gen),
        q=F.normalize(torch.randn(n, hv, k, generator=gen), dim=-1) * k**-0.5,
        k=F.normalize(torch.randn(n, h, k, generator=gen), dim=-1),
        v=torch.randn(n, hv, v, generator=gen).to(torch.bfloat16),
        log_decay=-F.softplus(torch.randn(n, hv, generator=gen)) * 0.5,
        beta=torch.rand(n, hv, generator=gen),
        parents=torch.tensor(parents, dtype=torch.long),
    )
    return {name: t.to(device) for name, t in inputs.items()}


def tree_scan_fn(inputs: dict):
    """The adapter's former path, as it ran: ``tree_scan`` over a prebuilt topology, ``gdn_step`` per depth."""
    q, k, v, g, beta = (inputs[name] for name in ("q", "k", "v", "log_decay", "beta"))
    rep = q.shape[1] // k.shape[1]
    parents = inputs["parents"].cpu()
    topo = TreeTopology.from_tree(DraftTree(tokens=torch.zeros_like(parents), parents=parents), q.device)
    init = inputs["init_state"][None]

    def step(parent_states, nodes):
        states = gdn_step(
            parent_states,
            k.index_select(0, nodes).repeat_interleave(rep, dim=1),
            v.index_select(0, nodes).float(),
            g.index_select(0, nodes),
            beta.index_select(0, nodes),
        )
        return states, (states * q.index_select(0, nodes)[..., None]).sum(-2)

    return lambda: tree_scan(init, topo, step)


class Runner:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.compiled_step = torch.compile(gdn_update, dynamic=True)
        self.results: dict[tuple, float] = {}

    def fn(self, provider: str, inputs: dict):
        if provider == "tree_scan":
            return tree_scan_fn(inputs)
        if provider == "reference":
            return lambda: tree_gdn_reference(**inputs)
        if provider == "compiled":
            return lambda: level_scan(**inputs, step=self.compiled_step)
        if self.device.type != "cuda":
            return None
        from specdec.kernels.tree_gdn.triton import tree_gdn_triton

        return lambda: tree_gdn_triton(**inputs)

    def bench(self, n: int, provider: str, shape_name: str, tree: str) -> tuple[float, float, float]:
        inputs = make_inputs(shapes()[shape_name], n, tree, self.device)
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
    """Compulsory traffic: the committed state, per-node q, k, v (bf16), g, beta, parent, outputs."""
    hv, h, k, v = shape["hv"], shape["h"], shape["k"], shape["v"]
    return 4 * hv * k * v + n * (4 * hv * k + 4 * h * k + 2 * hv * v + 8 * hv + 8 + 4 * hv * v)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else torch.device("cpu")
    parser.add_argument("--device", default=str(default))
    parser.add_argument("--out", default=str(REPO / "bench_out" / "kernels"))
    args = parser.parse_args()
    device = torch.device(args.device)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    runner = Runner(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"tree_gdn | {name} | torch {torch.__version__} | triton {triton.__version__} | {datetime.date.today()}")

    benchmarks = [
        triton.testing.Benchmark(
            x_names=["n"],
            x_vals=NODES,
            line_arg="provider",
            line_vals=PROVIDERS,
            line_names=PROVIDERS,
            plot_name=f"tree_gdn-{shape_name}-{tree}",
            args={"shape_name": shape_name, "tree": tree},
            ylabel="ms",
        )
        for shape_name in shapes()
        for tree in TREES
    ]
    triton.testing.perf_report(benchmarks)(runner.bench).run(print_data=False)

    rows = []
    for shape_name, shape in shapes().items():
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
    write_csv(out_dir / "tree_gdn.csv", rows, header)
    if device.type == "cuda":
        sweep = _sweep(runner)
        print_table(sweep, list(sweep[0]))
        write_csv(out_dir / "tree_gdn_configs.csv", sweep, list(sweep[0]))
    print(f"CSV under {out_dir}")


def _sweep(runner: Runner) -> list[dict]:
    """Launch configurations of the kernel at N = 64 (random tree): value block x warps."""
    from specdec.kernels.tree_gdn.triton import _launch_config, _tree_gdn

    rows = []
    for shape_name, shape in shapes().items():
        inputs = make_inputs(shape, 64, "random", runner.device)
        default = _launch_config(shape["k"], shape["v"])
        for block_v in (8, 16, 32):
            for num_warps in (1, 2, 4):
                fn = functools.partial(_tree_gdn, **inputs, block_v=block_v, num_warps=num_warps)
                ms = time_call(fn, runner.device)[0]
                rows.append(
                    {"shape": shape_name, "block_v": block_v, "num_warps": num_warps, "triton": ms}
                    | {"default": "*" if (block_v, num_warps) == default else ""}
                )
    return rows


if __name__ == "__main__":
    main()
