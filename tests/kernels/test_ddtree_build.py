"""``ddtree_build``: the one-launch Triton selection (interpreter on CPU, compiled on GPU) equals the heap builder.

The interpreter (the ``interpreter`` tier) runs the first ``INTERPRETED_TREES`` tree cases, which hold every top-k
(None, 1, 2, 3, 8, 15) four times, tie-heavy rows with -inf, depths 1-15 and budgets 1-76; the GPU test the first
``GPU_TREES`` (nearly every case compiles its own selection kernel: D, K and N are compile-time constants).
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from oracles.ddtree_heap import build_ddtree
from oracles.host_trees import to_draft_tree

import specdec
from specdec.budget import ddtree_scores, expected_accepts
from specdec.trees import ddtree_device
from specdec.trees.build import ddtree_batch
from specdec.types import DeviceTree, Proposal

REPO = Path(__file__).resolve().parents[2]


def cases(num: int = 150, seed: int = 0):
    """(logq, budget, topk) with D <= 15 and keys that fit: log-softmax rows, tie-heavy integer rows, -inf."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(num):
        depth = int(torch.randint(1, 16, (1,), generator=gen))
        vocab = int(torch.randint(1, 48, (1,), generator=gen))
        budget = int(torch.randint(1, 80, (1,), generator=gen))
        topk = [None, 1, 2, 3, 8, 15][i % 6]
        if i % 3 == 0:  # many exact ties: small integers, some -inf
            logq = torch.randint(-4, 1, (depth, vocab), generator=gen).float() - 3.0
            if i % 2 == 0:
                logq[logq < -6] = float("-inf")
        else:
            logq = torch.log_softmax(2 * torch.randn(depth, vocab, generator=gen), dim=-1)
        k = min(budget if topk is None else topk, budget, vocab)
        if depth * k.bit_length() <= 63:
            out.append((logq, budget, topk))
    return out


INTERPRETED_TREES = 24
GPU_TREES = 72


def exhausted_cases(seed: int = 5) -> list[tuple[torch.Tensor, int, None]]:
    """(logq, budget, None): every reachable prefix popped (budget = V + V^2 + ... + V^D), rows of 0, -1 and -inf,
    so that prefixes of score -inf are popped (in rank order) while the slots of exhausted siblings are closed."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for depth, vocab in [(2, 2), (2, 3), (3, 2), (3, 3), (4, 2), (4, 3), (5, 2)] * 2:
        logq = torch.tensor([0.0, -1.0, float("-inf")])[torch.randint(0, 3, (depth, vocab), generator=gen)]
        out.append((logq, sum(vocab**d for d in range(1, depth + 1)), None))
    return out


def _build_exhausted(device: str) -> list:
    trees = []
    for logq, budget, topk in exhausted_cases():
        tree = ddtree_device(logq.to(device), torch.tensor(5, device=device), budget=budget, topk=topk,
                             num_slots=budget + 1, impl="triton", topk_impl="triton")  # fmt: skip
        draft = to_draft_tree(tree)
        trees.append((draft.tokens, draft.parents))
    return trees


def _check_exhausted(trees) -> None:
    assert len(trees) == len(exhausted_cases()) >= 14
    assert sum(bool(logq[1:].isinf().any()) for logq, _, _ in exhausted_cases()) >= 8  # -inf below depth 1
    for (logq, budget, topk), (tokens, parents) in zip(exhausted_cases(), trees, strict=True):
        want = build_ddtree(logq, 5, budget=budget, topk=topk)
        assert want.tokens.numel() == budget + 1  # the whole prefix tree
        assert torch.equal(tokens.cpu(), want.tokens.cpu()), (logq, budget)
        assert torch.equal(parents.cpu(), want.parents), (logq, budget)


def _build_all(device: str, topk_impl: str = "torch", num: int | None = None) -> list:
    trees = []
    for logq, budget, topk in cases()[:num]:
        root = torch.tensor(5, device=device)
        tree = ddtree_device(logq.to(device), root, budget=budget, topk=topk, num_slots=budget + 2, impl="triton",
                             topk_impl=topk_impl)  # fmt: skip
        draft = to_draft_tree(tree)
        trees.append((draft.tokens, draft.parents))
    return trees


def topk_cases(seed: int = 1) -> list[tuple[torch.Tensor, int]]:
    """(logq, k): vocabularies below, at and past one 4096-wide chunk and the largest row kept in registers (16384),
    past the two-launch width (32768: a multiple of its chunk, and one whose padded last chunk holds -inf ties),
    tie-heavy rows, -inf, -0.0 next to +0.0, bf16 and float64 input (compared after rounding to fp32)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i, vocab in enumerate([1, 2, 7, 48, 300, 4096, 4100, 8195, 16384, 16390, 40960, 32769]):
        depth = int(torch.randint(1, 16, (1,), generator=gen))
        if i % 2:
            logq = torch.randint(-3, 1, (depth, vocab), generator=gen).float()  # many exact ties
            logq[logq == -3] = float("-inf")
            logq[logq == 0] = torch.where(torch.rand(int((logq == 0).sum()), generator=gen) < 0.5, -0.0, 0.0)
        else:
            logq = torch.log_softmax(3 * torch.randn(depth, vocab, generator=gen), dim=-1)
        logq = logq.to([torch.float32, torch.bfloat16, torch.float64][i % 3])
        for k in sorted({1, min(3, vocab), min(8, vocab), min(15, vocab)}):
            out.append((logq, k))
    return out


def _topk_all(device: str) -> list:
    from specdec.kernels.ddtree_build import topk_rows

    return [topk_rows(logq.to(device), k) for logq, k in topk_cases()]


def _check_topk(results) -> None:
    from specdec.kernels.ddtree_build.reference import topk_rows_reference as _topk_rows

    assert len(results) > 20
    for (logq, k), (vals, ids) in zip(topk_cases(), results, strict=True):
        want_vals, want_ids = _topk_rows(logq, k)
        assert torch.equal(ids.cpu(), want_ids), (tuple(logq.shape), k, logq.dtype)
        assert torch.equal(vals.cpu().view(torch.int32), want_vals.view(torch.int32))  # bitwise: -0.0 is kept


def _wide_smallest_cases() -> list[tuple[torch.Tensor, int]]:
    """(x, k) for the ``k`` smallest of rows past the two-launch width: continuous, and with +inf and exact ties
    (the padded last chunk holds +inf, whose ids past the row must lose the tie)."""
    gen = torch.Generator().manual_seed(7)
    cont = torch.randn(3, 33000, generator=gen)
    tied = torch.randint(0, 3, (2, 40000), generator=gen).float()
    tied[tied == 2] = float("inf")
    return [(cont, 8), (tied, 5), (tied[:, :32800], 15)]


def _wide_smallest_all(device: str) -> list:
    from specdec.kernels.ddtree_build import topk_rows

    return [topk_rows(x.to(device), k, smallest=True) for x, k in _wide_smallest_cases()]


def _check_wide_smallest(results) -> None:
    for (x, k), (vals, ids) in zip(_wide_smallest_cases(), results, strict=True):
        for row in range(x.shape[0]):
            want = sorted(range(x.shape[1]), key=lambda j, r=row: (float(x[r, j]), j))[:k]  # (value asc, id asc)
            assert ids[row].cpu().tolist() == want, (tuple(x.shape), k, row)
            assert torch.equal(vals[row].cpu(), x[row, want])


def _check(trees, num: int | None = None) -> None:
    assert len(trees) == len(cases()[:num]) and len(trees) >= min(num or 90, 90)
    for (logq, budget, topk), (tokens, parents) in zip(cases()[:num], trees, strict=True):
        want = build_ddtree(logq, 5, budget=budget, topk=topk)
        assert torch.equal(tokens.cpu(), want.tokens.cpu()), (budget, topk)
        assert torch.equal(parents.cpu(), want.parents), (budget, topk)


def test_interpreted_tree_cases_cover_every_topk_ties_and_depths():
    picked = cases()[:INTERPRETED_TREES]
    assert len(picked) == INTERPRETED_TREES
    assert {topk for _, _, topk in picked} == {None, 1, 2, 3, 8, 15}
    assert any(logq.isinf().any() for logq, _, _ in picked) and {logq.shape[0] for logq, _, _ in picked} >= {1, 2, 15}
    assert min(b for _, b, _ in picked) <= 2 and max(b for _, b, _ in picked) >= 70


def batch_cases(seed: int = 3) -> list[tuple[torch.Tensor, torch.Tensor, int, int | None]]:
    """(logq [B, D, V], roots [B], budget, topk): batches of rows with ties and -inf, as the round builds them."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    shapes = [(3, 5, 12, 10, 3), (4, 15, 40, 31, 8), (2, 3, 6, 7, None), (5, 4, 9, 15, 2), (1, 15, 40, 32, 8)]
    # B, D, V, budget, topk (B = 1: a single sequence's round)
    for batch, depth, vocab, budget, topk in shapes:
        logq = torch.log_softmax(torch.randn(batch, depth, vocab, generator=gen), -1)
        logq = (logq * 2).round() / 2  # ties
        logq[..., -1] = float("-inf")
        out.append((logq, torch.arange(batch) + 5, budget, topk))
    return out


def _build_batches(device: str, topk_impl: str = "torch") -> list:
    return [  # plain tuples of tensors (saved by the interpreted run)
        tuple(ddtree_batch(logq.to(device), roots.to(device), budget=budget, topk=topk, num_slots=budget + 3,
                           impl="triton", topk_impl=topk_impl))  # fmt: skip
        for logq, roots, budget, topk in batch_cases()
    ]


def _check_batches(trees) -> None:
    """Row b of each batched build is the heap builder's tree of row b alone (padded past its nodes)."""
    assert len(trees) == len(batch_cases())
    for (logq, roots, budget, topk), tree in zip(batch_cases(), trees, strict=True):
        tree = DeviceTree(*tree)
        for b in range(logq.shape[0]):
            want = build_ddtree(logq[b], int(roots[b]), budget=budget, topk=topk)
            n = want.tokens.numel()
            assert torch.equal(tree.tokens[b, :n].cpu(), want.tokens.cpu()), (budget, topk, b)
            assert torch.equal(tree.parents[b, :n].cpu(), want.parents), (budget, topk, b)
            assert int(tree.num_nodes[b]) == n and bool(tree.valid[b, :n].all()) and not tree.valid[b, n:].any()
            assert tree.tokens[b, n:].eq(roots[b]).all() and tree.parents[b, n:].eq(-1).all()
            assert tree.depth[b, n:].eq(0).all()


def test_batched_build_on_cpu_equals_each_row_alone():
    trees = [
        ddtree_batch(logq, roots, budget=budget, topk=topk, num_slots=budget + 3)
        for logq, roots, budget, topk in batch_cases()
    ]
    _check_batches(trees)
    with pytest.raises(ValueError, match=r"logq \[B, D, V\] and roots \[B\]"):
        ddtree_batch(batch_cases()[0][0][0], torch.tensor([1]), budget=3, topk=None, num_slots=4)


AUTO_SIZES = (3, 15, 31)
# the sets of candidate sizes run: up to EXPECT_SIZES_MAX (the selection writes the tree and the expectations
# itself; one size past the pops of the largest round) and more (the scores summed after the launch)
AUTO_SIZE_SETS = (AUTO_SIZES, (2, 5, 9, 14), (3, 7, 15, 31, 47))


def _auto_cases():
    gen = torch.Generator().manual_seed(11)
    logq = torch.randn(3, 6, 50, generator=gen).mul(2).log_softmax(-1)  # continuous: no equal scores
    roots = torch.tensor([5, 7, 9])
    return logq, roots


def _auto_steps(device: str):
    """``AutoStep.build_expecting`` at every size of each size set (the one-pass Triton path where it applies)."""
    logq, roots = _auto_cases()
    out = {}
    for sizes, look in itertools.product(AUTO_SIZE_SETS, (True, False)):
        policy = specdec.DDTree(budget="auto", topk=4, sizes=sizes, lookahead=look)
        for size in sizes:
            tree, expected = policy.at(size).build_expecting(Proposal(logq=logq.to(device)), roots.to(device), 6)
            out[sizes, size, look] = ([t.cpu() for t in (tree.tokens, tree.parents, tree.depth, tree.num_nodes)],
                                      expected.cpu())  # fmt: skip
    return out


def _check_auto_steps(out) -> None:
    """Against the two apart on the CPU's tensor ops: the fixed policy's tree of that size and ``expectations``."""
    logq, roots = _auto_cases()
    assert set(out) == {(sizes, size, look) for sizes in AUTO_SIZE_SETS for size in sizes for look in (True, False)}
    for sizes, look in itertools.product(AUTO_SIZE_SETS, (True, False)):
        policy = specdec.DDTree(budget="auto", topk=4, sizes=sizes, lookahead=look)
        for size in sizes:
            step = policy.at(size)
            want = specdec.DDTree(budget=size, topk=4).build(Proposal(logq=logq), roots, 6)
            tensors, expected = out[sizes, size, look]
            for got, ref in zip(tensors, (want.tokens, want.parents, want.depth, want.num_nodes), strict=True):
                assert torch.equal(got, ref), (sizes, size, got, ref)
            torch.testing.assert_close(expected, step.expectations(Proposal(logq=logq)), rtol=1e-12, atol=1e-12)
            # the sizes up to the next one above this round's (without lookahead: up to its own) are computed (the
            # largest size's scores cut: the enumeration-checked reference), the larger ones are marked -1
            upto = next((s for s in sizes if s > size), sizes[-1]) if look else size
            full = expected_accepts(ddtree_scores(logq, budget=sizes[-1], topk=4), sizes)
            known = sum(s <= upto for s in sizes)
            torch.testing.assert_close(expected[:, :known], full[:, :known], rtol=1e-12, atol=1e-12)
            assert (expected[:, known:] == -1).all(), (sizes, size, expected)


def test_auto_step_builds_apart_on_cpu():
    """Without Triton the auto round's tree and expectations are the fixed tree and ``expectations`` themselves."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("the CPU's tensor-op path")
    _check_auto_steps(_auto_steps("cpu"))


# each part in its own interpreter run
INTERPRETED_PARTS = {
    "auto_step": (lambda: _auto_steps("cpu"), _check_auto_steps),
    "trees": (lambda: _build_all("cpu", num=INTERPRETED_TREES), lambda out: _check(out, INTERPRETED_TREES)),
    "trees_triton_topk": (lambda: _build_all("cpu", "triton", num=INTERPRETED_TREES),
                          lambda out: _check(out, INTERPRETED_TREES)),  # fmt: skip
    "topk": (lambda: _topk_all("cpu"), _check_topk),
    "topk_wide_smallest": (lambda: _wide_smallest_all("cpu"), _check_wide_smallest),
    "batched": (lambda: _build_batches("cpu", "triton"), _check_batches),
    "exhausted": (lambda: _build_exhausted("cpu"), _check_exhausted),
}


@pytest.mark.interpreter
@pytest.mark.parametrize("part", list(INTERPRETED_PARTS))
def test_interpreted_selection_equals_heap_builder(tmp_path, part):
    pytest.importorskip("triton")
    out = tmp_path / "results.pt"
    env = {
        **os.environ,
        "TRITON_INTERPRET": "1",
        "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests"), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run([sys.executable, __file__, part, str(out)], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=900)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    INTERPRETED_PARTS[part][1](torch.load(out))


def test_triton_topk_is_refused_on_cpu_without_the_interpreter():
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("checks the error without the interpreter")
    logq = torch.log_softmax(torch.randn(3, 10), -1)
    with pytest.raises(ValueError, match="GPU"):
        ddtree_device(logq, torch.tensor(1), budget=4, topk=2, num_slots=5, topk_impl="triton")
    with pytest.raises(ValueError, match="topk_impl"):
        ddtree_device(logq, torch.tensor(1), budget=4, topk=2, num_slots=5, topk_impl="cuda")


def test_keys_that_do_not_fit_are_refused():
    from specdec.kernels.ddtree_build import triton_fits

    logq = torch.log_softmax(torch.randn(15, 100), -1)
    assert not triton_fits(logq, 64)  # 15 digits of 7 bits
    with pytest.raises(ValueError, match="int64"):
        from specdec.kernels.ddtree_build.triton import best_first_triton

        best_first_triton(logq[:, :64], torch.zeros(15, 64, dtype=torch.long), 10)
    with pytest.raises(ValueError, match=r"num_slots >= num_nodes \+ 1 = 11"):
        best_first_triton(logq[:2, :4], torch.zeros(2, 4, dtype=torch.long), 10, roots=torch.ones(1), num_slots=11)
    with pytest.raises(ValueError, match="roots"):
        best_first_triton(logq[None, :2, :4], torch.zeros(1, 2, 4, dtype=torch.long), 10, roots=torch.ones(1),
                          num_slots=8)  # fmt: skip


@pytest.mark.gpu
def test_compiled_selection_equals_heap_builder_on_cuda():
    _check(_build_all("cuda", num=GPU_TREES), GPU_TREES)
    _check(_build_all("cuda", topk_impl="triton", num=GPU_TREES), GPU_TREES)
    # the engine's default: Triton top-k for small vocabularies
    _check(_build_all("cuda", topk_impl="auto", num=GPU_TREES), GPU_TREES)
    _check_topk(_topk_all("cuda"))
    # an auto round's tree and expectations from one pass equal the two built apart
    _check_auto_steps(_auto_steps("cuda"))
    _check_batches(_build_batches("cuda", "triton"))  # whole padded trees written by the selection's launch
    _check_exhausted(_build_exhausted("cuda"))  # every prefix popped, those of score -inf in rank order


if __name__ == "__main__":  # the interpreted run of one part: python test_ddtree_build.py PART OUT
    torch.save(INTERPRETED_PARTS[sys.argv[1]][0](), sys.argv[2])
