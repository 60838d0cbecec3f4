"""Fixed-shape storage and forwards of an ``Eagle3Drafter`` for the round (static K/V of the head's one layer).

Row ``t`` of the head pairs the fused target state of position ``t`` with the embedding of the token at ``t + 1``
and sits at rotary position and slot ``t``. The storage holds, per sequence, the head's keys/values of every
committed row ``[2, B, H_kv, capacity + 1, D]`` and the fused target state of every committed position
``[B, capacity + 1, H]`` (slot ``capacity`` is a scratch slot no query sees, where rows past the end land).

- ``prefill``: rows ``0 .. T-2`` of the prompt (the last prompt row needs the root, known in the round).
- ``resume``: a prompt continuing the kept sequence from position ``s``: rows ``s - 1 .. T-2`` (as ``prefill``).
- ``propose``: row ``prefix - 1`` (the fused state of the last committed position with the root) gives the depth-1
  distribution; each next step pairs the head's own output with the token it drafted, at the next slot. Those
  slots past the committed rows are rewritten by the next ``commit`` before any query reads them.
- ``propose_tree`` (EAGLE-2's dynamic tree, for policies that read ``candidates``): the same first row, then per
  level one forward of the ``k`` frontier rows, all at the level's position; their keys/values go to a per-round
  scratch block (``[2, B, H_kv, (L - 1) * k, D]``, never the committed storage), and each frontier row sees the
  committed rows and its own ancestors in the block only.
- ``commit``: the accepted path's fused states go to positions ``prefix ..``; its rows (each with the next accepted
  token) are written in one causal block. Only accepted tokens' rows stay.

Shapes never change and nothing is read on the host, so the round can be captured in a CUDA graph.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from specdec import attention
from specdec.drafters.dflash_static import _NORM_IMPL
from specdec.kernels.kv_write import kv_write
from specdec.kernels.rms_norm import add_rms_norm, rms_norm, rms_norm_cat
from specdec.kernels.rotary.routing import fused, rotary_kernel_for
from specdec.kernels.row_gather import embed, plain_table
from specdec.kernels.tree_attention import tree_attention
from specdec.runtime import constant
from specdec.state.storage import mask_values
from specdec.target import weights_state
from specdec.trees.dynamic import expand_candidates
from specdec.types import Accept, Proposal

__all__ = ["Eagle3Static"]

_FUSED = fused(apply_rotary_pos_emb)  # the rotary kernel where a call fits it, HF's rotation otherwise


class Eagle3Static:
    """Static storage of one ``Eagle3Drafter`` for ``batch`` sequences of up to ``capacity`` tokens.

    Args:
        drafter (Eagle3Drafter): bound to its target.
        capacity (int): slots per sequence.
        batch (int): sequences. Default 1.
    """

    def __init__(self, drafter, capacity: int, batch: int = 1) -> None:
        model, cfg = drafter.model, drafter.config
        device, dtype = model.fc.weight.device, model.fc.weight.dtype
        self.drafter, self.capacity, self.scratch = drafter, capacity, capacity
        self.norm_impl = _NORM_IMPL  # Backends.dflash_norm: the drafters' RMSNorms
        size = capacity + 1
        self.kv = torch.zeros(2, batch, cfg.num_key_value_heads, size, cfg.head_dim, dtype=dtype, device=device)
        self.fused = torch.zeros(batch, size, cfg.hidden_size, dtype=dtype, device=device)
        self.rows = torch.arange(batch, device=device)[:, None]
        self.slots = torch.arange(size, device=device)
        cos, sin = model.rope(self.slots[None], dtype)  # rotary tables by slot (= position), computed once
        self.rope_table = torch.stack((cos[0], sin[0]), 1)  # [slots, 2, D]: one gather for both per forward
        self.rep = cfg.num_attention_heads // cfg.num_key_value_heads
        self.tree_kv: dict[int, torch.Tensor] = {}  # the committed and a candidate tree's keys/values, by its rows
        self.target_ids = self.drafter.model.target_ids()
        # q/k/v and gate/up stacked: two products per step fewer (a copy of those weights, refreshed when they change)
        self.packed = model.packed_weights()
        self._packed_from = self._weights_key()

    def _weights_key(self) -> tuple:
        """Where the head's stacked projections are and how often they were written (``weights_state``): changes
        when any of them is updated in place (training, ``load_state_dict``) or replaced."""
        attn, mlp = self.drafter.model.midlayer.self_attn, self.drafter.model.midlayer.mlp
        return weights_state([attn.q_proj, attn.k_proj, attn.v_proj, mlp.gate_proj, mlp.up_proj])

    def refresh(self) -> None:
        """Before a call that reuses this storage: the draft-to-target id map (``d2t`` may have been changed) and,
        where the head's weights changed since they were stacked, the stacked projections, copied into the same
        tensors: a captured round reads them by address, so new tensors would leave the graph reading freed memory
        (ids out of the vocabulary, stale weights)."""
        self.target_ids.copy_(self.drafter.model.target_ids())
        key = self._weights_key()
        if key != self._packed_from:  # the head's weights changed since the copy: rewrite it in place
            self.drafter.model.packed_weights(out=self.packed)
            self._packed_from = key

    def _norm(self, module, x: torch.Tensor) -> torch.Tensor:
        """One of the head's RMSNorm modules applied to ``x`` by ``Backends.dflash_norm`` (``auto``: one launch on
        CUDA; the module's own ops, bit for bit, elsewhere)."""
        return rms_norm(x, module.weight, module.variance_epsilon, impl=self.norm_impl)

    def _norm_cat(self, module_a, a: torch.Tensor, module_b, b: torch.Tensor) -> torch.Tensor:
        """``torch.cat([_norm(module_a, a), _norm(module_b, b)], -1)``: one launch where the norms take the kernel
        (``rms_norm_cat``), else the two norms and the concatenation, bit for bit."""
        return rms_norm_cat(a, b, module_a.weight, module_b.weight, module_a.variance_epsilon,
                            module_b.variance_epsilon, impl=self.norm_impl)  # fmt: skip

    def _layer_input(self, tokens, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The head's ``layer_input`` (residual, attention input) of ``tokens`` (target ids ``[B, L]``, or ``(draft
        ids, draft-to-target map)``) and ``hidden [B, L, H]``. Where the embedding is a plain ``nn.Embedding`` of the
        hidden's dtype, the lookup (and the id map) run inside the side-by-side norms (``rms_norm_cat``'s
        ``rows``): one launch for embedding, map, both norms and the concatenation; the same values as the
        embedding module and :meth:`_norm_cat`."""
        model, layer = self.drafter.model, self.drafter.model.midlayer
        ids, row_map = tokens if isinstance(tokens, tuple) else (tokens, None)
        table = plain_table(self.drafter._embed)
        if table is not None and table.dtype == hidden.dtype:
            norms = layer.input_layernorm, layer.hidden_norm
            x = rms_norm_cat(table, hidden, norms[0].weight, norms[1].weight, norms[0].variance_epsilon,
                             norms[1].variance_epsilon, rows=ids, row_map=row_map, impl=self.norm_impl)  # fmt: skip
            return model.residual(x, hidden), x
        ids = ids if row_map is None else row_map[ids]
        return model.layer_input(embed(self.drafter._embed, ids), hidden, self._norm, self._norm_cat)

    def _add_norm(self, module, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(residual + x, module's norm of it)``: one launch where the norms take the kernel (``add_rms_norm``),
        else the tensor add and :meth:`_norm`, bit for bit."""
        return add_rms_norm(x, residual, module.weight, module.variance_epsilon, impl=self.norm_impl)

    def _rope(self, q, k, cos, sin):
        """``q [B, H_q, L, D]``, ``k [B, H_kv, L, D]`` rotated by ``cos``/``sin`` ``[B, L, D]``: one
        ``specdec.kernels.rotary`` launch where the target's rotation takes it (``Backends.target_rotary``,
        uncompiled) and the call fits it (bf16: the same products and sums as HF's, bit for bit), else HF's
        ``apply_rotary_pos_emb``."""
        if not torch.compiler.is_compiling() and rotary_kernel_for(q.device):
            return _FUSED(q, k, cos, sin)
        return apply_rotary_pos_emb(q, k, cos, sin)

    def _seen(self, positions: torch.Tensor, span: int) -> torch.Tensor:
        """The last committed slot a row at each of ``positions`` reads: its own position, and for a row past the
        capacity every slot in ``[0, span)`` but the scratch one."""
        return positions.clamp(max=min(self.capacity, span) - 1)

    def _steps(self, positions: torch.Tensor, span: int) -> list[tuple]:
        """What ``L`` one-row steps at ``positions [B, L]`` (one column each) need, computed for all of them at once
        (a chain's steps then slice it, launching nothing): per step ``(slots [B, 1]`` (past the capacity: the
        scratch slot), the rotary tables ``(cos, sin)`` ``[B, 1, D]``, the last committed slot it reads ``seen
        [B, 1]``, and for the attention kernel (None where SDPA runs) its mask ``[B, 1, 1, span]``, the slots each
        sequence reads and its flat prefix ``[B]``)."""
        slots, (cos, sin) = self._place(positions)
        seen = self._seen(positions, span)
        kernel = attention.triton_kernel_for(self.kv.device, torch.compiler.is_compiling(), self.kv.dtype,
                                             self.kv.shape[-1])  # fmt: skip
        if kernel:
            mask = (self.slots[:span] <= seen[..., None])[:, None]  # [B, 1, L, span], True = visible
            flat = seen.t().contiguous()  # [L, B]: a step's row is one contiguous [B]
            lengths = flat + 1
        steps = []
        for j in range(positions.shape[1]):
            visible = (mask[:, :, j : j + 1], lengths[j], flat[j]) if kernel else None
            steps.append((slots[:, j : j + 1], (cos[:, j : j + 1], sin[:, j : j + 1]), seen[:, j : j + 1], visible))
        return steps

    def _forward(self, tokens: torch.Tensor, hidden: torch.Tensor, step: tuple, span: int):
        """One row per sequence: ``tokens [B, 1]`` and their hidden ``[B, 1, H]`` at the step's position (a
        :meth:`_steps` entry); writes the row's keys/values at its slot and attends over slots ``[0, span)`` up to
        its position. Returns (draft logits ``[B, 1, Vd]``, hidden fed back ``[B, 1, H]``)."""
        model = self.drafter.model
        slots, rotary, seen, visible = step
        residual, q = self._write(tokens, hidden, slots, rotary)
        out = self._attend(q, seen, span, visible)
        return model.finish_head(residual, out, self._add_norm, self.packed["gate_up"])

    def _place(self, positions: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """Rows at ``positions [B, L]``: their slots (past the capacity: the scratch slot) and rotary tables
        ``(cos, sin)`` ``[B, L, D]``."""
        slots = positions.clamp(max=self.scratch)
        return slots, self.rope_table[slots].unbind(-2)

    def _write(self, tokens: torch.Tensor, hidden: torch.Tensor, slots: torch.Tensor, rotary):
        """The rows' keys/values (``tokens [B, L]``, their hidden ``[B, L, H]``) into ``slots [B, L]``, rotated by
        ``rotary`` (``(cos, sin)`` ``[B, L, D]``); returns (residual, rotated queries). A row's key and value depend
        on its own token and hidden only, so rows whose output nobody reads (prefill, resume, commit) stop here."""
        model, norm = self.drafter.model, self._norm
        residual, x = self._layer_input(tokens, hidden)
        q, k, v = model.qkv(x, *rotary, norm, self._rope, self.packed["qkv"])
        kv_write(self.kv[0], self.kv[1], slots, k, v)  # [B, H_kv, L, D] at (row, :, slot): one launch on CUDA
        return residual, q

    def _attend(self, q: torch.Tensor, seen: torch.Tensor, span: int, visible: tuple | None) -> torch.Tensor:
        """Grouped attention of ``q [B, H_q, L, D]`` over the stored slots ``[0, span)``, row ``i`` reading slots
        ``<= seen[:, i]`` (``[B, L]``, non-decreasing along ``L``); returns ``[B, L, H_q * D]``. ``visible``: the
        kernel's mask, lengths and flat prefix for these rows, computed ahead (:meth:`_steps`; None: SDPA).

        ``specdec.kernels.tree_attention`` where the target's attention takes it (CUDA; ``Backends.attention_kernel``):
        each sequence reads only its slots in use, the prefix up to the first row's slot without a mask; else SDPA
        over the span with an additive mask."""
        keys, values = self.kv[0, :, :, :span], self.kv[1, :, :, :span]
        batch, heads, rows, dim = q.shape
        if visible is not None:  # the kernel's path (``_steps`` sets it where the attention takes the kernel)
            mask, lengths, flat = visible
            out = tree_attention(q, keys, values, mask, dim**-0.5, lengths, impl=attention.kernel_impl(), flat=flat)
            return out.reshape(batch, rows, -1)
        # row r*L + i of a stacked group is query i of the group's r-th head (see _sdpa)
        keep = self.slots[:span] <= seen.repeat(1, self.rep)[..., None]  # [B, rep * L, span]
        return self._sdpa(q, keys, values, keep)

    def _sdpa(self, q, keys, values, keep):
        """Grouped attention of ``q [B, H_q, L, D]`` over ``keys``/``values`` ``[B, H_kv, K, D]`` where ``keep
        [B, rep * L, K]`` (row ``r * L + i``: query ``i`` of the ``r``-th head of a group); returns
        ``[B, L, H_q * D]``."""
        batch, heads, rows, dim = q.shape
        # heads g*rep .. g*rep+rep-1 share key/value head g: stacked along the query axis (no copy of the keys)
        q = q.reshape(batch, heads // self.rep, self.rep * rows, dim)
        bias = torch.where(keep, *mask_values(q.dtype, q.device))  # one kernel
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=bias[:, None])
        return out.reshape(batch, heads, rows, dim).transpose(1, 2).reshape(batch, rows, -1)

    def _tree_forward(self, tokens, hidden, rotary, visible, joint, first: int, flat, span: int):
        """The ``k`` frontier rows of one level: ``tokens [B, k]``, ``hidden [B, k, H]`` rotated by ``rotary``
        (``(cos, sin)`` ``[B, k, D]``: the level's position); their keys/values go to rows ``span + first ..
        span + first + k - 1`` of ``joint`` (``[2, B, H_kv, span + R, D]``: the committed slots ``[0, span)``
        copied once per draft, then the tree's ``R`` rows; one ``kv_write`` launch on CUDA); each row attends over
        the slots ``visible [B, k, span + R]`` marks (the committed slots up to the root's row, then its own
        ancestors and itself among the tree's rows): through ``specdec.kernels.tree_attention`` where the target's
        attention takes it (``flat [B]``: the committed slots every row sees, read without their mask), else SDPA
        (``flat`` None). Returns (draft logits ``[B, k, Vd]``, hidden fed back ``[B, k, H]``)."""
        model, norm = self.drafter.model, self._norm
        batch, width = tokens.shape
        residual, x = self._layer_input(tokens, hidden)
        q, k, v = model.qkv(x, *rotary, norm, self._rope, self.packed["qkv"])
        start = span + first

        def make_slots():
            return (start + torch.arange(width, device=joint.device)).expand(batch, -1).contiguous()

        slots = constant(("eagle3_tree_rows", str(joint.device), batch, start, width), make_slots)  # [B, k] int64
        kv_write(joint[0], joint[1], slots, k.to(joint.dtype), v.to(joint.dtype))
        if flat is not None:  # the attention kernel: the group's heads share each K/V tile and the mask's rows
            batch, heads, rows, dim = q.shape
            out = tree_attention(q, joint[0], joint[1], visible[:, None], dim**-0.5, impl=attention.kernel_impl(),
                                 flat=flat)  # fmt: skip
            out = out.reshape(batch, rows, -1)
        else:
            out = self._sdpa(q, joint[0], joint[1], visible.repeat(1, self.rep, 1))
        return model.finish_head(residual, out, self._add_norm, self.packed["gate_up"])

    # -- the drafter's part of the round (``specdec.drafters.base.DraftState``) ---------------------------------
    def prefill(self, input_ids: torch.Tensor, hidden: torch.Tensor | None) -> None:
        """The prompts ``[B, T]`` and their fused target states ``[B, T, K*H_t]``: states into positions ``0 .. T-1``,
        rows ``0 .. T-2`` into the head's keys/values (rows past a shorter prompt land where the round rewrites)."""
        n = input_ids.shape[1]
        fused = self.drafter.model.fuse(hidden)
        self.fused[:, :n] = fused.to(self.fused.dtype)
        if n > 1:
            positions = self.slots[: n - 1][None].expand(input_ids.shape[0], -1)
            self._write(input_ids[:, 1:], fused[:, :-1], *self._place(positions))

    def resume(self, input_ids: torch.Tensor, hidden: torch.Tensor | None, start: int) -> None:
        """A continued prompt: its tokens ``[B, n]`` from position ``start >= 1`` on and their fused target states.
        The states go to positions ``start ..``; rows ``start - 1 .. start + n - 2`` are written (row ``start - 1``
        pairs the kept state of the last reused position with the first new token), as a prefill of the whole
        sequence writes them; the rows before stay."""
        n = input_ids.shape[1]
        fused = self.drafter.model.fuse(hidden)
        self.fused[:, start : start + n] = fused.to(self.fused.dtype)
        states = self.fused[:, start - 1 : start + n - 1]
        positions = (start - 1 + self.slots[:n])[None].expand(input_ids.shape[0], -1)
        self._write(input_ids, states, *self._place(positions))

    def logq(self, root: torch.Tensor, prefix: torch.Tensor, depth: int, span: int | None = None) -> torch.Tensor:
        """Per-depth log-probabilities ``[B, depth, V]`` (fp32, target vocabulary) of the greedy draft after each
        ``root [B]`` at position ``prefix [B]``.

        The steps' slots, rotary tables and attention masks are computed once for all ``depth`` steps; each step
        feeds its logits' first maximum (a draft id, mapped to a target id) to the next, and one log-softmax over
        every step's logits ends the chain."""
        span = min(span or self.capacity + 1, self.capacity + 1)
        position = (prefix - 1).clamp(min=0)[:, None]  # [B, 1]: the last committed position
        hidden = self.fused[self.rows, position]  # [B, 1, H]
        token = root[:, None]
        logits = []
        for step in self._steps(position + self.slots[:depth], span):
            out, hidden = self._forward(token, hidden, step, span)
            logits.append(out)
            token = (out.argmax(dim=-1), self.target_ids)  # [B, 1]: first maximum, mapped to a target id
        draft = torch.log_softmax(torch.cat(logits, dim=1).float(), dim=-1)  # [B, depth, Vd]
        full = draft.new_full((*draft.shape[:2], self.drafter.config.vocab_size), float("-inf"))
        return full.index_copy_(2, self.target_ids, draft)

    def propose(self, root: torch.Tensor, prefix: torch.Tensor, depth: int, span: int) -> Proposal:
        """Greedy drafts of ``depth`` tokens after each row's root: ``logq [B, depth, V]``."""
        return Proposal(logq=self.logq(root, prefix, depth, span))

    def propose_tree(self, root: torch.Tensor, prefix: torch.Tensor, levels: int, topk: int, span: int) -> Proposal:
        """EAGLE-2's candidate tree after each row's root: ``levels`` levels of ``topk`` candidates per expanded node
        (``Proposal.candidates``, ``parents``, ``scores`` ``[B, topk + (levels - 1) * topk**2]``)."""
        return self.draft_tree(root, prefix, levels, topk, span)[0]

    def draft_tree(self, root: torch.Tensor, prefix: torch.Tensor, levels: int, topk: int, span: int | None = None):
        """:meth:`propose_tree` and the log-probabilities of every drafted row ``[B, 1 + (levels - 1) * topk, Vd]``
        (fp32, draft vocabulary): row 0 the root's, then level by level the frontier rows in frontier order.

        The root's row (the fused state of the last committed position with the root, as :meth:`logq`'s first step)
        gives level 1; each next level is one forward of the ``topk`` frontier rows (frontier token, the hidden its
        parent's row fed back, at position ``prefix - 1 + level``) whose keys/values go after a copy of the committed
        ones (made once per draft); the selection is ``specdec.trees.dynamic.expand_candidates``.
        """
        span = min(span or self.capacity + 1, self.capacity + 1)
        cfg = self.drafter.model.config
        last = torch.clamp(prefix - 1, min=0)[:, None]  # [B, 1]: the last committed position (the root's row)
        logits, hidden = self._forward(root[:, None], self.fused[self.rows, last], self._steps(last, span)[0], span)
        rows = [torch.log_softmax(logits, dim=-1, dtype=torch.float32)]  # [B, 1, Vd]
        batch, size = root.shape[0], (levels - 1) * topk
        state = {"hidden": hidden, "seen": torch.zeros(batch, 1, size, dtype=torch.bool, device=root.device)}
        if size:
            # what every level shares, made once per draft: the committed keys/values with room for the tree's rows
            # after them (one copy, not one concatenation per level), the committed slots each row sees, and the
            # levels' rotary tables (level l at position last + l)
            full = self.tree_kv.get(size)  # one buffer per tree size, for every span: [2, B, H_kv, slots + R, D]
            if full is None:
                shape = (2, batch, cfg.num_key_value_heads, self.kv.shape[3] + size, cfg.head_dim)
                full = self.tree_kv[size] = self.kv.new_zeros(shape)
            joint = full[:, :, :, : span + size]
            joint[:, :, :, :span] = self.kv[:, :, :, :span]
            root_row = self._seen(last, span)  # [B, 1]: the last committed slot every row reads
            # each level's mask [B, k, span + R]: the committed slots up to the root's row, written once here, then
            # the tree rows each frontier row sees, written by every level in place (no concatenation per level)
            visible = torch.empty(batch, topk, span + size, dtype=torch.bool, device=root.device)
            torch.le(self.slots[:span], root_row[..., None].expand(-1, topk, -1), out=visible[..., :span])
            positions = (last + self.slots[1:levels]).clamp(max=self.scratch)  # [B, levels - 1]
            tables = self.rope_table[positions]  # [B, levels - 1, 2, D]
            kernel = attention.triton_kernel_for(self.kv.device, torch.compiler.is_compiling(), self.kv.dtype,
                                                 self.kv.shape[-1])  # fmt: skip
            flat = root_row[:, 0] + 1 if kernel else None
        own = constant(("eye", str(root.device), size),  # tree row i is itself (made once, not in every round)
                       lambda: torch.eye(size, dtype=torch.bool, device=root.device))  # fmt: skip

        def step(level: int, tokens: torch.Tensor, parent_rows: torch.Tensor) -> torch.Tensor:
            first = (level - 1) * topk
            pick = parent_rows[..., None]
            fed = state["hidden"].gather(1, pick.expand(-1, -1, state["hidden"].shape[-1]))
            seen = torch.bitwise_or(state["seen"].gather(1, pick.expand(-1, -1, size)), own[first : first + topk],
                                    out=visible[..., span:])  # fmt: skip
            rotary = tables[:, level - 1 : level].expand(-1, topk, -1, -1).unbind(-2)  # [B, k, D] each
            logits, state["hidden"] = self._tree_forward(tokens, fed, rotary, visible, joint, first, flat, span)
            state["seen"] = seen
            rows.append(torch.log_softmax(logits, dim=-1, dtype=torch.float32))
            return rows[-1]

        proposal = expand_candidates(rows[0][:, 0], step, levels=levels, topk=topk, token_ids=self.target_ids)
        return proposal, torch.cat(rows, 1)

    def commit(self, accept: Accept, hidden: torch.Tensor | None, prefix: torch.Tensor) -> None:
        """The accepted path's fused target states (``hidden``: the verified slots ``[B, S, K*H_t]``) at positions
        ``prefix ..``, and its rows (each with the token that follows it) into the head's keys/values."""
        path = accept.path
        fused = self.drafter.model.fuse(hidden.gather(1, path[..., None].expand(-1, -1, hidden.shape[-1])))
        positions = prefix[:, None] + torch.arange(path.shape[1], device=path.device)  # [B, P]
        self.fused[self.rows, positions.clamp(max=self.scratch)] = fused.to(self.fused.dtype)
        if path.shape[1] > 1:  # the last row needs the next root: the round's first step writes it
            self._write(accept.tokens[:, :-1], fused[:, :-1], *self._place(positions[:, :-1]))
