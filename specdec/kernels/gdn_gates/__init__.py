"""``gdn_gates``: a Gated DeltaNet layer's per-node inputs of the recurrence (L2-normalised queries and keys, write
strengths ``beta``, log decays ``g``) from its post-conv projections, in one launch.

In the Gated DeltaNet adapter (``specdec.state.gdn``) these are ~25 small tensor ops per layer and forward (casts,
squares, sums, square roots, the repeat over grouped value heads, sigmoid, softplus, exponentials), a few
microseconds each on CUDA however small the tensors: a Qwen3.5-style 8 B hybrid has 24 such layers. The Triton
version (``triton.py``) is one launch; the reference (``reference.py``) is the adapter's former ops verbatim.
"""

from __future__ import annotations

from typing import Literal

import torch

from specdec.backends import env_default
from specdec.kernels._triton import pick_impl
from specdec.kernels.gdn_gates.reference import gdn_gates_reference, l2norm

__all__ = ["fits_triton", "gdn_gates", "gdn_gates_reference", "l2norm"]

_MODULE = "specdec.kernels.gdn_gates.triton"

Impl = Literal["auto", "torch", "triton"]

# ``Backends.gdn_gates`` (``SPECDEC_GDN_GATES``): what a call without ``impl`` uses
IMPL = env_default("gdn_gates")


def fits_triton(x: torch.Tensor, b: torch.Tensor, a: torch.Tensor, *, num_k_heads: int, head_k_dim: int,
                num_v_heads: int) -> bool:  # fmt: skip
    """Whether the Triton version takes the call: 2-D ``x [T, C]``, ``b`` / ``a [T, HV]`` (any strides: a tree's
    post-conv rows are a transposed view), float dtypes other than fp64, ``HV`` a multiple of ``H``, ``C >= 2 H
    K``."""
    return (
        x.dim() == b.dim() == a.dim() == 2
        and x.shape[0] == b.shape[0] == a.shape[0]
        and b.shape[1] == a.shape[1] == num_v_heads
        and num_k_heads > 0
        and num_v_heads % num_k_heads == 0
        and x.shape[1] >= 2 * num_k_heads * head_k_dim
        and all(t.dtype in (torch.float32, torch.bfloat16, torch.float16) for t in (x, b, a))
    )


def gdn_gates(
    x: torch.Tensor,
    b: torch.Tensor,
    a: torch.Tensor,
    a_log: torch.Tensor,
    dt_bias: torch.Tensor,
    *,
    num_k_heads: int,
    head_k_dim: int,
    num_v_heads: int,
    impl: Impl | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(q, k, beta, g)`` of ``T`` nodes. Arguments and results as :func:`gdn_gates_reference`.

    Args:
        impl (str | None): ``"triton"`` (one launch: CUDA or Triton's interpreter; ``fits_triton`` must hold),
            ``"torch"`` (the reference) or ``"auto"``: Triton where it runs and the call fits, else the reference;
            None: ``Backends.gdn_gates`` (default ``"auto"``).
    """
    impl = IMPL if impl is None else impl
    shape = {"num_k_heads": num_k_heads, "head_k_dim": head_k_dim, "num_v_heads": num_v_heads}
    fits = fits_triton(x, b, a, **shape)
    if impl == "triton" and not fits:
        raise ValueError(f"impl='triton' takes x [T, C], b / a [T, HV] (fp32 / bf16 / fp16) "
                         f"with HV a multiple of H and C >= 2 H K; got x {x.dtype} {list(x.shape)}, b "
                         f"{list(b.shape)}, a {list(a.shape)}, {shape}: use impl='torch'.")  # fmt: skip
    if pick_impl(impl, x.device, _MODULE, fits=fits) == "torch":
        return gdn_gates_reference(x, b, a, a_log, dt_bias, **shape)
    from specdec.kernels.gdn_gates.triton import gdn_gates_triton

    return gdn_gates_triton(x, b, a, a_log, dt_bias, **shape)
