"""``tree_mamba2``: reference vs each node's path run causally with ``mamba2_step``; Triton (interpreter on CPU,
compiled on GPU) vs the reference.

The Triton comparisons on CPU run in one subprocess with ``TRITON_INTERPRET=1`` (it must be set before Triton is
imported, and must not leak into the rest of the suite); that process runs this file as a script, writes the
kernel outputs to a file and the tests here compare them. ``torch.empty`` is NaN-poisoned in that process, so a
scratch row or output element read before it is written shows up.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from specdec.kernels.tree_mamba2 import tree_mamba2
from specdec.kernels.tree_mamba2.reference import tree_mamba2_reference
from specdec.state.mamba2 import mamba2_step
from specdec.types import DraftTree

REPO = Path(__file__).resolve().parents[2]
TOL = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (1e-5, 1e-5), torch.float16: (1e-5, 1e-5)}  # output is fp32
TREES = ("chain", "bush", "random", "deep", "interleaved", "forest")


@dataclass(frozen=True)
class Case:
    n: int
    h: int  # heads
    p: int  # head dim
    s: int  # state size
    g: int  # groups of B and C
    tree: str  # chain | bush | random | deep (mostly chains, random branch points) | interleaved (two chains,
    # parents[i] = i - 2: no node's state is its successor's parent state) | forest (several roots)
    dtype: torch.dtype = torch.float32  # of x, B, C, D
    block_p: int = 0  # 0: the kernel's default launch config

    @property
    def id(self) -> str:
        extra = "" if self.dtype == torch.float32 else f"-{str(self.dtype).split('.')[-1]}"
        extra += f"-bp{self.block_p}" if self.block_p else ""
        return f"{self.tree}-n{self.n}-h{self.h}-p{self.p}-s{self.s}-g{self.g}{extra}"


def make_parents(tree: str, n: int, gen: torch.Generator) -> list[int]:
    parents = [-1]
    for i in range(1, n):
        if tree == "chain":
            parents.append(i - 1)
        elif tree == "bush":
            parents.append(0)
        elif tree == "random":
            parents.append(int(torch.randint(0, i, (1,), generator=gen)))
        elif tree == "deep":
            branch = bool(torch.rand((), generator=gen) < 0.3)
            parents.append(int(torch.randint(0, i, (1,), generator=gen)) if branch else i - 1)
        elif tree == "interleaved":
            parents.append(max(i - 2, 0))
        elif tree == "forest":
            parents.append(int(torch.randint(-1, i, (1,), generator=gen)))
        else:
            raise ValueError(tree)
    return parents


def make_inputs(case: Case, device="cpu", seed: int = 0) -> dict:
    """Inputs in the ranges a Mamba2 layer produces: dt = softplus(.), A = -exp(.), so exp(dt A) is in (0, 1)."""
    gen = torch.Generator().manual_seed(seed)
    n, h, g = case.n, case.h, case.g

    def randn(*shape):
        return torch.randn(*shape, generator=gen)

    inputs = dict(
        init_state=randn(h, case.p, case.s),
        x=randn(n, h, case.p).to(case.dtype),
        B=randn(n, g, case.s).to(case.dtype),
        C=randn(n, g, case.s).to(case.dtype),
        dt=F.softplus(randn(n, h) - 1.0),
        A=-torch.exp(randn(h) * 0.5),
        D=randn(h).to(case.dtype),
        parents=torch.tensor(make_parents(case.tree, n, gen), dtype=torch.long),
    )
    return {name: t.to(device) for name, t in inputs.items()}


def _per_head(inputs: dict) -> tuple[torch.Tensor, ...]:
    """x, B, C, D in fp32 with B and C expanded from groups to heads."""
    rep = inputs["x"].shape[1] // inputs["B"].shape[1]
    B, C = (inputs[name].float().repeat_interleave(rep, dim=1) for name in ("B", "C"))
    return inputs["x"].float(), B, C, inputs["D"].float()


def path_output(inputs: dict) -> torch.Tensor:
    """Oracle: each node's output from its own root-to-node path run causally, one ``mamba2_step`` per token."""
    x, B, C, D = _per_head(inputs)
    dt, A, parents = inputs["dt"], inputs["A"], inputs["parents"].tolist()
    out = []
    for i in range(len(parents)):
        path, node = [], i
        while node >= 0:
            path.append(node)
            node = parents[node]
        state = inputs["init_state"][None]
        for j in reversed(path):
            s = slice(j, j + 1)
            state = mamba2_step(state, x[s], dt[s], B[s], A)
        out.append((state[0] * C[i][:, None, :]).sum(-1) + D[:, None] * x[i])
    return torch.stack(out)


def level_scan_output(inputs: dict) -> torch.Tensor:
    """The adapter's path before ``tree_mamba2``: ``tree_scan`` with ``mamba2_step``, then the D skip."""
    from oracles.eager_state import TreeTopology, tree_scan  # tests/ is on the path under pytest only

    x, B, C, D = _per_head(inputs)
    parents = inputs["parents"].cpu()
    topo = TreeTopology.from_tree(DraftTree(tokens=torch.zeros_like(parents), parents=parents), x.device)

    def step(parent_states, nodes):
        states = mamba2_step(
            parent_states,
            x.index_select(0, nodes),
            inputs["dt"].index_select(0, nodes),
            B.index_select(0, nodes),
            inputs["A"],
        )
        return states, (states * C.index_select(0, nodes)[:, :, None, :]).sum(-1)

    return tree_scan(inputs["init_state"][None].float(), topo, step) + D[:, None] * x


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    atol, rtol = TOL[dtype]
    assert actual.dtype == torch.float32 and actual.shape == expected.shape
    torch.testing.assert_close(actual, expected.float(), atol=atol, rtol=rtol)


SMALL, GROUPED = (1, 16, 16, 1), (4, 24, 20, 2)  # (h, p, s, g)
REFERENCE_CASES = [
    Case(n, *shape, tree)
    for n in (1, 2, 7, 16, 63, 65, 128)
    for tree in TREES
    for shape in (SMALL, GROUPED)
    if not (n == 1 and tree != "chain")
] + [Case(33, 4, 16, 32, 2, "random", dtype=torch.bfloat16), Case(33, 4, 16, 16, 4, "deep", dtype=torch.float16)]

# The interpreter's cases (the ``interpreter`` tier; cost ~ programs x nodes, so small heads for the long trees):
# one node, every tree kind, 1 / 2 / 4 / 8 groups, odd head sizes, bf16 and fp16, a Nemotron-H-8B head layout,
# 17-128 nodes, both ``block_p`` choices. The GPU tests run ``GPU_CASES``.
TRITON_CASES = [
    Case(1, 2, 16, 16, 1, "chain"),
    Case(7, 4, 16, 16, 2, "bush"),
    Case(7, 4, 24, 20, 4, "random"),
    Case(16, 8, 16, 16, 2, "deep", dtype=torch.bfloat16),  # the test suite's tiny Mamba2 / Nemotron-H layer
    Case(17, 16, 64, 128, 8, "random", dtype=torch.bfloat16),  # Nemotron-H-8B head layout (P 64, S 128, 8 groups)
    Case(33, 2, 16, 32, 1, "forest"),
    Case(17, 2, 16, 16, 1, "interleaved"),
    Case(65, 1, 24, 16, 1, "deep", block_p=8),
    Case(65, 1, 40, 8, 1, "bush", block_p=32),
    Case(128, 1, 16, 16, 1, "chain", dtype=torch.float16),
]

GPU_CASES = [
    *(Case(n, 8, 64, 128, 2, tree) for n in (1, 7, 16, 63, 65, 128) for tree in TREES if n > 1 or tree == "chain"),
    Case(64, 128, 64, 128, 8, "random", dtype=torch.bfloat16),  # Nemotron-H-8B layer
    Case(65, 24, 128, 256, 1, "deep", dtype=torch.bfloat16),  # Falcon-H1-like layer
    Case(17, 8, 16, 16, 2, "random"),  # the test suite's tiny layer
    Case(300, 2, 48, 40, 1, "deep"),
]


@pytest.mark.parametrize("case", REFERENCE_CASES, ids=lambda c: c.id)
def test_reference_matches_paths(case):
    inputs = make_inputs(case)
    before = inputs["init_state"].clone()
    assert_close(tree_mamba2_reference(**inputs), path_output(inputs), case.dtype)
    assert torch.equal(inputs["init_state"], before)


@pytest.mark.parametrize("case", [c for c in REFERENCE_CASES if c.tree != "forest"], ids=lambda c: c.id)
def test_reference_matches_level_scan(case):
    """The adapter's former path (a ``DraftTree`` has one root, so no forests here)."""
    inputs = make_inputs(case)
    assert_close(tree_mamba2_reference(**inputs), level_scan_output(inputs), case.dtype)


@pytest.mark.parametrize("seed", range(12))
def test_reference_matches_paths_random_sizes(seed):
    gen = torch.Generator().manual_seed(100 + seed)
    n = int(torch.randint(1, 129, (1,), generator=gen))
    tree = TREES[int(torch.randint(0, len(TREES), (1,), generator=gen))]
    g, p, s = (int(torch.randint(1, hi, (1,), generator=gen)) for hi in (3, 20, 20))
    case = Case(n, 2 * g, p, s, g, tree)
    inputs = make_inputs(case, seed=seed)
    assert_close(tree_mamba2_reference(**inputs), path_output(inputs), case.dtype)


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory) -> dict[str, torch.Tensor]:
    pytest.importorskip("triton")
    path = tmp_path_factory.mktemp("tree_mamba2") / "outputs.pt"
    env = {
        **os.environ,
        "TRITON_INTERPRET": "1",
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run(
        [sys.executable, __file__, str(path)], env=env, cwd=REPO, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return torch.load(path)


@pytest.mark.interpreter
@pytest.mark.parametrize("case", TRITON_CASES, ids=lambda c: c.id)
def test_triton_interpreted_matches_reference(case, interpreted):
    inputs = make_inputs(case)
    out = interpreted[case.id]
    assert not out.isnan().any()
    assert_close(out, tree_mamba2_reference(**inputs), case.dtype)
    assert torch.equal(interpreted[case.id + "/init_state"], inputs["init_state"])


ROW_KINDS = ("deep", "bush", "forest")


def row_inputs(n: int = 12) -> dict:
    """Three sequences' inputs stacked (``tree_mamba2_rows``'s layout), each from its own tree kind and seed; ``A``
    and ``D`` are the layer's, shared."""
    rows = [make_inputs(Case(n, 4, 16, 16, 2, kind), seed=seed) for seed, kind in enumerate(ROW_KINDS)]
    out = {key: torch.stack([r[key] for r in rows]) for key in rows[0] if key not in ("A", "D")}
    return {**out, "A": rows[0]["A"], "D": rows[0]["D"]}


@pytest.mark.interpreter
def test_triton_interpreted_rows_match_each_sequence_alone(interpreted):
    inputs = row_inputs()
    out = interpreted["rows"]
    for b in range(len(ROW_KINDS)):
        alone = {key: (x if key in ("A", "D") else x[b]) for key, x in inputs.items()}
        assert_close(out[b], tree_mamba2_reference(**alone), torch.float32)


def test_rows_refuse_unbatched_shapes():
    from specdec.kernels.tree_mamba2 import tree_mamba2_rows

    with pytest.raises(ValueError, match=r"x \[R, N, H, P\] and parents \[R, N\]"):
        tree_mamba2_rows(**make_inputs(Case(3, 2, 8, 8, 1, "chain")))


def test_auto_on_cpu_is_the_reference():
    inputs = make_inputs(Case(9, 4, 8, 8, 2, "random"))
    assert torch.equal(tree_mamba2(**inputs), tree_mamba2_reference(**inputs))
    assert torch.equal(tree_mamba2(**inputs, impl="torch"), tree_mamba2_reference(**inputs))


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(impl="cuda"), "impl="),
        (dict(x=torch.zeros(5, 32)), "x must be"),
        (dict(x=torch.zeros(5, 3, 8)), "divisible"),
        (dict(B=torch.zeros(5, 3, 8)), "B must be"),
        (dict(C=torch.zeros(5, 2, 7)), "C must be"),
        (dict(dt=torch.zeros(5, 3)), "dt must be"),
        (dict(A=torch.zeros(2)), "A must be"),
        (dict(D=torch.zeros(4, 1)), "D must be"),
        (dict(init_state=torch.zeros(4, 8, 7)), "init_state must be"),
        (dict(parents=torch.tensor([-1, 0, 1, 3, 0])), "parents"),
        (dict(parents=torch.tensor([-1, 0, 1])), "parents must be"),
    ],
    ids=["impl", "x", "groups", "B", "C", "dt", "A", "D", "init_state", "parents-order", "parents-length"],
)
def test_errors(change, match):
    inputs = make_inputs(Case(5, 4, 8, 8, 2, "random"))
    with pytest.raises(ValueError, match=match):
        tree_mamba2(**{**inputs, **change})


def test_float_parents_are_refused():
    inputs = make_inputs(Case(5, 4, 8, 8, 2, "random"))
    with pytest.raises(TypeError, match="integer"):
        tree_mamba2(**{**inputs, "parents": inputs["parents"].float()})


@pytest.mark.skipif("TRITON_INTERPRET" in os.environ, reason="checks the error without the interpreter")
def test_triton_on_cpu_is_refused():
    with pytest.raises(ValueError, match="GPU"):
        tree_mamba2(**make_inputs(Case(3, 1, 8, 8, 1, "chain")), impl="triton")


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CASES, ids=lambda c: c.id)
def test_triton_gpu_matches_reference(case):
    if not torch.cuda.is_available():
        pytest.fail("needs a CUDA device: run `python -m pytest -m gpu tests/kernels` on a GPU machine")
    inputs = make_inputs(case, device=torch.device("cuda"))
    before = inputs["init_state"].clone()
    out = tree_mamba2(**inputs, impl="triton")
    assert out.is_cuda and not out.isnan().any()
    assert_close(out, tree_mamba2(**inputs, impl="torch"), case.dtype)
    assert_close(out.cpu(), tree_mamba2_reference(**make_inputs(case)), case.dtype)
    assert torch.equal(inputs["init_state"], before)
    assert torch.equal(tree_mamba2(**inputs), out)  # auto picks Triton on CUDA


def _run_interpreted(path: str) -> None:
    """Subprocess entry: kernel outputs of ``TRITON_CASES`` through the interpreter, saved to ``path``."""
    from specdec.kernels.tree_mamba2.triton import _tree_mamba2, tree_mamba2_triton
    from tests.kernel_harness import poison_empty  # the repo is on this subprocess's path, tests/ is not

    poison_empty()
    results = {}
    for case in TRITON_CASES:
        inputs = make_inputs(case)
        if case.block_p:
            results[case.id] = _tree_mamba2(**inputs, block_p=case.block_p, num_warps=1)
        else:
            results[case.id] = tree_mamba2_triton(**inputs)
        results[case.id + "/init_state"] = inputs["init_state"]
    from specdec.kernels.tree_mamba2 import tree_mamba2_rows

    results["rows"] = tree_mamba2_rows(**row_inputs(), impl="triton")
    torch.save(results, path)


if __name__ == "__main__":
    _run_interpreted(sys.argv[1])
