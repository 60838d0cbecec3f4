"""``kv_write``: the reference against a row-by-row brute force (one sequence and several, states as the HF layers
hand them over: a transposed view), the Triton version through the interpreter and compiled on CUDA equal to it bit
for bit (a copy) on stores that are views of the round's six-dimensional storage, slots never written left as they
were, the argument checks, and a planted bug (the slots of row 0 used for every row) that the comparison catches."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from kernel_harness import capture_without_host_reads, interpreted_outputs

from specdec.kernels.kv_write import fits_triton, kv_write

# (sequences, kv heads, new rows, head dim, capacity, dtype)
SPECS = [
    (1, 8, 1, 128, 64, torch.bfloat16),  # an 8 B AR step
    (1, 2, 33, 64, 80, torch.float32),  # a zoo tree of 33 nodes
    (3, 4, 5, 256, 40, torch.bfloat16),  # several sequences, the hybrid's head dim
    (2, 3, 7, 48, 30, torch.float16),  # no powers of two
]


def make_case(seed: int, rows, heads, n, dim, capacity, dtype) -> dict:
    gen = torch.Generator().manual_seed(seed)
    storage = torch.randn(2, 2, rows, heads, capacity, dim, generator=gen).to(dtype)  # [L, 2, B, H, cap, D]
    # each row's slots: distinct, in any order
    index = torch.stack([torch.randperm(capacity, generator=gen)[:n] for _ in range(rows)])
    # the layers hand over [B, N, H, D] projections transposed to [B, H, N, D]
    k = torch.randn(rows, n, heads, dim, generator=gen).to(dtype).transpose(1, 2)
    v = torch.randn(rows, n, heads, dim, generator=gen).to(dtype).transpose(1, 2)
    return dict(storage=storage, index=index, k=k, v=v)


def cases() -> list[dict]:
    return [make_case(i, *spec) for i, spec in enumerate(SPECS)]


def brute_force(case: dict) -> torch.Tensor:
    """Layer 1's keys and values written row by row, slot by slot."""
    out = case["storage"].clone()
    for b in range(case["index"].shape[0]):
        for n, slot in enumerate(case["index"][b].tolist()):
            out[1, 0, b, :, slot] = case["k"][b, :, n]
            out[1, 1, b, :, slot] = case["v"][b, :, n]
    return out


def run(case: dict, device: str = "cpu", **kw) -> torch.Tensor:
    storage = case["storage"].clone().to(device)
    kv_write(storage[1, 0], storage[1, 1], case["index"].to(device), case["k"].to(device), case["v"].to(device), **kw)
    return storage


def test_reference_equals_the_brute_force():
    for case in cases():
        assert torch.equal(run(case), brute_force(case))


def test_the_slots_of_the_first_row_for_every_row_fail_the_check():
    case = cases()[2]
    wrong = dict(case, index=case["index"][:1].expand_as(case["index"]))
    assert not torch.equal(run(wrong), brute_force(case))


def test_fits_and_refusals():
    case = cases()[2]
    keys, values = case["storage"][1, 0], case["storage"][1, 1]
    args = (keys, values, case["index"], case["k"], case["v"])
    assert fits_triton(*args)
    assert not fits_triton(keys, values, case["index"], case["k"].float(), case["v"].float())  # a cast on the way
    assert not fits_triton(keys, values, case["index"].int(), case["k"], case["v"])
    assert not fits_triton(keys, values, case["index"][:, :2], case["k"], case["v"])
    with pytest.raises(ValueError, match="impl='triton' takes stores"):
        kv_write(keys, values, case["index"].int(), case["k"], case["v"], impl="triton")
    store = case["storage"].clone()  # a cast on the way: the reference writes the rounded rows
    kv_write(store[1, 0], store[1, 1], case["index"], case["k"].float(), case["v"].float())
    assert torch.equal(store, brute_force(case))


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory) -> dict:
    pytest.importorskip("triton")
    return interpreted_outputs(__file__, tmp_path_factory.mktemp("kv_write"), {"cases": cases()})


@pytest.mark.interpreter
def test_interpreted_equals_the_reference_bit_for_bit(interpreted):
    for case, got in zip(interpreted["cases"], interpreted["outputs"], strict=True):
        assert torch.equal(got, brute_force(case))


def _run_interpreted(folder: Path) -> None:
    data = torch.load(folder / "cases.pt")
    torch.save({"outputs": [run(c, impl="triton") for c in data["cases"]]}, folder / "outputs.pt")


@pytest.mark.gpu
def test_compiled_equals_the_reference_on_cuda_and_replays():
    for case in cases():
        assert torch.equal(run(case, "cuda", impl="triton").cpu(), brute_force(case))
        assert torch.equal(run(case, "cuda").cpu(), brute_force(case))  # auto: Triton on CUDA
    case = cases()[2]
    storage = case["storage"].clone().cuda()
    args = (storage[1, 0], storage[1, 1], case["index"].cuda(), case["k"].cuda(), case["v"].cuda())
    graph, _ = capture_without_host_reads(lambda: kv_write(*args))  # runs once, then captures
    storage.copy_(case["storage"])
    graph.replay()
    assert torch.equal(storage.cpu(), brute_force(case))


if __name__ == "__main__":
    _run_interpreted(Path(sys.argv[1]))
