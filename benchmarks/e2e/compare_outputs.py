"""How often two ``fast_path.py`` runs decoded the same tokens, method by method (no timing, no GPU).

    SPECDEC_TREE_GDN_WALK=chunk python benchmarks/e2e/fast_path.py --target target-hybrid \
        --drafter assets/drafters/zoo-hybrid --no-hf --no-eager --out bench_out/chunk
    python benchmarks/e2e/fast_path.py --target target-hybrid --drafter assets/drafters/zoo-hybrid --no-hf \
        --no-eager --out bench_out/default
    python benchmarks/e2e/compare_outputs.py bench_out/default bench_out/chunk
    python benchmarks/e2e/compare_outputs.py bench_out/default bench_out/chunk --against hf-generate

Two runs that differ only in a kernel setting (an environment variable read at import) decode the same prompts;
each method's row gives the share of prompts whose new tokens are identical in both runs, and the first position
where they part on the others. With ``--against NAME`` every method of the second run is compared with the first
run's ``NAME`` row instead (``hf-generate``: how often each row equals HF's greedy tokens, which a run with
``--no-hf`` does not decode itself). In fp32 every setting is token-identical (``tests/``); in bf16 two computations
that round differently can resolve a near-tie differently, and this table shows how often that happens.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def load(run: str) -> dict[str, dict[str, list[int]]]:
    path = Path(run) / "results.json"
    if not path.exists():
        raise SystemExit(f"{path} not found: pass the --out folder of a finished fast_path.py run.")
    outputs = json.loads(path.read_text()).get("outputs")
    if outputs is None:
        raise SystemExit(f"{path} has no outputs: it was written by an older fast_path.py; run it again.")
    return outputs


def first_difference(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_a", help="--out folder of the first run")
    ap.add_argument("run_b", help="--out folder of the second run")
    ap.add_argument("--against", help="compare every method of run_b with this method of run_a")
    args = ap.parse_args()
    a, b = load(args.run_a), load(args.run_b)
    if args.against is not None:
        if args.against not in a:
            raise SystemExit(f"{args.run_a} has no {args.against!r} row; it has {', '.join(a)}.")
        a = dict.fromkeys(b, a[args.against])
    lines = [
        f"# identical outputs, {args.run_b} against {args.run_a}"
        + (f" ({args.against})" if args.against else " (method by method)"),
        "",
        "| method | identical | first differing token of the others |",
        "|---|---|---|",
    ]
    for method in [m for m in a if m in b]:
        prompts = [p for p in a[method] if p in b[method]]
        same = [p for p in prompts if a[method][p] == b[method][p]]
        parts = sorted(first_difference(a[method][p], b[method][p]) for p in prompts if p not in same)
        lines.append(f"| {method} | {len(same)}/{len(prompts)} | {', '.join(map(str, parts)) or '-'} |")
    alone = sorted(set(a) ^ set(b))
    if alone:  # rows one run has and the other does not: not compared
        lines += ["", f"- not in both runs, not compared: {', '.join(alone)}"]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
