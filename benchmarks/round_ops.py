"""Per-stage op counts of one speculative round, per rule x policy: the aten ops (kernels) each stage runs and the
bytes its outputs write, counted on the CPU with a ``TorchDispatchMode``.

On a small model the GPU round is launch-bound, so the kernels per round (and the bytes of the ``[B, S, V]``
tensors) are what a rule costs beside the forward. Stages: ``noise`` (the uniforms drawn before the round),
``draft`` (the drafter's proposal), ``policy`` (the tree), ``forward`` (the target's verify forward and the logits
processors), ``rule`` (the verification rule), ``commit`` (the rest of the round: K/V and drafter commit, outputs).

Columns: ``ops`` counts every aten op that is not a view or an allocation (each is one kernel launch, or a few, on
CUDA); ``launches`` counts a region that runs as one Triton launch on CUDA (``tree_rejection_round``, the
sample-and-match walk ``accept_path``) as 1 and its CPU tensor ops as 0, the rest as ``ops``: the estimate of
the kernels the captured round launches on CUDA for that stage (the DDTree build and the attention kernels are
counted as their tensor-op paths in both columns); ``MB`` is the bytes all outputs write; ``largest`` the biggest
single output (shape, dtype).

    python benchmarks/round_ops.py [--budget 32] [--new-tokens 24] [--temperature 1.0] [--only RSD] [--top-ops 20]

Needs the zoo dense target (``$SPECDEC_ZOO`` or ``../shared/zoo``; ``assets/zoo/target-dense`` when shipped) and its
DFlash drafter (``assets/drafters/zoo-dense``). Counts are per round, averaged over the rounds of one warm call
(they are the same every round: the round has no data-dependent control flow).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections import defaultdict
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import specdec  # noqa: E402
from specdec import engine as engine_module  # noqa: E402

STAGES = ("noise", "draft", "policy", "forward", "rule", "commit")
# (module, attribute): a function whose CUDA path is one Triton launch (its CPU path runs the tensor-op reference)
FUSED = (
    ("specdec.kernels.tree_rejection", "tree_rejection_round_reference"),
    ("specdec.kernels.tree_accept", "accept_path_reference"),
)
_NO_KERNEL = {"empty", "empty_strided", "empty_like", "lift_fresh", "detach", "_local_scalar_dense", "set_", "resize_"}


def methods(budget: int = 32) -> dict[str, tuple]:
    """Rule x policy rows at about ``budget`` nodes (the sampled chain and paths at the bench's sizes)."""
    chain = 15  # a DFlash block of 16 drafts at most 15 tokens
    return {
        f"sample-match / DDTree b{budget}": (specdec.DDTree(budget, 8), specdec.SampleMatch()),
        f"RSD / stochastic DDTree b{budget}": (
            specdec.StochasticDDTree(budget, 8),
            specdec.MultiDraftRejection(replacement=False),
        ),
        "SpecInfer / sampled paths 4x8": (specdec.SampledTrees(4, 8, merge=False), specdec.MultiDraftRejection()),
        "RSD / sampled trie 4x8": (specdec.SampledTrees(4, 8), specdec.MultiDraftRejection(replacement=False)),
        "traversal / sampled trie 4x8": (specdec.SampledTrees(4, 8), specdec.TraversalVerification()),
        f"speculative sampling / sampled chain {chain}": (specdec.SampledChain(chain), specdec.SpeculativeSampling()),
        f"block / sampled chain {chain}": (specdec.SampledChain(chain), specdec.BlockVerification()),
    }


class _Stats:
    def __init__(self) -> None:
        self.ops = 0
        self.launches = 0
        self.bytes = 0
        self.largest = (0, "")
        self.names: dict[str, int] = defaultdict(int)


class StageCounter(TorchDispatchMode):
    """Counts the aten ops run while a stage is set (``stage``), per stage; inside a fused region (``fused``) the
    ops count in ``ops`` only, the region as one launch."""

    def __init__(self) -> None:
        super().__init__()
        self.stage: str | None = None
        self.active = False  # counting (the warm-up call runs with the labels but no counts)
        self.fused = 0
        self.stats = {s: _Stats() for s in STAGES}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.stage is None or not self.active:
            return out
        name = func.overloadpacket.__name__
        if func.is_view or name in _NO_KERNEL or name.startswith("_to_copy") and _same_dtype(args, kwargs):
            return out
        stats = self.stats[self.stage]
        stats.ops += 1
        if not self.fused:
            stats.launches += 1
            stats.names[name] += 1
        for t in out if isinstance(out, tuple | list) else (out,):
            if isinstance(t, torch.Tensor):
                size = t.numel() * t.element_size()
                stats.bytes += size
                if size > stats.largest[0]:
                    stats.largest = (size, f"{list(t.shape)} {str(t.dtype).removeprefix('torch.')}")
        return out

    @contextlib.contextmanager
    def at(self, stage: str):
        outer, self.stage = self.stage, stage
        try:
            yield
        finally:
            self.stage = outer

    def fuse(self, fn):
        def wrapped(*args, **kwargs):
            if self.active and self.stage is not None and not self.fused:
                self.stats[self.stage].launches += 1
            self.fused += 1
            try:
                return fn(*args, **kwargs)
            finally:
                self.fused -= 1

        return wrapped


def _same_dtype(args, kwargs) -> bool:
    dtype = (kwargs or {}).get("dtype")
    return dtype is None or (args and isinstance(args[0], torch.Tensor) and args[0].dtype == dtype)


@contextlib.contextmanager
def _patched(counter: StageCounter, tree, rule, state_cls):
    """Label the round's stages: the drafter's ``propose``, the policy's ``build``, the round's forward and
    processing, the rule's ``accept``; the rest of the round is ``commit``; ``launch`` outside the round ``noise``."""
    import importlib

    saved = []

    def patch(owner, attr, make):
        old = getattr(owner, attr)
        saved.append((owner, attr, old))
        setattr(owner, attr, make(old))

    def staged(stage):
        def make(fn):
            def wrapped(*args, **kwargs):
                if counter.stage is None and stage not in ("noise", "commit"):
                    return fn(*args, **kwargs)
                with counter.at(stage):
                    return fn(*args, **kwargs)

            return wrapped

        return make

    round_cls = engine_module.Round
    patch(round_cls, "_round", staged("commit"))
    patch(round_cls, "_verify", staged("forward"))
    patch(round_cls, "_process", staged("forward"))
    patch(type(tree), "build", staged("policy"))
    patch(type(rule), "accept", staged("rule"))
    patch(state_cls, "propose", staged("draft"))

    def launch(fn):
        def wrapped(self, generator):
            captured = self.captured
            with counter.at("noise"):
                self.captured = _Unstaged(counter, captured)
                try:
                    return fn(self, generator)
                finally:
                    self.captured = captured

        return wrapped

    patch(round_cls, "launch", launch)
    for module, attr in FUSED:
        patch(importlib.import_module(module), attr, counter.fuse)
    try:
        yield
    finally:
        for owner, attr, old in reversed(saved):
            setattr(owner, attr, old)


class _Unstaged:
    """The captured round called with the stage cleared (the round labels its own stages)."""

    def __init__(self, counter: StageCounter, captured) -> None:
        self.counter, self.captured = counter, captured

    def __call__(self, *args, **kwargs):
        with self.counter.at(None):
            return self.captured(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.captured, name)


def zoo_pair():
    from specdec.drafters.dflash import DFlashDrafter

    zoo = Path(os.environ.get("SPECDEC_ZOO", REPO.parent / "shared" / "zoo"))
    path = zoo / "target-dense"
    if not path.exists():
        path = REPO / "assets" / "zoo" / "target-dense"
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    drafter = DFlashDrafter.from_pretrained(REPO / "assets" / "drafters" / "zoo-dense", target=target)
    return target, drafter


def count(target, drafter, tree, rule, new_tokens: int, temperature: float = 1.0) -> tuple[dict, int]:
    """Per-round stats of one warm ``generate`` call of ``tree`` + ``rule``."""
    ids = torch.tensor([[5, 9, 11, 5, 9, 11, 5, 9, 11, 5]])
    kw = dict(drafter=drafter, tree=tree, verifier=rule, max_new_tokens=new_tokens, do_sample=True,
              temperature=temperature, top_k=0)  # fmt: skip
    counter = StageCounter()
    rounds = [0]
    state_cls = type(drafter.attach(target, 64))  # the drafter's static state class (its ``propose``)

    def counting(fn):
        def wrapped(self):
            if counter.active:
                rounds[0] += 1
            return fn(self)

        return wrapped

    # patched before the rounds are built: a round binds its ``_round`` when it is made
    old = engine_module.Round._round
    engine_module.Round._round = counting(old)
    try:
        with _patched(counter, tree, rule, state_cls), torch.no_grad():
            specdec.generate(target, ids, generator=torch.Generator().manual_seed(0), **kw)  # warm: rounds built
            with counter:
                counter.active = True
                specdec.generate(target, ids, generator=torch.Generator().manual_seed(1), **kw)
    finally:
        engine_module.Round._round = old
    return counter.stats, max(rounds[0], 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=int, default=32, help="nodes of the DDTree rows")
    parser.add_argument("--new-tokens", type=int, default=24)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--only", nargs="*", help="substrings of the rows to run")
    parser.add_argument("--top-ops", type=int, default=0, help="list the N most frequent launches of the rule stage")
    args = parser.parse_args()
    torch.manual_seed(0)
    target, drafter = zoo_pair()
    rows = {k: v for k, v in methods(args.budget).items() if not args.only or any(s in k for s in args.only)}
    head = "| rule / policy | " + " | ".join(f"{s} ops / launches / MB" for s in STAGES)
    print(head + " | rule: largest output |")
    print("|---" * (len(STAGES) + 2) + "|")
    for name, (tree, rule) in rows.items():
        stats, rounds = count(target, drafter, tree, rule, args.new_tokens, args.temperature)
        cells = [
            f"{st.ops / rounds:.0f} / {st.launches / rounds:.0f} / {st.bytes / rounds / 2**20:.2f}"
            for st in (stats[s] for s in STAGES)
        ]
        print(f"| {name} | " + " | ".join(cells) + f" | {stats['rule'].largest[1]} |", flush=True)
        if args.top_ops:
            top = sorted(stats["rule"].names.items(), key=lambda kv: -kv[1])[: args.top_ops]
            print("  rule ops:", ", ".join(f"{n} {c / rounds:.1f}" for n, c in top), flush=True)


if __name__ == "__main__":
    main()
