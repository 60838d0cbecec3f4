"""Shared by the kernel tests: Triton's interpreter in a subprocess, and a strict CUDA-graph capture.

``TRITON_INTERPRET=1`` has to be set before Triton is imported, so the kernel tests save their cases to a folder,
run their own file as a script there with the interpreter on, and load the outputs it wrote. Those tests form the
``interpreter`` tier (``make test-interpreter``; not in the default ``make test``): they run a subset of the cases
that the GPU tests compile, picked by :func:`cover`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Hashable, Iterable, Sequence
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]


def cover(cases: Sequence, features: Callable[[object], Iterable[Hashable]], cost: Callable[[object], float],
          *, times: int = 1) -> list:
    """The cheap subset of ``cases`` for the interpreter: greedily the case that adds the most not yet covered
    features per unit of ``cost`` (interpreter work), until every feature of any case is held by ``times`` picked
    cases (or by all that have it). Returns the picked cases in their original order."""
    feats = [set(features(c)) for c in cases]
    need = {f: min(times, sum(f in fs for fs in feats)) for fs in feats for f in fs}
    picked: list[int] = []
    while any(need.values()):
        gain = [(sum(need.get(f, 0) > 0 for f in fs) / max(cost(c), 1e-9), -i) if i not in picked else (-1.0, 0)
                for i, (c, fs) in enumerate(zip(cases, feats, strict=True))]  # fmt: skip
        best = -max(gain)[1]
        picked.append(best)
        for f in feats[best]:
            need[f] = max(need[f] - 1, 0)
    return [cases[i] for i in sorted(picked)]


def run_interpreted(script: str | Path, folder: Path, *, timeout: int = 600) -> None:
    """Run ``python script folder`` with ``TRITON_INTERPRET=1`` and the repo and ``tests/`` importable."""
    env = {
        **os.environ,
        "TRITON_INTERPRET": "1",
        "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests"), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run(
        [sys.executable, str(script), str(folder)], env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, proc.stderr[-4000:]


SPLIT_PROGRAMS = 4
"""The split programs the attention kernel aims for in the decodes run through the interpreter (a GPU's plan aims
for one per SM, ``tree_attention.triton._TARGET_PROGRAMS``). The interpreter runs a launch's programs one after
another, most of them past a short span's last tile, and those took half of such a decode's time; two chunks per
group still run the combine over several partial states. The kernel's own tests keep the GPU's plans."""


def run_code_interpreted(code: str, *paths: Path, timeout: int = 600) -> None:
    """Run the Python ``code`` with ``TRITON_INTERPRET=1``, ``paths`` first on ``sys.path`` (given to it as
    ``sys.argv[1:]``) and the attention kernel aiming for :data:`SPLIT_PROGRAMS` programs, and assert that it
    succeeds (its stderr's tail otherwise)."""
    prelude = (
        "import sys; sys.path[:0] = sys.argv[1:]\n"
        f"import specdec.kernels.tree_attention.triton as _plan; _plan._TARGET_PROGRAMS = {SPLIT_PROGRAMS}\n"
    )
    proc = subprocess.run([sys.executable, "-c", prelude + code, *map(str, paths)],
                          env={**os.environ, "TRITON_INTERPRET": "1"}, capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]


def run_lines_interpreted(*lines: str, folders: Iterable[str] = ()) -> None:
    """The statements ``lines`` run by Triton's interpreter in a subprocess (:func:`run_code_interpreted`), with
    ``tests/`` and ``tests/<folder>`` for each of ``folders`` first on ``sys.path``; skipped where Triton is absent."""
    import pytest

    pytest.importorskip("triton")
    tests = Path(__file__).resolve().parent
    run_code_interpreted("\n".join(lines) + "\n", tests, *(tests / folder for folder in folders))


def interpreted_outputs(script: str | Path, folder: Path, data: dict) -> dict:
    """Save ``data`` (the cases) to ``folder/cases.pt``, run ``script`` on it under the interpreter
    (:func:`run_interpreted`; the script writes ``folder/outputs.pt``) and return ``data`` merged with those
    outputs: the body of every kernel test's module-scoped ``interpreted`` fixture."""
    torch.save(data, folder / "cases.pt")
    run_interpreted(script, folder)
    return {**data, **torch.load(folder / "outputs.pt")}


def capture_without_host_reads(step):
    """Run ``step()`` once on a side stream (compilation), then capture it in a CUDA graph with host syncs made
    errors; returns ``(graph, outputs of the captured call)``."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()  # compile outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    torch.cuda.set_sync_debug_mode("error")  # a host read would raise here
    try:
        with torch.cuda.graph(graph):
            out = step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return graph, out


def check_replays(cases: list[dict], bases: tuple[str, ...], call, check) -> None:
    """Capture ``call(static)`` once (:func:`capture_without_host_reads`), ``static`` being the first case with its
    ``bases`` tensors copied to CUDA (the captured call reads views of them); then for every case copy its ``bases``
    into those buffers, replay, and ``check(case, output)``."""
    static = {**cases[0], **{name: cases[0][name].to("cuda") for name in bases}}
    graph, out = capture_without_host_reads(lambda: call(static))
    for case in cases:
        for name in bases:
            static[name].copy_(case[name])
        graph.replay()
        check(case, out.clone())


def poison_empty(int_fill: int | None = None) -> None:
    """From now on ``torch.empty`` fills float tensors with NaN (integer ones with ``int_fill``, if given), so an
    output element a kernel never writes shows up. For the interpreter subprocess of a kernel test only."""
    empty = torch.empty

    def poisoned(*args, **kwargs):
        t = empty(*args, **kwargs)
        if t.is_floating_point():
            return t.fill_(float("nan"))
        return t if int_fill is None else t.fill_(int_fill)

    torch.empty = poisoned


def assert_within_bf16_rounding(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """``actual`` errs from the fp32 ``expected`` by no more than rounding ``expected`` to bf16 does (max abs): the
    bound for kernels whose outputs a bf16 model rounds to bf16 anyway."""
    assert not actual.isnan().any()
    error = (actual - expected).abs().max()
    rounding = (expected.bfloat16().float() - expected).abs().max()
    assert error <= rounding, f"error {error:.3g} > bf16 rounding {rounding:.3g}"


def one_pass_tf32(num_nodes: int, value_heads: int, value_dim: int, dtype: torch.dtype) -> bool:
    """Whether ``tree_gdn``'s default on a CUDA device with TF32 tensor cores runs the matrix form on 1-pass TF32
    products for such a call (``default_precision`` and ``auto_walk``)."""
    from specdec.kernels.tree_gdn.triton import auto_walk, default_precision

    precision = default_precision(dtype)
    return precision == "tf32" and auto_walk(num_nodes, value_heads, value_dim, precision=precision) == "chunk"


def assert_norm_close(got: torch.Tensor, want: torch.Tensor) -> None:
    """A norm's output against another summation order's (the reference, or another kernel compiled on a GPU):
    fp32 within rtol 2e-6; a half-precision output within one ulp of ``want`` and at least 99 % equal (a rounding
    neighbour where two fp32 sums of squares differ in their last bit). A wrong eps, weight or formula is far outside
    that."""
    got, want = got.cpu(), want.cpu()
    assert got.dtype == want.dtype and got.shape == want.shape
    if want.dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=2e-6, atol=1e-6)
        return
    ulp = (want.float().abs() * 2.0 ** -(7 if want.dtype == torch.bfloat16 else 10)).clamp(min=1e-30)
    assert ((got.float() - want.float()).abs() <= ulp * 1.01).all()
    assert (got == want).float().mean() >= 0.99


def topk_score_rows(vocab: int, n: int, seed: int) -> torch.Tensor:
    """``n >= 10`` fp32 rows of ``vocab`` scores for top-k selections: random; ties from four levels; a third -inf;
    all -inf; signed zeros under a few ones; all negative; fewer finite entries than most ``k``; extremes and
    subnormals; neighbouring floats (their keys one apart); the rest rounded to bf16 (many ties)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, vocab, generator=gen) * 3
    x[1] = torch.randint(0, 4, (vocab,), generator=gen).float() - 1.5
    x[2, torch.randperm(vocab, generator=gen)[: vocab // 3]] = float("-inf")
    x[3] = float("-inf")
    x[4] = torch.where(torch.rand(vocab, generator=gen) < 0.5, -0.0, 0.0)
    x[4, : max(vocab // 50, 1)] = 1.0
    x[5] = -x[5].abs()
    x[6] = float("-inf")
    x[6, : min(3, vocab)] = torch.tensor([2.0, -1.0, 2.0])[: min(3, vocab)]
    picks = torch.tensor([3e38, -3e38, 1e-45, -1e-45, 1e-40, -1e-40, 0.0, -0.0])
    x[7] = picks[torch.randint(0, len(picks), (vocab,), generator=gen)]
    near = (torch.tensor(1.5).view(torch.int32) + torch.arange(4, dtype=torch.int32)).view(torch.float32)
    x[8] = near[torch.randint(0, 4, (vocab,), generator=gen)]
    x[9:] = x[9:].bfloat16().float()
    return x


def route_gated_to_reference(monkeypatch, calls: list) -> None:
    """Make ``gate_up_silu`` take its ``gated_linear`` path on the CPU, computed by the reference (each call
    appended to ``calls``)."""
    from specdec.kernels import grouped_linear
    from specdec.kernels.grouped_linear import routing

    def reference(x, w_gate, w_up, b_gate=None, b_up=None, *, impl):
        calls.append(impl)
        return grouped_linear.gated_linear_reference(x, w_gate, w_up, b_gate, b_up)

    monkeypatch.setattr(routing, "projection_kernel_for", lambda device: True)
    monkeypatch.setattr(routing, "_kernels_take", lambda x, weights: True)
    monkeypatch.setattr(grouped_linear, "gated_linear", reference)
