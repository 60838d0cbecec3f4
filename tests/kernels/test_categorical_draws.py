"""``categorical_draws``: ``m`` inverse-CDF draws per row (``SampledTrees``' paths). The reference
(``categorical(probs, uniforms(noise, m), draws=True)``) against a brute force on the host (Python float64 running
sums of each row, counted against each uniform), the Triton launch (interpreter on CPU with ``torch.empty``
poisoned, compiled on GPU) against both, and ``SampledTrees`` through it.

Cases: V in {7, 12, 1500, 8192} (one block, several, the default and a small block), m in {1, 3, 4, 16}, rows with a
cut support (zeros the draws must never land on), float32 and float64 probabilities, noise sliced from a wider
tensor (strided rows, as the round's ``noise[:, :depth]``), and dyadic rows whose uniforms fall exactly on a
boundary of the cumulative sum (``searchsorted(..., right=True)``: the token after the boundary).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from unittest import mock

import pytest
import torch
from kernel_harness import capture_without_host_reads, interpreted_outputs, poison_empty

import specdec
import specdec.trees.sampled as sampled
from specdec.kernels.categorical_draws import categorical_draws, categorical_draws_reference

GRID = 2.0**-24


def brute(probs: torch.Tensor, noise: torch.Tensor, num: int) -> torch.Tensor:
    out = torch.zeros(*probs.shape[:2], num, dtype=torch.long)
    for b in range(probs.shape[0]):
        for lvl in range(probs.shape[1]):
            row = probs[b, lvl].double().tolist()
            cdf, running = [], 0.0
            for x in row:
                running += x
                cdf.append(running)
            for j in range(num):
                u = min(float(noise[b, lvl, 2 * j]) + float(noise[b, lvl, 2 * j + 1]) * GRID, 1.0 - 2.0**-52)
                out[b, lvl, j] = sum(c <= u * running for c in cdf)
    return out


def random_case(gen, batch, length, vocab, num, dtype=torch.float32) -> dict:
    probs = torch.softmax(torch.randn(batch, length, vocab, generator=gen) * 3, -1)
    probs = torch.where(probs < 0.5 / vocab, 0.0, probs).to(dtype)  # a cut support
    noise = torch.rand(batch, length + 2, 2 * num + 3, generator=gen)[:, :length]  # strided rows
    return {"probs": probs, "noise": noise, "num": num}


def boundary_case() -> dict:
    # p = [1/4, 0, 1/4, 1/2]: uniforms 1/4 and 1/2 sit on the boundaries (sums exact in any order): tokens 2 and 3
    probs = torch.tensor([[[0.25, 0.0, 0.25, 0.5]]])
    noise = torch.tensor([[[0.25, 0.0, 0.5, 0.0, 0.0, 0.0]]])
    return {"probs": probs, "noise": noise, "num": 3}


def cases(seed: int = 0) -> list[dict]:
    gen = torch.Generator().manual_seed(seed)
    return [
        random_case(gen, 2, 3, 7, 3),
        random_case(gen, 1, 5, 12, 4),
        random_case(gen, 3, 2, 1500, 4, torch.float64),
        random_case(gen, 2, 2, 8192, 16),
        random_case(gen, 64, 1, 12, 1),
        boundary_case(),
    ]


def args_of(case: dict, device: str = "cpu") -> tuple:
    return case["probs"].to(device), case["noise"].to(device), case["num"]


def check(case: dict, got: torch.Tensor) -> None:
    want = brute(case["probs"], case["noise"], case["num"])
    assert got.dtype == torch.long and torch.equal(got.cpu(), want), (got, want)
    assert (case["probs"].gather(-1, want) > 0).all()  # never a token of probability 0


def test_boundary_draws_are_hfs():
    assert categorical_draws_reference(*args_of(boundary_case())).tolist() == [[[2, 3, 0]]]


def test_reference_equals_the_brute_force():
    for case in cases():
        check(case, categorical_draws_reference(*args_of(case)))


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(probs=torch.zeros(2, 3)), "probs must be"),
        (dict(probs=torch.zeros(2, 3, 7, dtype=torch.float16)), "probs must be"),
        (dict(noise=torch.zeros(2, 3, 5)), "noise must be"),
        (dict(noise=torch.zeros(2, 4, 6)), "noise must be"),
        (dict(noise=torch.zeros(2, 3, 6, dtype=torch.long)), "noise must be"),
        (dict(num=0), "num=0"),
        (dict(num=True), "num=True"),
    ],
)
def test_bad_arguments_are_refused(change, match):
    case = {"probs": torch.ones(2, 3, 7), "noise": torch.zeros(2, 3, 6), "num": 3, **change}
    with pytest.raises(ValueError, match=match):
        categorical_draws(case["probs"], case["noise"], case["num"])


def test_auto_is_the_reference_on_cpu_and_triton_is_refused():
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("checks the CPU dispatch without the interpreter")
    case = cases()[1]
    check(case, categorical_draws(*args_of(case)))
    with pytest.raises(ValueError, match="GPU"):
        categorical_draws(*args_of(case), impl="triton")
    with pytest.raises(ValueError, match="impl='triton' takes float32 noise"):
        categorical_draws(case["probs"], case["noise"].double(), case["num"], impl="triton")
    check(case, categorical_draws(case["probs"], case["noise"].double(), case["num"]))  # float64 noise: reference


def test_backends_field_reaches_the_policy():
    from specdec.backends import Backends, use

    with use(Backends(categorical_draws="torch")):
        assert sampled._DRAWS_IMPL == "torch"
        with mock.patch.object(sampled, "categorical_draws", side_effect=categorical_draws) as spy:
            sampled_paths(batch=2)
        assert spy.call_args.kwargs["impl"] == "torch"
    with pytest.raises(ValueError, match="categorical_draws"):
        Backends(categorical_draws="cuda")


def sampled_paths(batch: int, seed: int = 0):
    """``SampledTrees(4, 5)``'s paths over a random ``logq`` at T = 1 (its uniforms drawn here)."""
    gen = torch.Generator().manual_seed(seed)
    logq = torch.log_softmax(torch.randn(batch, 5, 12, generator=gen) * 2, -1)
    noise = torch.rand(batch, 5, 12, generator=gen)
    policy = specdec.SampledTrees(4, 5).with_sampling(specdec.types.SamplingParams(do_sample=True))
    return policy.paths(specdec.types.Proposal(logq=logq), noise=noise)


# --- Triton through the interpreter ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory) -> dict:
    pytest.importorskip("triton")
    return interpreted_outputs(__file__, tmp_path_factory.mktemp("categorical_draws"), {"cases": cases(seed=1)})


@pytest.mark.interpreter
def test_interpreted_draws_equal_the_brute_force(interpreted):
    for case, got in zip(interpreted["cases"], interpreted["draws"], strict=True):
        check(case, got)
    for case, got in zip(interpreted["cases"], interpreted["small_block"], strict=True):
        check(case, got)


@pytest.mark.interpreter
def test_interpreted_policy_takes_the_kernel(interpreted):
    assert interpreted["policy_impl"] == "triton"
    assert torch.equal(interpreted["policy"], sampled_paths(batch=3))  # this process: the reference


def _run_interpreted(folder: Path) -> None:
    from specdec.kernels.categorical_draws import triton as kernels

    data = torch.load(folder / "cases.pt")
    poison_empty(-987654321)
    out = {
        "draws": [kernels.categorical_draws_triton(*args_of(c)) for c in data["cases"]],
        "small_block": [kernels.categorical_draws_triton(*args_of(c), block=4) for c in data["cases"]],
    }
    with mock.patch.object(kernels, "categorical_draws_triton", side_effect=kernels.categorical_draws_triton) as spy:
        out["policy"] = sampled_paths(batch=3)
    out["policy_impl"] = "triton" if spy.call_count else "torch"
    torch.save(out, folder / "outputs.pt")


# --- compiled on CUDA ---------------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_compiled_equals_the_brute_force_on_cuda_and_replays():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    for case in cases(seed=2):
        check(case, categorical_draws(*args_of(case, "cuda")))  # auto: Triton on CUDA
        check(case, categorical_draws(*args_of(case, "cuda"), impl="torch"))
    gen = torch.Generator().manual_seed(5)
    all_cases = [random_case(gen, 4, 8, 8192, 4) for _ in range(4)]
    probs, noise, num = args_of(all_cases[0], "cuda")
    graph, out = capture_without_host_reads(lambda: categorical_draws(probs, noise, num, impl="triton"))
    for case in all_cases:
        probs.copy_(case["probs"])
        noise.copy_(case["noise"])
        graph.replay()
        check(case, out.clone())


if __name__ == "__main__":
    _run_interpreted(Path(sys.argv[1]))
