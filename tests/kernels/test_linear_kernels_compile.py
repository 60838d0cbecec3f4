"""The skinny and grouped linear kernels and the tree attention compile for an H100 (sm_90) on a machine without a
GPU.

Triton's interpreter runs a kernel's Python, so it does not see what only the compiler rejects (a construct the
frontend does not lower, a type mismatch between the branches of a runtime ``if``, a shape error in a ``tl.dot``).
These tests lower every specialization the launchers choose at the Qwen3-8B shapes (split and unsplit, even and
partial ``K``, with and without bias, bf16 / fp32) through Triton's own pipeline down to a cubin, with the NVIDIA
backend that ships with Triton; no device is involved.
"""

from __future__ import annotations

import pytest

triton = pytest.importorskip("triton")


def _compile(fn, types: list[str], constexprs: dict) -> None:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature = dict(zip(fn.arg_names, types, strict=False))
    signature.update(dict.fromkeys(constexprs, "constexpr"))
    kernel = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs),
                            target=GPUTarget("cuda", 90, 32))  # fmt: skip
    assert kernel.asm.get("cubin"), fn


@pytest.fixture(scope="module")
def nvidia_backend():
    try:
        from triton.backends.nvidia.compiler import CUDABackend  # noqa: F401
    except ImportError as err:  # pragma: no cover - every Triton wheel of the pinned range ships it
        pytest.fail(f"Triton's NVIDIA backend does not import ({err}): install the triton wheel with its backends.")


BF16, FP32 = "*bf16", "*fp32"


@pytest.mark.parametrize("direct,even_k,bias,block_k,tiles",
                         [(True, True, False, 256, 16), (False, False, True, 128, 7)])  # fmt: skip
def test_grouped_kernel_and_reduce_compile(nvidia_backend, direct, even_k, bias, block_k, tiles):
    from specdec.kernels.grouped_linear import triton as kernels

    flags = {"TILES": tiles, "BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": block_k, "EVEN_K": even_k, "DIRECT": direct,
             "HAS_BIAS": bias, "OUT_BF16": True, "IEEE": False, "UPCAST": False}  # fmt: skip
    _compile(kernels._grouped_kernel, [BF16] * 13 + [FP32] + ["i32"] * 12, flags)
    _compile(kernels._grouped_reduce, [FP32] + [BF16] * 8 + ["i32"] * 7,
             {"BLOCK_R": 256, "HAS_BIAS": bias, "OUT_BF16": True})  # fmt: skip


@pytest.mark.parametrize("direct,even_k,bias", [(True, True, False), (False, False, True)])
def test_gated_kernel_and_reduce_compile(nvidia_backend, direct, even_k, bias):
    from specdec.kernels.grouped_linear import triton as kernels

    flags = {"TILES": 3, "BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 128, "EVEN_K": even_k, "DIRECT": direct,
             "HAS_BIAS": bias, "KIND": 1, "IEEE": False, "UPCAST": False}  # fmt: skip
    _compile(kernels._gated_kernel, [BF16] * 5 + [BF16 if direct else FP32] + ["i32"] * 5, flags)
    _compile(kernels._gated_reduce, [FP32, BF16, BF16, BF16, "i32", "i32", "i32"],
             {"BLOCK_R": 256, "HAS_BIAS": bias, "KIND": 1})  # fmt: skip


@pytest.mark.parametrize("dtype,ieee", [(BF16, False), (FP32, True)])
def test_skinny_kernel_compiles(nvidia_backend, dtype, ieee):
    from specdec.kernels.skinny_linear import triton as kernels

    flags = {"TILES": 3, "BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 64, "EVEN_K": not ieee, "DIRECT": ieee,
             "HAS_BIAS": ieee, "OUT_BF16": not ieee, "IEEE": ieee, "UPCAST": False}  # fmt: skip
    _compile(kernels._split_kernel, [dtype] * 3 + [dtype if ieee else FP32] + ["i32"] * 7, flags)


@pytest.mark.parametrize("rows,full", [(1, True), (4, False)])
def test_tree_attention_split_and_combine_compile(nvidia_backend, rows, full):
    """The attention's split kernel at the 8 B tree verify's plan (128 stacked rows, flat prefix, lengths), with
    and without ``FULL_TILES``, and its combine with one row per program (the plan's) and several
    (``COMBINE_ROWS``, a tuning override)."""
    from specdec.kernels.tree_attention import triton as kernels

    split = {"SCALE": 128**-0.5, "REP": 4, "BLOCK_M": 128, "BLOCK_N": 64, "D": 128, "MASK_BOOL": True,
             "HAS_LEN": True, "HAS_FLAT": True, "IEEE": False, "UPCAST": False, "FULL_TILES": full}  # fmt: skip
    _compile(kernels._split_kernel, [BF16] * 3 + ["*u8", "*i64", "*i64"] + [FP32] * 3 + ["i32"] * 16, split)
    combine = {"REP": 4, "D": 128, "BLOCK_C": 16, "BLOCK_N": 64, "HAS_LEN": True, "OUT_BF16": True, "ROWS": rows}
    _compile(kernels._combine_kernel, [FP32] * 3 + [BF16, "*i64"] + ["i32"] * 6, combine)
