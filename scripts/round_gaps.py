"""Where a replayed round's time goes between its kernels, on CUDA: kernel busy time per round against the gaps
between consecutive kernels (zoo dense pair, bf16, B = 1, 4 dev prompts x 128 tokens, warm, ``torch.profiler``).

    python scripts/round_gaps.py

Per method (plain decoding, DDTree b31): µs per round of kernels, of gaps under 40 µs (between kernels of one
replay) and of gaps of 40 µs or more (the GPU waiting on the host: the loop between rounds, a call's own work);
then the kernel pairs around the largest short gaps.
"""

import collections
import json

import torch
from torch.profiler import profile, ProfilerActivity
from transformers import AutoModelForCausalLM, AutoTokenizer
import specdec
from specdec.loading import zoo_dir
model = AutoModelForCausalLM.from_pretrained(zoo_dir() / "target-dense", dtype=torch.bfloat16).cuda().eval()
tok = AutoTokenizer.from_pretrained(zoo_dir() / "tokenizer")
drafter = specdec.DFlashDrafter.from_pretrained("assets/drafters/zoo-dense", target=model)
lines = [json.loads(row)["prompt"] for row in open(zoo_dir() / "prompts_dev.jsonl")][:4]
calls = [tok(p, return_tensors="pt").input_ids[:, -384:].cuda() for p in lines]
for name, tree in (("ar", None), ("b31", specdec.DDTree(budget=31, topk=8))):
    d = drafter if tree is not None else None
    for _ in range(2):
        for ids in calls:
            specdec.generate(model, ids, drafter=d, tree=tree, max_new_tokens=128)
    torch.cuda.synchronize()
    rounds = 0
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for ids in calls:
            rounds += specdec.generate(model, ids, drafter=d, tree=tree, max_new_tokens=128).stats.rounds
        torch.cuda.synchronize()
    ks = sorted((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                if e.device_type == torch.autograd.DeviceType.CUDA)  # fmt: skip
    busy = sum(e - s for s, e, _ in ks)
    gaps = collections.Counter()
    small, n_small, big = 0.0, 0, 0.0
    for (s0, e0, n0), (s1, e1, n1) in zip(ks, ks[1:]):
        g = s1 - e0
        if 0 < g < 40:
            small += g
            n_small += 1
            gaps[n0[:60] + " -> " + n1[:40]] += g
        elif g >= 40:
            big += g
    print(f"## {name}: {rounds} rounds; per round: kernels {busy / rounds:.1f} us, gaps < 40 us {small / rounds:.1f} "
          f"us ({n_small / rounds:.1f} gaps, {small / max(n_small, 1):.2f} us each), gaps >= 40 us (host) "
          f"{big / rounds:.1f} us")
    for k, v in gaps.most_common(12):
        print(f"  {v / rounds:6.2f} us/round  {k}")
