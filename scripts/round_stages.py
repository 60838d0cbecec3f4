"""Where a replayed round's device time goes, stage by stage, from the traces of ``bench ... profile=true``.

``python -m specdec bench ... profile=true out_dir=DIR`` writes one Chrome trace per method
(``DIR/profile/<method>.trace.json``; with ``contexts=[...]`` under ``DIR/context-N/profile/``). Every kernel of a
captured round is replayed by one ``cudaGraphLaunch``, and the trace links each replayed kernel to that launch
(its ``correlation``): the kernels of one launch are one round (where no kernel is linked so, a round ends at each
``_round_tail_kernel``). The script keeps the launches whose kernel count is
the most frequent one (the steady rounds of that method; the prompt's forward and rounds of other sizes have other
counts), and splits each round in kernel order at marker kernels:

* ``draft``: from the round's first kernel to the tree's first top-k (the drafter's forward and its logits);
* ``tree``: the top-k and the tree's selection and mask, up to the last of them;
* ``verify``: from there to the first kernel of the acceptance (the target's forward over the tree, its logits);
* ``accept``: the acceptance, the commit, the round's tail.

A round without a tree (plain decoding) is all ``verify``. Each stage's kernels are also summed by kind (products,
attention, norms, rotary, element-wise and the rest) by name. Prints µs per round per stage and kind, the kernels
per round, and the ``--top`` kernels by µs per round::

    python scripts/round_stages.py DIR/context-512/profile/*.trace.json [--top 12] [--dump N]

``--save-kernels F.csv.gz`` writes the steady rounds' kernels (method, round, name, µs) compactly, and the script
reads such a file back in place of the traces (``python scripts/round_stages.py F.csv.gz``).
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import re
import statistics
import sys
from collections import Counter, defaultdict
from pathlib import Path

TOPK = re.compile(r"_topk_rows_kernel|_topk_row_in_registers_kernel|gatherTopK|_topk_mask_kernel")
TREE = re.compile(r"_best_first_kernel|_tree_mask_kernel|_trie_kernel|_draws_kernel")
ACCEPT = re.compile(r"_accept_path_kernel|_tree_rejection_round_kernel|_traversal_kernel|_walk_kernel")
KINDS = (  # (kind, pattern on the kernel's name), first match wins
    ("products", re.compile(r"_grouped_kernel|_grouped_reduce|_gated_kernel|_gated_reduce")),
    ("attention", re.compile(r"_split_kernel|_combine_kernel|_reduce_kernel|flash|fmha|attention", re.I)),
    ("products", re.compile(r"gemm|gemv|nvjet|cutlass|xmma|sm90|splitk|_linear|cublas", re.I)),
    ("norms", re.compile(r"rms_norm|norm", re.I)),
    ("rotary", re.compile(r"rotary", re.I)),
    ("recurrent", re.compile(r"gdn|mamba|conv", re.I)),
    ("element-wise", re.compile(r"elementwise|vectorized|unrolled|silu_mul|copy|fill|index|gather|cat", re.I)),
)
STAGES = ("draft", "tree", "verify", "accept")


def kind_of(name: str) -> str:
    for kind, pattern in KINDS:
        if pattern.search(name):
            return kind
    return "other"


def load_trace(path: Path) -> dict[int, list[tuple[float, str, float]]]:
    """Kernels of a Chrome trace grouped by their graph launch: correlation -> [(ts, name, µs)] in time order."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    launches = {e["args"]["correlation"] for e in events
                if e.get("cat") == "cuda_runtime" and e.get("name") == "cudaGraphLaunch" and "args" in e}  # fmt: skip
    groups: dict[int, list[tuple[float, str, float]]] = defaultdict(list)
    for e in events:
        if e.get("cat") == "kernel" and e.get("args", {}).get("correlation") in launches:
            groups[e["args"]["correlation"]].append((float(e["ts"]), e["name"], float(e.get("dur", 0.0))))
    if not groups:  # no kernel linked to a graph launch: one round ends at each round-tail kernel
        kernels = sorted((float(e["ts"]), e["name"], float(e.get("dur", 0.0)))
                         for e in events if e.get("cat") == "kernel")  # fmt: skip
        index = 0
        for kernel in kernels:
            groups[index].append(kernel)
            index += "_round_tail_kernel" in kernel[1]
    for kernels in groups.values():
        kernels.sort()
    return groups


def steady_rounds(groups: dict[int, list]) -> list[list[tuple[str, float]]]:
    """The launches of the most frequent kernel count, each as [(name, µs)] in order."""
    if not groups:
        return []
    count, _ = Counter(len(k) for k in groups.values()).most_common(1)[0]
    return [[(name, dur) for _, name, dur in kernels] for kernels in groups.values() if len(kernels) == count]


def stage_of_each(names: list[str]) -> list[str]:
    """The stage of each kernel of one round, by the marker kernels' positions."""
    first_topk = next((i for i, n in enumerate(names) if TOPK.search(n)), None)
    if first_topk is None:
        return ["verify"] * len(names)
    last_tree = max([i for i, n in enumerate(names) if TREE.search(n) or TOPK.search(n)])
    first_accept = next((i for i, n in enumerate(names) if i > last_tree and ACCEPT.search(n)), len(names))
    return ["draft" if i < first_topk else "tree" if i <= last_tree else "verify" if i < first_accept else "accept"
            for i in range(len(names))]  # fmt: skip


def summarize(method: str, rounds: list[list[tuple[str, float]]], top: int, dump: int) -> None:
    n = len(rounds)
    table: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0])  # (stage, kind) -> [µs, kernels]
    per_kernel: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
    totals = []
    for r in rounds:
        stages = stage_of_each([name for name, _ in r])
        totals.append(sum(d for _, d in r))
        for (name, dur), stage in zip(r, stages, strict=True):
            cell = table[(stage, kind_of(name))]
            cell[0] += dur
            cell[1] += 1
            k = per_kernel[(stage, name)]
            k[0] += dur
            k[1] += 1
    kinds = [k for k, _ in KINDS] + ["other"]
    mean, median = statistics.mean(totals), statistics.median(totals)
    print(f"\n### {method}: {n} steady rounds, {len(rounds[0])} kernels each, "
          f"{mean:.1f} µs of kernels per round (median {median:.1f})\n")  # fmt: skip
    print("| stage | µs / round | kernels | " + " | ".join(kinds) + " |")
    print("|---|---|---|" + "---|" * len(kinds))
    for stage in STAGES:
        cells = {k: table.get((stage, k), [0.0, 0.0]) for k in kinds}
        us = sum(c[0] for c in cells.values()) / n
        count = sum(c[1] for c in cells.values()) / n
        if count == 0:
            continue
        row = " | ".join(f"{c[0] / n:.1f} ({c[1] / n:.0f})" if c[1] else "–" for c in cells.values())
        print(f"| {stage} | {us:.1f} | {count:.0f} | {row} |")
    print(f"\nTop {top} kernels by µs per round (stage, launches per round):\n")
    print("| µs / round | launches | stage | kernel |")
    print("|---|---|---|---|")
    ranked = sorted(per_kernel.items(), key=lambda kv: -kv[1][0])[:top]
    for (stage, name), (us, count) in ranked:
        print(f"| {us / n:.1f} | {count / n:.0f} | {stage} | `{name[:90]}` |")
    if dump:
        print(f"\nThe first {dump} kernels of one round in order (stage, µs):\n")
        first = rounds[len(rounds) // 2]
        for (name, dur), stage in list(zip(first, stage_of_each([nm for nm, _ in first]), strict=True))[:dump]:
            print(f"{stage:7s} {dur:8.1f}  {name[:110]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("inputs", nargs="+", type=Path, help="trace.json(.gz) files of profile=true, or a .csv.gz")
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--dump", type=int, default=0, help="print the first N kernels of one round in order")
    parser.add_argument("--save-kernels", type=Path, default=None)
    args = parser.parse_args()
    methods: dict[str, list[list[tuple[str, float]]]] = {}
    for path in args.inputs:
        if path.name.endswith(".csv.gz"):
            with gzip.open(path, "rt", newline="") as f:
                rows = defaultdict(list)
                for method, index, name, dur in csv.reader(f):
                    rows[(method, int(index))].append((name, float(dur)))
            for (method, _), kernels in sorted(rows.items()):
                methods.setdefault(method, []).append(kernels)
            continue
        label = f"{path.parent.parent.name}/{path.name.removesuffix('.gz').removesuffix('.trace.json')}"
        methods[label] = steady_rounds(load_trace(path))
    if args.save_kernels is not None:
        with gzip.open(args.save_kernels, "wt", newline="") as f:
            writer = csv.writer(f)
            for method, rounds in methods.items():
                for i, r in enumerate(rounds):
                    writer.writerows((method, i, name, f"{dur:.2f}") for name, dur in r)
    for method, rounds in methods.items():
        if not rounds:
            print(f"\n### {method}: no kernels replayed from a graph in this trace", file=sys.stderr)
            continue
        summarize(method, rounds, args.top, args.dump)


if __name__ == "__main__":
    main()
