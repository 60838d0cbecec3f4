"""``round_tail``: the reference against a row-by-row brute force (tree rounds with and without the tree's size,
plain decoding, inactive rows, one and many sequences), the Triton version through the interpreter and compiled on
CUDA equal to it (integers: bit for bit), a replay from a CUDA graph, the argument checks, and a planted bug (the
first accepted token taken as the root) that the comparison catches."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from kernel_harness import capture_without_host_reads, interpreted_outputs

from specdec.kernels.round_tail import fits_triton, round_tail

# (sequences, path length, output width, with num_path, with num_nodes)
SPECS = [(1, 16, 19, True, True), (5, 4, 7, True, True), (3, 9, 12, True, False), (70, 33, 36, True, True),
         (1, 1, 3, False, False), (40, 1, 1, False, False)]  # fmt: skip


def make_case(seed: int, batch, length, width, with_path, with_nodes) -> dict:
    gen = torch.Generator().manual_seed(seed)
    return dict(
        out=torch.full((batch, width), -7, dtype=torch.long),
        tokens=torch.randint(0, 50000, (batch, length), generator=gen),
        active=torch.rand(batch, generator=gen) < 0.7,
        root=torch.randint(0, 50000, (batch,), generator=gen),
        prefix=torch.randint(0, 4000, (batch,), generator=gen),
        num_path=torch.randint(1, length + 1, (batch,), generator=gen) if with_path else None,
        num_nodes=torch.randint(length, 4 * length, (batch,), generator=gen) if with_nodes else None,
    )


def cases() -> list[dict]:
    return [make_case(i, *spec) for i, spec in enumerate(SPECS)]


def brute_force(case: dict) -> tuple:
    out, root, prefix = case["out"].clone(), case["root"].clone(), case["prefix"].clone()
    length = case["tokens"].shape[1]
    for b in range(out.shape[0]):
        out[b, :length] = case["tokens"][b]
        num = 1 if case["num_path"] is None else int(case["num_path"][b])
        if case["num_path"] is not None:
            out[b, length] = num
            if case["num_nodes"] is not None:
                out[b, length + 1] = case["num_nodes"][b]
        if case["active"][b]:
            root[b] = case["tokens"][b, num - 1]
            prefix[b] += num
    return out, root, prefix


def run(case: dict, device: str = "cpu", **kw) -> tuple:
    on = {k: (v.clone().to(device) if v is not None else None) for k, v in case.items()}
    round_tail(on["out"], on["tokens"], on["active"], on["root"], on["prefix"], on["num_path"], on["num_nodes"], **kw)
    return on["out"].cpu(), on["root"].cpu(), on["prefix"].cpu()


def same(a: tuple, b: tuple) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_reference_equals_the_brute_force():
    for case in cases():
        assert same(run(case), brute_force(case))


def test_the_first_token_as_root_fails_the_check():
    case = cases()[1]
    wrong = dict(case, num_path=torch.ones_like(case["num_path"]))
    got = run(wrong)
    want = brute_force(case)
    assert not torch.equal(got[1], want[1])


def test_fits_and_refusals():
    c = cases()[1]
    args = (c["out"], c["tokens"], c["active"], c["root"], c["prefix"], c["num_path"], c["num_nodes"])
    assert fits_triton(*args)
    assert not fits_triton(c["out"][:, :5], *args[1:])  # no room for the length and the size
    assert not fits_triton(c["out"], c["tokens"].int(), *args[2:])
    assert not fits_triton(c["out"], c["tokens"], c["active"].long(), *args[3:])
    with pytest.raises(ValueError, match="impl='triton' takes int64"):
        round_tail(c["out"], c["tokens"].int(), *args[2:], impl="triton")


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory) -> dict:
    pytest.importorskip("triton")
    return interpreted_outputs(__file__, tmp_path_factory.mktemp("round_tail"), {"cases": cases()})


@pytest.mark.interpreter
def test_interpreted_equals_the_brute_force(interpreted):
    for case, got in zip(interpreted["cases"], interpreted["outputs"], strict=True):
        assert same(got, brute_force(case))


def _run_interpreted(folder: Path) -> None:
    data = torch.load(folder / "cases.pt")
    torch.save({"outputs": [run(c, impl="triton") for c in data["cases"]]}, folder / "outputs.pt")


@pytest.mark.gpu
def test_compiled_equals_the_brute_force_on_cuda_and_replays():
    for case in cases():
        assert same(run(case, "cuda", impl="triton"), brute_force(case))
        assert same(run(case, "cuda"), brute_force(case))  # auto: Triton on CUDA
    first, second = cases()[1], make_case(99, *SPECS[1])
    on = {k: v.clone().cuda() for k, v in first.items()}
    keys = ("out", "tokens", "active", "root", "prefix", "num_path", "num_nodes")
    graph, _ = capture_without_host_reads(lambda: round_tail(*(on[k] for k in keys)))  # runs once, then captures
    for k in keys:
        on[k].copy_(second[k])
    graph.replay()
    assert same((on["out"].cpu(), on["root"].cpu(), on["prefix"].cpu()), brute_force(second))


if __name__ == "__main__":
    _run_interpreted(Path(sys.argv[1]))
