"""The drafter protocol: what the round asks of every drafter.

A drafter is configuration plus weights; ``attach(target, capacity)`` gives its per-target state (static storage
and the drafter's part of the round, :class:`DraftState`), which the engine keeps and reuses across calls. Each
round the state proposes from the committed prefix (a :class:`~specdec.types.Proposal`: per-depth log-probs or
drafted paths), and after verification commits the accepted path. All of it runs inside the round: tensor ops,
shapes fixed by the tree policy, no host reads. A drafter that needs target hidden states lists the target
layers in ``target_layer_ids`` and receives their outputs from the target's own verify forward.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from specdec.types import Accept, Proposal

__all__ = ["DraftState", "Drafter"]


@runtime_checkable
class DraftState(Protocol):
    """A drafter's state for one target: static storage plus its part of the round (batch first)."""

    def refresh(self) -> None:
        """Called before a ``generate`` call reuses the state (e.g. to pick up changed weights)."""

    def prefill(self, input_ids: torch.Tensor, hidden: torch.Tensor | None) -> None:
        """See the prompt ``[B, T]`` (``hidden``: the tapped target features ``[B, T, K*H]`` or None)."""

    # Optional: ``resume(input_ids [1, n], hidden [1, n, K*H] | None, start)`` takes in a prompt that continues the
    # previous call's sequence from position ``start`` (its state for the positions before is kept); a state
    # without it makes such a call prefill from scratch (``Engine.reusable``).

    def propose(self, root: torch.Tensor, prefix: torch.Tensor, depth: int, span: int) -> Proposal:
        """Draft ``depth`` deep after each row's ``root [B]`` at position ``prefix [B]`` (the number of committed
        tokens before it); storage slots ``[0, span)`` hold everything the round may read."""

    def commit(self, accept: Accept, hidden: torch.Tensor | None, prefix: torch.Tensor) -> None:
        """Take in the accepted paths (``hidden``: tapped features of the verified slots ``[B, S, K*H]``)."""


@runtime_checkable
class Drafter(Protocol):
    """Protocol every drafter implements.

    Attributes:
        target_layer_ids: target decoder layers whose outputs the drafter needs (``hidden_states[i + 1]`` of
            an HF forward), or ``None``.
        num_forwards: drafter forward passes so far (for stats).
        provides: the :class:`~specdec.types.Proposal` fields it fills (``"logq"``, ``"paths"``).
    """

    target_layer_ids: tuple[int, ...] | None
    num_forwards: int
    provides: tuple[str, ...]

    def validate(self, target: object, tree) -> None:
        """Raise a clear error if this drafter cannot serve ``target`` (a ``TargetModel``) with ``tree``."""

    def draft_depth(self, tree) -> int:
        """Depth of the proposal for tree policy ``tree``."""

    def window(self, tree) -> int:
        """Storage slots past the root that a round writes (e.g. a DFlash block)."""

    def forwards_per_round(self, tree) -> int:
        """Drafter forwards per round (for stats)."""

    def attach(self, target, capacity: int, batch: int = 1) -> DraftState:
        """This drafter's state for ``target`` (a ``TargetModel``) and ``batch`` sequences of up to ``capacity``
        tokens each."""

    def reset(self) -> None:
        """Forget any per-sequence state kept outside :meth:`attach`'s state (most drafters keep none)."""
