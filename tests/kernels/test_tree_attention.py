"""``tree_attention``: the split-KV Triton attention (interpreter on CPU, compiled on GPU) and the torch reference,
both against expectations from outside the code under test: HF's own ``sdpa_attention_forward`` and a float64
brute force written here (one softmax per query head over its key / value head, ``h // rep``).

The interpreted comparisons run in one subprocess with ``TRITON_INTERPRET=1`` (it must be set before Triton is
imported and must not leak into the rest of the suite): this file, run as a script, reads the cases the tests
wrote, runs the Triton version with ``torch.empty`` NaN-poisoned (an output element or a workspace partial never
written shows up) and saves the outputs for the tests here to compare. These are the ``interpreter`` tier; they run
the cheapest cases that hold every feature of the whole set (``interpreted_cases``), the GPU tests all of them.
Keys and values are ``[:, :, :S]`` slices
of NaN-filled longer buffers, and most masks are slices of longer masks with NaN (float) or True (bool) past
``S``, so a read past the span shows up as NaN.

Tolerances (against the float64 brute force computed from the very inputs, i.e. the bf16 / fp16-rounded values):

- fp32 inputs: rtol 1e-5, atol 1e-5. The scores and sums are fp32 (IEEE dots, no TF32): errors are a few fp32
  ulps of the scores (|score| <~ 30 here) through exp, ~1e-6 observed.
- bf16 / fp16 inputs, the reference: rtol 2**-8, atol 1e-6: it computes in fp32 and rounds once (half an ulp,
  at most 2**-8 relative in bf16).
- bf16 / fp16 inputs, the kernel: rtol 2**-7, atol 1e-2, and a mean absolute error at most twice the
  reference's plus 1e-4 (a systematic error would pass the bound element by element). The fp32 result, slightly
  off, may round to the other neighbour (one ulp, at most 2**-7 relative); and the kernel rounds the probabilities
  to the value dtype for the ``p @ v`` dot (as FlashAttention does; the interpreter truncates, so up to 2**-8
  relative per weight) and normalises by the sum of the rounded weights, so the output is a convex combination
  whose weights are off by at most ~2**-7 relative: an error of at most ~2**-7 times the weighted mean of
  ``|v - out|`` (~1 for these N(0, 1) values), ~8e-3. Observed under the interpreter in bf16: max 1.1e-2 where
  the reference's is 7.7e-3 (Q 64 over S 17), means 1.0-1.8 times the reference's.
- HF's SDPA vs the reference: fp32 rtol / atol 1e-5; bf16 / fp16 atol 1e-2, rtol 2**-7 (both round once to the
  output dtype; SDPA's CPU kernel may round its intermediates differently).
"""

from __future__ import annotations

import itertools
import math
import os
import sys
from pathlib import Path

import pytest
import torch
from kernel_harness import check_replays, cover, interpreted_outputs, poison_empty
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from specdec.kernels.tree_attention import _check_args, tree_attention, tree_attention_reference

HEADS = [(4, 2), (8, 2), (6, 3), (4, 4), (32, 8)]
QS = [1, 3, 16, 64, 65]
SLOTS = [1, 17, 256, 1030]
DIMS = [64, 128]
DTYPES = [torch.float32, torch.bfloat16]
MASKS = ["bool", "float", "neg_inf"]  # bool; additive finfo(dtype).min; additive fp32 -inf
PATTERNS = ["random", "tree", "sparse"]
HALF = (torch.bfloat16, torch.float16)


# --- cases -------------------------------------------------------------------------------------------------------


def _randint(gen: torch.Generator, low: int, high: int) -> int:
    """Uniform in [low, high]."""
    return int(torch.randint(low, high + 1, (1,), generator=gen))


def visibility(gen: torch.Generator, rows: int, slots: int, pattern: str) -> torch.Tensor:
    """``[Q, S]`` bool, every row seeing slot 0. ``random``: slot 0 plus each slot with a random density (5-95 %);
    ``tree``: the committed prefix ``[0, S - Q)`` seen by all and a random tree in the last ``Q`` slots (each node
    sees itself and its ancestors; ``random`` when ``S < Q``); ``sparse``: slot 0 plus up to two random slots (most
    chunks of a long span are then hidden from a row)."""
    if pattern == "tree" and slots >= rows:
        prefix = slots - rows
        seen = torch.zeros(rows, slots, dtype=torch.bool)
        seen[:, :prefix] = True
        for i in range(rows):
            seen[i, prefix + i] = True
            if i > 0:
                parent = _randint(gen, 0, i - 1)
                seen[i, prefix : prefix + i] |= seen[parent, prefix : prefix + i]
        seen[:, 0] = True  # the root when prefix == 0 (every node descends from it): already set then
        return seen
    if pattern == "sparse":
        seen = torch.zeros(rows, slots, dtype=torch.bool)
        for _ in range(2):
            seen[torch.arange(rows), torch.randint(slots, (rows,), generator=gen)] = True
    else:
        density = [0.05, 0.5, 0.95][_randint(gen, 0, 2)]
        seen = torch.rand(rows, slots, generator=gen) < density
    seen[:, 0] = True
    return seen


def make_case(seed, heads, kv_heads, rows, slots, dim, dtype, mask, pattern, *, q_layout="heads",
              kv_layout="heads", mask_padded=True, q_scale=1.0) -> dict:  # fmt: skip
    """One case: ``query`` stored ``[1, H, Q, D]`` (``q_layout="hf"``: a transposed ``[1, Q, H, D]`` buffer),
    key / value buffers longer than ``S`` filled with NaN past it (``kv_layout="seq"``: stored ``[1, S', H_kv,
    D]`` like a sequence-major cache), the mask as ``mask`` kind (a slice of a longer mask when ``mask_padded``)."""
    gen = torch.Generator().manual_seed(seed)
    buf_slots = slots + _randint(gen, 1, 40) if slots < 1000 else 1536
    q = (torch.randn(1, heads, rows, dim, generator=gen, dtype=torch.float64) * q_scale).to(dtype)
    q_base = q.transpose(1, 2).contiguous() if q_layout == "hf" else q
    kv = []
    for _ in range(2):
        buf = torch.full((1, kv_heads, buf_slots, dim), float("nan"), dtype=dtype)
        buf[:, :, :slots] = torch.randn(1, kv_heads, slots, dim, generator=gen, dtype=torch.float64).to(dtype)
        kv.append(buf.transpose(1, 2).contiguous() if kv_layout == "seq" else buf)
    seen = visibility(gen, rows, slots, pattern)
    width = buf_slots if mask_padded else slots
    if mask == "bool":
        mask_base = torch.ones(1, 1, rows, width, dtype=torch.bool)
        mask_base[0, 0, :, :slots] = seen
    else:
        mask_dtype = dtype if mask == "float" else torch.float32
        hidden = torch.finfo(mask_dtype).min if mask == "float" else -math.inf
        mask_base = torch.full((1, 1, rows, width), float("nan"), dtype=mask_dtype)
        mask_base[0, 0, :, :slots] = torch.zeros(rows, slots, dtype=mask_dtype).masked_fill(~seen, hidden)
    return dict(q_base=q_base, k_base=kv[0], v_base=kv[1], mask_base=mask_base, slots=slots, scale=dim**-0.5,
                q_layout=q_layout, kv_layout=kv_layout, mask=mask, pattern=pattern,
                info=(heads, kv_heads, rows, slots, dim, str(dtype), mask, pattern, q_layout, kv_layout))  # fmt: skip


def cases() -> list[dict]:
    """44 cases picked from the cross product: every (heads, Q) pair once (25) with S cycling over ``SLOTS``
    (17 / 256 for Q >= 64, to keep the interpreter quick), D, dtype, mask kind, pattern and layouts alternating;
    then the shapes that matter: the 8 B layers (H 32, H_kv 8, D 128; the hybrid's 16, 4, 256) and the zoo's
    (6, 2, 64) over long spans with trees, S = 1, fp16, and row counts that need several row blocks."""
    specs = []
    for i, ((heads, kv_heads), rows) in enumerate((h, q) for h in HEADS for q in QS):
        slots = (17, 256)[i % 2] if rows >= 64 else SLOTS[(i + i // 5) % 4]
        specs.append((heads, kv_heads, rows, slots, DIMS[i % 2], DTYPES[(i // 2) % 2], MASKS[i % 3],
                      PATTERNS[(i // 3) % 3]))  # fmt: skip
    bf16, fp32, fp16 = torch.bfloat16, torch.float32, torch.float16
    specs += [
        (32, 8, 16, 1030, 128, bf16, "float", "tree"),
        (32, 8, 1, 1030, 128, bf16, "bool", "sparse"),
        (32, 8, 3, 1030, 128, fp32, "neg_inf", "random"),
        (32, 8, 16, 256, 128, fp32, "bool", "tree"),
        (6, 2, 1, 512, 64, bf16, "float", "tree"),
        (6, 2, 16, 512, 64, fp32, "bool", "tree"),
        (6, 2, 65, 256, 64, bf16, "bool", "sparse"),
        (8, 2, 65, 256, 128, fp32, "bool", "tree"),
        (4, 4, 64, 1, 64, bf16, "bool", "random"),
        (6, 3, 3, 1, 128, fp32, "float", "random"),
        (4, 2, 16, 1030, 64, fp16, "float", "sparse"),
        (8, 2, 3, 17, 128, fp16, "bool", "tree"),
        (4, 2, 1, 1030, 64, bf16, "neg_inf", "sparse"),
        (8, 2, 16, 1030, 64, fp32, "float", "random"),
        (4, 4, 3, 256, 128, bf16, "neg_inf", "tree"),
        (6, 3, 64, 17, 64, fp32, "bool", "sparse"),
        (16, 4, 1, 1030, 256, bf16, "float", "tree"),  # the 8 B Qwen3.5 hybrid's attention layers: D 256
        (16, 4, 16, 256, 256, fp32, "bool", "tree"),
        (16, 4, 64, 17, 256, bf16, "neg_inf", "sparse"),
    ]  # fmt: skip
    out = []
    for i, spec in enumerate(specs):
        out.append(make_case(i, *spec, q_layout=("heads", "hf")[(i // 4) % 2], kv_layout=("heads", "seq")[(i // 3) % 2],
                             mask_padded=i % 5 != 0, q_scale=(1.0, 4.0)[(i // 7) % 2]))  # fmt: skip
    return out


def case_features(case: dict) -> set:
    """What a case exercises: each of its settings, its dtype with its mask kind, and its launch plan's shape
    (several chunks with a partial last one, several row blocks, a padded row block, one chunk)."""
    from specdec.kernels.tree_attention.triton import split_plan

    heads, kv_heads, rows, slots, dim, dtype, mask, pattern, q_layout, kv_layout = case["info"]
    plan = split_plan(heads // kv_heads * rows, kv_heads, dim, 4 if dtype == "torch.float32" else 2)
    padded = case["mask_base"].shape[-1] > slots
    tiles = math.ceil(slots / plan["BLOCK_N"])
    return {("heads", heads, kv_heads), ("rows", rows), ("slots", slots), ("dim", dim), ("dtype, mask", dtype, mask),
            ("pattern", pattern), ("q layout", q_layout), ("kv layout", kv_layout), ("mask padded", padded),
            ("copied bool mask", mask == "bool" and padded), ("partial chunk", tiles % plan["chunks"] != 0),
            ("used chunks", min(tiles, plan["chunks"], 9)), ("row blocks", plan["row_blocks"] > 1),
            ("padded row block", (heads // kv_heads * rows) % plan["BLOCK_M"] != 0)}  # fmt: skip


def interpreted_cases() -> list[dict]:
    """The cheapest cases (interpreter work ~ H * Q * S * D) that hold every feature of ``cases()`` twice."""
    return cover(cases(), case_features, lambda c: c["info"][0] * c["info"][2] * c["info"][3] * c["info"][4], times=2)


def case_args(case: dict, device: str = "cpu") -> tuple:
    """``(query [1, H, Q, D], key, value [1, H_kv, S, D], mask [1, 1, Q, S], scale)`` as views of the buffers."""
    slots = case["slots"]
    q = case["q_base"].to(device)
    q = q.transpose(1, 2) if case["q_layout"] == "hf" else q
    k, v = case["k_base"].to(device), case["v_base"].to(device)
    if case["kv_layout"] == "seq":
        k, v = k.transpose(1, 2), v.transpose(1, 2)
    return q, k[:, :, :slots], v[:, :, :slots], case["mask_base"].to(device)[..., :slots], case["scale"]


# --- oracles and comparisons --------------------------------------------------------------------------------------


def brute64(query, key, value, mask, scale) -> torch.Tensor:
    """``[1, Q, H, D]`` float64: per query head ``h``, softmax(q_h k_g^T * scale + mask) v_g with ``g = h // rep``
    (a bool mask hides with -inf)."""
    heads, rows, dim = query.shape[1:]
    rep = heads // key.shape[1]
    q, k, v = (t.cpu().double() for t in (query, key, value))
    mask = mask.cpu()[0, 0]
    additive = torch.zeros(mask.shape, dtype=torch.float64).masked_fill(~mask, -math.inf) if mask.dtype == torch.bool \
        else mask.double()  # fmt: skip
    out = torch.empty(rows, heads, dim, dtype=torch.float64)
    for h in range(heads):
        g = h // rep
        scores = q[0, h] @ k[0, g].T * scale + additive
        out[:, h] = torch.softmax(scores, dim=-1) @ v[0, g]
    return out[None]


class _GroupedAttention(torch.nn.Module):
    """What HF's attention functions read from the attention module."""

    def __init__(self, groups: int):
        super().__init__()
        self.num_key_value_groups = groups
        self.is_causal = True


def hf_sdpa(query, key, value, mask, scale) -> torch.Tensor:
    """HF's ``sdpa_attention_forward`` with the mask made additive in query's dtype."""
    if mask.dtype == torch.bool:
        additive = torch.zeros(mask.shape, dtype=query.dtype).masked_fill(~mask, torch.finfo(query.dtype).min)
    else:
        additive = mask.to(query.dtype)
    module = _GroupedAttention(query.shape[1] // key.shape[1])
    out, _ = sdpa_attention_forward(module, query, key, value, additive, scaling=scale)
    return out


def _kernel_tolerance(dtype: torch.dtype) -> dict:
    return dict(rtol=2**-7, atol=1e-2) if dtype in HALF else dict(rtol=1e-5, atol=1e-5)


def check_oracle(case: dict, got: torch.Tensor, *, rtol: float, atol: float, mean_atol: float | None = None):
    """``got`` is the ``[1, Q, H, D]`` contiguous output in query's dtype, within ``rtol`` / ``atol`` of the float64
    brute force (and, with ``mean_atol``, a mean absolute error below it)."""
    args = case_args(case)
    query = args[0]
    heads, rows, dim = query.shape[1:]
    assert got.shape == (1, rows, heads, dim) and got.dtype == query.dtype and got.is_contiguous(), case["info"]
    want = brute64(*args)
    got = got.cpu().double()
    assert not got.isnan().any(), case["info"]
    torch.testing.assert_close(got, want, rtol=rtol, atol=atol, msg=lambda m: f"{case['info']}: {m}")
    if mean_atol is not None:
        assert float((got - want).abs().mean()) <= mean_atol, case["info"]


def check_kernel(case: dict, got: torch.Tensor) -> None:
    """The Triton output against the brute force, with the kernel's tolerance for its dtype; with half inputs its
    mean error at most twice the reference's plus 1e-4."""
    dtype = case["q_base"].dtype
    mean = None
    if dtype in HALF:
        args = case_args(case)
        mean = 2 * float((tree_attention_reference(*args).double() - brute64(*args)).abs().mean()) + 1e-4
    check_oracle(case, got, **_kernel_tolerance(dtype), mean_atol=mean)


# --- tests on CPU -------------------------------------------------------------------------------------------------


def test_cases_cover_what_matters():
    from specdec.kernels.tree_attention.triton import split_plan

    cs = cases()
    info = [c["info"] for c in cs]
    assert {(h, kv) for h, kv, *_ in info} == set(HEADS) | {(6, 2), (16, 4)}
    assert {i[2] for i in info} == set(QS) and {i[3] for i in info} >= set(SLOTS)
    assert {i[4] for i in info} == {64, 128, 256}
    assert {(i[5], i[6]) for i in info} >= {(str(d), m) for d in DTYPES for m in MASKS}
    assert {i[7] for i in info} == set(PATTERNS) and {i[8] for i in info} == {"heads", "hf"}
    assert {i[9] for i in info} == {"heads", "seq"} and "torch.float16" in {i[5] for i in info}
    assert sum(c["mask_base"].shape[-1] > c["slots"] for c in cs) > 25
    # the launch plans: several chunks with a partial last one, several row blocks, padded row blocks, one chunk
    plans = [(i, split_plan(i[0] // i[1] * i[2], i[1], i[4], 4 if i[5] == "torch.float32" else 2)) for i in info]
    tiles = [math.ceil(i[3] / p["BLOCK_N"]) for i, p in plans]
    assert sum(p["chunks"] > 8 and n > 8 and n % p["chunks"] != 0 for n, (_, p) in zip(tiles, plans, strict=True)) >= 5
    assert sum(p["row_blocks"] > 1 for _, p in plans) >= 5 and sum(n == 1 for n in tiles) >= 3
    assert sum((i[0] // i[1] * i[2]) % p["BLOCK_M"] != 0 for i, p in plans) >= 20
    # every S with several head layouts, big Q only over short spans (interpreter time)
    assert all(len({i[:2] for i in info if i[3] == s}) >= 3 for s in SLOTS)
    assert all(i[3] <= 256 for i in info if i[2] >= 64)


def test_interpreted_cases_hold_every_feature_at_a_fraction_of_the_cost():
    picked, everything = interpreted_cases(), cases()
    assert {f for c in picked for f in case_features(c)} == {f for c in everything for f in case_features(c)}

    def cost(cs):
        return sum(c["info"][0] * c["info"][2] * c["info"][3] * c["info"][4] for c in cs)

    assert len(picked) < len(everything) and cost(picked) < cost(everything) / 2
    assert len(copied_mask_cases(picked)) >= 1


def test_split_plan_fills_the_gpu_at_the_8b_shape():
    from specdec.kernels.tree_attention.triton import split_plan

    for rows in (1, 16, 32, 64):
        plan = split_plan(4 * rows, 8)
        programs = plan["chunks"] * 8 * plan["row_blocks"]
        assert programs >= 128 and plan["BLOCK_M"] >= 16 and plan["BLOCK_N"] == 64  # one wave of 132 SMs
    assert split_plan(128, 8)["row_blocks"] == 1  # a 32-node tree of 4 grouped heads: K / V read once


def test_launch_plans_read_each_device_property_once(monkeypatch):
    """The attention's shared-memory limit and the skinny kernel's SM count come from the device's properties,
    read once per device (a compiled caller then reads a cached constant); off CUDA, the planning defaults."""
    from types import SimpleNamespace

    from specdec.kernels import _triton
    from specdec.kernels.skinny_linear.triton import sm_count
    from specdec.kernels.tree_attention.triton import SHARED_BYTES, shared_limit, split_plan

    assert shared_limit(torch.device("cpu")) == SHARED_BYTES and sm_count(torch.device("cpu")) == 8
    reads = []
    props = {0: SimpleNamespace(shared_memory_per_block_optin=101376, multi_processor_count=84),
             1: SimpleNamespace(shared_memory_per_block_optin=232448, multi_processor_count=132)}  # fmt: skip
    monkeypatch.setattr(_triton, "_DEVICE_PROPERTIES", {})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: reads.append(i) or props[i])
    for _ in range(3):
        assert shared_limit(torch.device("cuda", 0)) == 101376 and shared_limit(torch.device("cuda")) == 232448
        assert sm_count(torch.device("cuda", 0)) == 84 and sm_count(torch.device("cuda")) == 132
    assert sorted(reads) == [0, 0, 1, 1]  # one read per (device, property)
    plan = split_plan(256, 4, 256, 2, shared_limit(torch.device("cuda", 0)))  # a 99 KiB device
    assert plan["STAGES"] == 2 and plan["BLOCK_N"] < 64


def test_split_plans_fit_the_shared_memory_they_are_given():
    """Triton's own figure on an H200 (its ``OutOfResources`` message): 245760 bytes for 64 rows of D 256 in bf16
    over 64-slot tiles in 3 stages (the 8 B hybrid's 64-node verify, compiled; the limit is 232448). Every plan fits
    the limit it is given by that estimate, the H200's and an A100's; the Qwen3-8B shapes keep their 64-slot,
    3-stage tiles. (The GPU test of that shape is the check against Triton itself.)"""
    from specdec.kernels.tree_attention.triton import SHARED_BYTES, shared_bytes, split_plan

    assert shared_bytes(64, 64, 3, 256, 2) == 245760
    assert SHARED_BYTES == 232448
    for dim, itemsize, rows, limit in itertools.product((64, 128, 256), (2, 4), (4, 16, 64, 128, 256),
                                                        (232448, 166912)):  # fmt: skip
        plan = split_plan(rows, 4, dim, itemsize, limit)
        need = shared_bytes(plan["BLOCK_M"], plan["BLOCK_N"], plan["STAGES"], dim, itemsize)
        assert need <= limit and plan["STAGES"] >= 2 and plan["BLOCK_N"] >= 16, (dim, itemsize, rows, plan)
    hybrid_64 = split_plan(4 * 64, 4, 256, 2)  # what failed to compile: now 2 stages
    assert (hybrid_64["BLOCK_M"], hybrid_64["BLOCK_N"], hybrid_64["STAGES"]) == (64, 64, 2)
    for rows in (1, 16, 32, 64):
        plan = split_plan(4 * rows, 8, 128, 2)
        assert plan["BLOCK_N"] == 64 and plan["STAGES"] == 3


def test_reference_matches_hf_sdpa():
    for case in cases():
        args = case_args(case)
        got, want = tree_attention_reference(*args), hf_sdpa(*args)
        assert got.shape == want.shape and got.dtype == want.dtype, case["info"]
        tol = dict(rtol=2**-7, atol=1e-2) if got.dtype in HALF else dict(rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got, want, **tol, msg=lambda m, c=case: f"{c['info']}: {m}")


def test_reference_matches_float64_brute_force():
    for case in cases():
        half = case["q_base"].dtype in HALF
        check_oracle(case, tree_attention_reference(*case_args(case)), rtol=2**-8 if half else 1e-5,
                     atol=1e-6 if half else 1e-5)  # fmt: skip


def test_oracle_check_catches_a_wrong_head_group():
    # The comparisons see one head mapped to the wrong key / value head (h % H_kv instead of h // rep): the
    # planted-bug check, kept as a test.
    case = next(c for c in cases() if c["info"][:2] == (8, 2) and c["q_base"].dtype == torch.bfloat16)
    q, k, v, mask, scale = case_args(case)
    rep = q.shape[1] // k.shape[1]
    wrong = tree_attention_reference(q, k.repeat(1, rep, 1, 1), v.repeat(1, rep, 1, 1), mask, scale)
    with pytest.raises(AssertionError):
        check_kernel(case, wrong)


def test_torch_impl_and_cpu_auto_are_the_reference():
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("checks the CPU dispatch without the interpreter")
    for case in cases()[::5] + cases()[-4:]:
        args = case_args(case)
        want = tree_attention_reference(*args)
        assert torch.equal(tree_attention(*args, impl="torch"), want), case["info"]
        assert torch.equal(tree_attention(*args), want), case["info"]
    with pytest.raises(ValueError, match="GPU"):
        tree_attention(*case_args(cases()[0]), impl="triton")


def test_fp64_and_odd_head_dims_use_the_reference():
    gen = torch.Generator().manual_seed(5)
    for dtype, dim in ((torch.float64, 64), (torch.float32, 96), (torch.bfloat16, 8)):
        q = torch.randn(1, 4, 3, dim, generator=gen).to(dtype)
        k, v = (torch.randn(1, 2, 9, dim, generator=gen).to(dtype) for _ in range(2))
        mask = torch.rand(1, 1, 3, 9, generator=gen) < 0.5
        mask[..., 0] = True
        got = tree_attention(q, k, v, mask, 0.3)
        torch.testing.assert_close(got.double(), brute64(q, k, v, mask, 0.3), rtol=1e-2, atol=1e-2)
        with pytest.raises(ValueError, match=rf"impl='triton' takes .*D = {dim}: use impl='torch'"):
            tree_attention(q, k, v, mask, 0.3, impl="triton")


def test_bad_arguments_are_refused():
    q, k, v = torch.randn(1, 4, 3, 64), torch.randn(1, 2, 9, 64), torch.randn(1, 2, 9, 64)
    mask = torch.ones(1, 1, 3, 9, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"query must be a 4-d \[B, H, Q, D\] tensor .*got torch.float32 \[4, 3, 64\]"):
        tree_attention(q[0], k, v, mask, 0.1)
    with pytest.raises(ValueError, match=r"key must be a 4-d \[B, H_kv, S, D\] .*got torch.int64"):
        tree_attention(q, k.long(), v, mask, 0.1)
    with pytest.raises(ValueError, match=r"key has batch 1, query 2: pass one K / V row per sequence"):
        tree_attention(q.expand(2, -1, -1, -1), k, v, mask, 0.1)
    with pytest.raises(ValueError, match=r"lengths must be None or a \[B\] = \[1\] int32 / int64 tensor"):
        tree_attention(q, k, v, mask, 0.1, torch.tensor([3.0]))
    with pytest.raises(ValueError, match=r"lengths must be None or a \[B\] = \[1\]"):
        tree_attention(q, k, v, mask, 0.1, torch.tensor([3, 4]))
    with pytest.raises(ValueError, match=r"share a dtype; got torch.float32, torch.bfloat16, torch.float32"):
        tree_attention(q, k.bfloat16(), v, mask, 0.1)
    with pytest.raises(ValueError, match=r"value must have key's shape \[1, 2, 9, 64\]; got \[1, 2, 8, 64\]"):
        tree_attention(q, k, v[:, :, :8], mask, 0.1)
    with pytest.raises(ValueError, match=r"key's head dim 32 differs from query's 64"):
        tree_attention(q, k[..., :32], v[..., :32], mask, 0.1)
    with pytest.raises(ValueError, match=r"H = 4 heads must be a positive multiple of key's H_kv = 3"):
        tree_attention(q, torch.randn(1, 3, 9, 64), torch.randn(1, 3, 9, 64), mask, 0.1)
    with pytest.raises(ValueError, match=r"S = 0 slots"):
        tree_attention(q, k[:, :, :0], v[:, :, :0], mask[..., :0], 0.1)
    with pytest.raises(ValueError, match=r"mask must be a bool .*got torch.int64 \[1, 1, 3, 9\].*mask.bool\(\)"):
        tree_attention(q, k, v, mask.long(), 0.1)
    with pytest.raises(ValueError, match=r"mask must be \[B, 1, Q, S\] = \[1, 1, 3, 9\].*got \[1, 1, 3, 12\]"):
        tree_attention(q, k, v, torch.ones(1, 1, 3, 12, dtype=torch.bool), 0.1)
    with pytest.raises(ValueError, match=r"got \[1, 4, 3, 9\]: .*mask\[:, :1\]"):
        tree_attention(q, k, v, mask.expand(1, 4, 3, 9), 0.1)
    with pytest.raises(ValueError, match=r"mask is on meta, query on cpu: move them to one device"):
        tree_attention(q, k, v, mask.to("meta"), 0.1)
    with pytest.raises(ValueError, match=r"scale=tensor.*finite Python float"):
        tree_attention(q, k, v, mask, torch.tensor(0.1))
    with pytest.raises(ValueError, match=r"scale=nan"):
        tree_attention(q, k, v, mask, math.nan)
    with pytest.raises(ValueError, match=r"impl='flash': choose 'auto', 'torch' or 'triton'"):
        tree_attention(q, k, v, mask, 0.1, impl="flash")
    _check_args(q, k, v, mask, 0.1, "triton")  # fits: no error


# --- Triton through the interpreter ------------------------------------------------------------------------------


def hidden_row_case() -> dict:
    """Rows 2 of a bool and a float mask see nothing (outside the contract): no crash, the other rows exact."""
    return make_case(99, 4, 2, 5, 100, 64, torch.float32, "bool", "random")


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory) -> dict:
    pytest.importorskip("triton")
    data = {"cases": interpreted_cases(), "hidden": hidden_row_case()}
    return interpreted_outputs(__file__, tmp_path_factory.mktemp("tree_attention"), data)


@pytest.mark.interpreter
def test_interpreted_matches_float64_brute_force(interpreted):
    for case, got in zip(interpreted["cases"], interpreted["outputs"], strict=True):
        check_kernel(case, got)


def copied_mask_cases(cs: list[dict]) -> list[dict]:
    """The smallest bool-mask cases (up to 4) whose mask is a slice of a wider one (not contiguous)."""
    sliced = [c for c in cs if c["mask"] == "bool" and c["mask_base"].shape[-1] > c["slots"]]
    return sorted(sliced, key=lambda c: c["q_base"].numel() * c["slots"])[:4]


@pytest.mark.interpreter
def test_interpreted_copied_bool_mask_matches_float64_brute_force(interpreted):
    # compiled callers copy a bool mask to bytes; the kernel must read the copy with the copy's strides
    picked = copied_mask_cases(interpreted["cases"])
    assert len(picked) >= 1 and all(not c["mask_base"][..., : c["slots"]].is_contiguous() for c in picked)
    for case, got in zip(picked, interpreted["copied_mask"], strict=True):
        check_kernel(case, got)


@pytest.mark.interpreter
def test_interpreted_auto_dispatch_fallbacks_and_empty(interpreted):
    # under TRITON_INTERPRET=1 "auto" runs Triton, except for what the kernel does not take (fp64, D = 96)
    assert interpreted["auto_impl"] == "triton"
    check_kernel(interpreted["cases"][0], interpreted["auto"])
    assert interpreted["fallback_calls"] == 0
    assert interpreted["empty"].shape == (1, 0, 4, 64)


@pytest.mark.interpreter
def test_interpreted_fully_hidden_row_does_not_crash(interpreted):
    case = interpreted["hidden"]
    q, k, v, mask, scale = case_args(case)
    for name in ("hidden_bool", "hidden_float"):
        got = interpreted[name]
        assert got.shape == (1, 5, 4, 64), name
        keep = torch.arange(5) != 2
        want = brute64(q[:, :, keep], k, v, mask[:, :, keep], scale)
        torch.testing.assert_close(got[:, keep].double(), want, rtol=1e-5, atol=1e-5)


def one_row_combine_cases(cs: list[dict]) -> list[dict]:
    """Cases for the GPU's combine (one row per program) under the interpreter, which otherwise combines up to
    ``_INTERPRETED_COMBINE_ROWS`` rows per program: several rows per group, several chunks, rows past a block."""

    def rows(c):
        return c["info"][0] // c["info"][1] * c["info"][2]

    picked = [c for c in cs if rows(c) > 64 and rows(c) % 64] + [c for c in cs if c["slots"] > 512 and rows(c) > 1]
    return sorted(picked, key=lambda c: rows(c) * c["slots"])[:4]


@pytest.mark.interpreter
def test_interpreted_one_row_combine_matches_float64_brute_force(interpreted):
    # the launch a GPU runs: one combine program per row (the interpreter's default takes many rows per program)
    picked = one_row_combine_cases(interpreted["cases"])
    assert any(c["info"][0] // c["info"][1] * c["info"][2] > 64 for c in picked)
    assert any(c["slots"] > 512 for c in picked)
    for case, got in zip(picked, interpreted["one_row_combine"], strict=True):
        check_kernel(case, got)


def _run_interpreted(folder: Path) -> None:
    """Subprocess entry: the Triton outputs of the saved cases through the interpreter, saved beside them."""
    from unittest import mock

    import specdec.kernels.tree_attention as package
    from specdec.kernels.tree_attention import triton as kernels

    data = torch.load(folder / "cases.pt")
    poison_empty()
    out = {"outputs": [tree_attention(*case_args(c), impl="triton") for c in data["cases"]]}
    with mock.patch.object(kernels, "_INTERPRETED_COMBINE_ROWS", 1):
        out["one_row_combine"] = [tree_attention(*case_args(c), impl="triton")
                                  for c in one_row_combine_cases(data["cases"])]  # fmt: skip
    with mock.patch.object(kernels, "tree_attention_triton", side_effect=kernels.tree_attention_triton) as spy:
        out["auto"] = tree_attention(*case_args(data["cases"][0]))
        out["auto_impl"] = "triton" if spy.call_count else "torch"
        spy.reset_mock()
        for dtype, dim in ((torch.float64, 64), (torch.float32, 96)):
            q, k = torch.randn(1, 4, 3, dim, dtype=dtype), torch.randn(1, 2, 9, dim, dtype=dtype)
            tree_attention(q, k, k, torch.ones(1, 1, 3, 9, dtype=torch.bool), 0.1)
        out["fallback_calls"] = spy.call_count
    q, k = torch.randn(1, 4, 0, 64), torch.randn(1, 2, 9, 64)
    out["empty"] = tree_attention(q, k, k, torch.ones(1, 1, 0, 9, dtype=torch.bool), 0.1, impl="triton")
    q, k, v, mask, scale = case_args(data["hidden"])
    hidden = mask.clone()
    hidden[:, :, 2] = False
    out["hidden_bool"] = tree_attention(q, k, v, hidden, scale, impl="triton")
    additive = torch.zeros(hidden.shape).masked_fill(~hidden, torch.finfo(torch.float32).min)
    out["hidden_float"] = tree_attention(q, k, v, additive, scale, impl="triton")
    # as under torch.compile, where a bool mask is copied to bytes: the copy of a sliced mask has its own strides
    with mock.patch.object(torch.compiler, "is_compiling", return_value=True):
        out["copied_mask"] = [tree_attention(*case_args(c), impl="triton") for c in copied_mask_cases(data["cases"])]
    assert package._triton_available()
    torch.save(out, folder / "outputs.pt")


# --- compiled on CUDA ---------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("part", range(4))
def test_compiled_matches_float64_brute_force_on_cuda(part):
    # a quarter of the cases per test: their compiles (one per launch specialisation) run on parallel workers
    for case in cases()[part::4]:
        check_kernel(case, tree_attention(*case_args(case, "cuda"), impl="triton"))
        check_kernel(case, tree_attention(*case_args(case, "cuda")))  # "auto" is Triton on CUDA


@pytest.mark.gpu
def test_kernel_inside_torch_compile_matches_float64_brute_force():
    # Inductor launches the kernel from its own wrapper, where a float argument is typed fp64: the scale must not
    # widen the softmax's fp32 loop state (a compile error at the 8 B shape before it became a constexpr).
    for case in cases()[-6:-2]:  # spans of 17-1030, D 64 / 128 / 256, fp32 / bf16, all mask kinds
        args = case_args(case, "cuda")
        torch._dynamo.reset()
        compiled = torch.compile(lambda q, k, v, m, s=args[4]: tree_attention(q, k, v, m, s, impl="triton"))
        check_kernel(case, compiled(*args[:4]))


@pytest.mark.gpu
@pytest.mark.parametrize("compiled", [False, True])
def test_the_8b_hybrids_64_node_verify_fits_shared_memory(compiled):
    # 64 queries x 4 heads per group of D 256 in bf16 over a long span: 64-slot tiles in 3 stages asked for 240 KiB
    # of shared memory, more than an H200 has (Triton's OutOfResources inside inductor's launcher).
    case = make_case(70, 16, 4, 64, 1030, 256, torch.bfloat16, "float", "tree", q_layout="hf")
    args = case_args(case, "cuda")
    torch._dynamo.reset()
    run = lambda q, k, v, m, s=args[4]: tree_attention(q, k, v, m, s, impl="triton")  # noqa: E731
    check_kernel(case, (torch.compile(run) if compiled else run)(*args[:4]))


@pytest.mark.gpu
@pytest.mark.parametrize("mask", ["bool", "float"])
def test_compiled_kernel_replays_in_a_cuda_graph(mask):
    # One capture at the 8 B shape, then new queries / keys / values / masks copied in before each replay.
    cs = [make_case(50 + i, 32, 8, 16, 1024, 128, torch.bfloat16, mask, "tree", q_layout="hf") for i in range(4)]

    def check(case, got):
        check_kernel(case, got)
        want = tree_attention_reference(*case_args(case, "cuda"))
        torch.testing.assert_close(got, want, rtol=2**-7, atol=1e-2)

    bases = ("q_base", "k_base", "v_base", "mask_base")
    check_replays(cs, bases, lambda static: tree_attention(*case_args(static, "cuda"), impl="triton"), check)


if __name__ == "__main__":
    _run_interpreted(Path(sys.argv[1]))
