"""Fixed-shape storage and forwards of an ``MTPDrafter`` for the round (static K/V of its one layer).

Row ``t`` of the head joins the target's hidden state ``h[t]`` (after its final norm) with the token ``x[t+1]``, at
position ``t``; its keys/values sit at slot ``t`` of a ``StaticKV`` of one layer, written through the decoder
layer's own attention (``StaticKVCache``). Committed rows are written for accepted tokens only:

- ``prefill``: the prompt rows ``0 .. T-1`` (token ``x[t+1]`` from the prompt; row ``T-1`` and any padding rows
  hold a placeholder token, rewritten before they are read);
- ``resume``: a prompt continuing the kept sequence from position ``s``: rows ``s - 1 .. T-1``, as ``prefill``;
- ``commit``: the accepted path's rows ``prefix .. prefix + P - 1`` (hidden of the path's nodes, token the next
  accepted one, the bonus last); rows past the path land in slots the next round writes before reading;
- ``propose``: row ``prefix - 1`` again (``h[prefix-1]`` and the root: the row the root's drafts start from),
  then ``D - 1`` greedy steps at positions ``prefix .. prefix + D - 2``, each feeding back its normalised output
  and its argmax token. Every step writes its own slot before reading it.

The target's hidden state of every committed position is kept (``[B, capacity, H]``) so that a row's start is
found by its position alone. No host reads, shapes fixed by ``D``: the round can be captured in a CUDA graph.
"""

from __future__ import annotations

import torch

from specdec.kernels.row_gather import embed
from specdec.state.rope import position_table
from specdec.state.storage import StaticKV, StaticKVCache, mask_values
from specdec.types import Accept, Proposal

__all__ = ["MTPStatic"]


class MTPStatic:
    """Static state of one ``MTPDrafter`` for ``batch`` sequences of up to ``capacity`` tokens.

    Args:
        drafter (MTPDrafter): the drafter (its ``model`` on the target's device).
        capacity (int): slots per sequence.
        batch (int): sequences. Default 1.
    """

    def __init__(self, drafter, capacity: int, batch: int = 1) -> None:
        module = drafter.model
        cfg = module.config
        weight = module.fc.weight
        device, dtype = weight.device, weight.dtype
        self.drafter, self.capacity = drafter, capacity
        heads = cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        self.storage = StaticKV(
            num_layers=1,
            num_kv_heads=getattr(cfg, "num_key_value_heads", None) or heads,
            head_dim=head_dim,
            capacity=capacity,
            dtype=dtype,
            device=device,
            batch=batch,
        )
        self.cache = StaticKVCache(self.storage)
        self.hidden = torch.zeros(batch, capacity, cfg.hidden_size, dtype=dtype, device=device)
        self.rows = torch.arange(batch, device=device)[:, None]
        self.keys = torch.arange(capacity, device=device)
        self.mrope = getattr(drafter._rotary, "mrope_section", None) is not None
        # the rotary tables by slot (= position), computed once: one gather per step instead of the rotary
        # module's ~8 ops; None (a module whose values depend on more than each position): its own forward
        self.rope_table = position_table(drafter._rotary, capacity, dtype, grids=3 if self.mrope else None)

    @property
    def draft_model(self):
        """The head's module: its forwards run in the round's attention scope, as the target's do (its RMSNorms
        through ``rms_norm`` where the target's are routed, its attention grouped)."""
        return self.drafter.model

    def refresh(self) -> None:
        return None

    def _mask(self, positions: torch.Tensor, span: int) -> torch.Tensor:
        """Additive mask ``[B, 1, N, span]``: row at position ``p`` sees slots ``<= p``."""
        seen = self.keys[:span] <= positions[..., None]
        return torch.where(seen, *mask_values(self.hidden.dtype, seen.device))[:, None]  # one kernel

    def _rotary(self, embeds: torch.Tensor, positions: torch.Tensor):
        """The rotary ``(cos, sin)`` of rows at ``positions [B, N]``."""
        if self.rope_table is not None:  # positions past the capacity read the last slot's, as the storage writes
            return self.rope_table[positions.clamp(max=self.capacity - 1)].unbind(-2)
        # multimodal RoPE (Qwen3.5) takes one position grid per section: a text row's is the same in all
        return self.drafter._rotary(embeds, positions[None].expand(3, -1, -1) if self.mrope else positions)

    def _extent(self, positions: torch.Tensor, span: int) -> tuple[torch.Tensor, torch.Tensor]:
        """For the attention kernel, rows at ``positions [B, N]`` (non-decreasing along ``N``, each seeing the slots
        up to its own): the slots each sequence reads, ``[B]`` int32 (up to its last row's position, within the
        span), and its flat prefix (the slots before its first row's, which every row sees)."""
        return (positions[:, -1] + 1).clamp(max=span).int(), positions[:, 0].clamp(max=span)

    def step(
        self,
        tokens: torch.Tensor,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        span: int,
        shared: bool = False,
        ahead: tuple | None = None,
    ) -> torch.Tensor:
        """One pass of the head over rows ``[B, N]`` (``tokens``, ``hidden [B, N, H]``) at ``positions [B, N]``,
        writing their keys/values at those slots and attending over slots ``[0, span)`` (each sequence reading only
        up to its last row's slot); returns the normalised output ``[B, N, H]``. ``shared``: every sequence has row
        0's positions (one mask row set for the batch). ``ahead``: the rows' ``(rotary, mask, extent)`` computed
        ahead (:meth:`propose` computes its steps' at once)."""
        drafter, module = self.drafter, self.drafter.model
        self.storage.write_index = positions
        self.storage.span = span
        embeds = embed(drafter._embed, tokens).to(self.hidden.dtype)
        if ahead is None:
            rows = positions[:1] if shared else positions
            ahead = (self._rotary(embeds, positions), self._mask(rows, span), self._extent(positions, span))
        rotary, mask, extent = ahead
        return module(embeds, hidden.to(self.hidden.dtype), rotary, mask, positions, self.cache, extent=extent)

    # -- the drafter's part of the round (``specdec.drafters.base.DraftState``) ---------------------------------
    def prefill(self, input_ids: torch.Tensor, hidden: torch.Tensor | None) -> None:
        """The prompts ``[B, T]`` and the target's last hidden state ``[B, T, H]``: rows ``0 .. T-1``."""
        if hidden is None:
            raise ValueError("MTPDrafter needs the target's hidden states at prefill (its target_layer_ids taps).")
        batch, n = input_ids.shape
        self.hidden[:, :n] = hidden
        tokens = torch.cat((input_ids[:, 1:], input_ids[:, -1:]), dim=1)  # x[t+1]; the last row's is rewritten
        positions = torch.arange(n, device=input_ids.device)[None].expand(batch, -1)
        self.step(tokens, self.hidden[:, :n], positions, n, shared=True)

    def resume(self, input_ids: torch.Tensor, hidden: torch.Tensor | None, start: int) -> None:
        """A continued prompt: its tokens ``[B, n]`` from position ``start >= 1`` on and the target's last hidden
        state ``[B, n, H]`` there. Rows ``start - 1 .. start + n - 1`` are written as a prefill of the whole sequence
        writes them (row ``start - 1``: the kept hidden state with the first new token; the last row's token is a
        placeholder); the rows before stay."""
        if hidden is None:
            raise ValueError("MTPDrafter needs the target's hidden states to resume (its target_layer_ids taps).")
        batch, n = input_ids.shape
        self.hidden[:, start : start + n] = hidden
        tokens = torch.cat((input_ids, input_ids[:, -1:]), dim=1)  # x[t+1] of rows start-1 ..; the last rewritten
        positions = (start - 1 + torch.arange(n + 1, device=input_ids.device))[None].expand(batch, -1)
        self.step(tokens, self.hidden[:, start - 1 : start + n], positions, start + n, shared=True)

    def propose(self, root: torch.Tensor, prefix: torch.Tensor, depth: int, span: int) -> Proposal:
        """``depth`` greedy steps from row ``prefix - 1`` (its hidden state and the root): ``logq [B, depth, V]``.

        The steps' rotary tables, masks and attention extents are computed once for all of them; each step feeds
        its logits' first maximum to the next, and one log-softmax over every step's logits ends the chain."""
        position = (prefix - 1)[:, None]  # [B, 1]
        hidden = self.hidden[self.rows, position]  # [B, 1, H]
        token = root[:, None]
        positions = position + self.keys[:depth]  # [B, depth]: step k's row
        rotary = self._rotary(self.hidden[:, :depth], positions)
        mask = self._mask(positions, span)  # [B, 1, depth, span]
        lengths = (positions + 1).clamp(max=span).int().t().contiguous()  # [depth, B]: a step's row is one [B]
        flat = positions.clamp(max=span).t().contiguous()
        head = self.drafter._lm_head
        logits = []
        for k in range(depth):
            one = slice(k, k + 1)
            ahead = (tuple(t[:, one] for t in rotary), mask[:, :, one], (lengths[k], flat[k]))
            hidden = self.step(token, hidden, positions[:, one], span, ahead=ahead)
            logits.append(head(hidden.to(head.weight.dtype)))
            token = logits[-1].argmax(dim=-1)  # [B, 1], the first maximum
        return Proposal(logq=torch.log_softmax(torch.cat(logits, dim=1), dim=-1, dtype=torch.float32))

    def commit(self, accept: Accept, hidden: torch.Tensor | None, prefix: torch.Tensor) -> None:
        """The accepted path's rows: the target's hidden state at each path node and the token accepted after it."""
        path = accept.path  # [B, P]
        positions = (prefix[:, None] + torch.arange(path.shape[1], device=path.device)).clamp(max=self.capacity - 1)
        rows = hidden.gather(1, path[..., None].expand(-1, -1, hidden.shape[-1])).to(self.hidden.dtype)
        self.hidden[self.rows, positions] = rows
        span = self.storage.capacity
        self.step(accept.tokens, rows, positions, span)
