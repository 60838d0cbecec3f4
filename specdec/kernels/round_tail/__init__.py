"""``round_tail``: the end of a decode round in one launch: the accepted tokens (and, for a tree round, the path's
length and the tree's size) into the round's output row, each sequence's new root and committed length.

After the acceptance rule, every round writes ``out[:, :P] = tokens`` (and ``out[:, P] = num_path``, ``out[:, P + 1]
= num_nodes``), takes the last accepted token as the next root where the sequence is active, and advances its
length by the tokens accepted. The reference (``reference.py``) is those tensor ops (eight launches for a tree
round, three for plain decoding); the Triton version (``triton.py``) is one. Integer copies and sums: equal to the
reference bit for bit. ``Backends.round_tail`` (``SPECDEC_ROUND_TAIL``): ``auto`` (Triton on CUDA outside
``torch.compile``), ``triton`` or ``torch``.
"""

from __future__ import annotations

from typing import Literal

import torch

from specdec.backends import env_default
from specdec.kernels._triton import pick_impl
from specdec.kernels.round_tail.reference import round_tail_reference

__all__ = ["fits_triton", "round_tail", "round_tail_reference"]

_MODULE = "specdec.kernels.round_tail.triton"

Impl = Literal["auto", "torch", "triton"]

# ``Backends.round_tail`` (``SPECDEC_ROUND_TAIL``): what a call without ``impl`` uses
IMPL = env_default("round_tail")


def fits_triton(out, tokens, active, root, prefix, num_path=None, num_nodes=None) -> bool:
    """Whether the Triton version takes the call: int64 ``out [B, W]``, ``tokens [B, P]``, ``root`` / ``prefix``
    ``[B]`` (and ``num_path`` / ``num_nodes [B]``), bool ``active [B]``, one device, ``W`` wide enough."""
    batch, width = (out.shape if out.dim() == 2 else (-1, -1))
    cols = tokens.shape[-1] + (0 if num_path is None else 1 + (num_nodes is not None))
    vectors = [t for t in (root, prefix, num_path, num_nodes) if t is not None]
    return (
        out.dim() == 2
        and tokens.dim() == 2
        and tokens.shape[0] == batch
        and cols <= width
        and all(t.dtype == torch.int64 for t in (out, tokens, *vectors))
        and active.dtype == torch.bool
        and all(t.shape == (batch,) for t in (active, *vectors))
        and all(t.device == out.device for t in (tokens, active, *vectors))
    )


@torch.no_grad()
def round_tail(
    out: torch.Tensor,
    tokens: torch.Tensor,
    active: torch.Tensor,
    root: torch.Tensor,
    prefix: torch.Tensor,
    num_path: torch.Tensor | None = None,
    num_nodes: torch.Tensor | None = None,
    *,
    impl: Impl | None = None,
) -> None:
    """The round's output row, next roots and lengths, in place.

    Args:
        out (torch.Tensor): ``[B, W]`` int64: columns ``0 .. P-1`` receive ``tokens``; with ``num_path``, column ``P``
            receives it and column ``P + 1`` ``num_nodes`` (when given); other columns are left as they are.
        tokens (torch.Tensor): ``[B, P]`` int64, the accepted tokens (padded past ``num_path``).
        active (torch.Tensor): ``[B]`` bool: sequences whose root and length advance.
        root (torch.Tensor): ``[B]`` int64, set to ``tokens[b, num_path[b] - 1]`` where active.
        prefix (torch.Tensor): ``[B]`` int64, increased by ``num_path`` where active.
        num_path (torch.Tensor | None): ``[B]`` int64 tokens accepted, 1 .. P; None: one (plain decoding).
        num_nodes (torch.Tensor | None): ``[B]`` int64, the tree's size (with ``num_path`` only).
        impl (str | None): ``"triton"`` (one launch; ``fits_triton`` must hold), ``"torch"`` (the reference) or
            ``"auto"``: Triton where it runs and the call fits, outside ``torch.compile``; None:
            ``Backends.round_tail``.
    """
    impl = IMPL if impl is None else impl
    if impl == "auto" and torch.compiler.is_compiling():  # the compiler fuses the ops itself
        impl = "torch"
    fits = fits_triton(out, tokens, active, root, prefix, num_path, num_nodes)
    if impl == "triton" and not fits:
        raise ValueError("impl='triton' takes int64 out [B, W], tokens [B, P], root, prefix, num_path and "
                         f"num_nodes [B] and a bool active [B] on one device; got out {out.dtype} {list(out.shape)}, "
                         f"tokens {tokens.dtype} {list(tokens.shape)}, active {active.dtype}: use "
                         "impl='torch'.")  # fmt: skip
    if pick_impl(impl, out.device, _MODULE, fits=fits) == "torch":
        round_tail_reference(out, tokens, active, root, prefix, num_path, num_nodes)
        return
    from specdec.kernels.round_tail.triton import round_tail_triton

    round_tail_triton(out, tokens, active, root, prefix, num_path, num_nodes)
