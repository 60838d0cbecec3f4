"""``kv_commit``: the reference against a slot-by-slot brute force (one sequence and several, paths padded by
repeating their last node, paths whose sources overlap other steps' targets), the Triton version through the
interpreter and compiled on CUDA equal to it bit for bit (a copy), a replay from a CUDA graph, the argument checks,
and a planted bug (each row written back at its own source slot) that the comparison catches."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from kernel_harness import capture_without_host_reads, interpreted_outputs

from specdec.kernels.kv_commit import fits_triton, kv_commit

# (layers, sequences, kv heads, head dim, capacity, path length, dtype)
SPECS = [
    (8, 1, 2, 64, 96, 16, torch.bfloat16),  # the zoo dense target, a DDTree path of 16
    (3, 1, 8, 128, 40, 1, torch.float32),  # one token accepted: a no-op move
    (2, 3, 4, 256, 64, 7, torch.bfloat16),  # several sequences, the hybrid's head dim
    (4, 2, 3, 48, 90, 33, torch.float16),  # no powers of two, a long path
]


def _path(gen: torch.Generator, length: int, nodes: int) -> torch.Tensor:
    """An increasing path of ``real`` nodes from the root (node 0) among ``nodes``, padded to ``length`` by repeating
    its last node; sometimes a chain (path[p] = p: sources equal targets), sometimes sparse."""
    real = int(torch.randint(1, length + 1, (1,), generator=gen))
    if torch.rand(1, generator=gen) < 0.25:
        picked = torch.arange(real)
    else:
        picked = torch.cat([torch.zeros(1, dtype=torch.long), torch.randperm(nodes - 1, generator=gen)[: real - 1] + 1])
        picked = picked.sort().values
    return torch.cat([picked, picked[-1:].expand(length - real)])


def make_case(seed: int, layers, batch, heads, dim, capacity, length, dtype) -> dict:
    gen = torch.Generator().manual_seed(seed)
    kv = torch.randn(layers, 2, batch, heads, capacity, dim, generator=gen).to(dtype)
    nodes = max(length + 4, 2)
    prefix = torch.randint(0, capacity - nodes + 1, (batch,), generator=gen)
    path = torch.stack([_path(gen, length, nodes) for _ in range(batch)])
    return dict(kv=kv, prefix=prefix, path=path)


def cases() -> list[dict]:
    return [make_case(i, *spec) for i, spec in enumerate(SPECS)] + [make_case(10 + i, *SPECS[i % 4]) for i in range(8)]


def brute_force(case: dict) -> torch.Tensor:
    """Each sequence's path rows read (all of them first), then written slot by slot from ``prefix``."""
    out = case["kv"].clone()
    for b in range(out.shape[2]):
        start = int(case["prefix"][b])
        rows = [out[:, :, b, :, start + int(n)].clone() for n in case["path"][b]]
        for p, row in enumerate(rows):
            out[:, :, b, :, start + p] = row
    return out


def run(case: dict, device: str = "cpu", **kw) -> torch.Tensor:
    kv = case["kv"].clone().to(device)
    prefix, path = case["prefix"].to(device), case["path"].to(device)
    if kv.shape[2] == 1 and kw.pop("flat", False):
        prefix, path = prefix[0], path[0]  # one sequence: a 0-d prefix and a [P] path
    kv_commit(kv, prefix, path, **kw)
    return kv


def test_cases_move_overlapping_rows():
    # some step reads a slot an earlier step of the same sequence writes (the order of reads and writes matters)
    overlapping = 0
    for case in cases():
        for b in range(case["path"].shape[0]):
            path = case["path"][b].tolist()
            overlapping += any(src in range(p) for p, src in enumerate(path) if src != p)
    assert overlapping > 3


def test_reference_equals_the_brute_force():
    for case in cases():
        assert torch.equal(run(case), brute_force(case))
        if case["kv"].shape[2] == 1:
            assert torch.equal(run(case, flat=True), brute_force(case))


def test_rows_written_at_their_own_source_fail_the_check():
    case = cases()[0]
    wrong = case["kv"].clone()  # a "commit" that leaves every row where the verify wrote it
    assert not torch.equal(wrong, brute_force(case))


def test_fits_and_refusals():
    case = cases()[2]
    assert fits_triton(case["kv"], case["prefix"], case["path"])
    assert not fits_triton(case["kv"], case["prefix"].int(), case["path"])
    assert not fits_triton(case["kv"], case["prefix"][:1], case["path"])
    assert not fits_triton(case["kv"][0], case["prefix"], case["path"])
    with pytest.raises(ValueError, match="impl='triton' takes a"):
        kv_commit(case["kv"].clone(), case["prefix"].int(), case["path"], impl="triton")


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory) -> dict:
    pytest.importorskip("triton")
    return interpreted_outputs(__file__, tmp_path_factory.mktemp("kv_commit"), {"cases": cases()})


@pytest.mark.interpreter
def test_interpreted_equals_the_brute_force_bit_for_bit(interpreted):
    for case, got, flat in zip(interpreted["cases"], interpreted["outputs"], interpreted["flat"], strict=True):
        assert torch.equal(got, brute_force(case))
        assert flat is None or torch.equal(flat, brute_force(case))


def _run_interpreted(folder: Path) -> None:
    data = torch.load(folder / "cases.pt")
    out = {"outputs": [run(c, impl="triton") for c in data["cases"]],
           "flat": [run(c, impl="triton", flat=True) if c["kv"].shape[2] == 1 else None for c in data["cases"]]}
    torch.save(out, folder / "outputs.pt")


@pytest.mark.gpu
def test_compiled_equals_the_brute_force_on_cuda_and_replays():
    for case in cases():
        assert torch.equal(run(case, "cuda", impl="triton").cpu(), brute_force(case))
        assert torch.equal(run(case, "cuda").cpu(), brute_force(case))  # auto: Triton on CUDA
    case = cases()[2]
    kv = case["kv"].clone().cuda()
    prefix, path = case["prefix"].cuda(), case["path"].cuda()
    graph, _ = capture_without_host_reads(lambda: kv_commit(kv, prefix, path))  # runs once, then captures
    for other in cases()[2::4]:  # new paths and prefixes copied in before each replay
        kv.copy_(other["kv"])
        prefix.copy_(other["prefix"])
        path.copy_(other["path"])
        graph.replay()
        assert torch.equal(kv.cpu(), brute_force(other))


if __name__ == "__main__":
    _run_interpreted(Path(sys.argv[1]))
