"""Where one ``specdec.generate`` call's wall time goes, phase by phase, as the host sees it (no profiler).

The zoo dense pair (``--target hybrid``: the hybrid pair; bf16 on CUDA, fp32 on the CPU) decodes dev prompts one call at a time (B = 1) with plain
decoding and DDTree b31 (``--methods``: also b15, b63 and ``auto``, the adaptive budget, whose controller's
``next_size`` / ``observe`` are timed too), each method warmed by two passes before a timed one. The library's functions that make up a
call are wrapped with wall-clock timers (inclusive: a function's time counts the ones it calls); the table gives ms
per call for each, and ``rest of generate`` is the call's wall time minus the top-level pieces (argument checks,
output assembly). A round's ``read`` holds the host's wait for the device; ``wait outside read`` is the time the
host spends waiting elsewhere (a ``.tolist()`` of a device tensor, measured as the time of the functions that hold
one). Calls of 1 new token show the fixed cost of a call (prefill and first token, no round).

    python scripts/call_phases.py [--num 16] [--new 128] [--prompts dev|held] [--methods ar,b31,auto]
        [--target dense|hybrid]
"""

from __future__ import annotations

import argparse
import collections
import functools
import importlib
import json
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import specdec
import specdec.budget as budget_module
import specdec.engine as engine_module
import specdec.target as target_module
from specdec.loading import zoo_dir

generate_module = importlib.import_module("specdec.generate")  # the module (the package's ``generate`` is its function)

SPENT: collections.Counter = collections.Counter()
CALLS: collections.Counter = collections.Counter()

# (owner, attribute, label, kind): kind "func" (a module function), "method", "classmethod"
WRAPPED = [
    (generate_module, "generate", "generate (whole call)", "func"),
    (generate_module, "resolve_generation_args", "resolve_generation_args", "func"),
    (generate_module, "check_input_ids", "check_input_ids", "func"),
    (generate_module, "infer_attention_mask", "infer_attention_mask (one read)", "func"),
    (generate_module, "token_bounds", "token_bounds", "func"),
    (generate_module, "follow_target", "follow_target", "func"),
    (generate_module, "round_reason", "round_reason", "func"),
    (generate_module, "_check_fits", "_check_fits", "func"),
    (generate_module, "_decode", "_decode", "func"),
    (generate_module, "_first_scores", "_first_scores", "func"),
    (generate_module, "_first_token", "_first_token", "func"),
    (target_module.TargetModel, "wrap", "TargetModel.wrap", "classmethod"),
    (engine_module.Engine, "for_target", "Engine.for_target", "classmethod"),
    (engine_module.Engine, "reusable", "Engine.reusable", "method"),
    (engine_module.Engine, "prefill", "Engine.prefill", "method"),
    (engine_module.Engine, "start", "Engine.start", "method"),
    (engine_module.Engine, "keep", "Engine.keep", "method"),
    (engine_module.Engine, "round_for", "Engine.round_for", "method"),
    (engine_module.Round, "launch", "Round.launch", "method"),
    (engine_module.Round, "read", "Round.read (waits for the device)", "method"),
    (engine_module.Round, "prepare", "Round.prepare", "method"),
    (engine_module.Round, "elapsed", "Round.elapsed", "method"),
    (budget_module.AutoBudget, "next_size", "auto: next_size", "method"),
    (budget_module.AutoBudget, "observe", "auto: observe", "method"),
    (budget_module.AutoBudget, "resume", "auto: resume", "method"),
]


def _timed(fn, label):
    @functools.wraps(fn)
    def inner(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            SPENT[label] += time.perf_counter() - start
            CALLS[label] += 1

    return inner


def install() -> None:
    for owner, name, label, kind in WRAPPED:
        raw = owner.__dict__[name]
        if kind == "classmethod":
            setattr(owner, name, classmethod(_timed(raw.__func__, label)))
        else:
            setattr(owner, name, _timed(raw, label))
    specdec.generate = generate_module.generate  # the package's name for it, too


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num", type=int, default=16)
    parser.add_argument("--new", type=int, default=128)
    parser.add_argument("--prompts", choices=("dev", "held"), default="dev")
    parser.add_argument("--methods", default="ar,b31", help="comma-separated: ar, b15, b31, b63, auto")
    parser.add_argument("--target", choices=("dense", "hybrid"), default="dense", help="the zoo pair")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(zoo_dir() / f"target-{args.target}", dtype=dtype).to(device).eval()
    tok = AutoTokenizer.from_pretrained(zoo_dir() / "tokenizer")
    drafter = specdec.DFlashDrafter.from_pretrained(Path(__file__).parents[1] / f"assets/drafters/zoo-{args.target}",
                                                    target=model)  # fmt: skip
    lines = (zoo_dir() / "prompts_dev.jsonl").read_text().splitlines()
    start = 48 if args.prompts == "held" else 0
    prompts = [json.loads(line)["prompt"] for line in lines][start : start + args.num]
    calls = [tok(p, return_tensors="pt").input_ids.to(device) for p in prompts]
    install()
    tables = {}
    trees = {"ar": None, "auto": specdec.DDTree(budget="auto", topk=8)}
    trees.update({f"b{n}": specdec.DDTree(budget=n, topk=8) for n in (15, 31, 63)})
    for name in args.methods.split(","):
        tree = trees[name]
        d = drafter if tree is not None else None
        for new in (args.new, 1):
            for _ in range(2):
                for ids in calls:
                    specdec.generate(model, ids, drafter=d, tree=tree, max_new_tokens=new)
            if device == "cuda":
                torch.cuda.synchronize()
            SPENT.clear()
            CALLS.clear()
            rounds = 0
            wall = time.perf_counter()
            for ids in calls:
                rounds += specdec.generate(model, ids, drafter=d, tree=tree, max_new_tokens=new).stats.rounds
            if device == "cuda":
                torch.cuda.synchronize()
            wall = (time.perf_counter() - wall) * 1e3 / len(calls)
            per_call = {label: SPENT[label] * 1e3 / len(calls) for label in SPENT}
            top = ("TargetModel.wrap", "resolve_generation_args", "check_input_ids", "infer_attention_mask (one read)",
                   "token_bounds", "follow_target", "round_reason", "_check_fits", "_decode")  # fmt: skip
            per_call["rest of generate"] = per_call["generate (whole call)"] - sum(per_call.get(k, 0.0) for k in top)
            tables[(name, new)] = (wall, rounds / len(calls), per_call)
    print(f"zoo {args.target}, {device}, {dtype}, {len(calls)} {args.prompts} prompts, B = 1; ms per call (inclusive)")
    cols = list(tables)
    print("| phase | " + " | ".join(f"{n} x{new}" for n, new in cols) + " |")
    print("|---|" + "---|" * len(cols))
    print("| wall per call | " + " | ".join(f"{tables[c][0]:.3f}" for c in cols) + " |")
    print("| rounds per call | " + " | ".join(f"{tables[c][1]:.1f}" for c in cols) + " |")
    labels = [label for _, _, label, _ in WRAPPED] + ["rest of generate"]
    for label in labels:
        print(f"| {label} | " + " | ".join(f"{tables[c][2].get(label, 0.0):.3f}" for c in cols) + " |")


if __name__ == "__main__":
    main()
