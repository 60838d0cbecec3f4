"""The precision of the rules that weigh q: ``p``, ``q`` and the residuals are float32 (``specdec.verify.draws``);
what float32 would get wrong is done in float64, and these tests hold it there.

* A rejection's residual ``norm(max(0, r - q))`` over a vocabulary of 2^17 whose tail tokens each hold 1e-7 (below
  float32's epsilon; a few 1e-30) and together all of the residual's mass: the round's ``r`` equals the residual
  computed in float64 here, entry by entry to 1e-5 (relative). A residual that dropped entries below float32's
  epsilon as rounding noise would lose the whole tail (and leave ``r = p``).
* The final draw (``categorical``) over a large vocabulary whose tail tokens each sit below half a float32 ulp of the
  running sum: a float32 cumulative sum adds nothing for them, so the tail (2.6 % of the mass here) would never be
  drawn. The expected distribution is the definition (head and tail masses, summed in float64 here); chi-square on
  the two cells, with the power check of ``sampled_rounds.assert_fits`` (20000 draws: a planted +2 % bias of the
  head is rejected with probability >= 0.99, the truth with <= 0.01). (On the CPU torch accumulates a float32
  cumulative sum in double and rounds each entry, which keeps the tail on average; a float32 scan on CUDA does not.)
* The same rounds of recursive rejection in float32 and in float64 (the same uniforms) accept the same paths and
  emit the same tokens: float32 moves a test only when a uniform lands within ~1e-7 (relative) of its threshold.
"""

import torch
from sampled_rounds import assert_fits

from specdec.kernels.tree_rejection import tree_rejection_round
from specdec.types import DeviceTree
from specdec.verify.draws import categorical, uniforms
from specdec.verify.multidraft import recursive_rejection

TAIL = 2**20 - 1  # tail tokens after the head token 0
TAIL_P = 2.5e-8  # each: below 2**-25, half a float32 ulp of a running sum in [1/2, 1)


def test_a_rejection_keeps_the_residual_tail_of_tiny_probabilities():
    vocab = 2**17
    p = torch.full((vocab,), 1e-7, dtype=torch.float64)
    p[1:9] = 1e-30
    p[0] = 1.0 - float(p[1:].sum())  # the head: ~0.987
    q = torch.zeros(vocab, dtype=torch.float64)
    q[0] = 1.0  # the draft is the head token: accepted with probability p[0] / q[0]
    residual = (p - q).clamp(min=0.0)
    want = residual / residual.sum()  # the tail alone, renormalised
    tree = dict(tree_tokens=torch.tensor([[5, 0]]), tree_parents=torch.tensor([[-1, 0]]),
                tree_depth=torch.tensor([[0, 1]]), tree_valid=torch.tensor([[True, True]]))  # fmt: skip
    test = torch.tensor([[0.5, 0.9999]], dtype=torch.float64)  # the child's uniform: above p[0] / q[0], rejected
    for replacement in (True, False):
        r, nxt = tree_rejection_round(**tree, p=p.float().expand(1, 2, -1), q=q.float().expand(1, 2, -1), test=test,
                                      max_children=1, replacement=replacement)  # fmt: skip
        assert nxt[0, 0] == 0  # the head was rejected
        assert r.dtype == torch.float32 and torch.allclose(r[0, 0].double(), want, rtol=1e-5, atol=0.0)


def test_final_draw_keeps_a_large_vocabularys_tail():
    probs = torch.full((TAIL + 1,), TAIL_P, dtype=torch.float32)
    probs[0] = 1.0 - TAIL * TAIL_P  # ~0.974: the running sum passes 1/2 at the first token
    tail = float(probs[1:].double().sum())
    want = torch.tensor([1.0 - tail, tail], dtype=torch.float64)  # the head's and the tail's probability
    gen = torch.Generator().manual_seed(0)
    u = uniforms(torch.rand(20000, 4, generator=gen), 2)[:, 1]  # the rules' 48-bit uniforms
    drawn = categorical(probs, u, draws=True)
    assert_fits((drawn > 0).long(), want)


def test_float32_rounds_equal_float64_rounds():
    gen = torch.Generator().manual_seed(3)
    batch, slots, vocab, depth = 4000, 9, 64, 3
    parents = torch.tensor([-1, 0, 0, 0, 1, 1, 2, 4, 4])  # the root's three children, siblings at every depth
    depths = torch.tensor([0, 1, 1, 1, 2, 2, 2, 3, 3])
    tokens = torch.randint(vocab, (batch, slots), generator=gen)
    valid = torch.ones(batch, slots, dtype=torch.bool)
    tree = DeviceTree(tokens, parents.expand(batch, -1), depths.expand(batch, -1), valid,
                      torch.full((batch,), slots))  # fmt: skip
    logits = torch.randn(batch, slots, vocab, generator=gen)
    p = torch.softmax(logits, -1)
    q = torch.softmax(logits.gather(1, parents.clamp(min=0)[None, :, None].expand(batch, -1, vocab)) * 0.8, -1)
    tree = tree._replace(tokens=torch.multinomial(q.flatten(0, 1), 1, generator=gen).view(batch, slots))
    noise = torch.rand(batch, slots, 4, generator=gen)
    for replacement in (True, False):
        single = recursive_rejection(tree, p, q, noise, depth, replacement)
        double = recursive_rejection(tree, p.double(), q.double(), noise, depth, replacement)
        assert torch.equal(single.num_path, double.num_path) and torch.equal(single.tokens, double.tokens)
        assert (single.num_path > 1).any() and (single.num_path == 1).any()
