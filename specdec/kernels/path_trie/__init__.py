"""``path_trie``: sampled draft paths merged into a trie (``SampledTrees(merge=True)``'s tree) in one launch.

``path_trie(paths, root, num_slots)`` takes ``k`` full-length paths per row, ``[B, k, L]`` int64, and returns the
fields of the round's ``DeviceTree``: every distinct prefix one node, numbered path by path and depth by depth
(siblings in the order of the first path that drew them), the root in slot 0, padding past the last node. The
reference (``reference.py``, the specification and the CPU path) is about twenty tensor ops; the Triton version
(``triton.py``) is one program per row that compares the prefixes in registers. Both read nothing on the host, so
they can be captured in a CUDA graph, and their outputs are equal. See ``docs/kernels.md``.
"""

from __future__ import annotations

from typing import Literal

import torch

from specdec.kernels._triton import describe, pick_impl
from specdec.kernels.path_trie.reference import path_trie_reference

__all__ = ["MAX_ENTRIES", "path_trie", "path_trie_reference"]

_MODULE = "specdec.kernels.path_trie.triton"

MAX_ENTRIES = 1024
"""The most path entries (``k * L``) the Triton version holds in registers (more: the reference)."""

Impl = Literal["auto", "torch", "triton"]


def path_trie(paths: torch.Tensor, root: torch.Tensor, num_slots: int, *, impl: Impl = "auto"):
    """Merge ``paths [B, M, L]`` (int64, every entry a token) into one trie per row (:func:`path_trie_reference`).

    Args:
        root (torch.Tensor): ``[B]`` (or ``[B, 1]``) int64, each row's root token.
        num_slots (int): slots per row, ``>= M * L + 1``.
        impl (str): ``"triton"`` (one launch: CUDA or Triton's interpreter), ``"torch"`` (the reference) or
            ``"auto"``: Triton where it runs and ``M * L <= MAX_ENTRIES``, else the reference.

    Returns:
        tuple: ``tokens``, ``parents``, ``depth`` ``[B, S]`` int64, ``valid [B, S]`` bool, ``num_nodes [B]``.
    """
    if not isinstance(paths, torch.Tensor) or paths.dim() != 3 or paths.dtype != torch.long or 0 in paths.shape:
        raise ValueError(f"paths must be a non-empty [B, M, L] int64 tensor; got {describe(paths)}.")
    batch, num, length = paths.shape
    if not isinstance(root, torch.Tensor) or root.dtype != torch.long or root.numel() != batch:
        raise ValueError(f"root must be {batch} int64 tokens ([B] or [B, 1]); got {describe(root)}.")
    if isinstance(num_slots, bool) or not isinstance(num_slots, int) or num_slots < num * length + 1:
        raise ValueError(f"num_slots={num_slots!r}: pass an int >= M * L + 1 = {num * length + 1} (every node and "
                         f"the root).")  # fmt: skip
    fits = num * length <= MAX_ENTRIES
    if impl == "triton" and not fits:
        raise ValueError(f"impl='triton' holds at most {MAX_ENTRIES} path entries, got {num * length}; use "
                         f"impl='torch'.")  # fmt: skip
    if pick_impl(impl, paths.device, _MODULE, fits=fits) == "torch":
        return path_trie_reference(paths, root, num_slots)
    from specdec.kernels.path_trie.triton import path_trie_triton

    return path_trie_triton(paths, root, num_slots)
