"""``categorical_draws``: ``m`` inverse-CDF draws per row of a distribution in one launch (``SampledTrees``' paths).

``categorical_draws(probs, noise, m)`` draws ``m`` tokens from each row of ``probs [B, L, V]``, draw ``j`` at the
float64 uniform made of the float32 pair ``noise[b, l, 2j : 2j + 2]``: what ``SampledTrees`` draws its ``k`` paths
of a depth with (``specdec.verify.draws``: ``categorical(probs, uniforms(noise, k), draws=True)``, the
reference, five launches on CUDA with a float64 cumulative sum of every row). The Triton version (``triton.py``) is
one program per row that runs the float64 sum over vocabulary blocks, twice in one order, and counts for every draw
at once. A token of probability 0 is never drawn. The draws equal the reference's except where a uniform falls
within the rounding of a boundary of the cumulative sum (the sums run in another order).
See ``docs/kernels.md``.
"""

from __future__ import annotations

from typing import Literal

import torch

from specdec.kernels._triton import describe, pick_impl
from specdec.kernels.categorical_draws.reference import categorical_draws_reference

__all__ = ["categorical_draws", "categorical_draws_reference"]

_MODULE = "specdec.kernels.categorical_draws.triton"

Impl = Literal["auto", "torch", "triton"]


def categorical_draws(probs: torch.Tensor, noise: torch.Tensor, num: int, *, impl: Impl = "auto") -> torch.Tensor:
    """``num`` draws per row of ``probs`` (:func:`categorical_draws_reference`): ``[B, L, num]`` int64.

    Args:
        probs (torch.Tensor): ``[B, L, V]`` float32 / float64, non-negative, a positive total per row.
        noise (torch.Tensor): ``[B, L, W]`` uniforms in ``[0, 1)``, ``W >= 2 * num`` (float32 for the kernel).
        num (int): draws per row, >= 1.
        impl (str): ``"triton"`` (one launch: CUDA or Triton's interpreter), ``"torch"`` (the reference) or
            ``"auto"``: Triton where it runs and the call fits, else the reference.
    """
    if not isinstance(probs, torch.Tensor) or probs.dim() != 3 or probs.dtype not in (torch.float32, torch.float64):
        raise ValueError(f"probs must be a [B, L, V] float32 or float64 tensor; got {describe(probs)}.")
    if isinstance(num, bool) or not isinstance(num, int) or num < 1:
        raise ValueError(f"num={num!r}: pass an int >= 1.")
    if (not isinstance(noise, torch.Tensor) or noise.dim() != 3 or noise.shape[:2] != probs.shape[:2]
            or noise.shape[2] < 2 * num or not noise.is_floating_point()):  # fmt: skip
        raise ValueError(f"noise must be [B, L, >= {2 * num}] = [{probs.shape[0]}, {probs.shape[1]}, ...] uniforms "
                         f"(two per draw); got {describe(noise)}.")  # fmt: skip
    fits = (noise.dtype == torch.float32 and probs.stride(-1) == 1 and noise.stride(-1) == 1
            and probs.shape[-1] > 0 and noise.device == probs.device)  # fmt: skip
    if impl == "triton" and not fits:
        raise ValueError(f"impl='triton' takes float32 noise and probs and noise with a contiguous last dim; got "
                         f"{describe(probs)} and {describe(noise)}: use impl='torch'.")  # fmt: skip
    if pick_impl(impl, probs.device, _MODULE, fits=fits) == "torch":
        return categorical_draws_reference(probs, noise, num)
    from specdec.kernels.categorical_draws.triton import categorical_draws_triton

    return categorical_draws_triton(probs, noise, num)
