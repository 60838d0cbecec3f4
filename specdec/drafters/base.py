"""The drafter protocol: what the ``generate`` loop calls on every drafter.

A drafter sees the committed tokens through a ``DecodeContext`` and proposes a ``DraftTree`` rooted at the
last committed token. Drafters never call the target; one that needs target hidden states lists the target
layers in ``target_layer_ids`` and receives their outputs (from the target's own verify forward) in
``ctx.target_hidden``.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from specdec.types import DecodeContext, DraftTree, TreeSpec, VerifyResult

__all__ = ["Drafter"]


@runtime_checkable
class Drafter(Protocol):
    """Protocol every drafter implements.

    Attributes:
        target_layer_ids: target decoder layers whose outputs the drafter needs (``hidden_states[i + 1]`` of
            an HF forward), or ``None``.
        num_forwards: drafter forward passes so far (for stats).
    """

    target_layer_ids: tuple[int, ...] | None
    num_forwards: int

    def validate(self, target: object, tree: TreeSpec) -> None:
        """Raise a clear error if this drafter cannot serve ``target`` (a ``TargetModel``) with ``tree``."""

    def prefill(self, ctx: DecodeContext) -> None:
        """See the prompt once (``ctx.input_ids`` is prompt + first token)."""

    def propose(self, ctx: DecodeContext, tree: TreeSpec) -> DraftTree:
        """Propose a tree rooted at ``ctx.input_ids[0, -1]`` with at most ``tree.budget`` non-root nodes."""

    def commit(self, ctx: DecodeContext, result: VerifyResult) -> None:
        """Bring the drafter's own state in step with ``ctx`` (the tokens committed by ``result`` included)."""

    def reset(self) -> None:
        """Forget every sequence state (caches), keeping weights."""
