"""``rejection_walk``: the walk after a round of recursive rejection sampling (each node's accepted child from the
root, then the bonus drawn from the end node's ``r`` by inverse CDF). The reference against a brute force (a Python
walk and an exact cumulative sum), the Triton version through the interpreter and compiled on CUDA against the
reference (equal: path, count and tokens), and planted bugs (a strict comparison at a token's boundary, which
draws a token of probability 0; a walk one step short) that the checks catch."""

from __future__ import annotations

import sys
from fractions import Fraction
from pathlib import Path

import pytest
import torch
from kernel_harness import capture_without_host_reads, interpreted_outputs, poison_empty

from specdec.kernels.tree_rejection import rejection_walk, rejection_walk_reference

# (batch, slots, vocab, dtype, max depth)
SPECS = [(1, 1, 7, torch.float32, 0), (3, 16, 300, torch.float32, 8), (2, 33, 4100, torch.float32, 12),
         (4, 9, 64, torch.float64, 8), (1, 64, 1000, torch.float32, 63)]  # fmt: skip


def make_case(seed: int, batch: int, slots: int, vocab: int, dtype: torch.dtype, max_depth: int,
              pair: bool = False) -> dict:  # fmt: skip
    """Random trees (parents before children, depth from them; a chain where ``max_depth = slots - 1``), each node's
    accepted child (one of its children, or itself: no child accepted), ``r`` with zeros (tokens outside its
    support) and strided uniforms (``pair``: each one's two float32 halves, ``noise[..., 2:4]`` of the round's
    ``[B, S, 4]`` uniforms, as the rules pass them)."""
    gen = torch.Generator().manual_seed(seed)
    parents = torch.full((batch, slots), -1, dtype=torch.long)
    depth = torch.zeros(batch, slots, dtype=torch.long)
    for b in range(batch):
        for i in range(1, slots):
            if max_depth == slots - 1:
                p = i - 1
            else:  # a parent whose depth leaves room below max_depth
                allowed = [j for j in range(i) if depth[b, j] < max_depth]
                p = allowed[int(torch.randint(len(allowed), (1,), generator=gen))]
            parents[b, i], depth[b, i] = p, depth[b, p] + 1
    nxt = torch.arange(slots).repeat(batch, 1)
    for b in range(batch):
        for i in range(slots):
            children = [j for j in range(slots) if parents[b, j] == i]
            if children and torch.rand((), generator=gen) < 0.75:
                nxt[b, i] = children[int(torch.randint(len(children), (1,), generator=gen))]
    r = torch.rand(batch, slots, vocab, generator=gen, dtype=torch.float64)
    r = torch.where(torch.rand(r.shape, generator=gen) < 0.3, 0.0, r)
    r = (r / r.sum(-1, keepdim=True)).to(dtype)
    u = torch.rand(batch, slots, 2, generator=gen, dtype=torch.float64)[..., 1]  # strided, as the round's
    if pair:
        u = torch.rand(batch, slots, 4, generator=gen)[..., 2:4]
    tokens = torch.randint(vocab, (batch, slots), generator=gen)
    return dict(tokens=tokens, depth=depth, nxt=nxt, r=r, u=u, max_depth=max_depth)


def boundary_case() -> dict:
    """``u * total`` exactly at a cumulative value: r = [1/4, 0, 1/4, 1/2] at u = 1/2 draws token 3 (the CDF's
    entries <= 1/2 are three), never token 1 (probability 0)."""
    r = torch.tensor([[[0.25, 0.0, 0.25, 0.5]]])
    return dict(tokens=torch.tensor([[2]]), depth=torch.zeros(1, 1, dtype=torch.long), nxt=torch.zeros(1, 1,
                dtype=torch.long), r=r, u=torch.tensor([[0.5]], dtype=torch.float64), max_depth=0)  # fmt: skip


def cases() -> list[dict]:
    pairs = [make_case(len(SPECS) + i, *spec, pair=True) for i, spec in enumerate(SPECS[1:3])]
    return [make_case(i, *spec) for i, spec in enumerate(SPECS)] + [boundary_case()] + pairs


def args(case: dict, device: str = "cpu") -> tuple:
    return (*(case[k].to(device) for k in ("tokens", "depth", "nxt", "r", "u")), case["max_depth"])


def brute_force(case: dict) -> tuple[list, list, list]:
    """Per sequence: the path (a Python walk), its count, and the tokens (drafts, then the bonus: the first token
    whose exact cumulative sum of ``r`` exceeds ``u`` times the exact total; zeros after)."""
    paths, nums, new = [], [], []
    steps = case["max_depth"] + 1
    for b in range(case["nxt"].shape[0]):
        path = [0]
        while len(path) < steps:
            path.append(int(case["nxt"][b, path[-1]]))
        end = path[-1]
        d = int(case["depth"][b, end])
        probs = [Fraction(float(x)) for x in case["r"][b, end].double()]
        u = case["u"][b, end]
        if u.dim():  # the float32 halves: a + b 2^-24, below 1 - 2^-52
            u = min(Fraction(float(u[0])) + Fraction(float(u[1])) / 2**24, 1 - Fraction(1, 2**52))
        at = Fraction(float(u)) * sum(probs)
        run, bonus = Fraction(0), 0
        for k, x in enumerate(probs):
            run += x
            if run > at:
                bonus = k
                break
        toks = [int(case["tokens"][b, path[i + 1]]) for i in range(d)] + [bonus] + [0] * (steps - d - 1)
        paths.append(path), nums.append(d + 1), new.append(toks)
    return paths, nums, new


def check(case: dict, got) -> None:
    paths, nums, new = brute_force(case)
    path, num_path, tokens = got  # an Accept, or its fields as a tuple (the interpreter's saved outputs)
    assert path.cpu().tolist() == paths
    assert num_path.cpu().tolist() == nums
    assert tokens.cpu().tolist() == new


def test_reference_equals_the_brute_force():
    for case in cases():
        check(case, rejection_walk_reference(*args(case)))
    assert rejection_walk(*args(cases()[1])).tokens.shape == (3, 9)  # CPU auto: the reference


def test_a_strict_comparison_at_a_boundary_fails_the_check():
    case = boundary_case()
    got = rejection_walk_reference(*args(case))
    strict = got._replace(tokens=torch.tensor([[1]]))  # what `cdf < at` counts: token 1, of probability 0
    with pytest.raises(AssertionError):
        check(case, strict)
    short = cases()[4]  # a walk one step short: the path's end repeated a step early
    got = rejection_walk_reference(*args(short))
    with pytest.raises(AssertionError):
        check(short, got._replace(path=torch.cat([got.path[:, :1], got.path[:, :-1]], 1)))


def test_bad_arguments_are_refused():
    case = cases()[1]
    a = list(args(case))
    with pytest.raises(ValueError, match=r"u must be \[3, 16\] float64 uniforms or their \[3, 16, 2\] float32"):
        rejection_walk(*a[:4], a[4].float(), a[5])
    with pytest.raises(ValueError, match=r"u must be"):
        rejection_walk(*a[:4], torch.rand(3, 16, 2, dtype=torch.float64), a[5])
    with pytest.raises(ValueError, match="max_depth=-1"):
        rejection_walk(*a[:5], -1)
    with pytest.raises(ValueError, match=r"r must be \[3, 16, V\]"):
        rejection_walk(*a[:3], a[3][:, :2], *a[4:])


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory) -> dict:
    pytest.importorskip("triton")
    return interpreted_outputs(__file__, tmp_path_factory.mktemp("rejection_walk"), {"cases": cases()})


@pytest.mark.interpreter
def test_interpreted_equals_the_brute_force(interpreted):
    for case, got, small in zip(interpreted["cases"], interpreted["outputs"], interpreted["small_block"],
                                strict=True):  # fmt: skip
        check(case, got)
        check(case, small)


def _run_interpreted(folder: Path) -> None:
    from specdec.kernels.tree_rejection.triton import rejection_walk_triton

    data = torch.load(folder / "cases.pt")
    poison_empty()
    out = {"outputs": [tuple(rejection_walk(*args(c), impl="triton")) for c in data["cases"]],
           "small_block": [tuple(rejection_walk_triton(*args(c), block=64)) for c in data["cases"]]}  # fmt: skip
    torch.save(out, folder / "outputs.pt")


@pytest.mark.gpu
def test_compiled_equals_the_brute_force_on_cuda_and_replays():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    for case in cases():
        check(case, rejection_walk(*args(case, "cuda"), impl="triton"))
        check(case, rejection_walk(*args(case, "cuda")))  # auto: Triton on CUDA
    case = cases()[2]
    a = args(case, "cuda")
    graph, out = capture_without_host_reads(lambda: rejection_walk(*a))
    graph.replay()
    check(case, out)


if __name__ == "__main__":
    _run_interpreted(Path(sys.argv[1]))
