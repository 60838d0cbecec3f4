"""``trees.build.topk_last`` on CUDA takes the DDTree builder's top-k kernel (EAGLE-2's candidate expansion, the
stochastic DDTree's draws without replacement): its values equal ``torch.topk``'s, its ids too where no two values
tie, ranked by (value desc, id asc) where they do; ``largest=False`` as ``torch.topk(largest=False)``."""

from __future__ import annotations

import pytest
import torch

from specdec.trees.build import topk_last
from specdec.verify.draws import exponential_keys

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("shape", [(2, 10, 2048), (1, 10, 100), (3, 4, 32000), (2, 7)])
def test_candidate_topk_equals_torch_topk_on_cuda(cuda, shape):
    gen = torch.Generator().manual_seed(sum(shape))
    x = torch.log_softmax(torch.randn(*shape, generator=gen), -1).to(cuda)
    k = min(10, shape[-1])
    vals, ids = topk_last(x, k)
    want_vals, want_ids = x.topk(k, dim=-1)
    assert vals.shape == ids.shape == (*shape[:-1], k) and ids.dtype == torch.long
    assert torch.equal(vals, want_vals) and torch.equal(ids, want_ids)  # random fp32: no ties
    tied = torch.zeros(4, 64, device=cuda)
    tied[:, 5::7] = 1.0  # ties: the smaller ids first
    vals, ids = topk_last(tied, 3)
    assert ids.tolist() == [[5, 12, 19]] * 4 and vals.eq(1).all()


def test_exponential_race_draws_equal_torch_topk_on_cuda(cuda):
    # the stochastic DDTree's draws: the k smallest keys of a race over a processed q (zeros outside its support)
    gen = torch.Generator().manual_seed(5)
    probs = torch.softmax(torch.randn(2, 16, 8192, generator=gen) * 3, -1)
    probs[..., ::3] = 0.0
    u = torch.rand(2, 16, 8192, generator=gen).clamp(min=1e-30)
    keys = exponential_keys(probs, u).to(cuda)
    vals, ids = topk_last(keys, 8, largest=False)
    want = keys.topk(8, dim=-1, largest=False)
    assert torch.equal(ids, want.indices) and torch.equal(vals, want.values)
