"""``rms_norm_cat``: two RMSNorms written side by side (EAGLE-3's layer input: the token embedding's norm, then the
hidden's). The reference against HF's own modules and ``torch.cat`` (``LlamaRMSNorm`` plain, ``Qwen3NextRMSNorm``
with the unit offset), the Triton version through the interpreter and compiled on CUDA: each half equal, bit for
bit, to the one-input ``rms_norm`` kernel on its input run in the same place (compiled on a GPU: within the
rounding of another summation order) (whose own tests hold it to the float64
oracle and HF). With ``rows`` (and ``row_map``) the first half is an embedding lookup in the same launch: equal,
bit for bit, to the kernel on the looked-up rows, and the reference to ``nn.Embedding`` then the module. Planted bugs
(the halves swapped, one eps used for both, the id map skipped) fail the comparison."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from kernel_harness import assert_norm_close, capture_without_host_reads, interpreted_outputs, poison_empty
from torch import nn

from specdec.kernels.rms_norm import rms_norm, rms_norm_cat

# (leading shape, D, dtype, strided inputs, unit offset)
SPECS = [
    ((1, 1), 256, torch.bfloat16, False, False),
    ((2, 9), 384, torch.bfloat16, True, False),
    ((5,), 100, torch.float32, False, False),
    ((3, 4), 64, torch.float16, True, True),
    ((1, 1), 4096, torch.bfloat16, True, True),
    ((33,), 96, torch.float32, True, True),
]


def make_case(seed: int, lead, dim, dtype, strided, unit_offset) -> dict:
    gen = torch.Generator().manual_seed(seed)

    def rows(scale):
        x = (torch.randn(*lead, 2 * dim if strided else dim, generator=gen) * scale).to(dtype)
        return x[..., dim:] if strided else x  # strided: a column slice of a wider tensor

    a, b = rows(3), rows(0.2)
    wa = (1 + 0.2 * torch.randn(dim, generator=gen)).to(dtype)
    wb = (0.3 * torch.randn(dim, generator=gen)).to(dtype)
    return dict(a=a, b=b, wa=wa, wb=wb, eps_a=1e-6, eps_b=0.05, unit_offset=unit_offset)


def cases() -> list[dict]:
    return [make_case(i, *spec) for i, spec in enumerate(SPECS)]


# (leading shape, D, dtype, table rows, id map)
GATHER_SPECS = [
    ((1, 1), 256, torch.bfloat16, 50, True),
    ((3, 5), 96, torch.float32, 40, False),
    ((4,), 128, torch.float16, 70, True),
]


def gather_cases() -> list[dict]:
    """Cases whose first half is the rows ``table[map[ids]]`` (``map`` None: ``table[ids]``)."""
    out = []
    for i, (lead, dim, dtype, size, mapped) in enumerate(GATHER_SPECS):
        case = make_case(100 + i, lead, dim, dtype, False, False)
        gen = torch.Generator().manual_seed(200 + i)
        case["table"] = (torch.randn(size, dim, generator=gen) * 2).to(dtype)
        case["map"] = torch.randperm(size, generator=gen)[: size // 2] if mapped else None
        case["ids"] = torch.randint(0, size // 2 if mapped else size, lead, generator=gen)
        case["a"] = case["table"][case["ids"] if case["map"] is None else case["map"][case["ids"]]]
        out.append(case)
    return out


def gathered(case: dict, impl: str, device="cpu", skip_map: bool = False) -> torch.Tensor:
    table, b, wa, wb, ids = (case[k].to(device) for k in ("table", "b", "wa", "wb", "ids"))
    row_map = None if case["map"] is None or skip_map else case["map"].to(device)
    return rms_norm_cat(table, b, wa, wb, case["eps_a"], case["eps_b"], rows=ids, row_map=row_map, impl=impl)


def halves(case: dict, impl: str, device="cpu") -> torch.Tensor:
    """The two one-input norms where the call under test ran, concatenated: what each half must equal."""
    a, b, wa, wb = (case[k].to(device) for k in ("a", "b", "wa", "wb"))
    off = case["unit_offset"]
    return torch.cat([rms_norm(a, wa, case["eps_a"], unit_offset=off, impl=impl),
                      rms_norm(b, wb, case["eps_b"], unit_offset=off, impl=impl)], -1)  # fmt: skip


def check(got: torch.Tensor, want: torch.Tensor) -> None:
    got, want = got.cpu(), want.cpu()
    assert got.dtype == want.dtype and got.shape == want.shape and got.is_contiguous()
    assert torch.equal(got, want)


def check_close(got: torch.Tensor, want: torch.Tensor) -> None:
    """Compiled on a GPU, two kernels may sum a row's squares in another order (the compiler lays each out on its
    own): ``assert_norm_close``."""
    assert got.is_contiguous()
    assert_norm_close(got, want)


def call(case: dict, impl: str = "auto", device="cpu") -> torch.Tensor:
    a, b, wa, wb = (case[k].to(device) for k in ("a", "b", "wa", "wb"))
    return rms_norm_cat(a, b, wa, wb, case["eps_a"], case["eps_b"], unit_offset=case["unit_offset"], impl=impl)


def test_reference_is_hfs_norm_modules_concatenated():
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextRMSNorm

    for case in cases():
        dim = case["a"].shape[-1]
        modules = []
        for w, eps in ((case["wa"], case["eps_a"]), (case["wb"], case["eps_b"])):
            module = (Qwen3NextRMSNorm if case["unit_offset"] else LlamaRMSNorm)(dim, eps=eps).to(w.dtype)
            with torch.no_grad():
                module.weight.copy_(w)
            modules.append(module)
        with torch.no_grad():
            want = torch.cat([modules[0](case["a"]), modules[1](case["b"])], -1)
        check(call(case), want)  # CPU auto: the reference


def test_gathered_reference_is_an_embedding_lookup_then_the_norms():
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    for case in gather_cases():
        dim = case["b"].shape[-1]
        embed = nn.Embedding(*case["table"].shape).to(case["table"].dtype)
        modules = [LlamaRMSNorm(dim, eps=eps).to(case["wa"].dtype) for eps in (case["eps_a"], case["eps_b"])]
        with torch.no_grad():
            embed.weight.copy_(case["table"])
            for module, w in zip(modules, (case["wa"], case["wb"]), strict=True):
                module.weight.copy_(w)
            ids = case["ids"] if case["map"] is None else case["map"][case["ids"]]
            want = torch.cat([modules[0](embed(ids)), modules[1](case["b"])], -1)
        check(gathered(case, "auto"), want)
        check(gathered(case, "auto"), halves(case, "torch"))


def test_bad_rows_are_refused_by_name():
    table, b, w = torch.randn(10, 8), torch.randn(2, 3, 8), torch.ones(8)
    with pytest.raises(ValueError, match="rows has b's leading shape"):
        rms_norm_cat(table, b, w, w, 1e-6, 1e-6, rows=torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="rows must be an integer tensor"):
        rms_norm_cat(table, b, w, w, 1e-6, 1e-6, rows=torch.zeros(2, 3))
    with pytest.raises(ValueError, match="pass rows too"):
        rms_norm_cat(table[:6].view(2, 3, 8), b, w, w, 1e-6, 1e-6, row_map=torch.arange(10))


def test_misfits_take_the_reference_or_are_refused():
    a, b, w = torch.randn(2, 8), torch.randn(2, 8, dtype=torch.float64), torch.randn(8)
    with pytest.raises(ValueError, match="impl=.triton. takes a and b of one shape, dtype and device"):
        rms_norm_cat(a, b, w, w, 1e-6, 1e-6, impl="triton")
    out = rms_norm_cat(a, b, w, w, 1e-6, 1e-6)
    assert out.shape == (2, 16) and out.dtype == torch.float64  # the second half's promotion, as torch.cat's
    with pytest.raises(ValueError, match="weight must be"):
        rms_norm_cat(a, a, w, torch.randn(7), 1e-6, 1e-6)
    a.requires_grad_(True)
    rms_norm_cat(a, a.detach(), w, w, 1e-6, 1e-6).sum().backward()
    assert a.grad is not None


def test_planted_swaps_fail_the_check():
    case = cases()[1]
    want = halves(case, "torch")
    dim = case["a"].shape[-1]
    with pytest.raises(AssertionError):
        check(torch.cat([want[..., dim:], want[..., :dim]], -1), want)  # halves swapped
    one_eps = dict(case, eps_b=case["eps_a"])
    with pytest.raises(AssertionError):
        check(call(one_eps, "torch"), want)
    case = gather_cases()[0]
    with pytest.raises(AssertionError):
        check(gathered(case, "torch", skip_map=True), halves(case, "torch"))


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory) -> dict:
    pytest.importorskip("triton")
    return interpreted_outputs(__file__, tmp_path_factory.mktemp("rms_norm_cat"),
                               {"cases": cases(), "gather": gather_cases()})  # fmt: skip


@pytest.mark.interpreter
def test_interpreted_halves_equal_the_one_input_kernel(interpreted):
    for got, want in zip(interpreted["outputs"], interpreted["halves"], strict=True):
        check(got, want)
    for got, want in zip(interpreted["gathered"], interpreted["gathered_halves"], strict=True):
        check(got, want)


def _run_interpreted(folder: Path) -> None:
    data = torch.load(folder / "cases.pt")
    poison_empty()
    out = {"outputs": [call(c, "triton") for c in data["cases"]],
           "halves": [halves(c, "triton") for c in data["cases"]],
           "gathered": [gathered(c, "triton") for c in data["gather"]],
           "gathered_halves": [halves(c, "triton") for c in data["gather"]]}  # fmt: skip
    torch.save(out, folder / "outputs.pt")


@pytest.mark.gpu
def test_compiled_halves_equal_the_one_input_kernel_on_cuda_and_replay():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    for case in cases():
        want = halves(case, "triton", "cuda")
        check_close(call(case, "triton", "cuda"), want)
        check_close(call(case, "auto", "cuda"), want)  # auto: Triton on CUDA
    for case in gather_cases():
        check_close(gathered(case, "triton", "cuda"), halves(case, "triton", "cuda"))
    case = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in cases()[1].items()}
    graph, out = capture_without_host_reads(lambda: call(case, "auto", "cuda"))
    graph.replay()
    check_close(out, halves(case, "triton", "cuda"))


if __name__ == "__main__":
    _run_interpreted(Path(sys.argv[1]))
