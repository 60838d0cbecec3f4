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

    def __init__(self, drafter, capacity: int) -> None:
        self.drafter = drafter
        self.model = StaticModel(drafter.lm, capacity + 1)
        self.scratch = capacity
        device = drafter.lm.device
        self.history = torch.zeros(capacity + 1, dtype=torch.long, device=device)  # committed token per position

    @property
    def draft_model(self):
        """The draft HF model (its forwards run in the round's attention scope)."""
        return self.model.target.model

    def refresh(self) -> None:
        return None

    def prefill(self, input_ids: torch.Tensor, hidden: torch.Tensor | None = None) -> None:
        """Run the prompt (positions ``0 .. T-1``) into the draft model's slots and record it."""
        n = input_ids.shape[1]
        positions = torch.arange(n, device=input_ids.device)
        self.model.forward(input_ids, positions[None], self.model.causal_mask(positions), positions, last_only=True)
        self.history[:n] = input_ids[0]

    def record(self, tokens: torch.Tensor, first: torch.Tensor) -> None:
        """Committed ``tokens [P]`` at positions ``first .. first + P - 1`` (rows past the real ones land in
        positions no window reads before they are overwritten)."""
        self.history.index_copy_(0, first + torch.arange(tokens.shape[0], device=tokens.device), tokens)

    def logq(self, prefix: torch.Tensor, depth: int) -> torch.Tensor:
        """Per-depth log-probabilities ``[depth, V]`` (fp32) of the greedy draft after the root at ``prefix``."""
        model, device = self.model, self.history.device
        window = prefix - depth + torch.arange(depth + 1, device=device)  # positions, the root last
        real = window >= 0
        positions = window.clamp(min=0)
        slots = torch.where(real, window, self.scratch)
        keys = model.keys[None]
        seen = torch.where(real[:, None], (keys <= positions[:, None]) & (keys != self.scratch), keys == self.scratch)
        mask = model.additive_mask(seen)
        logits, _ = model.forward(self.history[positions][None], positions[None], mask, slots)
        rows = [torch.log_softmax(logits[-1:].float(), dim=-1)]
        for step in range(1, depth):
            position = (prefix + step).view(1)
            token = rows[-1].argmax(dim=-1)  # first maximum, as the eager drafter
            logits, _ = model.forward(token[None], position[None], model.causal_mask(position), position)
            rows.append(torch.log_softmax(logits[-1:].float(), dim=-1))
        return torch.cat(rows)

    def propose(self, root: torch.Tensor, prefix: torch.Tensor, depth: int, span: int) -> Proposal:
        """Greedy drafts of ``depth`` tokens after each row's root: ``logq [B, depth, V]``."""
        rows = []
        for r, p in zip(root, prefix, strict=True):
            self.record(r.view(1), p)
            rows.append(self.logq(p, depth))
        return Proposal(logq=torch.stack(rows))

    def commit(self, accept: Accept, hidden: torch.Tensor | None, prefix: torch.Tensor) -> None:
        """Record the committed tokens (the accepted drafts and the bonus) after each row's old root."""
        self.record(accept.tokens[0], prefix[0] + 1)
