"""Round cost at the Qwen3-8B shape (or, with --hybrid, a Qwen3.5 hybrid of about 8 B; random bf16 weights) with a
5-layer DFlash-shaped drafter of that width.

    python benchmarks/e2e/shape_8b.py [--compile] [--layers 36] [--prompt 512]
    python benchmarks/e2e/shape_8b.py --hybrid            # Qwen3.5 architecture, 32 layers, 3 GDN : 1 attention

Times, as medians of CUDA-graph replays after warm-up: the copy bandwidth and the HBM floor (weight bytes /
bandwidth); the fast path's AR step (one captured round of plain decoding); the pieces and whole of a DDTree round
(drafter block forward, tree build, verify, acceptance and commit) for budgets 15/31/63 (16/32/64 nodes); and the
round's verify alone (``_Round._verify``: tree mask and target forward, hybrids' recurrent layers through specdec's
adapters and tree scans) over fixed trees of 1/16/32/64 nodes, with the engine's attention and with HF's own
``sdpa`` (grouped K/V repeated per query head; ``specdec.attention``). ``--compile`` adds the AR step (with its
heaviest kernels), the b31 round and the four verifies compiled under the graphs (about a minute of compilation
each at this size). Rows are printed as they are measured, and as a table at the end. Needs a CUDA device
(``--small`` runs a tiny config on CPU to check the script).
"""

from __future__ import annotations

import argparse
import logging
import time

import torch
from round_profile import profile_fn, profile_round  # benchmarks/e2e, beside this script
from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig, Qwen3Config, Qwen3ForCausalLM

from specdec.bench import median_ms
from specdec.drafters.dflash import DFlashDrafter
from specdec import attention
from specdec.kernels.skinny_linear import routing as linear
from specdec.engine import FastEngine
from specdec.runtime import Captured, compile_fn
from specdec.kernels import _triton
from specdec.kernels.tree_accept import tree_mask
from specdec.target import TargetModel
from specdec.trees.device import ddtree_device, root_tree_device
from specdec.types import DDTree, SamplingParams

GREEDY = SamplingParams()
logger = logging.getLogger("shape_8b")


def timed(fn, iters: int = 30) -> float:
    """Median ms of ``fn()`` (already captured or cheap to launch) after one untimed call (CUDA events on a GPU;
    the CPU smoke run of the script, ``--small``, times 3 calls)."""
    fn()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return median_ms(fn, device, iters=iters if device.type == "cuda" else 3)


def bandwidth_gbs(device) -> float:
    x = torch.empty(2**30 if device.type == "cuda" else 2**24, dtype=torch.uint8, device=device)
    y = torch.empty_like(x)
    ms = timed(lambda: y.copy_(x), 20)
    return 2 * x.numel() / ms / 1e6  # bytes read + written, GB/s


def option(kv: str) -> tuple[str, object]:
    """``"key=value"`` as an inductor option (True / False / an int / the string)."""
    key, _, value = kv.partition("=")
    if value in ("True", "False"):
        return key, value == "True"
    return key, int(value) if value.lstrip("-").isdigit() else value


def nbytes(module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


@torch.no_grad()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=36)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument(
        "--compile-mode",
        default="default",
        choices=("default", "max-autotune-no-cudagraphs"),
        help="inductor mode of the compiled rows (max-autotune benchmarks kernel choices: minutes more per shape)",
    )
    ap.add_argument(
        "--compile-options",
        nargs="+",
        default=None,
        metavar="KEY=VALUE",
        help="inductor options instead of a mode (compile=dict), e.g. max_autotune=True "
        "coordinate_descent_tuning=True max_autotune_gemm_backends=ATEN",
    )
    ap.add_argument(
        "--attention-ab",
        action="store_true",
        help="only the AR step (captured, and compiled) with HF's sdpa attention, the engine's grouped one on SDPA, "
        "and grouped on the Triton split-K/V kernel (specdec.kernels.tree_attention), + kernel lists",
    )
    ap.add_argument(
        "--variants",
        nargs="+",
        default=["hf", "grouped", "triton"],
        choices=["hf", "grouped", "triton"],
        help="with --attention-ab: which attentions to time (HF sdpa, grouped SDPA, grouped Triton kernel)",
    )
    ap.add_argument(
        "--verify-only",
        action="store_true",
        help="only the verify rows (1 / 16 / 32 / 64 nodes; with --compile compiled too): no AR step, pieces, rounds "
        "or profiles",
    )
    ap.add_argument("--skip-verify", action="store_true", help="leave out the verify rows (time for the rounds)")
    ap.add_argument(
        "--draft",
        choices=("flat", "peaked"),
        default="flat",
        help="the draft log-probs the verify trees (and the timed tree builds) come from: logits ~ 3 N(0, 1), whose "
        "DDTree is 2-3 deep, or the same with one confident token per position (14-15 deep, as a trained drafter's)",
    )
    ap.add_argument(
        "--nodes",
        type=int,
        nargs="+",
        default=[16, 32, 64],
        choices=[16, 32, 64],
        help="the verify rows' tree sizes besides the 1-node verify they are compared with",
    )
    ap.add_argument(
        "--linear-kernel",
        choices=("torch", "triton"),
        default=None,
        help="the target's linear layers: their own F.linear, or the split-K skinny kernel (SPECDEC_LINEAR_KERNEL)",
    )
    ap.add_argument(
        "--compile-graph",
        choices=("split", "whole"),
        default=None,
        help="compiled rows: each Triton kernel call ends a compiled region, or one graph per round "
        "(SPECDEC_COMPILE_GRAPH)",
    )
    ap.add_argument(
        "--profile-replays",
        action="store_true",
        help="with --compile: also profile the compiled verifies as graph replays (each kernel's time inside the "
        "graph, not in an eager run) and log the heaviest kernels",
    )
    ap.add_argument("--small", action="store_true", help="a tiny config on CPU: checks the script, times nothing")
    ap.add_argument(
        "--hybrid",
        action="store_true",
        help="a Qwen3.5-architecture hybrid instead (3 Gated-DeltaNet : 1 attention layers, hidden 4096, 32 layers)",
    )
    args = ap.parse_args()
    if args.linear_kernel is not None:
        linear.KERNEL = args.linear_kernel  # read as the engine builds each round's scope
    if args.compile_graph is not None:
        _triton.COMPILE_GRAPH = args.compile_graph  # read as each kernel call is traced
    device = torch.device("cpu" if args.small else "cuda")
    width = (
        dict(
            vocab_size=1000,
            hidden_size=128,
            intermediate_size=256,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
        )
        if args.small
        else dict(
            vocab_size=151936,
            hidden_size=4096,
            intermediate_size=12288,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=128,
        )
    )
    if args.hybrid:
        small = dict(vocab_size=1000, hidden_size=128, intermediate_size=256, linear_num_key_heads=2,
                     linear_num_value_heads=4, linear_key_head_dim=32, linear_value_head_dim=32,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=32)  # fmt: skip
        layers = args.layers if args.layers != 36 else 32
        cfg = Qwen3_5TextConfig(
            **(small if args.small else {}),
            num_hidden_layers=layers,
            layer_types=["full_attention" if i % 4 == 3 else "linear_attention" for i in range(layers)],
            tie_word_embeddings=False,
            attn_implementation="sdpa",
        )
        model_cls = Qwen3_5ForCausalLM
    else:
        cfg = Qwen3Config(
            **width,
            num_hidden_layers=args.layers,
            max_position_embeddings=40960,
            rope_theta=1e6,
            tie_word_embeddings=False,
            attn_implementation="sdpa",
        )
        model_cls = Qwen3ForCausalLM
    t0 = time.perf_counter()
    torch.manual_seed(0)
    with torch.device(device):
        model = model_cls(cfg).to(torch.bfloat16).eval()
    drafter = DFlashDrafter.for_target(
        model,
        mask_token_id=cfg.vocab_size - 1,
        num_layers=5,
        block_size=16,
        num_taps=5 if args.layers >= 8 else 1,
        dtype=torch.bfloat16,
        device=device,
    )
    for p in drafter.model.parameters():  # sharper than the 0.02 init so drafts are not all ties
        if p.dim() == 2:
            p.mul_(4.0)
    setup_s = time.perf_counter() - t0
    target = TargetModel.wrap(model)
    gbs = bandwidth_gbs(device)
    t_bytes, d_bytes = nbytes(model), nbytes(drafter.model)
    floor = t_bytes / gbs / 1e6
    floor_round = (t_bytes + d_bytes) / gbs / 1e6
    rows: list[tuple[str, float, str]] = []

    def add(name: str, ms: float, note: str) -> None:  # printed at once too: a run cut short keeps its figures
        rows.append((name, ms, note))
        print(f"{name}: {ms:.3f} ms {note}", flush=True)

    prompt = torch.randint(10, cfg.vocab_size - 10, (1, args.prompt), device=device)
    gpu = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    shape = "Qwen3.5 hybrid shape (3 GDN : 1 attention)" if args.hybrid else "Qwen3-8B shape"
    header = (
        f"# {shape} ({cfg.num_hidden_layers} layers, random bf16), prompt {args.prompt}, {gpu}, "
        f"linear layers: {linear.KERNEL}, compiled regions: {_triton.COMPILE_GRAPH}\n"
        f"target {t_bytes / 1e9:.2f} GB, drafter {d_bytes / 1e9:.2f} GB, copy bandwidth {gbs / 1e3:.3f} TB/s, "
        f"HBM floor {floor:.2f} ms (target), {floor_round:.2f} ms (target + drafter); setup {setup_s:.0f} s"
    )
    print(header, flush=True)
    engine = FastEngine.for_target(target, capacity=args.prompt + 1024)
    span = engine.span_for(args.prompt + 96)  # the span bucket a round at this prompt length uses

    mode = True if args.compile_mode == "default" else args.compile_mode
    if args.compile_options:
        mode = dict(option(kv) for kv in args.compile_options)
        args.compile_mode = " ".join(args.compile_options)  # the rows' label
    verify_target = 1.2 if args.hybrid else 1.15  # the issues' bound on an N-node verify against one node
    # compiled forwards attend as the engine compiles them (specdec.attention.grouped_for)
    compiled_scope = engine.attention_scope(None, compiled=True)

    def start(d):
        engine.prefill(prompt, d)
        engine.set_root(prompt[0, -1])

    def compiled_round(name: str, d, tree):
        """Time the round of ``d`` / ``tree`` compiled under its graph; returns (ms, the round)."""
        start(d)
        c0 = time.perf_counter()
        rnd = engine.round_for(d, tree, GREEDY, graph=True, compile=mode, span=span)
        rnd.captured()
        compile_s = time.perf_counter() - c0
        ms = timed(lambda: rnd.captured())
        ref = floor if d is None else floor_round
        add(name, ms, f"{ms / ref:.2f} x its floor; compile + capture {compile_s:.0f} s")
        return ms, rnd

    def time_rounds(logq):
        """The AR step (with HF's attention too), the drafter, the builds and the DDTree rounds, timed."""
        # AR step: the whole captured round of plain decoding; first with HF's sdpa attention (grouped K/V repeated
        # per query head), then as the engine runs it (query heads stacked per K/V head, specdec.attention).
        attention.MODE = "0"
        start(None)
        ar_hf = engine.round_for(None, None, GREEDY, graph=True, span=span)
        ar_hf_ms = timed(lambda: ar_hf.captured())
        add("AR step, HF sdpa attention (K/V repeated)", ar_hf_ms, f"{ar_hf_ms / floor:.2f} x HBM floor")
        attention.MODE = "auto"
        engine._rounds.clear()
        start(None)
        ar = engine.round_for(None, None, GREEDY, graph=True, span=span)
        ar_ms = timed(lambda: ar.captured())
        add("AR step (captured round)", ar_ms, f"{ar_ms / floor:.2f} x HBM floor (target <= 1.3 with compile)")

        # Pieces of a DDTree round (each captured alone) and the whole round.
        start(drafter)
        static = engine._static(drafter)
        prefix = engine.prefix
        draft = Captured(lambda: static.logq(engine.root, prefix, 15, span), device=device, graph=True)
        draft_ms = timed(draft)
        add("drafter block forward (16 slots)", draft_ms, "")
        builds = {}
        for budget in (15, 31, 63):

            def build(b=budget):  # as the round builds it: DDTree (Triton where it applies), then the tree mask
                tree = ddtree_device(
                    logq, engine.root, budget=b, topk=8, num_slots=b + 1, impl="auto", topk_impl="auto"
                )
                return tree_mask(tree.parents, tree.valid, prefix, span, 15, torch.bfloat16)

            builds[budget] = timed(Captured(build, device=device, graph=True))
            add(f"tree build + mask, budget {budget}", builds[budget], "")
        rounds = {}
        for budget in (15, 31, 63):
            start(drafter)
            rounds[budget] = rnd = engine.round_for(
                drafter, DDTree(budget=budget, topk=8), GREEDY, graph=True, span=span
            )
            ms = timed(lambda rnd=rnd: rnd.captured())
            note = f"{ms / floor_round:.2f} x (target+drafter bytes)/bandwidth (target <= 1.25)" if budget == 31 else ""
            add(f"DDTree round, budget {budget} (captured)", ms, note)
            if args.hybrid:
                rest = ms - draft_ms - builds[budget]
                add(f"  verify + accept + commit, {budget + 1} nodes (round - draft - build)", rest,
                    f"{rest / ar_ms:.2f} x the AR step (target <= 1.2)")  # fmt: skip
        return ar, ar_ms, rounds

    if args.attention_ab:  # the AR step with each attention, uncompiled and compiled, timed, then profiled
        timings = {}
        known = {"hf": ("HF sdpa", "0", "sdpa"), "grouped": ("grouped", "1", "sdpa"),
                 "triton": ("grouped, Triton kernel", "1", "triton")}  # fmt: skip
        variants = {known[v][0]: known[v][1:] for v in args.variants}
        for name, (mode_, kernel) in variants.items():
            attention.MODE, attention.KERNEL = mode_, kernel
            engine._rounds.clear()
            start(None)
            eager = engine.round_for(None, None, GREEDY, graph=True, span=span)
            ms = timed(lambda eager=eager: eager.captured())
            add(f"AR step, {name} attention", ms, f"{ms / floor:.2f} x HBM floor")
            timings[name] = compiled_round(f"AR step, compiled ({args.compile_mode}), {name} attention", None, None)
        for name, (_, rnd) in timings.items():
            attention.MODE, attention.KERNEL = variants[name]
            start(None)
            logger.warning("heaviest kernels, %s attention:", name)
            phases = profile_round(rnd, engine, 3, top=("round",))
            add(f"  kernel sum, {name}", phases["round"][1], f"{phases['round'][0]:.0f} kernels")
        attention.MODE, attention.KERNEL = "auto", "auto"
        print(header)
        for name, ms, note in rows:
            print(f"| {name} | {ms:.3f} | {note} |")
        return

    start(drafter)
    logits = torch.randn(15, cfg.vocab_size, device=device) * 3
    if args.draft == "peaked":  # one confident token per position (p ~ 0.8), as a trained drafter's first choice
        logits[torch.arange(15, device=device), torch.randint(0, cfg.vocab_size, (15,), device=device)] += 20
    logq = torch.log_softmax(logits, -1)
    if args.verify_only:  # the verifies' owners: the rounds whose buckets they use (captured, not timed)
        rounds = {n - 1: engine.round_for(drafter, DDTree(budget=n - 1, topk=8), GREEDY, graph=True, span=span)
                  for n in args.nodes}  # fmt: skip
    else:
        ar, ar_ms, rounds = time_rounds(logq)

    # The round's own verify (tree mask, target forward; hybrids: the recurrent layers through their adapters and
    # tree scans) over a fixed tree of 1 / 16 / 32 / 64 nodes, captured alone; it commits nothing, so it repeats.
    # Timed with the engine's attention and with HF's sdpa (outside the scope: K/V repeated per query head).
    start(drafter)
    owners = {1: engine.round_for(None, None, GREEDY, graph=True, span=span)}
    owners.update({b + 1: rounds[b] for b in rounds if b + 1 in args.nodes})
    if args.skip_verify:
        owners = {}
    verifies, fwd = {}, {}
    for n, owner in owners.items():
        tree = (root_tree_device(engine.root) if n == 1 else
                ddtree_device(logq, engine.root, budget=n - 1, topk=8, num_slots=owner.slots))  # fmt: skip
        verifies[n] = lambda owner=owner, tree=tree: owner._verify(tree)
        hf_ms = timed(Captured(verifies[n], device=device, graph=True))
        fwd[n] = timed(Captured(verifies[n], device=device, graph=True, scope=owner.captured.scope))
        note = "" if n == 1 else f"{fwd[n] / fwd[1]:.2f} x the 1-node verify (target <= {verify_target})"
        plain = "outside the engine's scope (HF sdpa attention, the layers' own linears)"
        add(f"verify, {n} nodes", fwd[n], f"{note}; {plain} {hf_ms:.3f} ms")

    compiled_verifies = {}
    if args.compile:
        if not args.verify_only:
            ar_compiled, ar_c = compiled_round(f"AR step, compiled ({args.compile_mode})", None, None)
            _, b31_c = compiled_round(
                f"DDTree round b31, compiled ({args.compile_mode})", drafter, DDTree(budget=31, topk=8)
            )
        for n, verify in verifies.items():  # the verify alone, compiled, against its compiled 1-node form
            start(drafter)
            c0 = time.perf_counter()
            step = Captured(compile_fn(verify, mode), device=device, graph=True, scope=compiled_scope)
            try:
                step()
            except Exception as err:  # a shape inductor cannot compile: report it, keep the other rows
                logger.exception("the %d-node verify did not compile", n)
                add(f"verify, {n} nodes, compiled ({args.compile_mode})", float("nan"), f"failed: {err}"[:200])
                continue
            compile_s = time.perf_counter() - c0
            ms = timed(step)
            fwd[-n] = ms
            compiled_verifies[n] = step
            note = "" if n == 1 else f"{ms / fwd[-1]:.2f} x the compiled 1-node verify (target <= {verify_target})"
            vs_ar = "" if args.verify_only else f"; {ms / ar_compiled:.2f} x the compiled AR step"
            add(f"verify, {n} nodes, compiled ({args.compile_mode})", ms, f"{note}{vs_ar}; compile {compile_s:.0f} s")

    # Kernel profiles last: the profiler slows the graph replays timed after it.
    if (
        device.type == "cuda" and args.hybrid and not args.verify_only
    ):  # kernel time per phase (profiler, eager runs of the same rounds)
        start(None)
        ar_phases = profile_round(ar, engine, 3)
        for budget, rnd in rounds.items():
            start(drafter)
            ph = profile_round(rnd, engine, 3)
            verify, verify_ar = ph["verify"][1], ar_phases["verify"][1]
            commit = ph.get("commit", (0, 0.0))[1] + ph.get("commit-rec", (0, 0.0))[1]
            add(
                f"  verify kernels, {budget + 1} nodes / 1 node",
                verify,
                f"{verify / verify_ar:.2f} x the 1-node verify ({verify_ar:.3f} ms) (target <= 1.2)",
            )
            add(
                f"  commit kernels (K/V rows + recurrent replay), budget {budget}",
                commit,
                f"{100 * commit / ph['round'][1]:.1f} % of the round's kernel time (target <= 5 %)",
            )
    if (
        device.type == "cuda" and args.compile and not args.verify_only
    ):  # where the compiled AR step's time goes (heaviest kernels, stderr)
        start(None)
        phases = profile_round(ar_c, engine, 3, top=("round",))
        add("  AR step, compiled: kernel sum", phases["round"][1], f"{phases['round'][0]:.0f} kernels")
        start(drafter)
        logger.warning("heaviest kernels, DDTree round b31, compiled:")
        phases = profile_round(b31_c, engine, 3, top=("round",))
        add("  DDTree round b31, compiled: kernel sum", phases["round"][1], f"{phases['round'][0]:.0f} kernels")
    if device.type == "cuda" and args.verify_only and not args.compile:  # the verifies' kernels, uncompiled
        for n, verify in verifies.items():
            start(drafter)
            logger.warning("heaviest kernels, verify, %d nodes:", n)
            with owners[n].captured.scope:
                phases = profile_fn(verify, 3, top=("round",))
            add(f"  verify, {n} nodes: kernel sum", phases["round"][1], f"{phases['round'][0]:.0f} kernels")
    if device.type == "cuda" and args.compile and compiled_verifies:  # the compiled verifies' kernels
        start(drafter)
        for n, step in compiled_verifies.items():
            logger.warning("heaviest kernels, verify, %d nodes, compiled:", n)
            with compiled_scope:
                phases = profile_fn(step.fn, 3, top=("round",))
            add(f"  verify, {n} nodes, compiled: kernel sum", phases["round"][1], f"{phases['round'][0]:.0f} kernels")

    if device.type == "cuda" and args.profile_replays and compiled_verifies:  # kernel times inside the replays
        start(drafter)
        for n, step in compiled_verifies.items():
            step()
            torch.cuda.synchronize()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(3):
                    step()
                torch.cuda.synchronize()
            logger.warning("kernels inside the graph replays, verify, %d nodes, compiled (3 replays):\n%s", n,
                           prof.key_averages().table(sort_by="device_time_total", row_limit=16))  # fmt: skip
            scans = [e for e in prof.key_averages() if "tree_gdn" in e.key]
            for e in scans:
                add(f"  verify, {n} nodes, compiled, replayed: {e.key}", e.device_time_total / 3e3,
                    f"{e.count / 3:.0f} launches per replay, {e.device_time_total / e.count:.1f} us each")  # fmt: skip

    print(header)
    print("\n| figure | ms | note |\n|---|---|---|")
    for name, ms, note in rows:
        print(f"| {name} | {ms:.3f} | {note} |")


if __name__ == "__main__":
    main()
