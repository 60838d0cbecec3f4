"""``ddtree_build``: the DDTree best-first selection in one Triton launch (GPU), or the torch device ops.

Reference: ``the best-first heap of ``docs/trees.md`` (a host oracle in ``tests/oracles``); the torch device version in
``specdec.trees.build`` is the CPU path. See ``docs/kernels.md``.
"""

from __future__ import annotations

import os

import torch

from specdec.kernels._triton import importable

__all__ = ["EXPECT_SIZES_MAX", "best_first", "topk_rows", "triton_fits"]

EXPECT_SIZES_MAX = 4
"""The most candidate sizes whose expectations the selection's launch writes itself (``best_first(expect=...)``)."""


def triton_fits(logq: torch.Tensor, k: int) -> bool:
    """Whether the Triton selection applies: CUDA (or Triton's interpreter), Triton imports, one int64 rank key."""
    on_device = logq.device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"
    return on_device and logq.shape[0] * k.bit_length() <= 63 and _triton_available()


def best_first(vals: torch.Tensor, ids: torch.Tensor, num_nodes: int, *, scores: bool = False,
               roots: torch.Tensor | None = None, num_slots: int | None = None, tree_nodes: int | None = None,
               expect: tuple[int, ...] = ()):  # fmt: skip
    """Tokens, parents and depths of the first ``num_nodes`` heap pops, and with ``scores=True`` their scores;
    with ``roots`` and ``num_slots``, whole padded trees of the first ``tree_nodes`` pops; with ``expect``, the
    expected accepted drafts at those sizes (see ``triton.best_first_triton``)."""
    from specdec.kernels.ddtree_build.triton import best_first_triton

    return best_first_triton(vals, ids, num_nodes, scores=scores, roots=roots, num_slots=num_slots,
                             tree_nodes=tree_nodes, expect=expect)  # fmt: skip


def topk_rows(logq: torch.Tensor, k: int, smallest: bool = False):
    """Per-row top-``k`` (fp32 values, int64 ids) in (value desc, id asc) order in one launch, or with ``smallest``
    the ``k`` smallest in (value asc, id asc) order (see ``triton.topk_rows_triton``); the tensor-op version is
    ``reference.topk_rows_reference``."""
    if logq.device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError("the Triton top-k needs tensors on a GPU (or Triton's interpreter); use topk_impl='torch'.")
    from specdec.kernels.ddtree_build.triton import topk_rows_triton

    return topk_rows_triton(logq, k, smallest)


def _triton_available() -> bool:
    return importable("specdec.kernels.ddtree_build.triton")
