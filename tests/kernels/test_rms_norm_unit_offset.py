"""``rms_norm(..., unit_offset=True)``: the Gemma / Qwen3-Next RMSNorm, ``(x / rms) * (1 + w)`` in fp32 rounded once
to ``x``'s dtype. The reference against HF's own modules (``Gemma3RMSNorm``, ``Qwen3NextRMSNorm``: bitwise, on
random weights), the Triton version against the reference through the interpreter (``interpreter`` tier) and
compiled on CUDA (``gpu``).

Agreement of the Triton version: its fp32 sum of squares is added in another order, and its ``1 / sqrt`` is IEEE
where torch's ``rsqrt`` may differ by an ulp, so fp32 outputs are within rtol 2e-6, and a bf16 / fp16 output is the
reference's value or a neighbour (one ulp), at least 99 % equal. A kernel taking the plain formula
(``w * (x / rms)``, rounded twice) or ``x / rms * w`` without the unit is far outside that (kept as a test).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from kernel_harness import assert_norm_close, interpreted_outputs, poison_empty

from specdec.kernels.rms_norm import rms_norm, rms_norm_reference

SHAPES = [(3, 64), (2, 5, 128), (4, 2048), (1, 4096)]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def cases() -> list[dict]:
    gen = torch.Generator().manual_seed(11)
    out = []
    for shape in SHAPES:
        for dtype in DTYPES:
            x = (torch.randn(shape, generator=gen) * 2).to(dtype)
            w = (torch.randn(shape[-1], generator=gen) * 0.5).to(dtype)
            out.append({"x": x, "w": w, "eps": 1e-6})
    return out


def compare(case: dict, got: torch.Tensor) -> None:
    want = rms_norm_reference(case["x"], case["w"], case["eps"], unit_offset=True)
    assert want.dtype == case["x"].dtype
    assert_norm_close(got, want)


def test_reference_is_hfs_gemma_and_qwen3_next_norms():
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextRMSNorm

    for case in cases():
        for cls in (Gemma3RMSNorm, Qwen3NextRMSNorm):
            module = cls(case["x"].shape[-1], eps=case["eps"]).to(case["x"].dtype)
            with torch.no_grad():
                module.weight.copy_(case["w"])
                want = module(case["x"])
            assert torch.equal(rms_norm_reference(case["x"], case["w"], case["eps"], unit_offset=True), want), cls


def test_the_plain_formula_fails_the_comparison():
    case = next(c for c in cases() if c["x"].dtype == torch.bfloat16 and c["x"].shape[-1] >= 2048)
    with pytest.raises(AssertionError):
        compare(case, rms_norm_reference(case["x"], case["w"], case["eps"]))
    with pytest.raises(AssertionError):
        compare(case, rms_norm_reference(case["x"], case["w"] + 1, case["eps"]))  # w * x/rms: rounded twice


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory) -> dict:
    pytest.importorskip("triton")
    return interpreted_outputs(__file__, tmp_path_factory.mktemp("rms_norm_unit_offset"), {"cases": cases()})


@pytest.mark.interpreter
def test_interpreted_equals_reference(interpreted):
    for case, got in zip(interpreted["cases"], interpreted["outputs"], strict=True):
        compare(case, got)


@pytest.mark.gpu
def test_compiled_equals_reference_on_cuda():
    for case in cases():
        x, w = case["x"].cuda(), case["w"].cuda()
        compare(case, rms_norm(x, w, case["eps"], unit_offset=True, impl="triton"))


def _run_interpreted(folder: Path) -> None:
    data = torch.load(folder / "cases.pt")
    poison_empty()
    outputs = [rms_norm(c["x"], c["w"], c["eps"], unit_offset=True, impl="triton") for c in data["cases"]]
    torch.save({"outputs": outputs}, folder / "outputs.pt")


if __name__ == "__main__":
    _run_interpreted(Path(sys.argv[1]))
