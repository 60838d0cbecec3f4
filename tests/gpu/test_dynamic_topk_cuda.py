"""EAGLE-2's candidate expansion on CUDA takes the DDTree builder's top-k kernel (``trees.dynamic._topk``): its values
equal ``torch.topk``'s, its ids too where no two values tie, ranked by (value desc, id asc) where they do."""

from __future__ import annotations

import pytest
import torch

from specdec.trees.dynamic import _topk

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("shape", [(2, 10, 2048), (1, 10, 100), (3, 4, 32000), (2, 7)])
def test_candidate_topk_equals_torch_topk_on_cuda(cuda, shape):
    gen = torch.Generator().manual_seed(sum(shape))
    x = torch.log_softmax(torch.randn(*shape, generator=gen), -1).to(cuda)
    k = min(10, shape[-1])
    vals, ids = _topk(x, k)
    want_vals, want_ids = x.topk(k, dim=-1)
    assert vals.shape == ids.shape == (*shape[:-1], k) and ids.dtype == torch.long
    assert torch.equal(vals, want_vals) and torch.equal(ids, want_ids)  # random fp32: no ties
    tied = torch.zeros(4, 64, device=cuda)
    tied[:, 5::7] = 1.0  # ties: the smaller ids first
    vals, ids = _topk(tied, 3)
    assert ids.tolist() == [[5, 12, 19]] * 4 and vals.eq(1).all()
