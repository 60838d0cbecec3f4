"""Host time of the auto budget's controller per round: ``next_size`` before a launch and ``observe`` after a read.

The controller of ``DDTree(budget="auto")`` runs on the host between a round's read and the next launch, so its time
adds to every round the device does not hide (a call's first and last rounds, or every round where the host is the
bound). This drives one controller through calls of 30 rounds with made-up expectations, accepts and device times
(drawn once, before timing) and prints microseconds per round for each batch size:

    python benchmarks/auto_host.py [--batches 1,8,32] [--calls 200]
"""

from __future__ import annotations

import argparse
import random
import time

import specdec


def one_call(ctrl, draws, batch: int, rounds: int = 30) -> int:
    """One call's rounds through ``ctrl``; returns how many ran attached (a tree, not plain decoding)."""
    ctrl.resume()
    width, rows = len(ctrl.sizes), list(range(batch))
    left = dict.fromkeys(rows, 64)
    attached = 0
    for r in range(rounds):
        size = ctrl.next_size(left, final=False)
        expected, accepted, jitter = draws[r % len(draws)]
        if size > 0:
            known = min(ctrl.sizes.index(size) + 2, width)  # a round computes up to the next size
            expected = [row[:known] + [-1.0] * (width - known) for row in expected]
            attached += 1
        else:
            expected, accepted = None, [0] * batch
        ctrl.observe(size, expected, accepted, 0.7 + 0.01 * max(size, 0) + jitter, rows=rows)
        for b in rows:
            left[b] = max(1, left[b] - 2)
    return attached


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    print("| B | us per round (next_size + observe) | attached rounds |")
    print("|---|---|---|")
    for batch in (int(b) for b in args.batches.split(",")):
        ctrl = specdec.DDTree(budget="auto", topk=8).controller(batch)
        rng = random.Random(0)
        draws = [([[rng.uniform(1.0, 3.0) * (1 + 0.1 * k) for k in range(len(ctrl.sizes))] for _ in range(batch)],
                  [rng.randint(0, 4) for _ in range(batch)], rng.uniform(-0.02, 0.02)) for _ in range(64)]  # fmt: skip
        for _ in range(20):
            one_call(ctrl, draws, batch)
        start = time.perf_counter()
        attached = sum(one_call(ctrl, draws, batch) for _ in range(args.calls))
        elapsed = time.perf_counter() - start
        print(f"| {batch} | {elapsed / (30 * args.calls) * 1e6:.1f} | {attached / (30 * args.calls):.0%} |")


if __name__ == "__main__":
    main()
