"""``rotary``: the reference against HF's own ``apply_rotary_pos_emb`` (bit for bit), the Triton version through
the interpreter and compiled on CUDA against the reference (bit for bit: every product and sum is rounded as
PyTorch rounds it), full and partial rotary (the first ``R`` of ``D`` dims rotated), the argument checks, which
calls are routed to it, and a planted bug (the second half's sign) that the comparison catches."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import transformers.models.llama.modeling_llama as llama
import transformers.models.qwen3.modeling_qwen3 as qwen3
import transformers.models.qwen3_next.modeling_qwen3_next as qwen3_next
from kernel_harness import capture_without_host_reads, interpreted_outputs, poison_empty

from specdec.kernels.rotary import fits_triton, rotary, rotary_reference, routing

# (B, H, H_kv, N, D, dtype, shared cos[, rotated dims: partial rotary])
SPECS = [
    (1, 4, 2, 1, 16, torch.bfloat16, True),
    (2, 8, 2, 5, 64, torch.bfloat16, False),
    (1, 32, 8, 33, 128, torch.bfloat16, True),  # the 8 B shape, a 32-node tree
    (3, 6, 2, 7, 64, torch.float16, False),
    (1, 16, 4, 2, 256, torch.float16, True),
    (2, 4, 4, 64, 32, torch.bfloat16, False),
    (1, 16, 2, 3, 256, torch.bfloat16, True, 64),  # Qwen3-Next / Qwen3.5: a quarter of 256 rotated
    (2, 8, 2, 5, 128, torch.bfloat16, False, 32),
    (1, 4, 2, 2, 64, torch.bfloat16, True, 48),  # a rotated half that is no power of two
]
PARTIAL = [spec for spec in SPECS if len(spec) > 7]


def make_case(seed: int, batch, heads, kv_heads, num, dim, dtype, shared, rot=None) -> dict:
    """q / k as ``[B, H, N, D]`` views of ``[B, N, H, D]`` buffers (as the attention layers pass them), cos / sin
    of random angles over ``rot`` dims (default all ``D``), magnitudes spread so that products and sums round."""
    gen = torch.Generator().manual_seed(seed)
    scale = torch.logspace(-2, 2, dim)[torch.randperm(dim, generator=gen)]
    q = (torch.randn(batch, num, heads, dim, generator=gen) * scale).to(dtype).transpose(1, 2)
    k = (torch.randn(batch, num, kv_heads, dim, generator=gen) * scale).to(dtype).transpose(1, 2)
    angle = torch.rand(1 if shared else batch, num, (rot or dim) // 2, generator=gen) * 1000
    angle = torch.cat([angle, angle], dim=-1)
    return dict(q=q, k=k, cos=angle.cos().to(dtype), sin=angle.sin().to(dtype), info=(batch, heads, kv_heads, num,
                dim, str(dtype), shared))  # fmt: skip


def cases() -> list[dict]:
    return [make_case(i, *spec) for i, spec in enumerate(SPECS)]


def args(case: dict, device: str = "cpu") -> tuple:
    return tuple(case[name].to(device) for name in ("q", "k", "cos", "sin"))


def check(case: dict, got) -> None:
    want = rotary_reference(*args(case))
    for a, b in zip(got, want, strict=True):
        a = a.cpu()
        assert a.shape == b.shape and a.dtype == b.dtype, case["info"]
        assert torch.equal(a, b), (case["info"], (a.float() - b.float()).abs().max())


@pytest.mark.parametrize("module", [qwen3, llama, qwen3_next], ids=["qwen3", "llama", "qwen3_next"])
def test_reference_is_hfs_function_bit_for_bit(module):
    partial = module is qwen3_next  # the one of the three that rotates part of the head
    for case in cases():
        if case["cos"].shape[-1] < case["q"].shape[-1] and not partial:
            continue
        got = module.apply_rotary_pos_emb(*args(case))
        check(case, got)
    assert not partial or any(c["cos"].shape[-1] < c["q"].shape[-1] for c in cases())


def test_partial_calls_are_routed_only_where_the_function_rotates_part_of_the_head(monkeypatch):
    """``fused`` sends a partial ``cos`` to the kernel for Qwen3-Next's function (probed equal to the reference), and
    leaves it to the original for Llama's (which cannot rotate part of a head); full calls go to the kernel for
    both."""
    sent = []
    monkeypatch.setattr("specdec.kernels.rotary.rotary", lambda *a, **k: sent.append(a[2].shape[-1]) or "kernel")
    partial = make_case(0, *PARTIAL[1])
    full = cases()[1]
    assert routing.fused(qwen3_next.apply_rotary_pos_emb)(*args(partial)) == "kernel"
    assert routing.fused(qwen3_next.apply_rotary_pos_emb)(*args(full)) == "kernel"
    assert routing.fused(llama.apply_rotary_pos_emb)(*args(full)) == "kernel"
    with pytest.raises(RuntimeError):  # Llama's own function, as HF would call it, refuses the narrower cos
        routing.fused(llama.apply_rotary_pos_emb)(*args(partial))
    assert sent == [32, 64, 64]


def test_a_wrong_sign_fails_the_check():
    case = cases()[1]
    q, k, cos, sin = args(case)
    half = q.shape[-1] // 2
    wrong_q, wrong_k = rotary_reference(q, k, cos, sin)
    wrong_q = wrong_q.clone()
    wrong_q[..., half:] = q[..., half:] * cos[:, None, :, half:] - q[..., :half] * sin[:, None, :, half:]
    with pytest.raises(AssertionError):
        check(case, (wrong_q, wrong_k))


def test_fits_and_refusals():
    case = cases()[0]
    q, k, cos, sin = args(case)
    assert fits_triton(q, k, cos, sin)
    assert not fits_triton(q.float(), k.float(), cos.float(), sin.float())  # fp32: the reference
    assert fits_triton(q, k, cos[..., :8], sin[..., :8])  # partial rotary: the first 8 dims rotated
    assert not fits_triton(q, k, cos[..., :7], sin[..., :7])  # an odd rotated width
    assert not fits_triton(q[..., :8], k, cos[..., :8], sin[..., :8])  # q and k of different head dims
    assert torch.equal(rotary(q, k, cos, sin)[0], rotary_reference(q, k, cos, sin)[0])  # CPU auto: the reference
    with pytest.raises(ValueError, match="impl='triton' takes bf16"):
        rotary(q.float(), k.float(), cos.float(), sin.float(), impl="triton")
    half = [c for c in cases() if c["q"].dtype == torch.float16][0]
    assert not fits_triton(*args(half))  # fp16: the reference (a product can be fp16-subnormal)


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory) -> dict:
    pytest.importorskip("triton")
    return interpreted_outputs(__file__, tmp_path_factory.mktemp("rotary"), {"cases": cases()})


@pytest.mark.interpreter
def test_interpreted_equals_the_reference(interpreted):
    for case, got in zip(interpreted["cases"], interpreted["outputs"], strict=True):
        check(case, got)


def _impl(case: dict) -> str:
    return "triton" if case["q"].dtype == torch.bfloat16 else "auto"  # fp16: the reference


def _run_interpreted(folder: Path) -> None:
    data = torch.load(folder / "cases.pt")
    poison_empty()
    out = {"outputs": [rotary(*args(c), impl=_impl(c)) for c in data["cases"]]}
    torch.save(out, folder / "outputs.pt")


@pytest.mark.gpu
def test_compiled_equals_the_reference_on_cuda_and_replays():
    for case in cases():
        check(case, rotary(*args(case, "cuda"), impl=_impl(case)))
        check(case, rotary(*args(case, "cuda")))  # auto: Triton on CUDA
    case = cases()[2]
    static = args(case, "cuda")
    graph, out = capture_without_host_reads(lambda: rotary(*static))
    graph.replay()
    check(case, out)


if __name__ == "__main__":
    _run_interpreted(Path(sys.argv[1]))
