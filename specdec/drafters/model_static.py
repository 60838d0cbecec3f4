"""Fixed-shape drafting with a small HF LM for the round (``ModelDrafter`` over static K/V).

Each round the draft model re-runs the last ``D + 1`` committed tokens (all tokens committed since its last
round are among them, and re-running the others writes the same keys/values again), reads the depth-1
distribution at the root, then takes ``D - 1`` greedy one-token steps, all at explicit slots, so the whole draft
can be captured in a CUDA graph.
"""

from __future__ import annotations

import torch

from specdec.state.storage import StaticModel
from specdec.types import Accept, Proposal

__all__ = ["ModelStatic"]


class ModelStatic:
    """Static storage and forwards of one ``ModelDrafter`` for sequences of up to ``capacity`` tokens.

    Args:
        drafter (ModelDrafter): the drafter (its ``lm`` is an attention-only ``TargetModel``).
        capacity (int): slots; one more is kept as a scratch slot for window rows before position 0.
    """

    def __init__(self, drafter, capacity: int, batch: int = 1) -> None:
        self.drafter = drafter
        self.model = StaticModel(drafter.lm, capacity + 1, batch)
        self.scratch = capacity
        device = drafter.lm.device
        # committed token per sequence and position
        self.history = torch.zeros(batch, capacity + 1, dtype=torch.long, device=device)
        self.rows = torch.arange(batch, device=device)[:, None]

    @property
    def draft_model(self):
        """The draft HF model (its forwards run in the round's attention scope)."""
        return self.model.target.model

    def refresh(self) -> None:
        return None

    def prefill(self, input_ids: torch.Tensor, hidden: torch.Tensor | None = None) -> None:
        """Run the prompts ``[B, T]`` (positions ``0 .. T-1``) into the draft model's slots and record them."""
        n = input_ids.shape[1]
        positions = torch.arange(n, device=input_ids.device)
        self.model.forward(
            input_ids, positions[None].expand(input_ids.shape[0], -1), self.model.causal_mask(positions), positions,
            last_only=True,
        )  # fmt: skip
        self.history[:, :n] = input_ids

    def resume(self, input_ids: torch.Tensor, hidden: torch.Tensor | None, start: int) -> None:
        """A continued prompt: its tokens from position ``start`` on, run into the draft model's slots on top of the
        earlier call's."""
        n = input_ids.shape[1]
        positions = start + torch.arange(n, device=input_ids.device)
        self.model.forward(
            input_ids, positions[None].expand(input_ids.shape[0], -1), self.model.causal_mask(positions), positions,
            last_only=True,
        )  # fmt: skip
        self.history[:, start : start + n] = input_ids

    def record(self, tokens: torch.Tensor, first: torch.Tensor) -> None:
        """Committed ``tokens [B, P]`` at positions ``first[b] .. first[b] + P - 1`` (rows past the real ones land in
        positions no window reads before they are overwritten)."""
        positions = (first[:, None] + torch.arange(tokens.shape[1], device=tokens.device)).clamp(max=self.scratch)
        self.history[self.rows, positions] = tokens

    def logq(self, prefix: torch.Tensor, depth: int) -> torch.Tensor:
        """Per-depth log-probabilities ``[B, depth, V]`` (fp32) of the greedy draft after each root at ``prefix
        [B]``."""
        model, device = self.model, self.history.device
        window = prefix[:, None] - depth + torch.arange(depth + 1, device=device)  # [B, depth + 1], the root last
        real = window >= 0
        positions = window.clamp(min=0)
        slots = torch.where(real, window, self.scratch)
        keys = model.keys[None, None]
        near = (keys <= positions[..., None]) & (keys != self.scratch)
        seen = torch.where(real[..., None], near, keys == self.scratch)  # [B, depth + 1, capacity + 1]
        logits, _ = model.forward(self.history.gather(1, positions), positions, model.additive_mask(seen), slots)
        rows = [torch.log_softmax(logits[:, -1:], dim=-1, dtype=torch.float32)]
        for step in range(1, depth):
            position = (prefix + step)[:, None]  # [B, 1]
            token = rows[-1].argmax(dim=-1)  # [B, 1], first maximum, as the eager drafter
            logits, _ = model.forward(token, position, model.causal_mask(position), position)
            rows.append(torch.log_softmax(logits[:, -1:], dim=-1, dtype=torch.float32))
        return torch.cat(rows, dim=1)

    def propose(self, root: torch.Tensor, prefix: torch.Tensor, depth: int, span: int) -> Proposal:
        """Greedy drafts of ``depth`` tokens after each row's root: ``logq [B, depth, V]``."""
        self.record(root[:, None], prefix)
        return Proposal(logq=self.logq(prefix, depth))

    def commit(self, accept: Accept, hidden: torch.Tensor | None, prefix: torch.Tensor) -> None:
        """Record the committed tokens (the accepted drafts and the bonus) after each row's old root."""
        self.record(accept.tokens, prefix + 1)
