"""``tree_attention`` over batches of sequences with their own lengths (the decode step and the tree verify at any
context): the torch reference (CPU tier), the Triton kernel through the interpreter (``interpreter`` tier) and
compiled on CUDA (``gpu``), all against a float64 brute force written here that attends, per sequence ``b``, over
slots ``[0, lengths[b])`` only.

Every case stores its K / V in a buffer longer than the span, holds NaN in every slot at or past a sequence's
length (and past the span), and makes the mask *visible* there: a read past a sequence's length, or a length
ignored, shows up as NaN or as a different result (``test_ignoring_the_lengths_fails_the_check`` keeps that
planted bug as a test). Contexts 1, 17, 4 k and 40 k slots, GQA ratios 1 / 4 / 8, ragged rows (lengths that
differ by thousands of slots in one batch), masks of one row for all sequences or one per sequence, and split
counts that do not divide a length. Tolerances as in ``test_tree_attention.py``.
"""

from __future__ import annotations

import functools
import math
import sys
from pathlib import Path

import pytest
import torch
from kernel_harness import check_replays, interpreted_outputs, poison_empty

from specdec.kernels.tree_attention import tree_attention, tree_attention_reference

HALF = (torch.bfloat16, torch.float16)

# (heads, kv_heads, Q, span S, lengths, D, dtype, shared mask): GQA 1 / 4 / 8, contexts 1 / 17 / 4 k / 40 k
SPECS = [
    (4, 4, 1, 1, [1], 64, torch.float32, True),
    (8, 2, 1, 17, [17, 5, 1], 64, torch.bfloat16, False),
    (8, 1, 3, 17, [9, 17], 128, torch.float32, True),
    (16, 2, 1, 4096, [4096, 1000, 2999], 128, torch.bfloat16, False),
    (32, 8, 16, 4100, [4100, 37], 128, torch.bfloat16, False),  # the 8 B layers, a tree of 16 over a ragged batch
    (4, 4, 5, 4096, [3333], 64, torch.float32, True),
    (8, 1, 1, 40960, [40960, 40001], 64, torch.bfloat16, False),
    (8, 2, 16, 40960, [39999], 256, torch.bfloat16, True),  # the 8 B hybrid's attention: D 256
    (4, 4, 1, 40960, [40960], 64, torch.float32, True),
]
# the cheap ones for the interpreter: every GQA ratio, ragged rows, both mask layouts, fp32 and bf16, 4 k and 40 k
INTERPRETED = [0, 1, 2, 3, 5, 6]
FLAT_INTERPRETED = [1, 3, 4]  # of INTERPRETED: ragged bf16 rows, a 4 k span in one mask, fp32 Q 5


def make_case(seed: int, heads, kv_heads, rows, span, lengths, dim, dtype, shared) -> dict:
    """Query ``[B, H, Q, D]``, K / V as ``[:, :, :S]`` of NaN-padded ``[B, H_kv, S + 7, D]`` buffers with NaN at and
    past each length, a float mask visible past each length (a tree over the last ``Q`` readable slots, the prefix
    before it seen by every row)."""
    gen = torch.Generator().manual_seed(seed)
    batch = len(lengths)
    q = torch.randn(batch, heads, rows, dim, generator=gen, dtype=torch.float64).to(dtype)
    kv = []
    for _ in range(2):
        buf = torch.full((batch, kv_heads, span + 7, dim), float("nan"), dtype=dtype)
        for b, n in enumerate(lengths):
            buf[b, :, :n] = torch.randn(kv_heads, n, dim, generator=gen).to(dtype)
        kv.append(buf)
    seen = torch.ones(1 if shared else batch, rows, span, dtype=torch.bool)  # visible past every length
    for b in range(seen.shape[0]):
        n = min(lengths) if shared else lengths[b]
        tree = max(0, n - rows)
        seen[b, :, tree:n] = False
        for i in range(min(rows, n)):
            seen[b, i, tree + i] = True
            if i:
                parent = int(torch.randint(i, (1,), generator=gen))
                seen[b, i, tree : tree + i] |= seen[b, parent, tree : tree + i]
    mask = torch.zeros(seen.shape, dtype=dtype).masked_fill(~seen, torch.finfo(dtype).min)[:, None]
    return dict(q=q, k=kv[0], v=kv[1], mask=mask, span=span, lengths=torch.tensor(lengths), scale=dim**-0.5,
                info=(heads, kv_heads, rows, span, tuple(lengths), dim, str(dtype), shared))  # fmt: skip


@functools.cache
def _cases() -> tuple[dict, ...]:
    return tuple(make_case(i, *spec) for i, spec in enumerate(SPECS))


def cases() -> list[dict]:
    return list(_cases())


def case_args(case: dict, device: str = "cpu", lengths: bool = True) -> tuple:
    span = case["span"]
    k, v = case["k"].to(device)[:, :, :span], case["v"].to(device)[:, :, :span]
    return (case["q"].to(device), k, v, case["mask"].to(device), case["scale"],
            case["lengths"].to(device) if lengths else None)  # fmt: skip


def flat_args(case: dict, device: str = "cpu") -> tuple:
    """``case_args`` with each sequence's flat prefix (the slots before its tree, seen by every row) and the mask
    there, past slot 0, made *hidden*: a kernel that reads the mask in a flat prefix past slot 0 hides the prefix
    and fails the check against the unchanged mask."""
    q, k, v, mask, scale, lengths = case_args(case, device)
    rows = q.shape[2]
    flat = (lengths - rows).clamp(min=0)
    if mask.shape[0] == 1:
        flat = flat.min().expand(flat.shape).clone()  # one mask for all: its tree starts at the shortest length
    poisoned = mask.clone()
    for b in range(mask.shape[0]):
        poisoned[b, ..., 1 : int(flat[b])] = torch.finfo(mask.dtype).min
    return q, k, v, poisoned, scale, lengths, flat


def brute64(query, key, value, mask, scale, lengths) -> torch.Tensor:
    """``[B, Q, H, D]`` float64: per sequence and query head, softmax over slots ``[0, lengths[b])`` only."""
    batch, heads, rows, dim = query.shape
    rep = heads // key.shape[1]
    out = torch.empty(batch, rows, heads, dim, dtype=torch.float64)
    for b in range(batch):
        n = int(lengths[b])
        additive = mask[b if mask.shape[0] > 1 else 0, 0, :, :n].cpu().double()
        k = key[b, :, :n].cpu().double().repeat_interleave(rep, dim=0)  # [H, n, D]: head h reads h // rep
        v = value[b, :, :n].cpu().double().repeat_interleave(rep, dim=0)
        scores = query[b].cpu().double() @ k.transpose(1, 2) * scale + additive  # [H, Q, n]
        out[b] = (torch.softmax(scores, dim=-1) @ v).transpose(0, 1)
    return out


_WANT: dict = {}  # the brute force of each case, once per process (several tests check against it)


def check(case: dict, got: torch.Tensor, *, kernel: bool) -> None:
    if case["info"] not in _WANT:
        _WANT[case["info"]] = brute64(*case_args(case))
    want = _WANT[case["info"]]
    half = case["q"].dtype in HALF
    tol = dict(rtol=2**-7, atol=1e-2) if half and kernel else dict(rtol=2**-8, atol=1e-6) if half else \
        dict(rtol=1e-5, atol=1e-5)  # fmt: skip
    got = got.cpu().double()
    assert got.shape == want.shape and not got.isnan().any(), case["info"]
    torch.testing.assert_close(got, want, **tol, msg=lambda m: f"{case['info']}: {m}")


# --- CPU: the reference ---------------------------------------------------------------------------------------------


def test_cases_cover_what_matters():
    from specdec.kernels.tree_attention.triton import split_plan

    info = [c["info"] for c in cases()]
    assert {h // kv for h, kv, *_ in info} == {1, 4, 8}
    assert {1, 17, 4096, 40960} <= {i[3] for i in info}
    assert any(len(set(i[4])) > 1 and max(i[4]) - min(i[4]) >= 1000 for i in info)  # ragged by thousands
    assert {i[7] for i in info} == {True, False} and any(i[2] > 1 for i in info)
    # a length whose tiles the split cannot share out evenly
    for heads, kv_heads, rows, _, lengths, dim, _, _ in info:
        plan = split_plan(heads // kv_heads * rows, kv_heads, dim)
        if any(math.ceil(n / plan["BLOCK_N"]) % plan["chunks"] for n in lengths):
            break
    else:
        raise AssertionError("no case with a split that does not divide its length")


def test_reference_matches_float64_brute_force():
    for case in cases():
        check(case, tree_attention_reference(*case_args(case)), kernel=False)


def test_reference_reads_no_mask_in_the_flat_prefix():
    for case in cases():
        check(case, tree_attention_reference(*flat_args(case)), kernel=False)


def test_a_flat_prefix_one_slot_too_long_fails_the_check():
    # the planted bug: the flat prefix reaching into the tree (its first node sees no sibling)
    case = cases()[4]
    q, k, v, mask, scale, lengths, flat = flat_args(case)
    with pytest.raises(AssertionError):
        check(case, tree_attention_reference(q, k, v, mask, scale, lengths, flat + 2), kernel=False)


def test_ignoring_the_lengths_fails_the_check():
    # the planted bug: a call that reads past a sequence's length (here: all of the span) sees NaN or visible keys
    case = cases()[1]
    with pytest.raises(AssertionError):
        check(case, tree_attention_reference(*case_args(case, lengths=False)), kernel=False)


def test_one_length_one_short_fails_the_check():
    case = cases()[2]
    q, k, v, mask, scale, lengths = case_args(case)
    with pytest.raises(AssertionError):
        check(case, tree_attention_reference(q, k, v, mask, scale, lengths - 1), kernel=False)


def test_the_launch_plan_depends_on_one_sequences_shapes_only():
    """Neither the span nor the batch changes the plan (chunks, tiles, row blocks), so a row of a batch is
    computed exactly as the sequence alone at any span bucket (what keeps bf16 batches equal to batch 1)."""
    import inspect

    from specdec.kernels.tree_attention.triton import split_plan

    assert list(inspect.signature(split_plan).parameters) == ["rows", "kv_heads", "dim", "itemsize", "shared"]


def test_a_batch_equals_each_sequence_alone():
    case = cases()[3]
    q, k, v, mask, scale, lengths = case_args(case)
    whole = tree_attention_reference(q, k, v, mask, scale, lengths)
    for b in range(q.shape[0]):
        alone = tree_attention_reference(q[b : b + 1], k[b : b + 1], v[b : b + 1], mask[b : b + 1], scale,
                                         lengths[b : b + 1])  # fmt: skip
        assert torch.equal(whole[b : b + 1], alone)


# --- Triton through the interpreter ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory) -> dict:
    pytest.importorskip("triton")
    data = {"cases": [cases()[i] for i in INTERPRETED]}
    return interpreted_outputs(__file__, tmp_path_factory.mktemp("tree_attention_lengths"), data)


@pytest.mark.interpreter
def test_interpreted_matches_float64_brute_force(interpreted):
    for case, got in zip(interpreted["cases"], interpreted["outputs"], strict=True):
        check(case, got, kernel=True)


@pytest.mark.interpreter
def test_interpreted_kernel_reads_no_mask_in_the_flat_prefix(interpreted):
    for i, got in zip(FLAT_INTERPRETED, interpreted["flat"], strict=True):
        check(interpreted["cases"][i], got, kernel=True)


@pytest.mark.interpreter
def test_interpreted_kernel_without_lengths_fails_the_check(interpreted):
    with pytest.raises(AssertionError):
        check(interpreted["cases"][1], interpreted["no_lengths"], kernel=True)


def batch_and_alone(case: dict, device: str = "cpu") -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The case's batch at its span, and each sequence alone over the smallest span that holds it (another span
    bucket, a batch of one), through the Triton version."""
    q, k, v, mask, scale, lengths = case_args(case, device)
    whole = tree_attention(q, k, v, mask, scale, lengths, impl="triton")
    alone = []
    for b in range(q.shape[0]):
        n = int(case["lengths"][b])
        m = mask[b if mask.shape[0] > 1 else 0][None, ..., :n]
        alone.append(tree_attention(q[b : b + 1], k[b : b + 1, :, :n], v[b : b + 1, :, :n], m, scale,
                                    lengths[b : b + 1], impl="triton"))  # fmt: skip
    return whole, alone


@pytest.mark.interpreter
def test_interpreted_batch_rows_equal_each_sequence_alone_bit_for_bit(interpreted):
    whole, alone = interpreted["batch_and_alone"]
    assert len(alone) == whole.shape[0] > 1
    for b, row in enumerate(alone):
        assert torch.equal(whole[b : b + 1], row), b


def _flat_call(case: dict, device: str = "cpu") -> torch.Tensor:
    q, k, v, mask, scale, lengths, flat = flat_args(case, device)
    return tree_attention(q, k, v, mask, scale, lengths, impl="triton", flat=flat)


def _run_interpreted(folder: Path) -> None:
    data = torch.load(folder / "cases.pt")
    poison_empty()
    out = {"outputs": [tree_attention(*case_args(c), impl="triton") for c in data["cases"]]}
    out["no_lengths"] = tree_attention(*case_args(data["cases"][1], lengths=False), impl="triton")
    out["flat"] = [_flat_call(data["cases"][i]) for i in FLAT_INTERPRETED]
    out["batch_and_alone"] = batch_and_alone(data["cases"][1])
    torch.save(out, folder / "outputs.pt")


# --- compiled on CUDA ---------------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_compiled_matches_float64_brute_force_on_cuda():
    for case in cases():
        check(case, tree_attention(*case_args(case, "cuda"), impl="triton"), kernel=True)
        check(case, tree_attention(*case_args(case, "cuda")), kernel=True)  # "auto" is Triton on CUDA


@pytest.mark.gpu
def test_flat_prefix_reads_no_mask_there_and_changes_no_bit_on_cuda():
    for case in cases():
        got = _flat_call(case, "cuda")
        check(case, got, kernel=True)
        q, k, v, mask, scale, lengths = case_args(case, "cuda")
        flat = flat_args(case, "cuda")[-1]
        # with the true mask the flat prefix changes nothing: the same tiles, sums and order
        assert torch.equal(tree_attention(q, k, v, mask, scale, lengths, impl="triton", flat=flat),
                           tree_attention(q, k, v, mask, scale, lengths, impl="triton")), case["info"]  # fmt: skip
        assert torch.equal(got, tree_attention(q, k, v, mask, scale, lengths, impl="triton", flat=flat))


@pytest.mark.gpu
def test_batch_rows_equal_each_sequence_alone_bit_for_bit_on_cuda():
    for case in (cases()[3], cases()[4], cases()[6]):  # bf16, ragged by thousands of slots, trees and steps
        whole, alone = batch_and_alone(case, "cuda")
        for b, row in enumerate(alone):
            assert torch.equal(whole[b : b + 1], row), (case["info"], b)


@pytest.mark.gpu
def test_combine_programs_of_several_rows_match_float64_brute_force_on_cuda():
    from specdec.kernels.tree_attention.triton import tree_attention_triton

    for case in cases():
        for rows in (2, 8):
            check(case, tree_attention_triton(*case_args(case, "cuda"), plan={"COMBINE_ROWS": rows}), kernel=True)


@pytest.mark.gpu
def test_one_graph_replays_at_any_length():
    # captured once; lengths (data) and contents copied in before each replay: the launch plan never depends on them
    cs = [make_case(80 + i, 32, 8, 16, 4100, [n, max(16, 4100 - n)], 128, torch.bfloat16, False)
          for i, n in enumerate((16, 2049, 4100, 700))]  # fmt: skip

    def run(static):
        return tree_attention(*case_args(static, "cuda"), impl="triton")

    check_replays(cs, ("q", "k", "v", "mask", "lengths"), run, lambda case, got: check(case, got, kernel=True))


if __name__ == "__main__":
    _run_interpreted(Path(sys.argv[1]))
