"""Fused Triton kernel of ``tree_gdn``: the whole tree recurrence of one layer in one launch.

One program per (value head, block of ``BLOCK_V`` value columns) owns a ``[K, BLOCK_V]`` slice of the state and
walks the nodes in order ``0 .. N-1`` (a parent always precedes its children):

- the running state stays in registers while ``parents[i] == i - 1`` (chains, first children);
- any other node reloads its parent's state from a scratch buffer (``init_state`` for ``parents[i] == -1``);
- after its update, node i's state is written to scratch only if a node other than ``i + 1`` is its child.
  Each program reads the parent array once into registers and tests this per node, so no other launch is needed.

The scratch has one ``[HV, K, V]`` fp32 row per node (rows are written only for such branch points and are never
zeroed). The next node's inputs are loaded one step ahead, so their latency overlaps the current update.

That walk is ``N`` dependent steps. For trees of up to ``PATHS_MAX_NODES`` nodes the default is the path-parallel
kernel instead: one program per (value head, value block, node) replays the node's own root-to-node path from
``init_state`` (its depth + 1 steps, no scratch, no barriers) and writes that node's output. The work is the sum
of the depths instead of ``N``, but the steps in sequence are only the deepest path's: a DDTree of budget 64 drawn
from a 16-token block is at most 17 deep where the node walk is 65 long. A chain of ``N`` nodes costs both kernels
``N`` steps in sequence, and the path kernel ``N (N + 1) / 2`` updates in all, so long chains (the chain-tree
prefill) keep the node walk.

A third schedule, ``walk="chunk"`` (trees of up to ``CHUNK_MAX_NODES`` nodes), takes every node at once in matrix
form (``_tree_gdn_chunk_kernel``), one program per (value head, block of value columns). Its
products run on tensor cores in 1 TF32 pass for bf16 values (``precision="tf32"``: within bf16 rounding, see
``default_precision``), in 3 TF32 passes for others (``"tf32x3"``, as accurate as fp32 products at the tests'
1e-5), or in fp32 (``"ieee"``, several times slower). ``"auto"`` takes it for the tree sizes in
``CHUNK_AUTO_SIZES`` when it has at least ``CHUNK_MIN_PROGRAMS`` programs (value heads x 32-column value blocks).
On 1-pass products it brings the 8B hybrid's compiled 16 / 32 / 64-node verifies on an H200 to 1.09 / 1.16 / 1.14 x
the 1-node verify (1.16 x at 64 nodes on 15-deep trees; docs/hybrid.md); at the zoo hybrid's 16 programs the path
schedule stays faster.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdec.backends import env_default
from specdec.kernels._triton import device_property

__all__ = [
    "CHUNK_MAX_NODES",
    "PATHS_MAX_NODES",
    "auto_walk",
    "default_precision",
    "gdn_path_replay_triton",
    "tensor_cores",
    "tree_gdn_triton",
]

PATHS_MAX_NODES = 128
"""Trees of up to this many nodes run the path-parallel kernel, larger ones the node walk."""

CHUNK_MAX_NODES = 64
"""The largest tree the matrix-form kernel (``walk="chunk"``) takes: its ``[N, N]`` and ``[N, K]`` tiles."""

CHUNK_CONFIGS = ((16, 16, 32, 4), (32, 32, 64, 4), (64, 64, 32, 4))
"""The matrix-form kernel's launch by tree size: ``(up to this many nodes, BLOCK_N rows, BLOCK_V value columns,
warps)``, the fastest of a 27-way sweep at the 8B shape on the round's DDTree trees (H200, docs/kernels.md)."""

CHUNK_SQUARING_NODES = 33
"""From this many nodes the matrix-form kernel finds each node's ancestors by squaring the parent relation on tensor
cores (``ceil(log2(depth)) + 1`` products, one for depth <= 1) instead of walking every node up at once (``depth``
rounds of register work): at the 8B shape on an H200 (``bench_tree_gdn.py --providers chunk-walk-graph
chunk-squaring-graph``) the squaring was faster at 64 nodes on every tree (18.3 vs 20.5 us 3 deep, 26.4 vs 36.8 15
deep) and slower or equal at 16 and 32 nodes (docs/kernels.md)."""

CHUNK_BLOCK_V = 32
"""``walk="auto"`` counts the matrix form's programs in value blocks of this many columns."""

CHUNK_AUTO_SIZES = {"tf32x3": ((16, 16), (33, 64)), "tf32": ((16, 64),)}
"""Tree sizes (inclusive ranges) for which ``walk="auto"`` takes the matrix form, by its products' precision.
Measured inside the 8B hybrid's verify on an H200 (docs/hybrid.md): on 3-pass TF32 products faster than the path
schedule at 16 and 64 nodes on deep trees and as fast on shallow ones, at 32 nodes no faster on deep trees and slower
on shallow ones; on 1-pass TF32 products 2.0-6.2 x faster at every size from 16 to 64 nodes on both trees
(``bench_tree_gdn.py``). Smaller trees not measured. fp32 products (``"ieee"``: GPUs without TF32 tensor cores) have
no entry: there ``"auto"`` takes the matrix form only when ``SPECDEC_TREE_GDN_WALK=chunk`` forces it."""

CHUNK_MIN_PROGRAMS = 64
"""``walk="auto"`` takes the matrix form only with at least this many programs (value heads x value blocks)."""

PRECISIONS = ("ieee", "tf32x3", "tf32")
"""The matrix form's products: fp32, 3-pass TF32 (as accurate as fp32 at the tests' 1e-5) or 1-pass TF32 (inputs
rounded to TF32's 10-bit mantissa, products summed in fp32)."""

TREE_PRECISION = env_default("tree_gdn_precision")
"""What ``precision=None`` runs in the matrix form on a device with TF32 tensor cores: ``"auto"``
(``default_precision``) or one of ``PRECISIONS``."""

TREE_WALK = env_default("tree_gdn_walk")
"""What ``walk="auto"`` runs for trees of up to ``CHUNK_MAX_NODES`` nodes: ``"auto"`` (``auto_walk``), ``"paths"``
or ``"chunk"``."""


def tensor_cores(device: torch.device) -> bool:
    """Whether ``device`` runs the matrix form's 3-pass TF32 products: CUDA compute capability 8.0 or newer (read
    once per device); Triton's interpreter (CPU) emulates them."""
    return device.type != "cuda" or device_property(device, "major", 8) >= 8


def default_precision(values_dtype: torch.dtype, tf32: bool = True) -> str:
    """The matrix form's products for ``precision=None``: ``"ieee"`` without TF32 tensor cores (``tf32=False``), else
    ``SPECDEC_TREE_GDN_PRECISION`` when set, else 1-pass TF32 for bf16 values and 3-pass TF32 otherwise.

    A bf16 model keeps its layer outputs in bf16 (8-bit mantissa), and 1-pass TF32 products err by less than that
    rounding: at the 8B shape on the round's trees 0.24-0.28 x of it (``bench_tree_gdn.py --accuracy``; the
    GPU test ``test_one_pass_tf32_errs_less_than_rounding_to_bf16`` holds them to it). The outputs feed only this
    round's logits: the committed state is advanced by ``gdn_path_replay`` in fp32. fp16 (10-bit mantissa) and fp32
    models keep the 3-pass products, as accurate as fp32 ones.
    """
    if not tf32:
        return "ieee"
    if TREE_PRECISION != "auto":
        return TREE_PRECISION
    return "tf32" if values_dtype == torch.bfloat16 else "tf32x3"


def auto_walk(num_nodes: int, num_value_heads: int, value_dim: int, *, precision: str = "tf32x3") -> str:
    """The schedule ``walk="auto"`` runs for a tree of ``num_nodes`` nodes whose matrix form would take products of
    ``precision`` (see the module docstring); without TF32 tensor cores (``precision="ieee"``) the matrix form is not
    picked unless ``SPECDEC_TREE_GDN_WALK=chunk``."""
    if num_nodes <= CHUNK_MAX_NODES and TREE_WALK == "chunk":
        return "chunk"
    if num_nodes <= CHUNK_MAX_NODES and TREE_WALK == "auto" and precision in CHUNK_AUTO_SIZES:
        programs = num_value_heads * triton.cdiv(value_dim, CHUNK_BLOCK_V)
        if programs >= CHUNK_MIN_PROGRAMS and any(lo <= num_nodes <= hi for lo, hi in CHUNK_AUTO_SIZES[precision]):
            return "chunk"
    return "paths" if num_nodes <= PATHS_MAX_NODES else "nodes"


@triton.jit
def _head_slice(HV, HEADS_PER_KEY, K: tl.constexpr, V: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr):
    """This program's value head (axis 0) and value block (axis 1): head, its key head, the number of key heads,
    the key / value offsets and their masks."""
    head = tl.program_id(0).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    offs_v = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    mask_k = offs_k < K
    mask_v = offs_v < V
    return head, head // HEADS_PER_KEY, HV // HEADS_PER_KEY, offs_k, offs_v, mask_k, mask_v


@triton.jit
def _delta_rule_step(state, k, v, g, beta):
    """One gated delta-rule update of a ``[BLOCK_K, BLOCK_V]`` state slice (decay, recall, corrected write)."""
    state = state * tl.exp(g)
    recalled = tl.sum(state * k[:, None], axis=0)  # [BLOCK_V]
    delta = (v - recalled) * beta
    return state + k[:, None] * delta[None, :]


@triton.jit
def _tree_gdn_kernel(
    init_ptr,
    q_ptr,
    k_ptr,
    v_ptr,
    g_ptr,
    beta_ptr,
    parents_ptr,
    out_ptr,
    scratch_ptr,
    N,
    HV,
    HEADS_PER_KEY,
    HEADS_PER_ROW,  # value heads of one sequence: program head h reads sequence h // HEADS_PER_ROW's tree
    NODE_STRIDE,
    K: tl.constexpr,
    V: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    head, key_head, num_key_heads, offs_k, offs_v, mask_k, mask_v = _head_slice(HV, HEADS_PER_KEY, K, V, BLOCK_K,
                                                                                BLOCK_V)  # fmt: skip
    parents_ptr += (head // HEADS_PER_ROW) * N  # this sequence's parent array
    mask_kv = mask_k[:, None] & mask_v[None, :]
    state_offs = head * K * V + offs_k[:, None] * V + offs_v[None, :]  # int64: head is int64

    node_ids = tl.arange(0, BLOCK_N)
    all_parents = tl.load(parents_ptr + node_ids, mask=node_ids < N, other=-2)

    state = tl.load(init_ptr + state_offs, mask=mask_kv, other=0.0)
    # inputs of node 0; each iteration prefetches those of the next node
    parent = tl.load(parents_ptr)
    k = tl.load(k_ptr + key_head * K + offs_k, mask=mask_k, other=0.0)
    q = tl.load(q_ptr + head * K + offs_k, mask=mask_k, other=0.0)
    v = tl.load(v_ptr + head * V + offs_v, mask=mask_v, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + head)
    beta = tl.load(beta_ptr + head)
    for i in range(0, N):
        node = tl.cast(i, tl.int64)
        nxt = tl.minimum(node + 1, N - 1)  # the last node prefetches itself again (unused, always in bounds)
        parent_next = tl.load(parents_ptr + nxt)
        k_next = tl.load(k_ptr + (nxt * num_key_heads + key_head) * K + offs_k, mask=mask_k, other=0.0)
        q_next = tl.load(q_ptr + (nxt * HV + head) * K + offs_k, mask=mask_k, other=0.0)
        v_next = tl.load(v_ptr + (nxt * HV + head) * V + offs_v, mask=mask_v, other=0.0)
        g_next = tl.load(g_ptr + nxt * HV + head)
        beta_next = tl.load(beta_ptr + nxt * HV + head)

        if parent != node - 1:
            if parent < 0:
                state = tl.load(init_ptr + state_offs, mask=mask_kv, other=0.0)
            else:
                state = tl.load(scratch_ptr + parent * NODE_STRIDE + state_offs, mask=mask_kv, other=0.0)
        state = _delta_rule_step(state, k, v, g, beta)
        out = tl.sum(state * q[:, None], axis=0)
        tl.store(out_ptr + (node * HV + head) * V + offs_v, out, mask=mask_v)
        branch_children = tl.sum(((all_parents == node) & (node_ids != node + 1)).to(tl.int32), axis=0)
        if branch_children > 0:
            tl.store(scratch_ptr + node * NODE_STRIDE + state_offs, state, mask=mask_kv)
            tl.debug_barrier()  # the reload of this row may be issued by other threads of the program

        parent, k, q, v, g, beta = parent_next, k_next, q_next, v_next.to(tl.float32), g_next, beta_next


def _launch_config(k_dim: int, v_dim: int) -> tuple[int, int]:
    """``(BLOCK_V, num_warps)``: narrow value blocks give more programs, the walk over nodes is latency-bound."""
    block_v = min(triton.next_power_of_2(v_dim), 16)
    elems = triton.next_power_of_2(k_dim) * block_v
    return block_v, 1 if elems <= 2048 else 2


@triton.jit
def _tree_gdn_paths_kernel(
    init_ptr,
    q_ptr,
    k_ptr,
    v_ptr,
    g_ptr,
    beta_ptr,
    parents_ptr,
    out_ptr,
    N,
    HV,
    HEADS_PER_KEY,
    HEADS_PER_ROW,  # value heads of one sequence: program head h reads sequence h // HEADS_PER_ROW's tree
    K: tl.constexpr,
    V: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """One program per (value head, value block, node): the node's root-to-node path replayed from ``init_state``.

    The path is found by walking up the parent array (``depth[j]``: how far above the node path node ``j`` sits,
    -1 off the path), then replayed from the root down, the next step's inputs loaded one step ahead.
    """
    node = tl.program_id(2).to(tl.int64)
    head, key_head, num_key_heads, offs_k, offs_v, mask_k, mask_v = _head_slice(HV, HEADS_PER_KEY, K, V, BLOCK_K,
                                                                                BLOCK_V)  # fmt: skip
    parents_ptr += (head // HEADS_PER_ROW) * N  # this sequence's parent array
    mask_kv = mask_k[:, None] & mask_v[None, :]

    node_ids = tl.arange(0, BLOCK_N)
    # the parent array in registers (one load), so the walk up is register work, not a chain of dependent loads
    all_parents = tl.load(parents_ptr + node_ids, mask=node_ids < N, other=-1).to(tl.int32)
    up = tl.full([BLOCK_N], -1, tl.int32)  # up[j] = steps from the node up to ancestor j (0: the node itself)
    cur = node.to(tl.int32)
    steps = tl.full([], 0, tl.int32)
    while cur >= 0:
        on = node_ids == cur
        up = tl.where(on, steps, up)
        cur = tl.sum(tl.where(on, all_parents, 0), axis=0)
        steps += 1

    state = tl.load(init_ptr + head * K * V + offs_k[:, None] * V + offs_v[None, :], mask=mask_kv, other=0.0)
    # inputs of the root (steps - 1 above the node); each iteration prefetches those of the next path node
    j = tl.sum(tl.where(up == steps - 1, node_ids, 0), axis=0).to(tl.int64)
    k = tl.load(k_ptr + (j * num_key_heads + key_head) * K + offs_k, mask=mask_k, other=0.0)
    v = tl.load(v_ptr + (j * HV + head) * V + offs_v, mask=mask_v, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + j * HV + head)
    beta = tl.load(beta_ptr + j * HV + head)
    for s in range(1, steps + 1):
        # the node itself (s == steps) prefetches itself again: unused, always in bounds
        nxt = tl.sum(tl.where(up == tl.maximum(steps - 1 - s, 0), node_ids, 0), axis=0).to(tl.int64)
        k_next = tl.load(k_ptr + (nxt * num_key_heads + key_head) * K + offs_k, mask=mask_k, other=0.0)
        v_next = tl.load(v_ptr + (nxt * HV + head) * V + offs_v, mask=mask_v, other=0.0)
        g_next = tl.load(g_ptr + nxt * HV + head)
        beta_next = tl.load(beta_ptr + nxt * HV + head)
        state = _delta_rule_step(state, k, v, g, beta)
        k, v, g, beta = k_next, v_next.to(tl.float32), g_next, beta_next
    q = tl.load(q_ptr + (node * HV + head) * K + offs_k, mask=mask_k, other=0.0)
    out = tl.sum(state * q[:, None], axis=0)
    tl.store(out_ptr + (node * HV + head) * V + offs_v, out, mask=mask_v)


@triton.jit
def _tree_gdn_chunk_kernel(
    init_ptr,
    q_ptr,
    k_ptr,
    v_ptr,
    g_ptr,
    beta_ptr,
    parents_ptr,
    out_ptr,
    N,
    HV,
    HEADS_PER_KEY,
    HEADS_PER_ROW,  # value heads of one sequence: program head h reads sequence h // HEADS_PER_ROW's tree
    K: tl.constexpr,
    V: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr,
    ANCESTRY: tl.constexpr,
):
    """One program per (value head, value block): every node of the tree at once, in matrix form.

    With ``G_i`` the log decay summed over node i's path (itself included) and ``anc(i)`` its ancestors, the
    corrections ``d_i = beta_i (v_i - k_i S_{pre,i})`` solve ``(I + A) d = beta (V - exp(G) K S_0)`` with
    ``A_ij = beta_i exp(G_i - G_j) k_i.k_j`` for ``j`` in ``anc(i)``, and each output is ``o_i = exp(G_i) q_i S_0 +
    sum over j in anc(i) + {i} of exp(G_i - G_j) q_i.k_j d_j``. ``A`` is nilpotent (a product of ``A`` factors
    follows an ancestor chain), so ``d = R - A d`` iterated ``depth`` times from ``d = R`` is exact for every node:
    after ``t`` rounds the nodes of depth ``< t`` hold their final values, each row summed as forward substitution
    would sum it.
    """
    head, key_head, num_key_heads, offs_k, offs_v, mask_k, mask_v = _head_slice(HV, HEADS_PER_KEY, K, V, BLOCK_K,
                                                                                BLOCK_V)  # fmt: skip
    parents_ptr += (head // HEADS_PER_ROW) * N  # this sequence's parent array
    rows = tl.arange(0, BLOCK_N)
    valid = rows < N
    parents = tl.load(parents_ptr + rows, mask=valid, other=-1).to(tl.int32)
    # anc[i, j]: j is i or one of its ancestors (depth: the longest path's node count - 1)
    if ANCESTRY == "walk":  # depth rounds of register work on [BLOCK_N, BLOCK_N] tiles
        cur = tl.where(valid, rows, -1)
        anc = (rows[:, None] < 0) & (rows[None, :] < 0)  # [BLOCK_N, BLOCK_N], all False
        depth = tl.full([], -1, tl.int32)
        while tl.max(cur, axis=0) >= 0:
            hit = rows[None, :] == cur[:, None]
            anc = anc | hit
            cur = tl.where(cur >= 0, tl.sum(tl.where(hit, parents[None, :], 0), axis=1), -1)
            depth += 1
    else:  # "squaring": reach = I + P (P: the parent relation) squared until it stops growing, ceil(log2(depth))
        # + 1 products on tensor cores (exact: 0/1 entries in fp16, counts <= BLOCK_N)
        reach = (((rows[:, None] == rows[None, :]) | (parents[:, None] == rows[None, :])) & valid[:, None]).to(
            tl.float16
        )
        grow = True
        while grow:
            wider = (tl.dot(reach, reach) > 0).to(tl.float16)
            grow = tl.sum((wider != reach).to(tl.int32)) > 0
            reach = wider
        anc = reach > 0
        depth = tl.max(tl.sum(anc.to(tl.int32), axis=1), axis=0) - 1

    g = tl.load(g_ptr + rows * HV + head, mask=valid, other=0.0)
    beta = tl.load(beta_ptr + rows * HV + head, mask=valid, other=0.0)
    cum = tl.sum(tl.where(anc, g[None, :], 0.0), axis=1)  # G_i
    decay = tl.where(anc, tl.exp(tl.where(anc, cum[:, None] - cum[None, :], 0.0)), 0.0)

    mask_nk = valid[:, None] & mask_k[None, :]
    keys = tl.load(k_ptr + (rows[:, None] * num_key_heads + key_head) * K + offs_k[None, :], mask=mask_nk, other=0.0)
    queries = tl.load(q_ptr + (rows[:, None] * HV + head) * K + offs_k[None, :], mask=mask_nk, other=0.0)
    values = tl.load(v_ptr + (rows[:, None] * HV + head) * V + offs_v[None, :],
                     mask=valid[:, None] & mask_v[None, :], other=0.0).to(tl.float32)  # fmt: skip
    state = tl.load(init_ptr + head * K * V + offs_k[:, None] * V + offs_v[None, :],
                    mask=mask_k[:, None] & mask_v[None, :], other=0.0)  # fmt: skip

    start = tl.exp(cum)[:, None]
    strict = anc & (rows[:, None] != rows[None, :])
    a = tl.where(strict, beta[:, None] * decay * tl.dot(keys, tl.trans(keys), input_precision=PRECISION), 0.0)
    r = beta[:, None] * (values - start * tl.dot(keys, state, input_precision=PRECISION))
    d = r
    for _ in range(depth):
        d = r - tl.dot(a, d, input_precision=PRECISION)
    scores = decay * tl.dot(queries, tl.trans(keys), input_precision=PRECISION)
    out = start * tl.dot(queries, state, input_precision=PRECISION) + tl.dot(scores, d, input_precision=PRECISION)
    tl.store(out_ptr + (rows[:, None] * HV + head) * V + offs_v[None, :], out, mask=valid[:, None] & mask_v[None, :])


def tree_gdn_triton(
    init_state: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    log_decay: torch.Tensor,
    beta: torch.Tensor,
    parents: torch.Tensor,
    *,
    walk: str = "auto",
    precision: str | None = None,
) -> torch.Tensor:
    """Triton ``tree_gdn``; arguments and result as ``tree_gdn_reference``.

    ``parents`` is not validated here (that would need a device sync): ``parents[i] < i`` is required.

    Args:
        walk (str): ``"paths"`` (one program per node replays its path), ``"nodes"`` (one walk over the nodes in
            order), ``"chunk"`` (all nodes at once in matrix form, trees of up to ``CHUNK_MAX_NODES`` nodes) or
            ``"auto"`` (``auto_walk``: chunk for the sizes of ``CHUNK_AUTO_SIZES`` with enough programs, else paths for
            trees of up to ``PATHS_MAX_NODES`` nodes, else nodes; ``SPECDEC_TREE_GDN_WALK`` can force paths or chunk).
        precision (str | None): the matrix form's products: ``"ieee"`` (fp32), ``"tf32x3"`` (3-pass TF32 on tensor
            cores: each fp32 operand split into two TF32 parts, three products; compute capability 8.0 or newer),
            ``"tf32"`` (1-pass TF32: operands rounded to a 10-bit mantissa) or ``None`` (``default_precision``: tf32
            for bf16 values, tf32x3 for others, ieee without TF32 tensor cores). The other schedules ignore it.
    """
    n = q.shape[0]
    tf32 = tensor_cores(q.device)
    if precision is None:
        precision = default_precision(v.dtype, tf32)
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r}: choose 'ieee', 'tf32x3', 'tf32' or None.")
    if precision != "ieee" and not tf32:
        raise ValueError(
            f"precision={precision!r} needs TF32 tensor cores (compute capability 8.0 or newer): use 'ieee'."
        )
    if walk == "auto":
        walk = auto_walk(n, q.shape[1], v.shape[-1], precision=precision)
    if walk not in ("paths", "nodes", "chunk"):
        raise ValueError(f"walk={walk!r}: choose 'auto', 'paths', 'nodes' or 'chunk'.")
    if walk == "chunk" and n > CHUNK_MAX_NODES:
        raise ValueError(f"walk='chunk' takes trees of up to {CHUNK_MAX_NODES} nodes; got {n}: use 'paths' or 'nodes'.")
    block_n = None
    if walk == "chunk":
        block_n, block_v, num_warps = chunk_config(n)
    else:
        block_v, num_warps = _launch_config(q.shape[-1], v.shape[-1])
    return _tree_gdn(init_state, q, k, v, log_decay, beta, parents, block_v=block_v, num_warps=num_warps, walk=walk,
                     precision=precision, block_n=block_n, ancestry=chunk_ancestry(n))  # fmt: skip


def chunk_config(num_nodes: int) -> tuple[int, int, int]:
    """``(BLOCK_N, BLOCK_V, num_warps)`` of the matrix-form kernel for a tree of ``num_nodes`` nodes."""
    return next(tuple(config) for limit, *config in CHUNK_CONFIGS if num_nodes <= limit)


def chunk_ancestry(num_nodes: int) -> str:
    """How the matrix-form kernel finds the ancestors in a tree of ``num_nodes`` nodes: ``"walk"`` or
    ``"squaring"`` (``CHUNK_SQUARING_NODES``)."""
    return "squaring" if num_nodes >= CHUNK_SQUARING_NODES else "walk"


def _tree_gdn(
    init_state,
    q,
    k,
    v,
    log_decay,
    beta,
    parents,
    *,
    block_v: int,
    num_warps: int,
    walk: str = "nodes",
    precision: str = "ieee",
    block_n: int | None = None,
    ancestry: str = "walk",
) -> torch.Tensor:
    n, hv, k_dim = q.shape
    v_dim = v.shape[-1]
    out = torch.empty((n, hv, v_dim), dtype=torch.float32, device=q.device)
    inputs = (
        init_state.float().contiguous(),
        q.float().contiguous(),
        k.float().contiguous(),
        v.contiguous(),
        log_decay.float().contiguous(),
        beta.float().contiguous(),
        parents.to(torch.int64).contiguous(),
        out,
    )
    sizes = dict(K=k_dim, V=v_dim, BLOCK_K=triton.next_power_of_2(k_dim), BLOCK_V=block_v,
                 BLOCK_N=triton.next_power_of_2(n), num_warps=num_warps)  # fmt: skip
    heads_per_key = hv // k.shape[1]
    heads_per_row = hv // (parents.numel() // n)  # parents [rows * N]: one tree per sequence
    if walk == "paths":
        _tree_gdn_paths_kernel[(hv, triton.cdiv(v_dim, block_v), n)](*inputs, n, hv, heads_per_key, heads_per_row,
                                                                    **sizes)  # fmt: skip
    elif walk == "chunk":  # tl.dot needs 16 rows / columns at least
        sizes.update(BLOCK_N=block_n or max(16, sizes["BLOCK_N"]))
        _tree_gdn_chunk_kernel[(hv, triton.cdiv(v_dim, block_v))](
            *inputs, n, hv, heads_per_key, heads_per_row, PRECISION=precision, ANCESTRY=ancestry, **sizes
        )
    else:
        scratch = torch.empty((n, hv, k_dim, v_dim), dtype=torch.float32, device=q.device)
        _tree_gdn_kernel[(hv, triton.cdiv(v_dim, block_v))](
            *inputs, scratch, n, hv, heads_per_key, heads_per_row, hv * k_dim * v_dim, **sizes
        )
    return out


@triton.jit
def _gdn_path_kernel(
    state_ptr,
    k_ptr,
    v_ptr,
    g_ptr,
    beta_ptr,
    path_ptr,
    num_ptr,
    P,
    HV,
    HEADS_PER_KEY,
    K: tl.constexpr,
    V: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    """One program per (sequence and value head, value block): load the state slice once, apply the path's updates,
    store. Program axis 0 runs over ``B * HV`` heads: sequence ``b = axis0 // HV`` follows its own path (``path
    [B, P]``, ``num [B]``) through the stash, whose nodes hold ``HV`` value heads each."""
    seq_head, _, _, offs_k, offs_v, mask_k, mask_v = _head_slice(HV, HEADS_PER_KEY, K, V, BLOCK_K, BLOCK_V)
    seq = seq_head // HV
    head = seq_head - seq * HV  # this sequence's value head
    key_head, num_key_heads = head // HEADS_PER_KEY, HV // HEADS_PER_KEY
    path_ptr += seq * P
    mask_kv = mask_k[:, None] & mask_v[None, :]
    state_offs = seq_head * K * V + offs_k[:, None] * V + offs_v[None, :]
    state = tl.load(state_ptr + state_offs, mask=mask_kv, other=0.0)
    num = tl.load(num_ptr + seq)
    for step in range(0, P):
        if step < num:
            node = tl.load(path_ptr + step)
            k = tl.load(k_ptr + (node * num_key_heads + key_head) * K + offs_k, mask=mask_k, other=0.0)
            v = tl.load(v_ptr + (node * HV + head) * V + offs_v, mask=mask_v, other=0.0).to(tl.float32)
            g = tl.load(g_ptr + node * HV + head)
            beta = tl.load(beta_ptr + node * HV + head)
            state = _delta_rule_step(state, k, v, g, beta)
    tl.store(state_ptr + state_offs, state, mask=mask_kv)


def gdn_path_replay_triton(state, k, v, log_decay, beta, path, num_path) -> None:
    """Triton ``gdn_path_replay``: arguments as ``gdn_path_replay_reference``; ``state`` must be contiguous fp32.
    A batch: ``state [B, HV, K, V]``, ``path [B, P]`` (node indices into the stash ``k``, ``v``, ...), ``num_path
    [B]``, in one launch."""
    if state.dtype != torch.float32 or not state.is_contiguous():
        raise ValueError("gdn_path_replay_triton updates state in place: pass a contiguous fp32 tensor.")
    hv, k_dim, v_dim = state.shape[-3:]
    rows = state.numel() // (hv * k_dim * v_dim)
    block_v, num_warps = _launch_config(k_dim, v_dim)
    _gdn_path_kernel[(rows * hv, triton.cdiv(v_dim, block_v))](
        state,
        k.float().contiguous(),
        v.contiguous(),
        log_decay.float().contiguous(),
        beta.float().contiguous(),
        path.to(torch.int64).contiguous(),
        num_path.to(torch.int64).reshape(rows),
        path.shape[-1],
        hv,
        hv // k.shape[1],
        K=k_dim,
        V=v_dim,
        BLOCK_K=triton.next_power_of_2(k_dim),
        BLOCK_V=block_v,
        num_warps=num_warps,
    )
