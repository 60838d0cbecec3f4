"""Where a fast-path round spends its device time: per phase, the kernels launched and their summed GPU time.

    python benchmarks/e2e/round_profile.py --target target-dense --drafter assets/drafters/zoo-dense \
        --budgets 15 32 64 --impls torch triton

For each method the script decodes one prompt through ``specdec.generate`` (so the round is warm and captured),
then (a) replays the captured round graph ``--replays`` times, putting the decode state back after each replay
(outside the timed interval), and reports the mean replay time from CUDA events; (b) runs the same round
function eagerly under ``torch.profiler`` and sums, per phase, the kernels it launched and their GPU time. The
kernel sum is what the graph costs without launch gaps; the replay time minus that sum is what the graph adds
(gaps between the kernels of a graph). Phases are the library's own functions, wrapped here by name.
Triton launches are not linked to the profiler's CPU ranges, so their kernels are taken from the raw trace and
credited by kernel name to the phase whose function launches them (``TRITON_PHASES``; also to "round"); before
this, the phase sums left them out.
Last, a per-call line: wall time of a whole ``generate`` call minus its rounds' replay time (prefill, setup,
host reads). With ``--num-prompts N`` the calls cycle through N dev prompts, every span bucket a method used is
replayed, and a second table gives each bucket's rounds per call and replay time, and their weighted mean: the
round cost that real decoding pays (rounds near the end of long prompts attend over a larger span).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import time

import torch
from transformers import AutoTokenizer

import specdec
import specdec.engine as fast_engine
from specdec.drafters.dflash import DFlashDrafter
from specdec.drafters.dflash_static import DFlashStatic
from specdec.engine import FastEngine
from specdec.state.storage import StaticModel
from specdec.loading import load_prompts, load_target, resolve_device, zoo_dir

logger = logging.getLogger("round_profile")

PHASES = {  # label -> (owner, attribute)
    "draft": (DFlashStatic, "logq"),
    "build": (fast_engine, "ddtree_device"),
    "build-chain": (fast_engine, "chain_device"),
    "mask": (fast_engine, "tree_mask"),
    "verify": (StaticModel, "forward"),
    "choose": (fast_engine, "target_choices"),
    "accept": (fast_engine, "accept_path"),
    "commit": (fast_engine, "commit_rows"),
    "commit-rec": (fast_engine, "commit_recurrent"),
    "ingest": (DFlashStatic, "ingest"),
}


# The library's Triton kernels, by name, and the phase that launches each (rms_norm runs in the draft and the
# ingest: credited to "norms").
TRITON_PHASES = {
    "_topk_rows_kernel": "build",
    "_topk_row_in_registers_kernel": "build",
    "_best_first_kernel": "build",
    "_tree_mask_kernel": "mask",
    "_accept_path_kernel": "accept",
    "_tree_gdn_kernel": "verify",
    "_tree_mamba2_kernel": "verify",
    "_gdn_path_kernel": "commit-rec",
    "_rms_norm_kernel": "norms",
}


def _triton_kernels(prof, attributed: set[str]) -> dict[str, list]:
    """Per phase ``[kernels, GPU us]`` of the library's Triton kernels in the raw trace (names not already
    credited through a CPU range, so that nothing is counted twice)."""
    try:
        events = prof.profiler.kineto_results.events()
    except AttributeError:  # another profiler build: leave them out, as before
        logger.warning("raw trace unavailable: Triton kernels are not in the phase sums")
        return {}
    out: dict[str, list] = {}
    for evt in events:
        label = TRITON_PHASES.get(evt.name())
        if label is None or evt.name() in attributed or "CUDA" not in str(evt.device_type()):
            continue
        for key in (label, "round"):
            acc = out.setdefault(key, [0, 0.0])
            acc[0] += 1
            acc[1] += evt.duration_ns() / 1e3
    return out


@contextlib.contextmanager
def labelled():
    """Wrap each phase function in a ``record_function`` of its label."""
    saved = {}
    for label, (owner, attr) in PHASES.items():
        fn = getattr(owner, attr)
        saved[label] = fn

        def wrapped(*a, _fn=fn, _label=label, **kw):
            with torch.profiler.record_function(f"phase:{_label}"):
                return _fn(*a, **kw)

        setattr(owner, attr, wrapped)
    try:
        yield
    finally:
        for label, (owner, attr) in PHASES.items():
            setattr(owner, attr, saved[label])


def _kernels(evt, names: dict | None = None) -> tuple[int, float]:
    """(kernels, GPU us) launched under ``evt``; adds per-kernel-name (count, us) to ``names``."""
    n, us = len(evt.kernels), sum(k.duration for k in evt.kernels)
    if names is not None:
        for k in evt.kernels:
            acc = names.setdefault(k.name[:60], [0, 0.0])
            acc[0] += 1
            acc[1] += k.duration
    for child in evt.cpu_children:
        cn, cus = _kernels(child, names)
        n, us = n + cn, us + cus
    return n, us


@torch.no_grad()
def profile_round(rnd, engine, rounds: int, top: tuple[str, ...] = ()) -> dict[str, tuple[int, float]]:
    """Per-phase (kernels per round, GPU ms per round) of ``rounds`` eager runs of the round function."""
    restore = rnd._snapshot()
    # A compiled round would recompile around the wrappers: profile it whole, unlabelled. The round's scope (its
    # attention, specdec.attention) as when it was captured: outside it a compiled round would recompile.
    with rnd.captured.scope, contextlib.nullcontext() if rnd.compile else labelled():
        rnd.captured.fn()  # wrapped warm run
        restore()
        return profile_fn(rnd.captured.fn, rounds, top, restore)


@torch.no_grad()
def profile_fn(run, rounds: int, top: tuple[str, ...] = (), restore=lambda: None) -> dict[str, tuple[int, float]]:
    """Per-phase (kernels per run, GPU ms per run) of ``rounds`` eager calls of ``run`` (warm; ``restore`` after
    each), the whole call labelled "round"; the heaviest kernels of the phases in ``top`` are logged."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(rounds):
            with torch.profiler.record_function("phase:round"):
                run()
            restore()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    out: dict[str, list] = {}
    names: dict[str, dict] = {}
    for evt in prof.events():
        if evt.name.startswith("phase:"):
            label = evt.name[6:]
            n, us = _kernels(evt, names.setdefault(label, {}))
            acc = out.setdefault(label, [0, 0.0])
            acc[0] += n
            acc[1] += us
    attributed = {name for per_label in names.values() for name in per_label}
    for label, (n, us) in _triton_kernels(prof, attributed).items():
        acc = out.setdefault(label, [0, 0.0])
        acc[0] += n
        acc[1] += us
    if top:
        for label in top:
            ranked = sorted(names.get(label, {}).items(), key=lambda kv: -kv[1][1])[:15]
            for name, (count, us) in ranked:
                logger.warning("  %s: %5.1f x %-60s %7.1f us", label, count / rounds, name, us / rounds)
    return {k: (v[0] / rounds, v[1] / rounds / 1e3) for k, v in out.items()}


def replay_ms(rnd, replays: int) -> float:
    graph = rnd.captured.graph
    if graph is None:
        return float("nan")
    restore = rnd._snapshot()
    total = 0.0
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        restore()
        end.synchronize()
        total += start.elapsed_time(end)
    return total / replays


@torch.no_grad()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="target-dense")
    ap.add_argument("--drafter", default="assets/drafters/zoo-dense")
    ap.add_argument("--budgets", type=int, nargs="+", default=[15, 32, 64])
    ap.add_argument("--topk", type=int, default=8)
    ap.add_argument("--impls", nargs="+", default=["auto"], help="DDTree selection impls to profile")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--replays", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5, help="profiled eager rounds per method")
    ap.add_argument("--calls", type=int, default=5, help="timed generate calls for the per-call line")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--top", nargs="*", default=[], help="phases whose heaviest kernels are listed (stderr)")
    ap.add_argument("--num-prompts", type=int, default=1,
                    help="dev prompts each timed call cycles through; with more than one, every span bucket the "
                         "method used is replayed and its round count printed (the span mix of real decoding)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    device, dtype = resolve_device("auto", "auto")
    if device.type != "cuda":
        raise SystemExit("round_profile.py needs a CUDA device (it times graph replays).")
    model = load_target(zoo_dir() / args.target, device=device, dtype=dtype)
    tok = AutoTokenizer.from_pretrained(zoo_dir() / "tokenizer")
    drafter = DFlashDrafter.from_pretrained(args.drafter, target=model)
    prompts = [tok(p["prompt"], return_tensors="pt").input_ids.to(device) for p in load_prompts()[: args.num_prompts]]
    k = drafter.config.block_size - 1
    methods = [("ar", None, None, "torch"), (f"chain-k{k}", drafter, specdec.Chain(k=k), "torch")]
    for impl in args.impls:
        for b in args.budgets:
            methods.append((f"ddtree-b{b}-{impl}", drafter, specdec.DDTree(budget=b, topk=args.topk), impl))
    rows, spans = [], []
    num_calls = args.calls * len(prompts)  # timed calls per method
    for name, d, tree, impl in methods:
        fast_engine._DDTREE_IMPL = impl
        engine = FastEngine._engines.get(model)
        if engine is not None:
            engine._rounds.clear()  # the impl is not part of a round's key
        gen = dict(drafter=d, tree=tree, max_new_tokens=args.max_new_tokens, do_sample=False, compile=args.compile)
        for ids in prompts:  # warm: every prompt (and so every span bucket) once
            specdec.generate(model, ids, **gen)
        engine = FastEngine._engines[model]
        before = {key: r.launched for key, r in engine._rounds.items()}
        walls, rounds = [], []
        for call in range(num_calls):
            ids = prompts[call % len(prompts)]
            torch.cuda.synchronize()
            t = time.perf_counter()
            out = specdec.generate(model, ids, **gen)
            torch.cuda.synchronize()
            walls.append(time.perf_counter() - t)
            rounds.append(out.stats.rounds)
        mine = [(key, r) for key, r in engine._rounds.items() if r.drafter is d]
        replays = {key: replay_ms(r, args.replays) for key, r in mine} if len(prompts) > 1 else {}
        if replays:
            spans.append((name, [(r.span, r.launched - before.get(key, 0), replays[key]) for key, r in mine]))
        # the round of this method that ran the most (one per span bucket the calls used)
        key, rnd = max(mine, key=lambda kr: kr[1].launched)
        rep = replays[key] if replays else replay_ms(rnd, args.replays)
        logger.warning("%s", name)
        phases = profile_round(rnd, engine, args.rounds, tuple(args.top))
        # the rounds' replay time per call: weighted by how often each span ran, or the most-used round's
        per_round = sum(n * ms for _, n, ms in spans[-1][1]) if replays else rep * sum(rounds)
        rounds_ms = per_round / num_calls
        per_call = 1e3 * sum(walls) / len(walls) - rounds_ms
        rows.append((name, rep, phases, per_call, sum(rounds) / len(rounds)))
        print(f"{name}: replay {rep:.3f} ms", flush=True)
    labels = [p for p in [*PHASES, "norms"] if any(p in r[2] for r in rows)]
    print(f"\n# round profile, {args.target}, {torch.cuda.get_device_name(device)}, compile={args.compile}")
    print("per phase: kernels / GPU ms per round (eager run of the round function under the profiler)\n")
    print("| method | graph replay ms | kernel sum ms | kernels | " + " | ".join(labels) + " | other | per-call ms |")
    print("|---|" + "---|" * (len(labels) + 5))
    for name, rep, phases, per_call, nr in rows:
        total = phases.get("round", (0, 0.0))
        named = [phases.get(p, (0, 0.0)) for p in labels]
        other = (total[0] - sum(n for n, _ in named), total[1] - sum(ms for _, ms in named))
        cells = [f"{n:.0f} / {ms:.3f}" for n, ms in named] + [f"{other[0]:.0f} / {other[1]:.3f}"]
        print(f"| {name} | {rep:.3f} | {total[1]:.3f} | {total[0]:.0f} | " + " | ".join(cells)
              + f" | {per_call:.1f} ({nr:.0f} rounds) |")  # fmt: skip
    if spans:
        all_spans = sorted({s for _, u in spans for s, _, _ in u})
        print(f"\n# span buckets over {len(prompts)} prompts: rounds timed per call, graph replay ms\n")
        print("| method | " + " | ".join(f"span {s}" for s in all_spans) + " | weighted replay ms |")
        print("|---|" + "---|" * (len(all_spans) + 1))
        for name, used in spans:
            by_span = {s: (n, ms) for s, n, ms in used}
            cells = [f"{by_span[s][0] / num_calls:.1f} / {by_span[s][1]:.3f}" if s in by_span else "-"
                     for s in all_spans]  # fmt: skip
            total = sum(n for _, n, _ in used)
            weighted = sum(n * ms for _, n, ms in used) / max(total, 1)
            print(f"| {name} | " + " | ".join(cells) + f" | {weighted:.3f} |")


if __name__ == "__main__":
    main()
