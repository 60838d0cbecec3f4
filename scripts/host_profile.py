"""Where a ``specdec.generate`` call's wall time goes: the prefill, the rounds' device time, and the host's own work.

The zoo dense pair (bf16 on CUDA, fp32 on the CPU) decodes prompts of the zoo's dev set one call at a time (or in
left-padded batches of ``--batch``), with plain decoding, DDTree b15 / b31 and ``DDTree(budget="auto")``, each
method warmed by two passes before its timed one. Per method and call: wall ms, the prefill phase's ms, the host's ms
from entering ``generate`` to the first round's launch, rounds, the device ms of one round (its CUDA events), the
wall ms per round past the prefill, and the ms per round the host waits for a round's result (the device is then
the bound; none left means the host is). A call of one new token (prefill and first token only) shows the fixed
cost of a call. A cProfile of one more pass per method goes to ``OUT/prof_<method>_B<batch>.txt``.

    python scripts/host_profile.py OUT [--num 32] [--batch 1] [--prompts held]

``--prompts held`` takes dev prompts 49-80 (the held-out set of ``scripts/gpu_trust.sh``), ``dev`` the first ones.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import specdec
import specdec.engine as engine_module
from specdec.loading import zoo_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--num", type=int, default=32)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--prompts", choices=("dev", "held"), default="held")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(zoo_dir() / "target-dense", dtype=dtype).to(device).eval()
    tok = AutoTokenizer.from_pretrained(zoo_dir() / "tokenizer", padding_side="left")
    heads = Path(__file__).parents[1] / "assets/drafters/zoo-dense"
    drafter = specdec.DFlashDrafter.from_pretrained(heads, target=model)
    lines = (zoo_dir() / "prompts_dev.jsonl").read_text().splitlines()
    start = 48 if args.prompts == "held" else 0
    prompts = [json.loads(line)["prompt"] for line in lines][start : start + args.num]
    calls = []
    for i in range(0, len(prompts), args.batch):
        enc = tok(prompts[i : i + args.batch], return_tensors="pt", padding=True).to(device)
        calls.append((enc.input_ids, enc.attention_mask if args.batch > 1 else None))

    spent = {"wait": 0.0, "device": 0.0, "rounds": 0, "timed": 0, "setup": 0.0, "entered": None}
    launch, read = engine_module.Round.launch, engine_module.Round.read

    def timed_read(self, ticket):
        t = time.perf_counter()
        if self.ready is not None:
            self.ready[ticket].synchronize()
        spent["wait"] += time.perf_counter() - t
        out = read(self, ticket)
        ms = self.elapsed(ticket) if self.timing is not None else None  # None: a cold round, not timed
        spent["device"] += (ms or 0.0) / 1e3
        spent["timed"] += ms is not None
        spent["rounds"] += 1
        return out

    def timed_launch(self, *a, **k):
        if spent["entered"] is not None:
            spent["setup"] += time.perf_counter() - spent["entered"]
            spent["entered"] = None
        return launch(self, *a, **k)

    engine_module.Round.read, engine_module.Round.launch = timed_read, timed_launch

    def run(tree, new_tokens=64, mark=False):
        rounds = prefill_ms = 0.0
        for ids, mask in calls:
            spent["entered"] = time.perf_counter() if mark else None
            out = specdec.generate(model, ids, attention_mask=mask, drafter=None if tree is None else drafter,
                                   tree=tree, max_new_tokens=new_tokens, do_sample=False)  # fmt: skip
            rounds += out.stats.target_forwards - 1
            prefill_ms += out.stats.phase_ms.get("prefill", 0.0)
        return rounds, prefill_ms

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    rows = []
    methods = [("ar", None), ("b15", specdec.DDTree(budget=15, topk=8)), ("b31", specdec.DDTree(budget=31, topk=8)),
               ("auto", specdec.DDTree(budget="auto", topk=8))]  # fmt: skip
    for name, tree in methods:
        run(tree)
        run(tree)
        for new_tokens in (64, 1):
            sync()
            spent.update(wait=0.0, device=0.0, rounds=0, timed=0, setup=0.0)
            t = time.perf_counter()
            rounds, prefill_ms = run(tree, new_tokens, mark=True)
            sync()
            wall_ms, n = (time.perf_counter() - t) * 1e3, len(calls)
            per_round = spent["rounds"] or 1
            cells = [wall_ms / n, prefill_ms / n, spent["setup"] * 1e3 / n, rounds / n,
                     spent["device"] * 1e3 / (spent["timed"] or 1), (wall_ms - prefill_ms) / max(rounds, 1),
                     spent["wait"] * 1e3 / per_round]  # fmt: skip
            rows.append(f"| {name} | {new_tokens} | " + " | ".join(f"{c:.3f}" for c in cells) + " |")
        profile = cProfile.Profile()
        profile.enable()
        run(tree)
        profile.disable()
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(35)
        pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(70)
        (args.out / f"prof_{name}_B{args.batch}.txt").write_text(text.getvalue())
    print(f"zoo dense, {device}, {dtype}, {len(prompts)} {args.prompts} prompts, batch {args.batch}; ms per call")
    print("| method | new tokens | call ms | prefill ms | host until 1st launch ms | rounds / call | round device ms "
          "| (wall - prefill) / round | host wait / round |")
    print("|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
