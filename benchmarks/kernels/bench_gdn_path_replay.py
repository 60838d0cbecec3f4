"""Speed of ``gdn_path_replay`` (the commit of a tree round on one Gated DeltaNet layer: the state advanced by the
accepted path).

Providers: ``reference`` (``P`` masked steps of tensor ops, the CPU path) and, on CUDA, ``reference-graph`` and
``triton-graph`` (the same calls replayed in a CUDA graph, as inside a fast-path round: kernel time without the
host's launch overhead) and ``triton`` (one launch per call). Shapes: the zoo hybrid's layer, a Qwen3.5 layer of
the 8 B shape of ``benchmarks/e2e/shape_8b.py`` and a Qwen3.5-27B-like layer; ``P`` = 16 steps (a block-16 DFlash
round), accepted paths of 1, 4 and 16 nodes.

    python benchmarks/kernels/bench_gdn_path_replay.py [--device cuda]

Prints median ms per layer; on CPU only the reference runs.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from specdec.kernels.tree_gdn import gdn_path_replay

SHAPES = {  # value heads, key heads, K, V
    "zoo-hybrid": (8, 4, 64, 64),
    "qwen3.5-8b-shape": (32, 16, 128, 128),
    "qwen3.5-27b-like": (48, 16, 128, 128),
}
STEPS = 16
ACCEPTED = [1, 4, 16]


def inputs(shape, accepted: int, device: torch.device, seed: int = 0):
    hv, h, k, v = shape
    gen = torch.Generator().manual_seed(seed)
    n = 64  # nodes of the verified tree; the path picks some of them
    args = dict(
        state=torch.randn(hv, k, v, generator=gen),
        k=F.normalize(torch.randn(n, h, k, generator=gen), dim=-1),
        v=torch.randn(n, hv, v, generator=gen).to(torch.bfloat16),
        log_decay=-F.softplus(torch.randn(n, hv, generator=gen)) * 0.5,
        beta=torch.rand(n, hv, generator=gen),
    )
    nodes = sorted(torch.randperm(n, generator=gen)[:accepted].tolist())
    path = torch.tensor(nodes + [nodes[-1]] * (STEPS - accepted))
    return {**{name: t.to(device) for name, t in args.items()}, "path": path.to(device)}, torch.tensor(
        accepted, device=device
    )


def timed(fn, device: torch.device, iters: int = 50) -> float:
    fn()
    out = []
    for _ in range(iters):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end))
        else:
            t = time.perf_counter()
            fn()
            out.append(1e3 * (time.perf_counter() - t))
    return statistics.median(out)


def graphed(fn, device: torch.device):
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


@torch.no_grad()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    device = torch.device(args.device)
    providers = ["reference"] + (["reference-graph", "triton", "triton-graph"] if device.type == "cuda" else [])
    print(f"# gdn_path_replay, ms per layer (median), {STEPS} steps, {device}")
    print("\n| shape | accepted | " + " | ".join(providers) + " |\n|---|---|" + "---|" * len(providers))
    for name, shape in SHAPES.items():
        for accepted in ACCEPTED:
            tensors, num = inputs(shape, accepted, device)
            cells = []
            for provider in providers:
                impl = "triton" if provider.startswith("triton") else "reference"

                def call(impl=impl, tensors=tensors, num=num):
                    gdn_path_replay(**tensors, num_path=num, impl=impl)

                fn = graphed(call, device) if provider.endswith("-graph") else call
                cells.append(f"{timed(fn, device):.4f}")
            print(f"| {name} | {accepted} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
