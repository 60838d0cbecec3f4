"""``topk_mask``: HF's top-k warper (``TopKLogitsWarper``) as one launch: every score strictly below its row's
``k``-th largest value set to the filter value (-inf).

HF's warper runs ``torch.topk(scores, k)`` for the ``k``-th largest value per row (a radix selection and a sort of
``k`` values per row), then a compare and a ``masked_fill``. The Triton version (``triton.py``) finds the same value
by a search over the row held in registers (a bracket on order-preserving integer keys, narrowed onto keys of the
row) and writes the masked row in the same launch; the reference (``reference.py``) is HF's formula verbatim. Which
entries are kept is identical (ties with the ``k``-th value are kept; -0.0 equals +0.0; rows of -inf stay as they
are), and kept entries are copied as they are, so the outputs are equal bit for bit. NaN scores (never expected) are
ranked by their bits, not as ``torch.topk`` ranks them. Sampling rounds apply it to the target's p and, under the
sampled policies, to the drafter's q (``specdec.verify.processing.TopKThreshold``).

``impl="auto"`` (the default) takes Triton on CUDA (or under ``TRITON_INTERPRET=1``) for fp32 rows of at most
``MAX_VOCAB`` entries with a contiguous last dim, else the reference.
"""

from __future__ import annotations

from typing import Literal

import torch

from specdec.kernels._triton import pick_impl
from specdec.kernels.topk_mask.reference import topk_mask_reference

__all__ = ["MAX_VOCAB", "fits_triton", "topk_mask", "topk_mask_reference"]

_MODULE = "specdec.kernels.topk_mask.triton"

Impl = Literal["auto", "torch", "triton"]

MAX_VOCAB = 32768
"""The longest row the Triton version takes (it holds the row in registers, ``BLOCK = next_power_of_2(V)``)."""


def fits_triton(scores: torch.Tensor) -> bool:
    """Whether the Triton version takes ``scores``: fp32 ``[..., V]``, ``1 <= V <= MAX_VOCAB``, the last dim
    contiguous, no autograd history to keep."""
    return (
        scores.dim() >= 1
        and scores.dtype == torch.float32
        and 1 <= scores.shape[-1] <= MAX_VOCAB
        and (scores.numel() == 0 or scores.stride(-1) == 1 or scores.shape[-1] == 1)
        and not (torch.is_grad_enabled() and scores.requires_grad)
    )


def topk_mask(scores: torch.Tensor, k: int, filter_value: float = float("-inf"), *, impl: Impl = "auto"
              ) -> torch.Tensor:  # fmt: skip
    """``scores [..., V]`` with every entry strictly below its row's ``k``-th largest value set to ``filter_value``
    (:func:`topk_mask_reference`), as a new tensor. ``k >= V`` removes nothing (a copy, no selection).

    Args:
        k (int): at least 1.
        impl (str): ``"triton"`` (one launch: CUDA or Triton's interpreter; ``fits_triton`` must hold), ``"torch"``
            (the reference) or ``"auto"``: Triton where it runs and the call fits, else the reference.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k={k!r}: pass a Python int >= 1.")
    fits = fits_triton(scores)
    if impl == "triton" and not fits:
        raise ValueError(f"impl='triton' takes fp32 scores [..., V] with V <= {MAX_VOCAB} and a contiguous last dim "
                         f"(no autograd); got {scores.dtype} {list(scores.shape)}: use impl='torch'.")  # fmt: skip
    if k >= scores.shape[-1]:  # every entry is at or above the row's smallest: nothing to remove
        return scores.clone()
    if pick_impl(impl, scores.device, _MODULE, fits=fits) == "torch":
        return topk_mask_reference(scores, k, filter_value)
    from specdec.kernels.topk_mask.triton import topk_mask_triton

    return topk_mask_triton(scores, k, filter_value)
