"""Count the ops of one warm round per stage, on the CPU, along the path a CUDA graph of the round captures.

    SPECDEC_ZOO=/work/shared/zoo python scripts/round_ops.py [--target dense|hybrid] [--methods ar,chain,b15,b32,...]
        [--dtype bfloat16] [--torch-only] [--ops]

Methods: ar, chain, b15 / b16 / b32 / b63 / b64 (the DFlash drafter), auto-b15 / auto-b31 (the round
``DDTree(budget="auto")`` runs at that size: the tree and its expectations), and on the dense target the shipped EAGLE-3
head's e3-chain4, e3-b15 (DDTree over its per-depth q) and e3-dyn16 (EAGLE-2's DynamicTree, 16 tokens); on the
hybrid target its shipped EAGLE-3 head's e3-chain4 and e3-b15 and its MTP head's mtp-chain1, mtp-chain3 and mtp-b15.

Each method decodes a zoo prompt (warm-up: its round is built and run), then two more rounds run (the first warms
the kernel path, as a capture's warm-up does; the second is counted) under a
``TorchDispatchMode`` that counts the ATen ops that launch work (views, ``empty`` and other metadata ops are left
out) and, under Triton's interpreter (``TRITON_INTERPRET=1``, set here before anything imports Triton), every
Triton kernel launch as one op: the kernels a CUDA round replays where its backends say ``auto``. The ops are
charged to the round's stages by the function that issued them: draft (``state.propose``), tree build
(``tree.build``), the verify forward (mask, the attention kernel, the K/V cache writes, the rest of the forward),
accept (the processors and ``rule.accept``), commit (``commit_rows``, the recurrent commit, ``state.commit``) and
bookkeeping (the rest of the round). ``--torch-only`` counts the tensor-op path instead (no interpreter: what a
CPU round runs). ``--ops`` lists each stage's ops by name.

Where this differs from the GPU's graph: an ATen op is counted once where its CUDA implementation may launch more
than one kernel (a cuBLAS product with a split-K reduction, a multi-pass ``topk`` or ``cat``) or a copy of zero
bytes may launch none; Triton launch plans that read device properties take their CPU defaults (same launch count).
Hybrid targets' recurrent layers run their tensor-op references (the Gated DeltaNet scans pick Triton on CUDA only,
and their launch plans need a GPU driver; Mamba2 has no Triton version), so a hybrid's forward and commit count far
more ops here than its CUDA graph holds; its attention, draft, tree, accept and bookkeeping stages are exact. The
stages are otherwise the code a CUDA round captures: the same functions, the same backends' choices (``auto``
resolves as on CUDA under the interpreter).
"""

from __future__ import annotations

import argparse
import collections
import functools
import os
import sys
from pathlib import Path

STAGES = ("draft", "tree", "mask", "attention", "cache_write", "forward_rest", "accept", "commit", "bookkeeping")
# ops that launch nothing on the device: views, allocations, metadata
_FREE = {
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "lift_fresh", "detach", "alias",
    "_unsafe_view", "view", "_reshape_alias", "as_strided", "expand", "slice", "select", "unsqueeze", "squeeze",
    "permute", "transpose", "t", "unbind", "split", "split_with_sizes", "chunk", "narrow", "view_as", "diagonal",
    "unfold", "movedim", "_to_copy_noop", "resolve_conj", "resolve_neg", "is_same_size", "sym_size", "sym_stride",
    "sym_numel", "sym_storage_offset", "dim", "size", "stride", "is_contiguous", "numel", "promote_types",
    "result_type", "can_cast",
}  # fmt: skip


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="dense", choices=("dense", "hybrid"))
    p.add_argument("--methods", default="ar,chain,b15,b32")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--max-new", type=int, default=24)
    p.add_argument("--torch-only", action="store_true")
    p.add_argument("--ops", action="store_true", help="list each stage's ops")
    p.add_argument("--trace", nargs="*", default=(), metavar="STAGE",
                   help="list these stages' ops in order, each with the specdec line that issued it")  # fmt: skip
    return p.parse_args()


def main() -> None:
    a = _parse()
    if not a.torch_only:
        os.environ["TRITON_INTERPRET"] = "1"
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    import specdec
    from specdec import engine as engine_mod
    from specdec.loading import asset_path, load_prompts, load_tokenizer

    torch.manual_seed(0)
    zoo = Path(os.environ.get("SPECDEC_ZOO", "../shared/zoo"))
    if a.target == "dense":
        target_dir, drafter_dir, tok_dir = asset_path("zoo/target-dense"), asset_path("drafters/zoo-dense"), None
    else:
        target_dir, drafter_dir = zoo / "target-hybrid", asset_path("drafters/zoo-hybrid")
    tok_dir = asset_path("zoo/tokenizer")
    from transformers import AutoModelForCausalLM

    dtype = getattr(torch, a.dtype)
    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=dtype, attn_implementation="sdpa").eval()
    drafter = specdec.DFlashDrafter.from_pretrained(drafter_dir, target=model)
    tok = load_tokenizer(tok_dir)
    prompt = load_prompts(limit=1)[0]["prompt"]
    ids = tok(prompt, return_tensors="pt").input_ids
    block = drafter.config.block_size - 1
    methods = {
        "ar": (None, None),
        "chain": (drafter, specdec.Chain(k=block)),
        **{f"b{n}": (drafter, specdec.DDTree(budget=n, topk=8)) for n in (15, 16, 32, 63, 64)},
        # the auto budget's round at one size: the same tree plus its expectations (computed up to the next size)
        **{f"auto-b{n}": (drafter, specdec.DDTree(budget="auto", topk=8).at(n)) for n in (15, 31)},
    }
    # T = 1: sample-and-match over DDTree against RSD (multi-draft rejection without replacement) over the stochastic
    # DDTree, at equal nodes (the rules' round cost)
    rules = {f"sm-b{n}": (drafter, specdec.DDTree(budget=n, topk=8), specdec.SampleMatch()) for n in (15, 32)}
    rules.update({f"rsd-b{n}": (drafter, specdec.StochasticDDTree(n, 8), specdec.MultiDraftRejection(replacement=False))
                  for n in (15, 32)})  # fmt: skip
    rules["specinfer"] = (drafter, specdec.SampledTrees(4, 8, merge=False), specdec.MultiDraftRejection(replacement=True))
    rules["spec-sampling"] = (drafter, specdec.SampledChain(15), specdec.SpeculativeSampling())
    # about 15 nodes: traversal over 3 merged sampled paths of 5, SpecInfer over the same paths unmerged
    rules["trav-p15"] = (drafter, specdec.SampledTrees(3, 5), specdec.TraversalVerification(replacement=False))
    rules["specinfer-p15"] = (drafter, specdec.SampledTrees(3, 5, merge=False),
                              specdec.MultiDraftRejection(replacement=True))
    methods.update({name: (d, tree) for name, (d, tree, _) in rules.items()})
    if a.target == "dense":  # the shipped EAGLE-3 head: its chain, DDTree over its per-depth q, EAGLE-2's tree
        eagle = specdec.Eagle3Drafter.from_pretrained(asset_path("drafters/zoo-dense-eagle3"), target=model)
        methods.update({
            "e3-chain4": (eagle, specdec.Chain(k=4)),
            "e3-b15": (eagle, specdec.DDTree(budget=15, topk=8)),
            "e3-dyn16": (eagle, specdec.DynamicTree(depth=5, topk=4, total_tokens=16)),
        })  # fmt: skip
    else:  # the shipped hybrid heads: EAGLE-3, and MTP through a checkpoint copy holding its mtp.* tensors
        import tempfile

        from specdec.drafters.mtp import with_mtp_head

        eagle = specdec.Eagle3Drafter.from_pretrained(asset_path("drafters/zoo-hybrid-eagle3"), target=model)
        folder = with_mtp_head(target_dir, asset_path("drafters/zoo-hybrid-mtp"),
                               Path(tempfile.mkdtemp()) / "target-hybrid-mtp")  # fmt: skip
        mtp = specdec.MTPDrafter.from_pretrained(folder, target=model)
        methods.update({
            "e3-chain4": (eagle, specdec.Chain(k=4)),
            "e3-b15": (eagle, specdec.DDTree(budget=15, topk=8)),
            "mtp-chain1": (mtp, specdec.Chain(k=1)),
            "mtp-chain3": (mtp, specdec.Chain(k=3)),
            "mtp-b15": (mtp, specdec.DDTree(budget=15, topk=8)),
        })  # fmt: skip

    state = {"stack": [], "armed": False, "counts": None, "names": None, "triton": 0, "trace": None}
    library = str(Path(specdec.__file__).parent)

    def issuer() -> str:
        """The innermost specdec frame outside the kernels' launch wrappers, as ``file:line``."""
        frame = sys._getframe(2)
        while frame is not None:
            path = frame.f_code.co_filename
            if path.startswith(library) and "/kernels/" not in path:
                return f"{path[len(library) + 1 :]}:{frame.f_lineno}"
            frame = frame.f_back
        return "?"

    def stage_of(stack: list[str]) -> str:
        if not stack:
            return "bookkeeping"
        top = stack[0]
        if top == "verify":  # split the forward by the innermost piece
            inner = [s for s in stack if s in ("mask", "attention", "cache_write")]
            return inner[-1] if inner else "forward_rest"
        return top

    def record(name: str) -> None:
        if state["armed"] and state["triton"] == 0:
            stage = stage_of(state["stack"])
            state["counts"][stage] += 1
            state["names"][stage][name] += 1
            if stage in a.trace:
                state["trace"].append((stage, name, issuer()))

    class Counter(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            if name not in _FREE and not getattr(func, "is_view", False):
                record(name)
            return func(*args, **(kwargs or {}))

    def labelled(label: str, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            state["stack"].append(label)
            try:
                return fn(*args, **kwargs)
            finally:
                state["stack"].pop()

        return wrapper

    patches: list[tuple[object, str, object]] = []

    def patch(owner, attr: str, label: str) -> None:
        old = getattr(owner, attr)
        patches.append((owner, attr, old))
        setattr(owner, attr, labelled(label, old))

    # Triton launches: one op each, nothing inside counted (the interpreter's own copies are not device work)
    if not a.torch_only:
        from triton.runtime.interpreter import InterpretedFunction

        run = InterpretedFunction.run

        def counted_run(self, *args, **kwargs):
            record(f"triton:{self.fn.__name__}")
            state["triton"] += 1
            try:
                return run(self, *args, **kwargs)
            finally:
                state["triton"] -= 1

        InterpretedFunction.run = counted_run

    from specdec.state import storage

    patch(engine_mod.Round, "_verify", "verify")
    patch(engine_mod, "tree_masks", "mask")
    patch(engine_mod, "verify_inputs", "mask")
    patch(engine_mod, "commit_rows", "commit")
    patch(engine_mod, "commit_recurrent", "commit")
    patch(storage._StaticLayer, "update", "cache_write")
    patch(storage.StaticModel, "additive_mask", "mask")
    patch(storage.StaticModel, "forward", "verify")
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from specdec.attention import NAME, _register

    _register()
    ALL_ATTENTION_FUNCTIONS._global_mapping[NAME] = labelled("attention", ALL_ATTENTION_FUNCTIONS[NAME])
    ALL_ATTENTION_FUNCTIONS._global_mapping["sdpa"] = labelled("attention", ALL_ATTENTION_FUNCTIONS["sdpa"])
    patch(engine_mod.Round, "_process", "accept")

    rows = {}
    for name in a.methods.split(","):
        d, tree = methods[name]
        # warm-up on the tensor-op path (Triton's interpreter is slow); the counted round takes the kernels
        os.environ["TRITON_INTERPRET"] = "0"
        sampling = dict(do_sample=True, temperature=1.0, verifier=rules[name][2]) if name in rules else {}
        specdec.generate(model, ids, drafter=d, tree=tree, max_new_tokens=a.max_new, **{"do_sample": False, **sampling})
        os.environ["TRITON_INTERPRET"] = "0" if a.torch_only else "1"
        engine = engine_mod.Engine._engines[model][1]
        rounds = reversed(list(engine._rounds.values()))
        rule = type(rules[name][2]) if name in rules else specdec.Greedy
        rnd = next(r for r in rounds if r.drafter is d and type(r.rule) is rule
                   and (d is None or r.tree == tree or (name in rules and type(r.tree) is type(tree))))
        mark = len(patches)
        if rnd.proposes:
            for attr in ("propose", "propose_tree"):  # EAGLE-3 drafts a candidate tree for DynamicTree
                if hasattr(rnd.state, attr):
                    patch(type(rnd.state), attr, "draft")
            patch(type(rnd.tree), "build", "tree")
            patch(type(rnd.state), "commit", "commit")
        patch(type(rnd.rule), "accept", "accept")
        state["counts"] = collections.Counter(dict.fromkeys(STAGES, 0))
        state["names"] = collections.defaultdict(collections.Counter)
        state["trace"] = []
        scope = engine.attention_scope(rnd.state)  # built now: the routing of the counted path
        with torch.no_grad(), scope, Counter():
            rnd.captured.fn()  # once on the counted path (what a capture's warm-up runs), then counted
            state["armed"] = True
            rnd.captured.fn()
            state["armed"] = False
        while len(patches) > mark:  # this method's classes as they were
            owner, attr, old = patches.pop()
            setattr(owner, attr, old)
        rows[name] = (state["counts"], state["names"], state["trace"])

    path = "torch ops (CPU path)" if a.torch_only else "GPU path: Triton kernels via the interpreter"
    print(f"# ops per warm round, zoo {a.target}, {a.dtype}, {path}\n")
    print("| method | " + " | ".join(STAGES) + " | total |")
    print("|---|" + "---|" * (len(STAGES) + 1))
    for name, (counts, _, _) in rows.items():
        print(f"| {name} | " + " | ".join(str(counts[s]) for s in STAGES) + f" | {sum(counts.values())} |")
    if a.ops:
        for name, (_, names, _) in rows.items():
            print(f"\n## {name}")
            for s in STAGES:
                if names[s]:
                    listed = ", ".join(f"{k} {v}" for k, v in names[s].most_common())
                    print(f"- {s} ({sum(names[s].values())}): {listed}")
    for name, (_, _, trace) in rows.items():
        if trace:
            print(f"\n## {name}: ops in order")
            for stage, op, where in trace:
                print(f"- {stage}: {op} ({where})")
    for owner, attr, old in reversed(patches):
        setattr(owner, attr, old)


if __name__ == "__main__":
    main()
