"""Speed of ``gdn_path_replay`` (the commit of a tree round on one Gated DeltaNet layer: the state advanced by the
accepted path).

Providers: ``reference`` (``P`` masked steps of tensor ops, the CPU path) and, on CUDA, ``reference-graph`` and
``triton-graph`` (the same calls replayed in a CUDA graph, as inside a captured round: kernel time without the
host's launch overhead) and ``triton`` (one launch per call). Shapes: the zoo hybrid's layer, a Qwen3.5 layer of
the 8 B shape of ``python -m specdec bench +experiment=shape-8b`` and a Qwen3.5-27B-like layer; ``P`` = 16 steps
(a block-16 DFlash round), accepted paths of 1, 4 and 16 nodes.

    python benchmarks/kernels/bench_gdn_path_replay.py [--device cuda]

Prints median ms per layer; on CPU only the reference runs.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from specdec.bench import median_ms
from specdec.kernels.tree_gdn import gdn_path_replay
from specdec.runtime import Captured

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
                impl = "triton" if provider.startswith("triton") else "torch"

                def call(impl=impl, tensors=tensors, num=num):
                    gdn_path_replay(**tensors, num_path=num, impl=impl)

                fn = Captured(call, device=device, graph=provider.endswith("-graph"))
                fn()  # warm (and captured, for the graph providers)
                cells.append(f"{median_ms(fn, device, iters=50):.4f}")
            print(f"| {name} | {accepted} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
