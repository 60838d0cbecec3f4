"""Decode the same prompts with the same methods under two checkouts of specdec, warm, and print tok/s side by side.

    python scripts/ab_rounds.py run --root PATH --label NAME --target DIR --drafter DIR --tokenizer DIR \
        --prompts FILE [--num-prompts 20] [--max-new 128] [--methods ar,chain,b15,b32,b63] [--compile] \
        [--dtype auto] --out FILE
    python scripts/ab_rounds.py table A.json B.json

``run`` imports specdec from ``--root`` (a checkout), so the two runs use only the public API
(``specdec.generate``, ``DFlashDrafter.from_pretrained``, ``Chain``, ``DDTree``). Each method decodes every prompt
once untimed (warm-up: graphs captured, compiled), then ``--repeats`` timed passes; tok/s = new tokens / wall time
of the timed passes. ``table`` prints one row per method: tok/s and tau of each run and their ratio.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def _run(a) -> None:
    sys.path.insert(0, a.root)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import specdec

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = getattr(torch, a.dtype) if a.dtype != "auto" else torch.bfloat16 if device.type == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(a.target, dtype=dtype).to(device).eval()
    tok = AutoTokenizer.from_pretrained(a.tokenizer)
    drafter = specdec.DFlashDrafter.from_pretrained(a.drafter, target=model)
    with open(a.prompts) as f:
        texts = [json.loads(line)["prompt"] for line in f][: a.num_prompts]
    prompts = [tok(t, return_tensors="pt").input_ids.to(device) for t in texts]
    block = drafter.config.block_size - 1
    methods = {
        "ar": (None, None),
        "chain": (drafter, specdec.Chain(k=block)),
        **{f"b{n}": (drafter, specdec.DDTree(budget=n, topk=8)) for n in (15, 16, 32, 63, 64)},
    }
    rows = []
    for name in a.methods.split(","):
        d, tree = methods[name]

        def once(ids, d=d, tree=tree):
            return specdec.generate(model, ids, drafter=d, tree=tree, max_new_tokens=a.max_new, do_sample=False,
                                    compile=a.compile)  # fmt: skip

        outs = [once(p) for p in prompts]  # warm-up
        torch.cuda.synchronize() if device.type == "cuda" else None
        new = rounds = committed = 0
        start = time.perf_counter()
        for _ in range(a.repeats):
            for p in prompts:
                out = once(p)
                new += out.sequences.shape[1] - p.shape[1]
                rounds += out.stats.rounds
                committed += sum(out.stats.accept_lengths)
        torch.cuda.synchronize() if device.type == "cuda" else None
        wall = time.perf_counter() - start
        rows.append({"method": name, "tok_s": new / wall, "tau": committed / max(rounds, 1),
                     "outputs": [o.sequences[0].tolist() for o in outs], "path": outs[0].stats.path})  # fmt: skip
        print(f"{a.label} {name}: {new / wall:.1f} tok/s tau {committed / max(rounds, 1):.2f}", flush=True)
    with open(a.out, "w") as f:
        json.dump({"label": a.label, "compile": a.compile, "device": str(device), "rows": rows}, f)


def _table(a) -> None:
    runs = []
    for path in a.files:
        with open(path) as f:
            runs.append(json.load(f))
    base, new = runs
    by = {r["method"]: r for r in new["rows"]}
    print(f"| method | {base['label']} tok/s | {new['label']} tok/s | ratio | tau {base['label']} | tau "
          f"{new['label']} | same outputs |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for r in base["rows"]:
        n = by.get(r["method"])
        if n is None:
            continue
        same = sum(x == y for x, y in zip(r["outputs"], n["outputs"], strict=True))
        print(f"| {r['method']} | {r['tok_s']:.1f} | {n['tok_s']:.1f} | {n['tok_s'] / r['tok_s']:.3f} | "
              f"{r['tau']:.2f} | {n['tau']:.2f} | {same}/{len(r['outputs'])} |")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--root", required=True)
    r.add_argument("--label", required=True)
    for key in ("target", "drafter", "tokenizer", "prompts", "out"):
        r.add_argument(f"--{key}", required=True)
    r.add_argument("--num-prompts", type=int, default=20)
    r.add_argument("--max-new", type=int, default=128)
    r.add_argument("--repeats", type=int, default=1)
    r.add_argument("--methods", default="ar,chain,b15,b32,b63")
    r.add_argument("--compile", action="store_true")
    r.add_argument("--dtype", default="auto", help="auto (bf16 on CUDA, fp32 on CPU), float32, bfloat16")
    t = sub.add_parser("table")
    t.add_argument("files", nargs=2)
    a = ap.parse_args()
    _run(a) if a.cmd == "run" else _table(a)


if __name__ == "__main__":
    main()
