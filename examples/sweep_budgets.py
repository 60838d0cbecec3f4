"""A hydra sweep of DDTree budgets through the CLI, then tau and tok/s against the budget in one plot.

    python examples/sweep_budgets.py --budgets 4 8 16 32 --num-prompts 3 --max-new-tokens 64
    # the sweep it runs:  python -m specdec -m drafter=dflash tree=ddtree tree.budget=4,8,16,32 ...

Every job of the multirun writes ``stats.jsonl`` into its own folder; this script reads them back.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from matplotlib.figure import Figure

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--budgets", type=int, nargs="+", default=[4, 8, 16, 32, 64])
    ap.add_argument("--target", default="dense", choices=["dense", "hybrid"])
    ap.add_argument("--num-prompts", type=int, default=5)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--out", default="sweep_out", help="sweep folder; the plot is written there too")
    args = ap.parse_args()
    out = Path(args.out).resolve()
    overrides = [
        f"target={args.target}", "drafter=dflash", "tree=ddtree", "tree.topk=8",
        f"tree.budget={','.join(map(str, args.budgets))}", f"prompts.limit={args.num_prompts}",
        f"max_new_tokens={args.max_new_tokens}", "show_text=false", f"hydra.sweep.dir={out}",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    subprocess.run([sys.executable, "-m", "specdec", "-m", *overrides], check=True, env=env)

    taus, speeds = [], []
    for job, budget in enumerate(args.budgets):  # hydra numbers the jobs in sweep order
        stats = [json.loads(line) for line in (out / str(job) / "stats.jsonl").read_text().splitlines()]
        rounds = sum(s["rounds"] for s in stats)
        taus.append(sum(s["tau"] * s["rounds"] for s in stats) / max(rounds, 1))
        timed = [s for s in stats if s["decode_tok_s"]]  # decode tokens exclude the first (from the prefill)
        decode_s = sum((s["new_tokens"] - 1) / s["decode_tok_s"] for s in timed)
        speeds.append(sum(s["new_tokens"] - 1 for s in timed) / decode_s if decode_s else 0.0)
        print(f"budget {budget:4d}: tau {taus[-1]:.2f}  {speeds[-1]:.1f} tok/s")

    fig = Figure(figsize=(9, 3.5), layout="constrained")
    ax_tau, ax_speed = fig.subplots(1, 2)
    ax_tau.plot(args.budgets, taus, marker="o")
    ax_speed.plot(args.budgets, speeds, marker="o")
    ax_speed.set_ylim(bottom=0)
    for ax, label in ((ax_tau, "τ (tokens per target forward)"), (ax_speed, "decode tok/s")):
        ax.set_xscale("log", base=2)
        ax.set(xlabel="DDTree budget", title=label)
        ax.grid(alpha=0.3)
    fig.savefig(out / "budgets.png", dpi=120)
    print("plot:", out / "budgets.png")


if __name__ == "__main__":
    main()
