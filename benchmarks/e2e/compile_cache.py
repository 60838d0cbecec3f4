"""Does ``compile=True`` reuse its compilation across processes? Runs the same compiled ``generate`` call in fresh
processes one after another, all pointed at one inductor cache folder, and prints each process's first call.

    python benchmarks/e2e/compile_cache.py --target target-dense --drafter assets/drafters/zoo-dense \
        --budget 15 --processes 2 [--cache-dir DIR]

Without ``--cache-dir`` the folder is a new empty one, so the first process compiles cold and the later ones can
only reuse what the first one stored (torch's inductor caches, keyed by the traced graphs). Each process decodes
one dev prompt twice: the first call compiles (``stats.compile_ms``; on CUDA also captures), the second shows
the warm cost. ``TORCHINDUCTOR_CACHE_DIR`` is how torch names that folder; point it at a lasting place to keep
compilations between sessions.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _zoo import add_pair_args  # benchmarks/e2e, beside this script


def child(args: argparse.Namespace) -> None:
    import logging

    import torch
    from _zoo import decodable_prompts, zoo_pair

    import specdec
    from specdec.loading import resolve_device

    logging.basicConfig(level=logging.WARNING)
    device, dtype = resolve_device(args.device, args.dtype)
    model, tok, drafter = zoo_pair(args.target, args.drafter, device, dtype)
    (_, ids), *_ = decodable_prompts(model, tok, 1)
    tree = specdec.DDTree(budget=args.budget, topk=args.topk)
    calls = []
    for _ in range(2):
        start = time.perf_counter()
        out = specdec.generate(model, ids, drafter=drafter, tree=tree, max_new_tokens=args.max_new_tokens,
                               compile=True, cuda_graphs=None if device.type == "cuda" else True)  # fmt: skip
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        calls.append({"wall_s": time.perf_counter() - start, "compile_ms": out.stats.compile_ms,
                      "capture_ms": out.stats.capture_ms, "path": out.stats.path})  # fmt: skip
    print("RESULT " + json.dumps({"device": str(device), "calls": calls}), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_pair_args(ap)
    ap.add_argument("--budget", type=int, default=15)
    ap.add_argument("--topk", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--cache-dir", default=None, help="inductor cache folder (default: a new empty one)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    if args.processes < 1:
        raise SystemExit(f"--processes={args.processes}: pass 1 or more.")
    cache = Path(args.cache_dir or tempfile.mkdtemp(prefix="specdec-inductor-"))
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache)}
    forwarded = [a for a in sys.argv[1:] if a != "--child"]
    lines = [
        f"# compile=True across processes, {args.target}, DDTree b{args.budget} topk {args.topk}, "
        f"{args.max_new_tokens} new tokens, inductor cache {cache}",
        "",
        "| process | device | first call s | its compile ms | its capture ms | second call s |",
        "|---|---|---|---|---|---|",
    ]
    print("\n".join(lines), flush=True)
    for i in range(args.processes):
        proc = subprocess.run([sys.executable, __file__, *forwarded, "--child"], env=env, capture_output=True,
                              text=True, cwd=Path(__file__).parent)  # fmt: skip
        found = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        if proc.returncode != 0 or not found:
            raise SystemExit(f"process {i + 1} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
        res = json.loads(found[-1].removeprefix("RESULT "))
        first, second = res["calls"]
        lines.append(f"| {i + 1} | {res['device']} | {first['wall_s']:.2f} | {first['compile_ms']:.0f} | "
                     f"{first['capture_ms']:.0f} | {second['wall_s']:.3f} |")  # fmt: skip
        print(lines[-1], flush=True)


if __name__ == "__main__":
    main()
