"""Split-KV ("flash-decoding") grouped-query attention of a few query rows over a long key span, in two launches
(capture-safe: no host reads, the launch plan comes from shapes alone).

Rows. The ``rep = H // H_kv`` query heads of key / value head ``g`` are stacked along the row axis: row
``r = i * Q + q`` (``r < R = rep * Q``) is query ``q`` of head ``g * rep + i``. A program holds ``BLOCK_M`` such
rows (padded to at least 16 so that ``tl.dot`` applies), so each K / V tile it loads serves every head of the
group: K / V are never expanded.

Split. Sequence ``b`` (of ``B``) reads slots ``[0, n_b)``: ``n_b = lengths[b]`` when a ``lengths`` tensor is
given (its committed prefix and this call's rows: the static storage's capacity past it is never read), else the
span ``S``. ``n_b`` is data, read by the kernel, so one launch plan (from shapes alone) serves every length and a
captured graph replays at any. ``_split_kernel`` runs on a grid ``(C, B * H_kv, cdiv(R, BLOCK_M))``: chunk ``c``
of a sequence takes the ``c``-th run of ``cdiv(cdiv(n_b, BLOCK_N), C)`` tiles of ``BLOCK_N`` slots (a program
whose run starts past ``n_b`` returns at once, and the combine reads only the runs before it), walks it with an
online softmax in fp32 (scores ``q @ k^T * scale`` from ``tl.dot``, the mask read in place: a bool mask replaces
hidden scores with the fp32 minimum, as the reference's additive conversion does; a float mask is added) and
writes its partial state (running max ``m``, sum of exponentials ``l``, unnormalised ``sum p * v``) in fp32 to a
workspace laid out ``[B * H_kv, R, C]`` (``[B * H_kv, R, C, D]``). ``C`` comes from ``split_plan`` over one
sequence's shapes, so that ``H_kv * row blocks * C`` is about ``_TARGET_PROGRAMS`` (~1 program per SM of a
132-SM H200; K / V bytes are what the call reads, and one program per head would leave most SMs idle). Neither
the span nor the batch size changes ``C``, the tiles or the combine, so each sequence's result is the same bit
for bit in any batch and span bucket.

Combine. ``_combine_kernel`` runs one program per (sequence, group, ``ROWS`` rows; one row on a GPU):
``out = sum_c e^(m_c - M) acc_c / sum_c e^(m_c - M) l_c`` with ``M = max_c m_c`` (chunks read ``BLOCK_C`` at a time
with the same online rescale), rounded to the output dtype (bf16 with integer round-to-nearest-even: Triton's
interpreter truncates a float32 -> bfloat16 cast) and stored at ``out[b, q, g * rep + i]``, the ``[B, Q, H, D]``
layout.

Precision. Scores and all sums are fp32; fp32 inputs use IEEE dots (no TF32). With bf16 / fp16 inputs the
probabilities are rounded to the value dtype for the ``p @ v`` dot (as FlashAttention does) and ``l`` sums those
rounded values, so the output stays an exact convex combination of its (rounded) weights.

A chunk a row sees nothing of (a sparse tree mask over a long span) has ``m = -inf`` (masked padding) or the fp32
minimum and weighs nothing in the combine; the exponent reference is clamped so no ``-inf - -inf`` arises.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from specdec.kernels._triton import device_property
from specdec.kernels.triton_ops import dot_fp32, to_bf16

__all__ = ["shared_bytes", "shared_limit", "split_plan", "tree_attention_triton"]

_TARGET_PROGRAMS = 128
"""Split programs aimed for: about one per SM on an H200 (132 SMs), one wave (two waves measured slower: 0.076 against
0.066 ms for a 32-node tree over 32 k slots at the 8 B shape, ``benchmarks/kernels/bench_tree_attention_long.py``)."""

_INTERPRETED_COMBINE_ROWS = 64
"""Rows per combine program under Triton's interpreter, which runs a launch's programs one after another and each
program's block ops at once: one program per row made the combine most of an interpreted decode's time. A GPU runs
one row per program (the launch plan that was measured)."""

_MAX_CHUNKS = 128
"""The most chunks a sequence's length is split over (the combine reads one partial state per chunk)."""

_SMALL_HEAD = 64
"""Head dims up to this take 16-row programs over 32-slot tiles (4 warps): at the zoo target's shape (6 / 2 heads of 64,
256-512 slots) 0.0074 against 0.0100 ms for a 32-node tree, 0.0066 against 0.0078 for 16 nodes and 0.0054 against
0.0057 for one row on an H100 (``benchmarks/kernels/bench_tree_attention_plans.py``, column ``m16n32``)."""

SHARED_BYTES = 232448
"""Shared memory one program may use when the device's own limit is not known (an H100 / H200's opt-in 227 KiB);
on CUDA the launcher reads the device's ``shared_memory_per_block_optin``."""

_FP32_MIN = tl.constexpr(-3.4028234663852886e38)  # torch.finfo(torch.float32).min


@triton.jit
def _tile(q, k_base, v_base, mask_rows, row_seen, flat, s0, end, m_i, l_i, acc, row_ok, dims, stride_ks, stride_vs,
          stride_ms, SCALE: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, MASK_BOOL: tl.constexpr,
          IEEE: tl.constexpr, UPCAST: tl.constexpr, HAS_FLAT: tl.constexpr, FULL: tl.constexpr):  # fmt: skip
    """One ``BLOCK_N``-slot tile of the online softmax: scores of the tile's slots ``[s0, s0 + BLOCK_N)`` (those
    at or past ``end`` hidden and never read), the mask read per slot (``MASKED``) or each row's flat value
    ``row_seen`` (additive, fp32), and the running max / sum / accumulator updated. ``FULL``: the caller knows
    every slot of the tile is below ``end`` (a whole tile of the flat prefix), so loads and scores skip that check."""
    cols = s0 + tl.arange(0, BLOCK_N)
    col_ok = cols < end
    cols64 = cols.to(tl.int64)
    # K^T tile [D, BLOCK_N]; slots past the length are never read (the cache beyond it may hold anything)
    if FULL:
        k = tl.load(k_base + cols64[None, :] * stride_ks + dims[:, None])
    else:
        k = tl.load(k_base + cols64[None, :] * stride_ks + dims[:, None], mask=col_ok[None, :], other=0.0)
    scores = dot_fp32(q, k, IEEE, UPCAST) * SCALE
    if MASKED:
        per_slot = col_ok
        if HAS_FLAT:
            per_slot = col_ok & (cols >= flat)  # a tile across the flat prefix's end reads the mask past it only
        seen = tl.load(mask_rows + cols64[None, :] * stride_ms, mask=row_ok[:, None] & per_slot[None, :], other=0)
        masked = tl.where(seen != 0, scores, _FP32_MIN) if MASK_BOOL else scores + seen.to(tl.float32)
        if HAS_FLAT:
            masked = tl.where(per_slot[None, :], masked, scores + row_seen[:, None])
        scores = masked
    else:
        scores = scores + row_seen[:, None]
    if not FULL:
        scores = tl.where(col_ok[None, :], scores, float("-inf"))

    m_new = tl.maximum(m_i, tl.max(scores, axis=1))
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing yet: no -inf - -inf
    p = tl.exp(scores - m_ref[:, None])
    alpha = tl.exp(m_i - m_ref)
    if FULL:
        v = tl.load(v_base + cols64[:, None] * stride_vs + dims[None, :])
    else:
        v = tl.load(v_base + cols64[:, None] * stride_vs + dims[None, :], mask=col_ok[:, None], other=0.0)
    if IEEE:
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + dot_fp32(p, v, IEEE, UPCAST)
    else:
        p_low = p.to(v.dtype)
        l_i = l_i * alpha + tl.sum(p_low.to(tl.float32), axis=1)
        acc = acc * alpha[:, None] + dot_fp32(p_low, v, IEEE, UPCAST)
    return m_new, l_i, acc


@triton.jit
def _split_kernel(
    q_ptr,  # [B, H, Q, D], strides (stride_qb, stride_qh, stride_qq, 1)
    k_ptr,  # [B, H_kv, S, D], strides (stride_kb, stride_kh, stride_ks, 1)
    v_ptr,  # [B, H_kv, S, D], strides (stride_vb, stride_vh, stride_vs, 1)
    mask_ptr,  # [B or 1, 1, Q, S], strides (stride_mb, stride_mq, stride_ms): uint8 (a bool mask) or float
    len_ptr,  # [B] int32 / int64: slots read per sequence (HAS_LEN), else unused
    flat_ptr,  # [B] int32 / int64: the flat prefix per sequence (HAS_FLAT), else unused
    m_ptr,  # [B * H_kv, R, C] fp32 workspace: running max
    l_ptr,  # [B * H_kv, R, C] fp32 workspace: sum of exponentials
    acc_ptr,  # [B * H_kv, R, C, D] fp32 workspace: sum of p * v
    Q,
    S,
    R,
    KV_HEADS,
    stride_qb,
    stride_qh,
    stride_qq,
    stride_kb,
    stride_kh,
    stride_ks,
    stride_vb,
    stride_vh,
    stride_vs,
    stride_mb,
    stride_mq,
    stride_ms,
    SCALE: tl.constexpr,  # constexpr: a float argument would be fp64 in a compiled caller's launch and widen the scores
    REP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    D: tl.constexpr,
    MASK_BOOL: tl.constexpr,  # the mask is bool (read as uint8): nonzero = visible
    HAS_LEN: tl.constexpr,  # read only [0, lengths[b]) of sequence b
    HAS_FLAT: tl.constexpr,  # slots [0, flat[b]) take each row's mask at slot 0
    IEEE: tl.constexpr,  # fp32 inputs: IEEE dots, p kept in fp32
    UPCAST: tl.constexpr,  # bf16 under the interpreter: dots on operands widened to fp32 (see dot_fp32)
    FULL_TILES: tl.constexpr,  # the flat prefix's whole tiles skip the length checks (they are all below it)
):
    chunk = tl.program_id(0)
    seq_group = tl.program_id(1)  # b * H_kv + g
    num_chunks = tl.num_programs(0)
    seq = seq_group // KV_HEADS
    group = seq_group % KV_HEADS
    rows = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < R
    head = group * REP + rows // Q
    qi = rows % Q
    dims = tl.arange(0, D)

    # this program's slots: the sequence's length in whole tiles, cut into num_chunks near-equal runs of tiles
    length = S
    if HAS_LEN:
        length = tl.minimum(tl.load(len_ptr + seq).to(tl.int32), S)
    tiles = tl.cdiv(length, BLOCK_N)
    per_tiles = tl.maximum(tl.cdiv(tiles, num_chunks), 1)
    if chunk >= tl.cdiv(tiles, per_tiles):
        return  # a run past the length: nothing to read, nothing the combine will read
    per = per_tiles * BLOCK_N
    start = chunk * per
    end = tl.minimum(start + per, length)

    seq64 = seq.to(tl.int64)
    q_offs = seq64 * stride_qb + head.to(tl.int64)[:, None] * stride_qh + qi.to(tl.int64)[:, None] * stride_qq
    q = tl.load(q_ptr + q_offs + dims[None, :], mask=row_ok[:, None], other=0.0)
    k_base = k_ptr + seq64 * stride_kb + group.to(tl.int64) * stride_kh
    v_base = v_ptr + seq64 * stride_vb + group.to(tl.int64) * stride_vh
    mask_rows = mask_ptr + seq64 * stride_mb + qi.to(tl.int64)[:, None] * stride_mq

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    # the flat prefix: whole tiles of the run below flat[b] take each row's mask at slot 0 (read once, here)
    mid = start
    flat = 0
    row_seen = tl.zeros([BLOCK_M], tl.float32)
    if HAS_FLAT:
        flat = tl.minimum(tl.load(flat_ptr + seq).to(tl.int32), end)
        mid = start + tl.maximum(flat - start, 0) // BLOCK_N * BLOCK_N
        first = tl.load(mask_rows, mask=row_ok[:, None], other=0)  # [BLOCK_M, 1]: each row's mask at slot 0
        if MASK_BOOL:
            row_seen = tl.sum(tl.where(first != 0, 0.0, _FP32_MIN), axis=1)
        else:
            row_seen = tl.sum(first.to(tl.float32), axis=1)
        for s0 in tl.range(start, mid, BLOCK_N):
            m_i, l_i, acc = _tile(q, k_base, v_base, mask_rows, row_seen, flat, s0, end, m_i, l_i, acc, row_ok, dims,
                                  stride_ks, stride_vs, stride_ms, SCALE, BLOCK_N, False, MASK_BOOL, IEEE, UPCAST,
                                  HAS_FLAT, FULL_TILES)  # fmt: skip
    for s0 in tl.range(mid, end, BLOCK_N):
        m_i, l_i, acc = _tile(q, k_base, v_base, mask_rows, row_seen, flat, s0, end, m_i, l_i, acc, row_ok, dims,
                              stride_ks, stride_vs, stride_ms, SCALE, BLOCK_N, True, MASK_BOOL, IEEE, UPCAST,
                              HAS_FLAT, False)  # fmt: skip

    part = (seq_group.to(tl.int64) * R + rows) * num_chunks + chunk
    tl.store(m_ptr + part, m_i, mask=row_ok)
    tl.store(l_ptr + part, l_i, mask=row_ok)
    tl.store(acc_ptr + part[:, None] * D + dims[None, :], acc, mask=row_ok[:, None])


@triton.jit
def _combine_kernel(
    m_ptr,  # [B * H_kv, R, C] fp32
    l_ptr,  # [B * H_kv, R, C] fp32
    acc_ptr,  # [B * H_kv, R, C, D] fp32
    out_ptr,  # [B, Q, H, D] contiguous
    len_ptr,  # [B] (HAS_LEN), else unused
    Q,
    H,
    R,
    C,
    S,
    KV_HEADS,
    REP: tl.constexpr,
    D: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_LEN: tl.constexpr,
    OUT_BF16: tl.constexpr,
    ROWS: tl.constexpr,
):
    pid = tl.program_id(0)  # (b * H_kv + g) * cdiv(R, ROWS) + row block
    blocks = tl.cdiv(R, ROWS)
    seq_group = pid // blocks
    seq = seq_group // KV_HEADS
    group = seq_group % KV_HEADS
    row = (pid % blocks) * ROWS + tl.arange(0, ROWS)  # [ROWS]
    row_ok = row < R
    head = group * REP + row // Q
    qi = row % Q
    dims = tl.arange(0, D)
    base = (seq_group.to(tl.int64) * R + row) * C  # [ROWS]
    # the chunks the split wrote: the runs of tiles that start before the sequence's length (an empty run added
    # nothing, so skipping it leaves every sum as it was)
    length = S
    if HAS_LEN:
        length = tl.minimum(tl.load(len_ptr + seq).to(tl.int32), S)
    tiles = tl.cdiv(length, BLOCK_N)
    used = tl.cdiv(tiles, tl.maximum(tl.cdiv(tiles, C), 1))

    m_run = tl.full([ROWS], float("-inf"), tl.float32)
    l_run = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, D], tl.float32)
    for c0 in tl.range(0, used, BLOCK_C):
        cs = c0 + tl.arange(0, BLOCK_C)
        ok = row_ok[:, None] & (cs < used)[None, :]  # [ROWS, BLOCK_C]
        at = base[:, None] + cs[None, :]
        m_c = tl.load(m_ptr + at, mask=ok, other=float("-inf"))
        l_c = tl.load(l_ptr + at, mask=ok, other=0.0)
        acc_c = tl.load(acc_ptr + at[:, :, None] * D + dims[None, None, :], mask=ok[:, :, None], other=0.0)
        m_new = tl.maximum(m_run, tl.max(m_c, axis=1))
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m_run - m_ref)
        w = tl.exp(m_c - m_ref[:, None])
        l_run = l_run * alpha + tl.sum(w * l_c, axis=1)
        acc = acc * alpha[:, None] + tl.sum(w[:, :, None] * acc_c, axis=1)
        m_run = m_new

    out = acc / tl.where(row_ok, l_run, 1.0)[:, None]  # rows past R: never stored
    out = to_bf16(out) if OUT_BF16 else out.to(out_ptr.dtype.element_ty)
    at_out = ((seq.to(tl.int64) * Q + qi) * H + head) * D  # [ROWS]
    tl.store(out_ptr + at_out[:, None] + dims[None, :], out, mask=row_ok[:, None])


def shared_bytes(block_m: int, block_n: int, stages: int, dim: int, itemsize: int) -> int:
    """An estimate of a ``_split_kernel`` program's shared memory: the query tile, ``stages`` buffers of K and V
    tiles, and an fp32 ``[BLOCK_M, BLOCK_N]`` tile for the scores. It equals the one figure Triton 3.6 reported on
    an H200 (245760 bytes at ``BLOCK_M`` 64, ``BLOCK_N`` 64, 3 stages, D 256, bf16: more than the 232448 there)."""
    return itemsize * dim * (block_m + 2 * stages * block_n) + 4 * block_m * block_n


def split_plan(
    rows: int, kv_heads: int, dim: int = 128, itemsize: int = 2, shared: int = SHARED_BYTES
) -> dict[str, int]:
    """The launch plan of a call, from the shapes of one sequence only: ``rows = rep * Q`` stacked rows per group,
    ``H_kv``, the head dim, the element size of K / V and the shared memory a program may use. Neither the span nor
    the batch enters it, so a sequence's tiles, chunks and sums are the same at every span bucket and batch size:
    a row of a batch equals the sequence decoded alone, bit for bit.

    Returns:
        dict: ``BLOCK_M`` (rows per program, 16-128; 16-64 for D 256; 16 for D up to ``_SMALL_HEAD``),
        ``row_blocks``, ``chunks`` (``C``, the programs each (sequence, group, row block) splits its length over:
        ~``_TARGET_PROGRAMS`` per sequence for the rows' own block, at most ``_MAX_CHUNKS``), ``BLOCK_N`` (slots per
        tile: 64, or 32 for rows of K / V wider than 512 bytes, e.g. D 256 in fp32, and for small heads),
        ``STAGES`` (software pipeline depth: 3, or 2 for those wide rows) and ``num_warps`` (8 for programs of
        16384 query elements or more, 8192 for D 256, else 4), ``COMBINE_ROWS`` (rows per combine program on a
        GPU: 1) and ``FULL_TILES`` (1: the flat prefix's whole tiles, which lie below the length, are loaded and
        scored without its checks; 0 checks them as a partial tile's, a tuning override). Where that needs more
        than ``shared`` bytes (``shared_bytes``; e.g. 64 rows of D 256 in bf16 over 64-slot tiles: 240 KiB), the
        pipeline is shortened to 2 stages and then the tiles halved.
    """
    wide = dim * itemsize > 512
    block_m = max(16, min(128 if dim <= 128 else 64, triton.next_power_of_2(rows)))  # one row block per tree
    row_blocks = triton.cdiv(rows, block_m)
    chunks = max(1, min(_MAX_CHUNKS, triton.cdiv(_TARGET_PROGRAMS, kv_heads * row_blocks)))
    block_n, stages = 32 if wide else 64, 2 if wide else 3
    if dim <= _SMALL_HEAD:  # small heads: 16-row programs over 32-slot tiles, the chunks as above (measured faster)
        block_m, block_n = 16, 32
        row_blocks = triton.cdiv(rows, block_m)
    while shared_bytes(block_m, block_n, stages, dim, itemsize) > shared and (stages > 2 or block_n > 16):
        if stages > 2:
            stages -= 1
        else:
            block_n //= 2
    warps = 8 if dim * block_m >= (16384 if dim <= 128 else 8192) else 4  # 4 for 64 rows of D 128: measured faster
    return {"BLOCK_M": block_m, "row_blocks": row_blocks, "chunks": chunks, "BLOCK_N": block_n, "STAGES": stages,
            "num_warps": warps, "COMBINE_ROWS": 1, "FULL_TILES": 1}  # fmt: skip


def shared_limit(device: torch.device) -> int:
    """The shared memory a program may use on ``device`` (CUDA: its opt-in limit, read once; else
    ``SHARED_BYTES``)."""
    return device_property(device, "shared_memory_per_block_optin", SHARED_BYTES)


def _last_dim_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 or t.shape[-1] == 1 else t.contiguous()


def tree_attention_triton(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor,
    scale: float,
    lengths: torch.Tensor | None = None,
    plan: dict[str, int] | None = None,
    flat: torch.Tensor | None = None,
) -> torch.Tensor:
    """Masked grouped-query attention in two launches (arguments as ``tree_attention_reference``; not checked
    here: fp32 / bf16 / fp16, a power-of-two head dim 16-256, ``lengths`` and ``flat`` integer ``[B]`` tensors or
    None).
    ``plan`` overrides entries of ``split_plan``'s launch plan (and ``num_warps``): for tuning benchmarks only.

    Returns:
        torch.Tensor: ``[B, Q, H, D]`` contiguous, query's dtype.
    """
    batch, heads, num_q, dim = query.shape
    kv_heads, slots = key.shape[1], key.shape[2]
    rep = heads // kv_heads
    out = torch.empty((batch, num_q, heads, dim), dtype=query.dtype, device=query.device)
    if num_q == 0 or batch == 0:
        return out
    query, key, value = (_last_dim_contiguous(t) for t in (query, key, value))
    rows = rep * num_q
    overrides = dict(plan or {})
    plan = split_plan(rows, kv_heads, dim, key.element_size(), shared_limit(query.device))
    plan.update({k: v for k, v in overrides.items() if k in plan})
    plan["row_blocks"] = triton.cdiv(rows, plan["BLOCK_M"])
    chunks = plan["chunks"]
    ws = dict(dtype=torch.float32, device=query.device)
    m = torch.empty((batch * kv_heads, rows, chunks), **ws)
    lsum = torch.empty((batch * kv_heads, rows, chunks), **ws)
    acc = torch.empty((batch * kv_heads, rows, chunks, dim), **ws)
    is_bool = mask.dtype == torch.bool
    # a bool mask is read as bytes: a view when eager; under torch.compile a copy (inductor cannot lower a bool view)
    mask_arg = (mask.to(torch.uint8) if torch.compiler.is_compiling() else mask.view(torch.uint8)) if is_bool else mask
    mask_batch_stride = mask_arg.stride(0) if mask_arg.shape[0] > 1 else 0
    warps = plan["num_warps"]
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    has_len = lengths is not None
    _split_kernel[(chunks, batch * kv_heads, plan["row_blocks"])](
        query, key, value, mask_arg, lengths if has_len else m, m if flat is None else flat, m, lsum, acc, num_q,
        slots, rows, kv_heads,
        query.stride(0), query.stride(1), query.stride(2), key.stride(0), key.stride(1), key.stride(2),
        value.stride(0), value.stride(1), value.stride(2),
        mask_batch_stride, mask_arg.stride(2), mask_arg.stride(3),  # the copy's own strides (a copy is contiguous)
        SCALE=float(scale), REP=rep, BLOCK_M=plan["BLOCK_M"], BLOCK_N=plan["BLOCK_N"], D=dim,
        MASK_BOOL=is_bool, HAS_LEN=has_len, HAS_FLAT=flat is not None, IEEE=query.dtype == torch.float32,
        UPCAST=query.dtype == torch.bfloat16 and interpreted, FULL_TILES=bool(plan["FULL_TILES"]), num_warps=warps,
        num_stages=plan["STAGES"],
    )  # fmt: skip
    per_program = min(triton.next_power_of_2(rows), _INTERPRETED_COMBINE_ROWS) if interpreted else plan["COMBINE_ROWS"]
    _combine_kernel[(batch * kv_heads * triton.cdiv(rows, per_program),)](
        m, lsum, acc, out, lengths if has_len else m, num_q, heads, rows, chunks, slots, kv_heads,
        REP=rep, D=dim, BLOCK_C=max(2, min(32, triton.next_power_of_2(chunks))), BLOCK_N=plan["BLOCK_N"],
        HAS_LEN=has_len, OUT_BF16=query.dtype == torch.bfloat16, ROWS=per_program,
        num_warps=4 if dim * chunks * per_program >= 4096 else 2,
    )  # fmt: skip
    return out
