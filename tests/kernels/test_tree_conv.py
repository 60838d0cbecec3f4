"""``tree_conv``: the reference (with the round's gather table, ``DeviceTopology.conv_index``) against a brute force
that walks each node's parents in float64; the Triton version through the interpreter and compiled on CUDA against
the reference (batches of ragged trees with padding slots, strided inputs as the projections arrive, bias or
none, SiLU or none, bf16 / fp16 / fp32, channel counts that are no powers of two and more than one channel block;
fp32 within a few ulps: the taps' sum order and the GPU's ``exp``; bf16 / fp16 within one ulp, rarely); the
activation probe; and a planted bug (the window read one column off) that the comparison catches."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from kernel_harness import capture_without_host_reads, interpreted_outputs, poison_empty
from torch import nn

from specdec.kernels.tree_conv import activation_kind, fits_triton, tree_conv, tree_conv_reference
from specdec.state.recurrent import DeviceTopology

# (rows, slots, channels, kernel width, window columns, dtype, bias, silu, strided inputs)
SPECS = [
    (1, 1, 96, 4, 3, torch.bfloat16, False, True, False),  # an AR step
    (2, 9, 200, 4, 3, torch.bfloat16, False, True, True),  # two ragged trees, projections as a transposed view
    (1, 6, 64, 3, 5, torch.float32, True, False, False),  # a longer window than the kernel needs, bias, no act.
    (2, 5, 1500, 4, 3, torch.float16, True, True, True),  # two channel blocks
]


def _trees(gen: torch.Generator, rows: int, slots: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random trees (parents[i] < i, -1 above the root) with trailing padding slots (parent -1, depth 0)."""
    parents = torch.full((rows, slots), -1, dtype=torch.long)
    depth = torch.zeros(rows, slots, dtype=torch.long)
    for b in range(rows):
        real = slots - b * (slots // 3)  # row b has fewer real nodes: the rest is padding
        for i in range(1, real):
            parents[b, i] = int(torch.randint(0, i, (1,), generator=gen))
            depth[b, i] = depth[b, parents[b, i]] + 1
    return parents, depth


def make_case(seed: int, rows, slots, channels, width, stored, dtype, bias, silu, strided) -> dict:
    gen = torch.Generator().manual_seed(seed)
    parents, depth = _trees(gen, rows, slots)
    index = DeviceTopology(SimpleNamespace(parents=parents, depth=depth)).conv_index(width, stored)
    inputs = (torch.randn(rows, slots, channels, generator=gen) * 2).to(dtype)
    if strided:
        inputs = inputs.transpose(1, 2).contiguous().transpose(1, 2)
    window = (torch.randn(rows, channels, stored, generator=gen) * 2).to(dtype)
    weight = torch.randn(channels, width, generator=gen).to(dtype)
    bias = torch.randn(channels, generator=gen).to(dtype) if bias else None
    return dict(inputs=inputs, window=window, weight=weight, index=index, parents=parents, depth=depth, bias=bias,
                silu=silu)  # fmt: skip


def cases() -> list[dict]:
    return [make_case(i, *spec) for i, spec in enumerate(SPECS)]


def act(case: dict):
    return nn.SiLU() if case["silu"] else None


def args(case: dict, device: str = "cpu") -> tuple:
    bias = None if case["bias"] is None else case["bias"].to(device)
    return (case["inputs"].to(device), case["window"].to(device), case["weight"].to(device), bias,
            case["index"].to(device), act(case))  # fmt: skip


def brute_force(case: dict) -> torch.Tensor:
    """Node i's taps from its own parents (newest = i), then the window's newest columns: float64."""
    inputs, window, weight = case["inputs"].double(), case["window"].double(), case["weight"].double()
    rows, slots, channels = inputs.shape
    width, stored = weight.shape[1], window.shape[2]
    out = torch.zeros(rows, slots, channels, dtype=torch.float64)
    for b in range(rows):
        for i in range(slots):
            path, node = [], i
            while node >= 0:
                path.append(node)
                node = int(case["parents"][b, node])
            taps = [inputs[b, path[d]] if d < len(path) else window[b, :, stored - (d - len(path) + 1)]
                    for d in range(width)]  # fmt: skip  (newest first)
            out[b, i] = sum(weight[:, width - 1 - d] * taps[d] for d in range(width))
            if case["bias"] is not None:
                out[b, i] += case["bias"].double()
    return F.silu(out) if case["silu"] else out


def check(case: dict, got: torch.Tensor) -> None:
    want = tree_conv_reference(*args(case)[:5], act(case) or (lambda t: t))
    got = got.cpu()
    assert got.shape == want.shape and got.dtype == want.dtype
    dtype = case["inputs"].dtype
    if dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=4e-6, atol=1e-5)
    else:  # one ulp of the output dtype where the fp32 sums differ in their last bits, and rarely
        torch.testing.assert_close(got.float(), want.float(), rtol=torch.finfo(dtype).eps, atol=1e-3)
        assert (got != want).float().mean().item() <= 0.02


def test_reference_equals_the_brute_force_over_each_path():
    for case in cases():
        got = tree_conv_reference(*args(case)[:5], act(case) or (lambda t: t))
        want = brute_force(case)
        ulp = torch.finfo(case["inputs"].dtype).eps
        torch.testing.assert_close(got.double(), want, rtol=ulp, atol=ulp * 4)


def test_a_window_read_one_column_off_fails_the_check():
    case = cases()[1]
    shifted = {**case, "window": torch.roll(case["window"], 1, dims=2)}
    with pytest.raises(AssertionError):
        check(case, tree_conv_reference(*args(shifted)[:5], nn.SiLU()))


def test_activation_probe_and_refusals():
    assert activation_kind(None) == "identity"
    assert activation_kind(nn.SiLU()) == activation_kind(F.silu) == "silu"
    hf = pytest.importorskip("transformers.activations")
    assert activation_kind(hf.ACT2FN["silu"]) == "silu"
    assert activation_kind(nn.GELU()) is None and activation_kind(torch.tanh) is None
    case = cases()[1]
    inputs, window, weight, bias, index, _ = args(case)
    assert fits_triton(inputs, window, weight, bias, index)
    assert not fits_triton(inputs, window, weight, bias, index.int())
    assert not fits_triton(inputs.double(), window, weight, bias, index)
    assert not fits_triton(inputs, window[:, :5], weight, bias, index)
    got = tree_conv(inputs, window, weight, bias, index, nn.GELU())  # CPU: the reference, any activation
    assert torch.equal(got, tree_conv_reference(inputs, window, weight, bias, index, nn.GELU()))
    one = tree_conv(inputs[0], window[0], weight, bias, index[0], nn.SiLU())  # one row: [N, C]
    assert torch.equal(one, tree_conv_reference(inputs, window, weight, bias, index, nn.SiLU())[0])


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory) -> dict:
    pytest.importorskip("triton")
    return interpreted_outputs(__file__, tmp_path_factory.mktemp("tree_conv"), {"cases": cases()})


@pytest.mark.interpreter
def test_interpreted_equals_the_reference(interpreted):
    for case, got in zip(interpreted["cases"], interpreted["outputs"], strict=True):
        check(case, got)
        assert got.is_contiguous()
    assert interpreted["gelu_fell_back"]


def _run_interpreted(folder: Path) -> None:
    data = torch.load(folder / "cases.pt")
    poison_empty()
    out = {"outputs": [tree_conv(*args(c), impl="triton") for c in data["cases"]]}
    case = data["cases"][1]
    try:  # a GELU is refused by impl="triton" and takes the reference under auto
        tree_conv(*args(case)[:5], nn.GELU(), impl="triton")
        refused = False
    except ValueError:
        refused = True
    auto = tree_conv(*args(case)[:5], nn.GELU())
    out["gelu_fell_back"] = refused and torch.equal(auto, tree_conv_reference(*args(case)[:5], nn.GELU()))
    torch.save(out, folder / "outputs.pt")


@pytest.mark.gpu
def test_compiled_equals_the_reference_on_cuda_and_replays():
    for case in cases():
        check(case, tree_conv(*args(case, "cuda"), impl="triton"))
        check(case, tree_conv(*args(case, "cuda")))  # auto: Triton on CUDA
    case = cases()[1]
    static = args(case, "cuda")
    graph, out = capture_without_host_reads(lambda: tree_conv(*static))
    graph.replay()
    check(case, out)


if __name__ == "__main__":
    _run_interpreted(Path(sys.argv[1]))
