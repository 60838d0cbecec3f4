"""One rank of a tensor-parallel run (``torchrun --nproc_per_node N tests/distributed/tp_worker.py CASES OUT``).

Reads the cases the test wrote (``CASES``: a ``torch.save``\\ d list of dicts: a model folder, a drafter, trees,
rules), loads each target with HF's tensor-parallel plan (``tp_plan="auto"``, gloo on the CPU), runs
``specdec.generate`` for every combination and saves this rank's tokens to ``OUT/rank<r>.pt``. ``--diverge``
plants the bug the test must catch: rank 1 draws its sampling noise from another seed (a ``RanksDiverged`` a run
raises is saved as its message). ``--rank1-max-time``: rank 1 alone passes a ``max_time`` that has passed at the
first read.
"""

from __future__ import annotations

import datetime
import faulthandler
import os
import sys
from pathlib import Path

import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ (models.py)

import specdec  # noqa: E402
from specdec.distributed import RankAgreement, RanksDiverged, rank  # noqa: E402
from specdec.loading import load_target  # noqa: E402


def build(spec: dict, target):
    """The drafter, tree and rule of a run spec (names, so that the test and the worker build the same ones)."""
    drafter = {
        None: lambda: None,
        "ngram": lambda: specdec.NGramDrafter(),
        "model": lambda: specdec.ModelDrafter(
            transformers.AutoModelForCausalLM.from_pretrained(spec["drafter_path"], dtype=torch.float32)
        ),
        "dflash": lambda: specdec.DFlashDrafter.from_pretrained(spec["drafter_path"], target=target),
    }[spec["drafter"]]()
    tree = {
        None: None,
        "chain": specdec.Chain(4),
        "ddtree": specdec.DDTree(budget=8, topk=4),
        "stochastic-ddtree": specdec.StochasticDDTree(budget=8, topk=4),
        "sampled-chain": specdec.SampledChain(4),
        "auto": specdec.DDTree(budget="auto"),
    }[spec["tree"]]
    verifier = {
        None: None,
        "speculative-sampling": specdec.SpeculativeSampling(),
        "multi-draft": specdec.MultiDraftRejection(replacement=False),
    }[spec["rule"]]
    return drafter, tree, verifier


def run_case(case: dict, *, diverge: bool, rank1_max_time: bool = False) -> dict:
    target = load_target(case["path"], device=torch.device("cpu"), dtype=torch.float32, tp_plan="auto")
    out = {}
    for spec in case["runs"]:
        drafter, tree, verifier = build({**spec, "drafter_path": case.get("drafter_path")}, target)
        seed = spec.get("seed")
        generator = None
        if seed is not None:
            generator = torch.Generator().manual_seed(seed + (1 if diverge and rank() == 1 else 0))
        try:
            got = specdec.generate(
                target, case["ids"], attention_mask=case.get("mask", torch.ones_like(case["ids"])), drafter=drafter,
                tree=tree,
                verifier=verifier, max_new_tokens=case["max_new_tokens"], do_sample=seed is not None,
                temperature=1.0 if seed is not None else None, generator=generator,
                max_time=1e-9 if rank1_max_time and rank() == 1 else None,
            )  # fmt: skip
        except RanksDiverged as error:  # the check every rank runs after each read: recorded for the test
            out[spec["name"]] = str(error)
            continue
        out[spec["name"]] = got.sequences
    return out


def main() -> None:
    faulthandler.enable()  # a crash of a rank prints its Python stack into the log the test shows
    cases = torch.load(sys.argv[1])
    folder = Path(sys.argv[2])
    diverge = "--diverge" in sys.argv[3:]
    timed = "--rank1-max-time" in sys.argv[3:]
    if not torch.distributed.is_initialized():  # a hang (ranks waiting in different collectives) fails in 2 minutes
        torch.distributed.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    results = {case["name"]: run_case(case, diverge=diverge, rank1_max_time=timed) for case in cases}
    # the round time every rank's adaptive policy sees: the slowest rank's (rank r reports r + 1 ms)
    results["agreed"] = RankAgreement(torch.device("cpu")).agree([[1, 2, 3]], [False], ms=1.0 + rank(),
                                                                 flag=rank() == 1)  # fmt: skip
    torch.save(results, folder / f"rank{rank()}.pt")
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
