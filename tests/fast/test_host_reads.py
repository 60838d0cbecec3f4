"""The fast path's host-read budget: one small read per round (accepted tokens and counts), none inside the round.

Every tensor -> host conversion (``tolist``, ``item``, ``cpu``, ``numpy``, ``bool`` / ``int`` / ``float`` /
``index`` of a tensor) is counted with its call site while ``specdec.generate`` runs the device-side round on CPU
(``cuda_graphs=True``: the code a CUDA graph captures, run eagerly). On CUDA a read inside a round could not be
captured at all; this holds the CPU run of the same code to the same rule, and the loop around it to one read
per round.
"""

from __future__ import annotations

import collections
import traceback
from pathlib import Path

import pytest
import torch
from models import tiny_model
from test_fast_path import prompt, sharp_drafter

import specdec
from specdec.fast.engine import _Round
from specdec.fast.graphs import Captured

READS = ["tolist", "item", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__"]
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def reads(monkeypatch):
    """Counter of (inside a round?, file, line) -> host reads, and the number of rounds run."""
    log = {"reads": collections.Counter(), "rounds": 0, "inside": False}

    def counted(name):
        original = getattr(torch.Tensor, name)

        def read(self, *args, **kwargs):
            frame = traceback.extract_stack(limit=3)[-2]
            path = Path(frame.filename).resolve()
            where = str(path.relative_to(REPO)) if path.is_relative_to(REPO) else frame.filename
            log["reads"][(log["inside"], where, frame.lineno)] += 1
            return original(self, *args, **kwargs)

        return read

    for name in READS:
        monkeypatch.setattr(torch.Tensor, name, counted(name))
    call = Captured.__call__

    def run(self, *args, **kwargs):
        is_round = isinstance(getattr(self.fn, "__self__", None), _Round)
        log["rounds"] += is_round
        log["inside"] = is_round
        try:
            return call(self, *args, **kwargs)
        finally:
            log["inside"] = False

    monkeypatch.setattr(Captured, "__call__", run)
    return log


@pytest.mark.parametrize("tree", [None, specdec.Chain(k=4), specdec.DDTree(budget=6, topk=3)], ids=str)
@pytest.mark.parametrize("do_sample", [False, True])
def test_dense_rounds_read_nothing_and_the_loop_reads_once_per_round(reads, tree, do_sample):
    target = tiny_model("llama", scale=2.0)
    drafter = sharp_drafter(target) if tree is not None else None
    reads["reads"].clear()  # building the drafter reads the target's embedding once (its identity check)
    out = specdec.generate(target, prompt(), drafter=drafter, tree=tree, max_new_tokens=16, do_sample=do_sample,
                           generator=torch.Generator().manual_seed(0), cuda_graphs=True)  # fmt: skip
    assert out.stats.path == "fast" and reads["rounds"] >= out.stats.rounds > 0
    inside = {k: n for k, n in reads["reads"].items() if k[0]}
    assert not inside, inside
    # one read per launched round (the pinned copy of its result) and one for the prefill's first token
    assert sum(reads["reads"].values()) == reads["rounds"] + 1, dict(reads["reads"])


def test_hybrid_rounds_read_only_in_the_cpu_reference_scans(reads):
    """On CPU the recurrent layers' tree scans are the PyTorch references, which walk the parent array on the host
    (one read per recurrent layer and round); on CUDA the Triton scans run and nothing is read."""
    from state.hybrid_harness import VOCAB, tiny_hybrid

    target = tiny_hybrid("qwen3_5")
    ids = torch.randint(0, VOCAB, (1, 8), generator=torch.Generator().manual_seed(0))
    drafter = sharp_drafter(target)
    reads["reads"].clear()
    out = specdec.generate(target, ids, drafter=drafter, tree=specdec.DDTree(budget=6, topk=3),
                           max_new_tokens=16, cuda_graphs=True)  # fmt: skip
    assert out.stats.path == "fast" and reads["rounds"] > 0
    inside = {k: n for k, n in reads["reads"].items() if k[0]}
    assert inside and {where for _, where, _ in inside} == {"specdec/kernels/_tree.py"}, inside
