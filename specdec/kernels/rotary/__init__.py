"""``rotary``: HF's rotary position embedding of the queries and keys (``apply_rotary_pos_emb``) in one launch.

On CUDA HF's function is ~10 small kernels per attention layer (two products, a negation, a concatenation and a
sum, for the queries and again for the keys), a few microseconds each however small the tensors. The Triton
version (``triton.py``) is one launch and equals the reference bit for bit (each product and the sum rounded to
the inputs' half dtype as PyTorch rounds them), also for partial rotary (the first ``R`` of ``D`` dims rotated, the
rest passed on, as Qwen3-Next and Qwen3.5 attention layers do). The round uses it through ``routing.py``.
"""

from __future__ import annotations

from typing import Literal

import torch

from specdec.kernels._triton import importable, pick_impl
from specdec.kernels.rotary.reference import rotary_reference

__all__ = ["TRITON_DTYPES", "fits_triton", "rotary", "rotary_reference"]

_MODULE = "specdec.kernels.rotary.triton"

Impl = Literal["auto", "torch", "triton"]

TRITON_DTYPES = (torch.bfloat16,)
"""The dtypes the Triton version takes: bf16 (a product of two bf16 values is exact in fp32, and bf16 has fp32's
exponent range, so no product of normal values lands in a range a conversion could flush). fp16 products can be
fp16-subnormal, which a GPU conversion compiled to flush subnormals would change: fp16 takes the reference."""


def fits_triton(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> bool:
    """Whether the Triton version takes the call: bf16, ``[B, H, N, D]`` / ``[B or 1, N, R]`` shapes with ``R <= D``
    even (``R < D``: partial rotary), last dims contiguous."""
    return (
        q.dtype in TRITON_DTYPES
        and k.dtype == cos.dtype == sin.dtype == q.dtype
        and q.dim() == k.dim() == 4
        and cos.dim() == sin.dim() == 3
        and cos.shape == sin.shape
        and q.shape[-1] % 2 == 0
        and cos.shape[-1] % 2 == 0
        and 0 < cos.shape[-1] <= q.shape[-1] == k.shape[-1]
        and q.shape[0] == k.shape[0]
        and cos.shape[0] in (1, q.shape[0])
        and q.shape[2] == k.shape[2] == cos.shape[1]
        and all(t.stride(-1) == 1 for t in (q, k, cos, sin))
    )


def rotary(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, impl: Impl = "auto"
) -> tuple[torch.Tensor, torch.Tensor]:
    """The rotated queries and keys. Arguments as :func:`rotary_reference`.

    Args:
        impl (str): ``"triton"`` (one launch: CUDA or Triton's interpreter; ``fits_triton`` must hold), ``"torch"``
            (the reference) or ``"auto"``: Triton where it runs and the call fits, else the reference.
    """
    fits = fits_triton(q, k, cos, sin)
    if impl == "triton" and not fits:
        raise ValueError(f"impl='triton' takes bf16 q [B, H, N, D], k [B, H_kv, N, D] and cos / sin "
                         f"[B or 1, N, R] with R <= D even; got q {q.dtype} {list(q.shape)}, k "
                         f"{list(k.shape)}, cos {cos.dtype} {list(cos.shape)}: use impl='torch'.")  # fmt: skip
    if pick_impl(impl, q.device, _MODULE, fits=fits) == "torch":
        return rotary_reference(q, k, cos, sin)
    from specdec.kernels.rotary.triton import rotary_triton

    return rotary_triton(q, k, cos, sin)


def _triton_available() -> bool:
    return importable(_MODULE)
