"""The compiled Triton tree-GDN kernel on CUDA against the PyTorch reference (on CUDA and on CPU)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from kernel_harness import assert_within_bf16_rounding, one_pass_tf32

from specdec.kernels.tree_gdn import tree_gdn, tree_gdn_reference

pytestmark = pytest.mark.gpu

# (nodes, value heads, key heads, key dim, value dim, tree, dtype of v)
CASES = [
    *((n, 4, 2, 64, 64, tree, torch.float32) for n in (1, 7, 16, 63, 65, 128) for tree in ("chain", "bush", "random")),
    (33, 8, 4, 64, 64, "random", torch.bfloat16),  # zoo hybrid layer (DDTree budget 32)
    (64, 48, 16, 128, 128, "random", torch.bfloat16),  # Qwen3.5-27B-like layer
    (300, 2, 2, 48, 40, "random", torch.float32),
]


def make_inputs(n, hv, h, k, v, tree, dtype, seed=0) -> dict:
    gen = torch.Generator().manual_seed(seed)
    if tree == "chain":
        parents = list(range(-1, n - 1))
    elif tree == "bush":
        parents = [-1] + [0] * (n - 1)
    else:
        parents = [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, n)]
    return dict(
        init_state=torch.randn(hv, k, v, generator=gen),
        q=F.normalize(torch.randn(n, hv, k, generator=gen), dim=-1) * k**-0.5,
        k=F.normalize(torch.randn(n, h, k, generator=gen), dim=-1),
        v=torch.randn(n, hv, v, generator=gen).to(dtype),
        log_decay=-F.softplus(torch.randn(n, hv, generator=gen)) * 0.5,
        beta=torch.rand(n, hv, generator=gen),
        parents=torch.tensor(parents),
    )


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[5]}-n{c[0]}-hv{c[1]}-{str(c[6]).split('.')[-1]}")
def test_tree_gdn_triton_cuda_matches_reference(cuda, case):
    from specdec.kernels.tree_gdn.triton import tree_gdn_triton

    cpu = make_inputs(*case)
    inputs = {name: t.to(cuda) for name, t in cpu.items()}
    before = inputs["init_state"].clone()
    out = tree_gdn(**inputs, impl="triton")
    assert out.is_cuda and not out.isnan().any()
    expected = tree_gdn_reference(**cpu)
    n, hv, _, _, v_dim, _, dtype = case
    if one_pass_tf32(n, hv, v_dim, dtype):  # the matrix form on 1-pass TF32 products (bf16 values): bf16 rounding
        assert_within_bf16_rounding(out.cpu(), expected)
        out = tree_gdn_triton(**inputs, precision="tf32x3")  # and its 3-pass products, as accurate as fp32
    torch.testing.assert_close(out, tree_gdn(**inputs, impl="torch"), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.cpu(), expected, atol=1e-5, rtol=1e-5)
    assert torch.equal(inputs["init_state"], before)  # the committed state is never written
    assert torch.equal(tree_gdn(**inputs), tree_gdn(**inputs, impl="triton"))  # "auto" picks Triton on CUDA


@pytest.mark.parametrize("n, hv, h, dim", [(16, 8, 4, 64), (33, 8, 4, 64), (64, 32, 16, 128)], ids=["16", "33", "64"])
def test_rows_equal_each_row_alone_bitwise(cuda, n, hv, h, dim):
    """A batch of 8 sequences (bf16 values, the bf16 models' products) gives each row exactly what that row gives
    alone: ``walk="auto"`` picks the schedule for one sequence's heads, so the batch size never changes a row's
    schedule or rounding (a batched decode equals batch 1 row for row)."""
    from specdec.kernels.tree_gdn import tree_gdn_rows

    rows = [make_inputs(n, hv, h, dim, dim, "random", torch.bfloat16, seed=s) for s in range(8)]
    batch = {name: torch.stack([r[name] for r in rows]).to(cuda) for name in rows[0]}
    together = tree_gdn_rows(**batch)
    for b in range(8):
        alone = tree_gdn_rows(**{name: t[b : b + 1] for name, t in batch.items()})
        assert torch.equal(together[b], alone[0]), b
