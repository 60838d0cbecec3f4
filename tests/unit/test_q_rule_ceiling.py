"""The per-node formulas of ``scripts/q_rule_ceiling.py`` against brute force on small random distributions:
inclusion chances and bounds by enumerating every draw of the siblings, sample-and-match and recursive rejection by
Monte Carlo (the latter through the library's own rule on a one-level tree)."""

from __future__ import annotations

import itertools
import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from q_rule_ceiling import (  # noqa: E402
    draw_siblings,
    inclusion_iid,
    inclusion_wor,
    opt_k,
    rejection_accept,
    sm_k,
    ss_1,
    top_p_mass,
)

from specdec.types import DeviceTree  # noqa: E402
from specdec.verify.multidraft import recursive_rejection  # noqa: E402

V = 5


def _dists(seed: int, cut: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """A random p and a q near it (float64, [V]); ``cut``: q is 0 on one token p likes."""
    gen = torch.Generator().manual_seed(seed)
    logits = 1.5 * torch.randn(V, generator=gen, dtype=torch.float64)
    p = torch.softmax(logits, -1)
    q_logits = logits + torch.randn(V, generator=gen, dtype=torch.float64)
    if cut:
        q_logits[p.argmax()] = -math.inf
    return p, torch.softmax(q_logits, -1)


def _tuples(q: torch.Tensor, k: int, replacement: bool):
    """Every ordered k-tuple of siblings with its probability: i.i.d. draws, or draws without replacement."""
    support = [int(i) for i in (q > 0).nonzero()[:, 0]]
    k = min(k, len(support)) if not replacement else k
    source = itertools.product(support, repeat=k) if replacement else itertools.permutations(support, k)
    for drafts in source:
        prob, left = 1.0, 1.0
        for x in drafts:
            prob *= float(q[x]) / (1.0 if replacement else left)
            left -= 0.0 if replacement else float(q[x])
        yield drafts, prob


def _exact_inclusion(q: torch.Tensor, k: int, replacement: bool) -> torch.Tensor:
    pi = torch.zeros_like(q)
    for drafts, prob in _tuples(q, k, replacement):
        for x in set(drafts):
            pi[x] += prob
    return pi


def _exact_rejection(p: torch.Tensor, q: torch.Tensor, k: int, replacement: bool) -> float:
    total = 0.0
    for drafts, prob in _tuples(q, k, replacement):
        total += prob * float(rejection_accept(p, q, torch.tensor([drafts]), replacement)[0])
    return total


@pytest.mark.parametrize("seed", range(6))
def test_opt_k_is_the_bound_over_every_draw_of_k_iid_siblings(seed):
    p, q = _dists(seed, cut=seed % 2 == 1)
    assert float(opt_k(p, q, 1)) == pytest.approx(float(ss_1(p, q)), abs=1e-12)
    previous = 0.0
    for k in (1, 2, 3, 4):
        pi = _exact_inclusion(q, k, replacement=True)
        assert torch.allclose(inclusion_iid(q, k), pi, atol=1e-12)
        bound = float(opt_k(p, q, k))
        assert bound == pytest.approx(float(torch.minimum(p, pi).sum()), abs=1e-12)
        assert bound >= float(ss_1(p, q)) - 1e-12 and bound >= previous - 1e-12  # monotone in k
        previous = bound
        # SpecInfer (recursive rejection with i.i.d. siblings) reaches the bound at k = 1 and never passes it
        specinfer = _exact_rejection(p, q, k, replacement=True)
        assert specinfer <= bound + 1e-12
        if k == 1:
            assert specinfer == pytest.approx(float(ss_1(p, q)), abs=1e-12)
        # without replacement: the bound with the Plackett-Luce inclusion chances holds for RSD, and is larger
        wor = _exact_inclusion(q, k, replacement=False)
        assert (wor >= pi - 1e-12).all()
        assert _exact_rejection(p, q, k, replacement=False) <= float(torch.minimum(p, wor).sum()) + 1e-12


@pytest.mark.parametrize("k", [1, 2, 3])
def test_inclusion_without_replacement_by_monte_carlo_matches_the_enumeration(k):
    p, q = _dists(7, cut=True)
    est = inclusion_wor(q, k, 40_000, torch.Generator().manual_seed(1))
    assert torch.allclose(est, _exact_inclusion(q, k, replacement=False), atol=0.01)
    assert float(est[q == 0].sum()) == 0.0


@pytest.mark.parametrize("seed", range(4))
def test_sm_k_against_a_monte_carlo_of_sample_and_match(seed):
    p, q = _dists(seed)
    gen = torch.Generator().manual_seed(100 + seed)
    n = 40_000
    samples = torch.multinomial(p, n, replacement=True, generator=gen)  # the target's sample at the node
    for k in (1, 2, 4):
        children = q.topk(k).indices
        accepted = (samples[:, None] == children).any(-1).double().mean()
        assert float(sm_k(p, q, k)) == pytest.approx(float(accepted), abs=4 * 0.5 / math.sqrt(n))
        assert float(sm_k(p, q.log(), k)) == pytest.approx(float(sm_k(p, q, k)), abs=1e-12)  # log q ranks alike
        assert float(sm_k(p, q, k)) <= float(top_p_mass(p, k)) + 1e-12
    assert float(top_p_mass(p, V)) == pytest.approx(1.0)


@pytest.mark.parametrize("replacement", [True, False], ids=["specinfer", "rsd"])
def test_rejection_accept_agrees_with_the_librarys_rule_on_a_one_level_tree(replacement):
    """Per draw of the siblings, ``rejection_accept`` is the chance the library's recursive rejection accepts one of
    them: over many rounds of a root with k drafted children (the rule's own uniforms) the two rates agree."""
    p, q = _dists(3, cut=True)
    k, n = 3, 20_000
    gen = torch.Generator().manual_seed(5)
    drafts = draw_siblings(q, k, n, replacement, gen)  # [n, k]
    tokens = torch.cat([torch.zeros(n, 1, dtype=torch.long), drafts], 1)
    tree = DeviceTree(
        tokens=tokens,
        parents=torch.tensor([-1] + [0] * k).expand(n, -1),
        depth=torch.tensor([0] + [1] * k).expand(n, -1),
        valid=torch.ones(n, k + 1, dtype=torch.bool),
        num_nodes=torch.full((n,), k + 1),
        max_children=k,
    )
    slots_p = p.expand(n, k + 1, -1).clone()
    slots_q = q.expand(n, k + 1, -1).clone()
    noise = torch.rand(n, k + 1, 4, generator=gen)
    out = recursive_rejection(tree, slots_p, slots_q, noise, 1, replacement)
    rate = float((out.num_path >= 2).double().mean())
    want = float(rejection_accept(p, q, drafts, replacement).mean())
    assert rate == pytest.approx(want, abs=4 * 0.5 / math.sqrt(n))
