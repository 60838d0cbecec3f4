"""``tree_gdn``: Triton (interpreter on CPU, compiled on GPU) vs the reference vs the adapter's level scan.

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
from unittest import mock

import pytest
import torch
import torch.nn.functional as F

from specdec.kernels.tree_gdn import gdn_path_replay, tree_gdn
from specdec.kernels.tree_gdn.reference import tree_gdn_reference
from specdec.state.gdn import gdn_step
from specdec.types import DraftTree

REPO = Path(__file__).resolve().parents[2]
TOL = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (1e-5, 1e-5), torch.float16: (1e-5, 1e-5)}  # output is fp32


@dataclass(frozen=True)
class Case:
    n: int
    hv: int
    k: int
    v: int
    tree: str  # chain | bush | random | forest (random, several roots) | deep (mostly chains, random branch points)
    h: int = 0  # key heads (0: same as hv)
    dtype: torch.dtype = torch.float32  # of v
    block_v: int = 0  # 0: the kernel's default launch config

    @property
    def id(self) -> str:
        extra = f"-h{self.h}" if self.h else ""
        extra += "" if self.dtype == torch.float32 else f"-{str(self.dtype).split('.')[-1]}"
        extra += f"-bv{self.block_v}" if self.block_v else ""
        return f"{self.tree}-n{self.n}-hv{self.hv}-k{self.k}-v{self.v}{extra}"


def make_parents(tree: str, n: int, gen: torch.Generator) -> list[int]:
    parents = [-1]
    for i in range(1, n):
        if tree == "chain":
            parents.append(i - 1)
        elif tree == "bush":
            parents.append(0)
        elif tree == "random":
            parents.append(int(torch.randint(0, i, (1,), generator=gen)))
        elif tree == "forest":  # several roots (e.g. the chain-tree prefill's one-node padding roots)
            parents.append(int(torch.randint(-1, i, (1,), generator=gen)))
        elif tree == "deep":
            branch = bool(torch.rand((), generator=gen) < 0.3)
            parents.append(int(torch.randint(0, i, (1,), generator=gen)) if branch else i - 1)
        else:
            raise ValueError(tree)
    return parents


def make_inputs(case: Case, device="cpu", seed: int = 0) -> dict:
    gen = torch.Generator().manual_seed(seed)
    n, hv, h = case.n, case.hv, case.h or case.hv

    def randn(*shape):
        return torch.randn(*shape, generator=gen)

    inputs = dict(
        init_state=randn(hv, case.k, case.v),
        q=F.normalize(randn(n, hv, case.k), dim=-1) * case.k**-0.5,
        k=F.normalize(randn(n, h, case.k), dim=-1),
        v=randn(n, hv, case.v).to(case.dtype),
        log_decay=-F.softplus(randn(n, hv)) * 0.5,
        beta=torch.rand(n, hv, generator=gen),
        parents=torch.tensor(make_parents(case.tree, n, gen), dtype=torch.long),
    )
    return {name: t.to(device) for name, t in inputs.items()}


def level_scan_output(inputs: dict) -> torch.Tensor:
    """The adapter's path before ``tree_gdn``: ``tree_scan`` with ``gdn_step``."""
    from oracles.eager_state import TreeTopology, tree_scan  # tests/ is on the path under pytest only

    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    parents = inputs["parents"]
    topo = TreeTopology.from_tree(DraftTree(tokens=torch.zeros_like(parents.cpu()), parents=parents.cpu()), q.device)

    def step(parent_states, nodes):
        states = gdn_step(
            parent_states,
            k.index_select(0, nodes),
            v.index_select(0, nodes).float(),
            inputs["log_decay"].index_select(0, nodes),
            inputs["beta"].index_select(0, nodes),
        )
        return states, (states * q.index_select(0, nodes)[..., None]).sum(-2)

    return tree_scan(inputs["init_state"][None].float(), topo, step)


def path_output(inputs: dict) -> torch.Tensor:
    """Oracle: each node's output from its own root-to-node path, one node at a time."""
    q, k = inputs["q"], inputs["k"].repeat_interleave(inputs["q"].shape[1] // inputs["k"].shape[1], dim=1)
    parents = inputs["parents"].tolist()
    out = []
    for i in range(len(parents)):
        path, node = [], i
        while node >= 0:
            path.append(node)
            node = parents[node]
        state = inputs["init_state"][None]
        for j in reversed(path):
            s = slice(j, j + 1)
            state = gdn_step(state, k[s], inputs["v"][s].float(), inputs["log_decay"][s], inputs["beta"][s])
        out.append((state * q[i][None, ..., None]).sum(-2)[0])
    return torch.stack(out)


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    atol, rtol = TOL[dtype]
    assert actual.dtype == torch.float32 and actual.shape == expected.shape
    torch.testing.assert_close(actual, expected.float(), atol=atol, rtol=rtol)


REFERENCE_CASES = [
    Case(n, hv, kd, vd, tree, h=h)
    for n in (1, 7, 16, 63, 65)
    for tree in ("chain", "bush", "random", "forest", "deep")
    for hv, h, kd, vd in ((1, 0, 16, 32), (4, 2, 64, 48))
    if not (n == 1 and tree != "chain")
] + [Case(33, 4, 32, 16, "random", dtype=torch.bfloat16), Case(33, 4, 32, 16, "deep", dtype=torch.float16)]

# the kernel's schedules: one program per node's path, one walk over the nodes, all nodes at once in matrix form
WALKS = ("paths", "nodes", "chunk")


def walks_for(case) -> tuple[str, ...]:
    """The schedules that take ``case``'s tree (the matrix form: up to 64 nodes)."""
    return WALKS if case.n <= 64 else WALKS[:2]


# The interpreter's cases (the ``interpreter`` tier; cost ~ programs x nodes, so small heads for the long trees):
# one node; every tree kind; grouped keys; bf16 and fp16 values; 16 nodes (the matrix form's smallest), 24 (padded
# to 64 rows), 40 (the parent relation squared, a forest) and 65 (past the matrix form); odd key / value sizes
# with a value block of 64; every schedule that takes each (``walks_for``). The GPU tests run ``GPU_CASES``.
TRITON_CASES = [
    Case(1, 4, 16, 16, "chain"),
    Case(7, 4, 32, 32, "bush"),
    Case(7, 4, 32, 32, "random", h=2),
    Case(16, 4, 64, 16, "deep", dtype=torch.bfloat16),
    Case(24, 2, 32, 32, "random", h=1),  # the matrix form pads 17-64 nodes to 64 rows
    Case(40, 1, 32, 16, "forest"),
    Case(65, 1, 48, 40, "deep", block_v=64),
    Case(65, 1, 16, 16, "chain", dtype=torch.float16),
]

GPU_CASES = [
    *(
        Case(n, 4, 64, 64, tree, h=2)
        for n in (1, 7, 16, 63, 65, 128)
        for tree in ("chain", "bush", "random", "forest", "deep")
    ),
    Case(64, 48, 128, 128, "random", h=16, dtype=torch.bfloat16),  # Qwen3.5-27B-like layer
    *(Case(n, 32, 128, 128, tree, h=16) for n, tree in ((16, "random"), (32, "deep"), (64, "random"))),  # 8B-like
    Case(65, 8, 64, 64, "deep", h=4, dtype=torch.bfloat16),  # zoo hybrid layer
    Case(300, 2, 48, 40, "deep"),
]


@pytest.mark.parametrize("case", [c for c in REFERENCE_CASES if c.tree != "forest"], ids=lambda c: c.id)
def test_reference_matches_level_scan(case):  # the level scan takes a DraftTree: one root
    inputs = make_inputs(case)
    before = inputs["init_state"].clone()
    out = tree_gdn_reference(**inputs)
    assert_close(out, level_scan_output(inputs), case.dtype)
    assert torch.equal(inputs["init_state"], before)


@pytest.mark.parametrize("case", [c for c in REFERENCE_CASES if c.n <= 16], ids=lambda c: c.id)
def test_reference_matches_paths(case):
    inputs = make_inputs(case)
    assert_close(tree_gdn_reference(**inputs), path_output(inputs), case.dtype)


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory) -> dict[str, torch.Tensor]:
    pytest.importorskip("triton")
    path = tmp_path_factory.mktemp("tree_gdn") / "outputs.pt"
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


# a batch of sequences, each with its own tree and state (the round's rows): one launch of tree_gdn_rows
ROW_KINDS = ("deep", "bush", "forest")


def row_inputs(n: int = 16) -> dict:
    """Three sequences' inputs stacked (``tree_gdn_rows``'s layout), each from its own tree kind and seed."""
    rows = [make_inputs(Case(n, 4, 32, 16, kind, h=2), seed=seed) for seed, kind in enumerate(ROW_KINDS)]
    return {key: torch.stack([r[key] for r in rows]) for key in rows[0]}


@pytest.mark.interpreter
@pytest.mark.parametrize("walk", ["paths", "nodes", "chunk"])
def test_triton_interpreted_rows_match_each_sequence_alone(walk, interpreted):
    inputs = row_inputs()
    out = interpreted[f"rows/{walk}"]
    assert out.shape[0] == len(ROW_KINDS)
    for b in range(len(ROW_KINDS)):
        assert_close(out[b], tree_gdn_reference(**{key: x[b] for key, x in inputs.items()}), torch.float32)


def test_rows_refuse_unbatched_shapes():
    from specdec.kernels.tree_gdn import tree_gdn_rows

    with pytest.raises(ValueError, match=r"q \[B, N, HV, K\] and parents \[B, N\]"):
        tree_gdn_rows(**make_inputs(Case(3, 2, 16, 16, "chain")))


@pytest.mark.interpreter
@pytest.mark.parametrize(
    "case, walk", [(c, w) for c in TRITON_CASES for w in walks_for(c)], ids=lambda x: getattr(x, "id", x)
)
def test_triton_interpreted_matches_reference(case, walk, interpreted):
    inputs = make_inputs(case)
    out = interpreted[f"{case.id}/{walk}"]
    assert not out.isnan().any()
    assert_close(out, tree_gdn_reference(**inputs), case.dtype)
    assert_close(out, path_output(inputs) if case.tree == "forest" else level_scan_output(inputs), case.dtype)
    assert torch.equal(interpreted[case.id + "/init_state"], inputs["init_state"])


def test_auto_walk_follows_the_node_count_and_the_programs():
    from specdec.kernels.tree_gdn import triton as kernels

    def walks(hv: int, v: int, sizes) -> list[str]:
        calls = []
        with mock.patch.object(kernels, "_tree_gdn", side_effect=lambda *a, **kw: calls.append(kw["walk"])):
            for n in sizes:
                kernels.tree_gdn_triton(**make_inputs(Case(n, hv, 16, v, "random")))
        return calls

    hi, paths_max = kernels.CHUNK_MAX_NODES, kernels.PATHS_MAX_NODES
    sizes = (1, 15, 16, 17, 32, 33, hi, hi + 1, paths_max, paths_max + 1)
    # 64 value heads x 1 value block, 32 x 2: enough programs for the matrix form; 32 x 1: too few
    tree = ["paths", "paths", "chunk", "paths", "paths", "chunk", "chunk", "paths", "paths", "nodes"]
    assert walks(64, 16, sizes) == tree
    assert walks(32, 64, (16, 32, 33, hi)) == ["chunk", "paths", "chunk", "chunk"]
    assert walks(32, 32, sizes) == ["paths"] * 9 + ["nodes"]
    with mock.patch.object(kernels, "TREE_WALK", "paths"):
        assert walks(64, 16, (16, hi)) == ["paths", "paths"]
    with mock.patch.object(kernels, "TREE_WALK", "chunk"):
        assert walks(1, 16, (1, 32, hi, hi + 1, paths_max + 1)) == ["chunk", "chunk", "chunk", "paths", "nodes"]
    # a GPU without TF32 tensor cores (before compute capability 8.0): no matrix form unless forced, fp32 products
    with mock.patch.object(kernels, "tensor_cores", return_value=False):
        assert walks(64, 16, (16, hi)) == ["paths", "paths"]
        with mock.patch.object(kernels, "TREE_WALK", "chunk"):
            assert walks(64, 16, (16,)) == ["chunk"]
        precisions = []
        with mock.patch.object(kernels, "_tree_gdn", side_effect=lambda *a, **kw: precisions.append(kw["precision"])):
            kernels.tree_gdn_triton(**make_inputs(Case(16, 4, 16, 16, "random")), walk="chunk")
        assert precisions == ["ieee"]
        for precision in ("tf32x3", "tf32"):
            with pytest.raises(ValueError, match="TF32 tensor cores"):
                kernels.tree_gdn_triton(**make_inputs(Case(16, 4, 16, 16, "random")), walk="chunk", precision=precision)
    with pytest.raises(ValueError, match="walk="):
        kernels.tree_gdn_triton(**make_inputs(Case(3, 1, 16, 16, "chain")), walk="levels")
    with pytest.raises(ValueError, match="up to 64 nodes"):
        kernels.tree_gdn_triton(**make_inputs(Case(65, 1, 16, 16, "random")), walk="chunk")
    with pytest.raises(ValueError, match="precision="):
        kernels.tree_gdn_triton(**make_inputs(Case(3, 1, 16, 16, "chain")), walk="chunk", precision="bf16")


def test_the_matrix_form_takes_1_pass_tf32_products_for_bf16_values():
    from specdec.kernels.tree_gdn import triton as kernels

    def run(dtype: torch.dtype, n: int = 16, hv: int = 64, **kw) -> dict:
        with mock.patch.object(kernels, "_tree_gdn") as launch:
            kernels.tree_gdn_triton(**make_inputs(Case(n, hv, 16, 16, "random", dtype=dtype)), **kw)
        return launch.call_args.kwargs

    assert [run(dtype)["precision"] for dtype in (torch.bfloat16, torch.float16, torch.float32)] == [
        "tf32",
        "tf32x3",
        "tf32x3",
    ]
    assert run(torch.bfloat16, precision="tf32x3")["precision"] == "tf32x3"  # an explicit precision wins
    # SPECDEC_TREE_GDN_PRECISION overrides the dtype's choice; without TF32 tensor cores: fp32 products
    for setting, expected in (("auto", "tf32"), ("tf32x3", "tf32x3"), ("tf32", "tf32"), ("ieee", "ieee")):
        with mock.patch.object(kernels, "TREE_PRECISION", setting):
            assert run(torch.bfloat16, walk="chunk")["precision"] == expected, setting
    with mock.patch.object(kernels, "tensor_cores", return_value=False):
        assert run(torch.bfloat16, walk="chunk")["precision"] == "ieee"
    # on 1-pass products the matrix form also takes 17-32-node trees (2.0-6.2 x the path schedule's speed, 8B shape)
    walks = {n: (run(torch.bfloat16, n)["walk"], run(torch.float32, n)["walk"]) for n in (15, 16, 17, 32, 33, 64, 65)}
    assert walks == {15: ("paths", "paths"), 16: ("chunk", "chunk"), 17: ("chunk", "paths"), 32: ("chunk", "paths"),
                     33: ("chunk", "chunk"), 64: ("chunk", "chunk"), 65: ("paths", "paths")}  # fmt: skip


def test_the_matrix_form_squares_the_parent_relation_from_33_nodes():
    # bench_tree_gdn.py --providers chunk-walk-graph chunk-squaring-graph at the 8B shape on an H200: the squaring
    # faster at 64 nodes on every tree, slower at 16 and 32 on 2-8-deep ones (docs/kernels.md)
    from specdec.kernels.tree_gdn import triton as kernels

    calls = []
    with mock.patch.object(kernels, "_tree_gdn", side_effect=lambda *a, **kw: calls.append(kw["ancestry"])):
        for n in (1, 16, 32, 33, 64):
            kernels.tree_gdn_triton(**make_inputs(Case(n, 4, 16, 16, "random")), walk="chunk")
    assert calls == ["walk", "walk", "walk", "squaring", "squaring"]


# The faster schedule per tree size inside the 8B hybrid's verify (HV 32, V 128; the 8B hybrid shape of
# `python -m specdec bench +experiment=shape-8b` [--draft peaked] [--compile], H200, fe588d4 / f8cdd59): the matrix
# form is faster at 16 and 64 nodes on deep trees
# and within noise on shallow ones, and at 32 nodes no faster on deep and slower on shallow trees. The zoo hybrid
# (HV 8, V 64) and the 27B-like layer (HV 48) as measured by bench_tree_gdn.py on DDTree trees (db37916).
TREE_BENCH = {(8, 64, 16): "paths", (8, 64, 32): "paths", (8, 64, 64): "paths",
              (32, 128, 16): "chunk", (32, 128, 32): "paths", (32, 128, 64): "chunk",
              (48, 128, 16): "chunk", (48, 128, 64): "chunk"}  # fmt: skip


# The same on 1-pass TF32 products (bench_tree_gdn.py --providers paths-graph chunk-tf32-graph --trees best-flat
# best-peaked, H200, 029dc94; the 64-node verify of the same shape, compiled): the zoo
# hybrid's 16 programs keep the path schedule (faster on the flat trees at every size), the 8B and 27B layers take
# the matrix form at every size (2.0-6.2 x faster on the 8B layer).
TREE_BENCH_TF32 = {(8, 64, 16): "paths", (8, 64, 32): "paths", (8, 64, 64): "paths",
                   (32, 128, 16): "chunk", (32, 128, 32): "chunk", (32, 128, 64): "chunk",
                   (48, 128, 16): "chunk", (48, 128, 32): "chunk", (48, 128, 64): "chunk"}  # fmt: skip


def test_auto_walk_picks_the_measured_faster_schedule_on_trees():
    from specdec.kernels.tree_gdn.triton import auto_walk

    assert {key: auto_walk(key[2], key[0], key[1]) for key in TREE_BENCH} == TREE_BENCH
    assert {key: auto_walk(key[2], key[0], key[1], precision="tf32") for key in TREE_BENCH_TF32} == (TREE_BENCH_TF32)


# The matrix form's tiles at the 8B shape, as measured by bench_tree_gdn.py --chunk-sweep on an H200 (db37916):
# nodes -> {(BLOCK_N, BLOCK_V, warps): (µs on the flat, µs on the peaked DDTree)}; configurations over 120 µs in
# all (2-warp 64-row tiles, which spill; 8-warp 32-row tiles) left out.
CHUNK_SWEEP = {
    16: {
        (16, 16, 2): (15.7, 20.8), (16, 16, 4): (26.0, 31.8), (16, 16, 8): (37.1, 50.1), (16, 32, 2): (9.0, 14.2),
        (16, 32, 4): (7.1, 11.4), (16, 32, 8): (9.0, 13.7), (16, 64, 2): (14.0, 21.2), (16, 64, 4): (9.5, 14.6),
        (16, 64, 8): (9.0, 14.1), (32, 16, 2): (37.9, 44.9), (32, 32, 2): (48.0, 51.6), (32, 32, 4): (46.8, 54.0),
        (32, 64, 4): (18.8, 27.1), (32, 64, 8): (21.2, 28.2), (64, 16, 4): (23.2, 42.8), (64, 32, 4): (18.3, 34.4),
        (64, 32, 8): (29.2, 51.2), (64, 64, 4): (26.0, 46.4), (64, 64, 8): (32.5, 59.0),
    },
    32: {
        (32, 16, 2): (39.9, 46.6), (32, 32, 2): (46.8, 52.8), (32, 32, 4): (48.4, 55.9), (32, 64, 4): (19.9, 28.3),
        (32, 64, 8): (21.7, 29.3), (64, 16, 4): (25.2, 45.0), (64, 32, 4): (19.8, 36.0), (64, 32, 8): (31.2, 53.4),
        (64, 64, 4): (27.9, 48.4), (64, 64, 8): (34.9, 61.5),
    },
    64: {
        (64, 16, 4): (26.4, 45.7), (64, 32, 4): (20.6, 36.5), (64, 32, 8): (32.3, 54.2), (64, 64, 4): (28.5, 48.8),
        (64, 64, 8): (35.6, 61.9),
    },
}  # fmt: skip


def test_chunk_config_is_the_measured_fastest_on_both_trees():
    from specdec.kernels.tree_gdn.triton import chunk_config

    for n, times in CHUNK_SWEEP.items():
        assert chunk_config(n) == min(times, key=lambda config: sum(times[config])), n


# The faster schedule on chains, as measured by bench_tree_gdn.py on an H200 (docs/kernels.md, 95b3174):
# (value heads, nodes) -> the schedule with the lower graph-replayed time per layer.
CHAIN_BENCH = {(8, 16): "paths", (8, 32): "paths", (8, 64): "nodes", (8, 128): "nodes",
               (32, 16): "nodes", (32, 32): "nodes", (32, 64): "nodes", (32, 128): "nodes",
               (48, 16): "nodes", (48, 32): "nodes", (48, 64): "nodes", (48, 128): "nodes"}  # fmt: skip


def test_chain_walk_picks_the_measured_faster_schedule():
    from specdec.kernels.tree_gdn import chain_walk

    assert {(heads, n): chain_walk(n, heads) for heads, n in CHAIN_BENCH} == CHAIN_BENCH


def test_auto_on_cpu_is_the_reference():
    inputs = make_inputs(Case(9, 2, 16, 16, "random"))
    assert torch.equal(tree_gdn(**inputs), tree_gdn_reference(**inputs))
    assert torch.equal(tree_gdn(**inputs, impl="torch"), tree_gdn_reference(**inputs))


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(impl="cuda"), "impl="),
        (dict(v=torch.zeros(4, 2, 16)), "v must be"),
        (dict(beta=torch.zeros(5, 3)), "beta must be"),
        (dict(k=torch.zeros(5, 3, 16)), "k must be"),
        (dict(parents=torch.tensor([-1, 0, 1, 3, 0])), "parents"),
    ],
    ids=["impl", "v", "beta", "grouped-k", "parents"],
)
def test_errors(change, match):
    inputs = make_inputs(Case(5, 2, 16, 16, "random"))
    with pytest.raises(ValueError, match=match):
        tree_gdn(**{**inputs, **change})


@pytest.mark.skipif("TRITON_INTERPRET" in os.environ, reason="checks the error without the interpreter")
def test_triton_on_cpu_is_refused():
    with pytest.raises(ValueError, match="GPU"):
        tree_gdn(**make_inputs(Case(3, 1, 16, 16, "chain")), impl="triton")


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CASES, ids=lambda c: c.id)
def test_triton_gpu_matches_reference(case):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    # kernel_harness is imported here, not at the top: this file also runs as a script (the interpreted cases) with
    # the repo on its path, not tests/
    from kernel_harness import assert_within_bf16_rounding, one_pass_tf32

    from specdec.kernels.tree_gdn.triton import tree_gdn_triton

    inputs = make_inputs(case, device=torch.device("cuda"))
    before = inputs["init_state"].clone()
    default = tree_gdn(**inputs, impl="triton")
    assert not default.isnan().any()
    assert torch.equal(tree_gdn(**inputs), default)  # auto picks Triton on CUDA
    # where the default runs the matrix form on 1-pass TF32 products (bf16 values), it is held to bf16 rounding
    # (as in the test below); everything else, and the 3-pass products in its place, to 1e-5
    out = tree_gdn_triton(**inputs, precision="tf32x3")
    if one_pass_tf32(case.n, case.hv, case.v, case.dtype):
        assert_within_bf16_rounding(default.cpu(), tree_gdn_reference(**make_inputs(case)))
    else:
        assert torch.equal(out, default)
    assert_close(out, tree_gdn(**inputs, impl="torch"), case.dtype)
    assert_close(out.cpu(), tree_gdn_reference(**make_inputs(case)), case.dtype)
    for walk in walks_for(case):
        assert_close(tree_gdn_triton(**inputs, walk=walk, precision="tf32x3"), out, case.dtype)
    if case.n <= 64:  # the matrix form with fp32 products too
        assert_close(tree_gdn_triton(**inputs, walk="chunk", precision="ieee"), out, case.dtype)
    assert torch.equal(inputs["init_state"], before)


@pytest.mark.gpu
@pytest.mark.parametrize("case", [c for c in GPU_CASES if 16 <= c.n <= 64], ids=lambda c: c.id)
def test_one_pass_tf32_errs_less_than_rounding_to_bf16(case):
    """``precision="tf32"`` (the default for bf16 values, whatever the case's dtype here): the matrix form's outputs
    stay closer to the fp32 reference than that reference rounded to bf16, the precision a bf16 model keeps."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    from kernel_harness import assert_within_bf16_rounding

    from specdec.kernels.tree_gdn.triton import tree_gdn_triton

    out = tree_gdn_triton(**make_inputs(case, device=torch.device("cuda")), walk="chunk", precision="tf32").cpu()
    assert_within_bf16_rounding(out, tree_gdn_reference(**make_inputs(case)))


# -- gdn_path_replay: the commit's replay of the accepted path ------------------------------------------------
PATH_CASES = [Case(n, hv, kd, vd, tree, h=h) for n, hv, h, kd, vd, tree in (
    (1, 2, 0, 16, 16, "chain"), (9, 4, 2, 32, 16, "random"), (17, 2, 1, 16, 48, "deep"), (33, 4, 0, 64, 32, "chain"),
)] + [Case(12, 4, 32, 32, "deep", h=2, dtype=torch.bfloat16)]  # fmt: skip


def make_path(case: Case, inputs: dict, seed: int) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """A root-to-node path of the case's tree, padded to the tree's depth + 1 by repeating its last node."""
    parents = inputs["parents"].tolist()
    gen = torch.Generator().manual_seed(seed)
    node = int(torch.randint(0, case.n, (1,), generator=gen))
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    path = path[::-1]
    depth = [0] * case.n
    for i in range(1, case.n):
        depth[i] = depth[parents[i]] + 1
    padded = path + [path[-1]] * (max(depth) + 1 - len(path))
    return torch.tensor(padded), torch.tensor(len(path)), path


def path_state_oracle(inputs: dict, path: list[int]) -> torch.Tensor:
    """Oracle: the state after the path's nodes, one ``gdn_step`` per node (host loop over the real nodes only)."""
    k = inputs["k"].repeat_interleave(inputs["q"].shape[1] // inputs["k"].shape[1], dim=1)
    state = inputs["init_state"][None].float()
    for j in path:
        s = slice(j, j + 1)
        state = gdn_step(state, k[s], inputs["v"][s].float(), inputs["log_decay"][s], inputs["beta"][s])
    return state[0]


def replay_args(inputs: dict, path: torch.Tensor, num: torch.Tensor) -> tuple:
    state = inputs["init_state"].float().clone()
    return state, inputs["k"], inputs["v"], inputs["log_decay"], inputs["beta"], path, num


@pytest.mark.parametrize("case", PATH_CASES, ids=lambda c: c.id)
def test_path_replay_reference_matches_node_by_node(case):
    inputs = make_inputs(case)
    for seed in range(4):
        path, num, real = make_path(case, inputs, seed)
        args = replay_args(inputs, path, num)
        gdn_path_replay(*args)  # auto on CPU: the reference
        assert_close(args[0], path_state_oracle(inputs, real), case.dtype)
        if len(real) < path.numel():  # the padding steps are masked out, not replayed
            assert not torch.allclose(args[0], path_state_oracle(inputs, path.tolist()))


@pytest.mark.interpreter
@pytest.mark.parametrize("case", PATH_CASES, ids=lambda c: c.id)
def test_path_replay_triton_interpreted_matches_node_by_node(case, interpreted):
    inputs = make_inputs(case)
    for seed in range(4):
        _, _, real = make_path(case, inputs, seed)
        assert_close(interpreted[f"{case.id}/path{seed}"], path_state_oracle(inputs, real), case.dtype)


def batched_replay(case: Case) -> tuple:
    """Three sequences' commits through one stash: each row its own state (scaled copies) and its own path."""
    inputs = make_inputs(case)
    made = [make_path(case, inputs, seed) for seed in range(3)]
    states = torch.stack([inputs["init_state"].float() * (1 + 0.5 * r) for r in range(3)])
    paths, nums = torch.stack([m[0] for m in made]), torch.stack([m[1] for m in made])
    return inputs, states, paths, nums, [m[2] for m in made]


def check_batched_replay(case: Case, out: torch.Tensor) -> None:
    inputs, states, _, _, reals = batched_replay(case)
    for r, real in enumerate(reals):
        alone = dict(inputs, init_state=states[r])
        assert_close(out[r], path_state_oracle(alone, real), case.dtype)


@pytest.mark.parametrize("case", PATH_CASES[1:3], ids=lambda c: c.id)
def test_path_replay_of_a_batch_equals_each_row_alone(case):
    inputs, states, paths, nums, _ = batched_replay(case)
    gdn_path_replay(states, inputs["k"], inputs["v"], inputs["log_decay"], inputs["beta"], paths, nums)
    check_batched_replay(case, states)
    with pytest.raises(ValueError, match=r"path \[B, P\] and num_path \[B\]"):
        gdn_path_replay(states, inputs["k"], inputs["v"], inputs["log_decay"], inputs["beta"], paths[0], nums)


@pytest.mark.interpreter
@pytest.mark.parametrize("case", PATH_CASES[1:3], ids=lambda c: c.id)
def test_path_replay_of_a_batch_interpreted_equals_each_row_alone(case, interpreted):
    check_batched_replay(case, interpreted[f"{case.id}/batched"])


def test_path_replay_errors():
    inputs = make_inputs(Case(5, 2, 16, 16, "chain"))
    path, num, _ = make_path(Case(5, 2, 16, 16, "chain"), inputs, 0)
    state, *rest = replay_args(inputs, path, num)
    with pytest.raises(ValueError, match="fp32"):
        gdn_path_replay(state.double(), *rest)
    with pytest.raises(ValueError, match="impl="):
        gdn_path_replay(state, *rest, impl="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("case", [*PATH_CASES, Case(64, 32, 128, 128, "deep", h=16, dtype=torch.bfloat16)],
                         ids=lambda c: c.id)  # fmt: skip
def test_path_replay_triton_gpu_matches_reference(case):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    inputs = make_inputs(case, device=torch.device("cuda"))
    for seed in range(4):
        path, num, real = make_path(case, make_inputs(case), seed)
        args = replay_args(inputs, path.cuda(), num.cuda())
        gdn_path_replay(*args, impl="triton")
        assert_close(args[0].cpu(), path_state_oracle(make_inputs(case), real), case.dtype)


def _run_interpreted(path: str) -> None:
    """Subprocess entry: kernel outputs of ``TRITON_CASES`` through the interpreter, saved to ``path``."""
    from specdec.kernels.tree_gdn.triton import _tree_gdn, gdn_path_replay_triton, tree_gdn_triton
    from tests.kernel_harness import poison_empty  # the repo is on this subprocess's path, tests/ is not

    poison_empty()
    results = {}
    for case in TRITON_CASES:
        inputs = make_inputs(case)
        for walk in walks_for(case):
            if case.block_v:
                results[f"{case.id}/{walk}"] = _tree_gdn(**inputs, block_v=case.block_v, num_warps=1, walk=walk)
            else:
                results[f"{case.id}/{walk}"] = tree_gdn_triton(**inputs, walk=walk)
        results[case.id + "/init_state"] = inputs["init_state"]
    from specdec.kernels.tree_gdn import tree_gdn_rows

    for walk in ("paths", "nodes", "chunk"):
        results[f"rows/{walk}"] = tree_gdn_rows(**row_inputs(), impl="triton", walk=walk)
    for case in PATH_CASES:
        inputs = make_inputs(case)
        for seed in range(4):
            args = replay_args(inputs, *make_path(case, inputs, seed)[:2])
            gdn_path_replay_triton(*args)
            results[f"{case.id}/path{seed}"] = args[0]
    for case in PATH_CASES[1:3]:
        inputs, states, paths, nums, _ = batched_replay(case)
        gdn_path_replay_triton(states, inputs["k"], inputs["v"], inputs["log_decay"], inputs["beta"], paths, nums)
        results[f"{case.id}/batched"] = states
    torch.save(results, path)


if __name__ == "__main__":
    _run_interpreted(sys.argv[1])
