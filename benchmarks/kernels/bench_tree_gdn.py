"""Speed of ``tree_gdn`` (one layer's gated delta-rule recurrence over a draft tree).

Providers: ``tree_scan`` (the adapter's former path: ``tree_scan`` + ``gdn_step``, level-synchronous), ``reference``
(``tree_gdn_reference``, level-synchronous), ``compiled`` (the reference with its per-depth step under
``torch.compile``), ``triton`` (one fused launch, the default schedule) and ``triton-graph`` (the same launch
replayed in a CUDA graph: kernel time without the host's launch overhead), and each schedule forced, graph-replayed:
``nodes-graph`` (one walk over the nodes), ``paths-graph`` (one program per node replays its path) and
``chunk-graph`` (every node at once in matrix form on 3-pass TF32 tensor-core products; ``chunk-ieee-graph``: fp32
products, ``chunk-tf32-graph``: 1-pass TF32 products; trees of up to 64 nodes; ``chunk-walk-graph`` /
``chunk-squaring-graph``: its two ways of finding the ancestors, forced). Shapes: the zoo hybrid target's GDN layer,
a Qwen3.5-8B-like and a Qwen3.5-27B-like layer. Trees: a chain, a random tree (uniform random parents), a
DDTree-like tree (random parents at most 15 deep: a 16-token block), and the round's own DDTree (budget N - 1, topk
8) over random draft log-probs: ``best-flat`` (logits ~ 3 N(0, 1), as the 8B shape's verify rows: 2-3 deep) and
``best-peaked`` (one confident token per position, as a trained drafter's: 14-15 deep); N = 16 .. 128.
``--chunk-sweep`` times the matrix form's tiles on the last two.

    python benchmarks/kernels/bench_tree_gdn.py [--device cuda] [--out bench_out/kernels] [--providers ...]

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
from oracles.ddtree_heap import build_ddtree
from oracles.eager_state import TreeTopology, tree_scan

from specdec.kernels.tree_gdn.reference import gdn_update, level_scan, tree_gdn_reference
from specdec.state.gdn import gdn_step
from specdec.types import DraftTree

REPO = Path(__file__).resolve().parents[2]
ZOO_CONFIG = REPO.parent / "shared" / "zoo" / "target-hybrid" / "config.json"
PROVIDERS = ["tree_scan", "reference", "compiled", "triton", "triton-graph", "nodes-graph", "paths-graph",
             "chunk-graph", "chunk-ieee-graph", "chunk-tf32-graph", "chunk-walk-graph",
             "chunk-squaring-graph"]  # fmt: skip
NODES = [16, 32, 64, 128]
TREES = ["chain", "random", "ddtree", "best-flat", "best-peaked"]
MAX_DEPTH = 15  # "ddtree" trees: a DDTree over a 16-token block has its nodes at depths 1..15 below the root
DRAFT_VOCAB = 32768  # "best-*" trees: DDTree's own builder over 15 positions' draft log-probs of this vocabulary


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
    return {
        "zoo-hybrid": zoo,
        "qwen3.5-8b": {"hv": 32, "h": 16, "k": 128, "v": 128},
        "qwen3.5-27b": {"hv": 48, "h": 16, "k": 128, "v": 128},
    }


def make_parents(tree: str, n: int, gen: torch.Generator) -> list[int]:
    if tree.startswith("best-"):  # the round's DDTree (budget n - 1, topk 8) over random draft log-probs
        logits = torch.randn(MAX_DEPTH, DRAFT_VOCAB, generator=gen) * 3  # "flat": as the 8B shape's verify rows
        if tree == "best-peaked":  # one confident token per position (p ~ 0.8), as a trained drafter's first choice
            logits[:, 0] += 20
        return build_ddtree(torch.log_softmax(logits, -1), 0, budget=n - 1, topk=8).parents.tolist()
    parents, depth = [-1], [0]
    for i in range(1, n):
        if tree == "chain":
            parent = i - 1
        elif tree == "random":
            parent = int(torch.randint(0, i, (1,), generator=gen))
        else:  # ddtree: any node above MAX_DEPTH may take children
            open_nodes = [j for j in range(i) if depth[j] < MAX_DEPTH]
            parent = open_nodes[int(torch.randint(0, len(open_nodes), (1,), generator=gen))]
        parents.append(parent)
        depth.append(depth[parent] + 1)
    return parents


def make_inputs(shape: dict[str, int], n: int, tree: str, device: torch.device, seed: int = 0) -> dict:
    gen = torch.Generator().manual_seed(seed)
    hv, h, k, v = shape["hv"], shape["h"], shape["k"], shape["v"]
    parents = make_parents(tree, n, gen)
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

        if provider.startswith("chunk-") and inputs["q"].shape[0] > 64:
            return None  # the matrix form takes trees of up to 64 nodes
        if provider in ("chunk-ieee-graph", "chunk-tf32-graph"):
            return lambda: tree_gdn_triton(**inputs, walk="chunk", precision=provider.split("-")[1])
        if provider in ("chunk-walk-graph", "chunk-squaring-graph"):  # the default tiles, the ancestry forced
            from specdec.kernels.tree_gdn.triton import _tree_gdn, chunk_config

            block_n, block_v, warps = chunk_config(inputs["q"].shape[0])
            ancestry = provider.split("-")[1]
            return lambda: _tree_gdn(**inputs, block_v=block_v, num_warps=warps, walk="chunk", precision="tf32x3",
                                     block_n=block_n, ancestry=ancestry)  # fmt: skip
        walk = provider.removesuffix("-graph") if provider in ("nodes-graph", "paths-graph", "chunk-graph") else "auto"
        return lambda: tree_gdn_triton(**inputs, walk=walk)

    def bench(self, n: int, provider: str, shape_name: str, tree: str) -> tuple[float, float, float]:
        inputs = make_inputs(shapes()[shape_name], n, tree, self.device)
        fn = self.fn(provider, inputs)
        try:
            ms = (
                time_call(fn, self.device, graph=provider.endswith("-graph"), rep=50)
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
    parser.add_argument("--providers", nargs="+", default=PROVIDERS, choices=PROVIDERS)
    parser.add_argument("--no-sweep", action="store_true", help="skip the launch-configuration sweep")
    parser.add_argument("--chunk-sweep", action="store_true", help="sweep the matrix form's tiles at the 8B shape")
    parser.add_argument("--chunk-precision", default="tf32x3", choices=["ieee", "tf32x3", "tf32"],
                        help="the products of --chunk-sweep")  # fmt: skip
    parser.add_argument("--accuracy", action="store_true",
                        help="the matrix form's error per precision at the 8B shape (fp32 reference)")  # fmt: skip
    parser.add_argument("--trees", nargs="+", default=TREES, choices=TREES)
    args = parser.parse_args()
    providers = [p for p in PROVIDERS if p in args.providers]
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
            line_vals=providers,
            line_names=providers,
            plot_name=f"tree_gdn-{shape_name}-{tree}",
            args={"shape_name": shape_name, "tree": tree},
            ylabel="ms",
        )
        for shape_name in shapes()
        for tree in args.trees
    ]
    triton.testing.perf_report(benchmarks)(runner.bench).run(print_data=False)

    rows = []
    for shape_name, shape in shapes().items():
        for tree in args.trees:
            for n in NODES:
                ms = {p: runner.results.get((shape_name, tree, n, p), math.nan) for p in PROVIDERS}
                gbps = min_bytes(shape, n) / (ms["triton"] * 1e-3) / 1e9 if "triton" in providers else math.nan
                rows.append(
                    {"shape": shape_name, "tree": tree, "n": n, **{p: ms[p] for p in providers}}
                    | {"speedup": ms["tree_scan"] / ms["triton"], "triton_gbps": gbps}
                )
    header = ["shape", "tree", "n", *providers, "speedup", "triton_gbps"]
    print_table(rows, header)
    write_csv(out_dir / "tree_gdn.csv", rows, header)
    if device.type == "cuda" and not args.no_sweep:
        sweep = _sweep(runner)
        print_table(sweep, list(sweep[0]))
        write_csv(out_dir / "tree_gdn_configs.csv", sweep, list(sweep[0]))
    if device.type == "cuda" and args.chunk_sweep:
        sweep = _chunk_sweep(runner, args.chunk_precision)
        print_table(sweep, list(sweep[0]))
        write_csv(out_dir / "tree_gdn_chunk_configs.csv", sweep, list(sweep[0]))
    if device.type == "cuda" and args.accuracy:
        accuracy = _accuracy(device)
        print_table(accuracy, list(accuracy[0]))
        write_csv(out_dir / "tree_gdn_accuracy.csv", accuracy, list(accuracy[0]))
    print(f"CSV under {out_dir}")


def _sweep(runner: Runner) -> list[dict]:
    """Launch configurations of both schedules at N = 64 (DDTree-like tree): value block x warps."""
    from specdec.kernels.tree_gdn.triton import _launch_config, _tree_gdn

    rows = []
    for shape_name, shape in shapes().items():
        inputs = make_inputs(shape, 64, "ddtree", runner.device)
        default = _launch_config(shape["k"], shape["v"])
        for block_v in (8, 16, 32):
            for num_warps in (1, 2, 4):
                ms = {}
                for walk in ("nodes", "paths"):
                    fn = functools.partial(_tree_gdn, **inputs, block_v=block_v, num_warps=num_warps, walk=walk)
                    ms[walk] = time_call(fn, runner.device, graph=True)[0]
                rows.append(
                    {"shape": shape_name, "block_v": block_v, "num_warps": num_warps}
                    | {"nodes-graph": ms["nodes"], "paths-graph": ms["paths"]}
                    | {"default": "*" if (block_v, num_warps) == default else ""}
                )
    return rows


def _chunk_sweep(runner: Runner, precision: str) -> list[dict]:
    """The matrix form's tiles (rows x value columns x warps, products of ``precision``) at the 8B shape, on the
    round's trees."""
    from specdec.kernels.tree_gdn.triton import _tree_gdn, chunk_ancestry, chunk_config, tree_gdn_triton

    rows = []
    for tree in ("best-flat", "best-peaked"):
        for n in (16, 32, 64):
            inputs = make_inputs(shapes()["qwen3.5-8b"], n, tree, runner.device)
            depth = _depth(inputs["parents"].tolist())
            paths = time_call(functools.partial(tree_gdn_triton, **inputs, walk="paths"), runner.device, graph=True)[0]
            for block_n in (16, 32, 64):
                for block_v in (16, 32, 64):
                    for warps in (2, 4, 8):
                        if block_n < n:
                            continue
                        fn = functools.partial(_tree_gdn, **inputs, block_v=block_v, num_warps=warps, walk="chunk",
                                               precision=precision, block_n=block_n,
                                               ancestry=chunk_ancestry(n))  # fmt: skip
                        default = (block_n, block_v, warps) == chunk_config(n)
                        rows.append({"tree": tree, "n": n, "depth": depth, "block_n": block_n, "block_v": block_v,
                                     "num_warps": warps, "chunk-graph": time_call(fn, runner.device, graph=True)[0],
                                     "paths-graph": paths, "default": "*" if default else ""})  # fmt: skip
    return rows


def _accuracy(device: torch.device) -> list[dict]:
    """Max abs error of the matrix form's outputs per precision against the fp32 reference (CPU), at the 8B shape
    on the round's trees, beside the error of rounding that reference to bf16 (what a bf16 model keeps)."""
    from specdec.kernels.tree_gdn.triton import tree_gdn_triton

    rows = []
    for tree in ("best-flat", "best-peaked"):
        for n in (16, 32, 64):
            inputs = make_inputs(shapes()["qwen3.5-8b"], n, tree, torch.device("cpu"))
            expected = tree_gdn_reference(**inputs)
            row = {"tree": tree, "n": n, "depth": _depth(inputs["parents"].tolist())}
            on_device = {name: t.to(device) for name, t in inputs.items()}
            for precision in ("ieee", "tf32x3", "tf32"):
                out = tree_gdn_triton(**on_device, walk="chunk", precision=precision).cpu()
                row[precision] = float((out - expected).abs().max())
            row["bf16 rounding"] = float((expected.bfloat16().float() - expected).abs().max())
            row["max |out|"] = float(expected.abs().max())
            rows.append(row)
    return rows


def _depth(parents: list[int]) -> int:
    depth = [0] * len(parents)
    for i, p in enumerate(parents):
        depth[i] = depth[p] + 1 if p >= 0 else 0
    return max(depth)


if __name__ == "__main__":
    main()
