"""Verification rules: from the target's logits over the round's trees to the accepted path and the next token.

A rule is any object with the attributes and methods of :class:`VerificationRule`; ``Greedy`` and
``SampleMatch`` are the built-in ones, both exact (token-identical to the target's own greedy decoding, or a
genuine target sample at every position). Rules run inside the round: tensor ops, no host reads, randomness only
from the uniforms the round draws with the run's generator before each round (``noise``). ``register_rule``
makes a rule selectable by name. Correctness arguments: ``docs/verification.md``; writing one: ``docs/extending.md``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from specdec.kernels.tree_accept import accept_paths
from specdec.types import Accept, DeviceTree, Proposal, SamplingParams
from specdec.verify.draws import exponential_keys
from specdec.verify.processing import process_logits

__all__ = ["RULES", "Greedy", "SampleMatch", "VerificationRule", "default_rule", "register_rule", "target_choices"]


@runtime_checkable
class VerificationRule(Protocol):
    """The verification-rule protocol.

    Attributes:
        name (str): how stats and errors name the rule.
    """

    name: str

    def check(self, sampling: SamplingParams, tree) -> None:
        """Raise ``ValueError`` naming the mismatch when the rule is not exact for these sampling settings or this
        tree policy (called once per ``generate`` call, before anything runs)."""

    def uses_noise(self, sampling: SamplingParams) -> bool:
        """Whether :meth:`accept` needs ``noise`` (uniforms ``[B, S, V]`` drawn fresh before every round; a rule
        that reads only the first ``n`` of each slot may say so with a class attribute ``noise_width = n``, and the
        round then draws ``[B, S, n]``: :func:`noise_width`)."""

    def accept(
        self, tree: DeviceTree, logits: torch.Tensor, sampling: SamplingParams, noise: torch.Tensor | None,
        max_depth: int, proposal: Proposal | None,
    ) -> Accept:  # fmt: skip
        """The accepted paths ``[B, max_depth + 1]`` of ``tree`` under the target's ``logits [B, S, V]``;
        ``proposal`` is the drafter's (e.g. ``logq``, the draft distribution a rule may weigh), None for plain
        decoding."""


_TINY = torch.finfo(torch.float32).tiny


def target_choices(logits: torch.Tensor, sampling: SamplingParams, noise: torch.Tensor | None = None) -> torch.Tensor:
    """The target's token at each node: its argmax, or a sample of its HF-processed distribution (an exponential
    race, the Gumbel-max trick in another monotone form).

    Args:
        logits (torch.Tensor): ``[..., V]`` target logits.
        sampling (SamplingParams): greedy (first maximum, as ``torch.argmax``) unless ``do_sample``; then
            temperature, top-k and top-p are applied as HF does and one token is drawn per row.
        noise (torch.Tensor | None): uniforms in [0, 1] of ``logits``' shape; required when ``sampling.do_sample``.

    Returns:
        torch.Tensor: ``logits.shape[:-1]`` int64.
    """
    if not sampling.do_sample:
        return logits.argmax(dim=-1)
    if noise is None or noise.shape != logits.shape:
        got = None if noise is None else tuple(noise.shape)
        raise ValueError(f"do_sample=True needs noise of shape {tuple(logits.shape)} (uniforms), got {got}.")
    # The exponential race: the smallest key p_j / log u_j wins with probability p_j (the Gumbel-max draw
    # argmax(log p + G) in a monotone form, in four launches instead of seven). u is kept inside the open interval
    # (0, 1), as the Gumbel noise kept it: a token of the support then keys strictly below 0, a token outside it
    # keys -0.0 and never wins (u = 1 would give 0 / 0, u = 0 a -0.0 key inside the support; 1 - 2**-24 is the
    # largest float32 below 1).
    probs = torch.softmax(process_logits(logits, sampling), dim=-1)  # fp32, 0 outside the support
    return exponential_keys(probs, noise.float().clamp(_TINY, 1.0 - 2.0**-24)).argmin(dim=-1)


def _walk(tree: DeviceTree, choices: torch.Tensor, max_depth: int) -> Accept:
    """Per row: from the root, step to the first real child carrying the current node's choice."""
    if tree.num_slots == 1:  # the root alone (plain decoding): its choice is the bonus, nothing to walk
        zeros = torch.zeros_like(choices)
        return Accept(path=zeros, num_path=zeros[:, 0] + 1, tokens=choices)
    return accept_paths(tree.tokens, tree.parents, tree.depth, tree.valid, choices, max_depth)  # one launch on CUDA


@dataclass(frozen=True)
class Greedy:
    """Greedy verification: walk from the root while a child carries the target's argmax; the bonus is the argmax
    at the last accepted node. Exact for any tree at ``do_sample=False``."""

    name = "greedy"

    def check(self, sampling: SamplingParams, tree) -> None:
        if sampling.do_sample:
            raise ValueError(
                "verifier=Greedy() is exact only for do_sample=False; use verifier=SampleMatch() (or leave "
                "verifier unset) to sample."
            )

    def uses_noise(self, sampling: SamplingParams) -> bool:
        return False

    def accept(self, tree, logits, sampling, noise, max_depth, proposal=None):
        return _walk(tree, logits.argmax(dim=-1), max_depth)


@dataclass(frozen=True)
class SampleMatch:
    """Sample-and-match: draw one target sample per node from its HF-processed distribution, then walk along the
    samples. Lossless for any deterministic tree at any temperature (every emitted token is a genuine target
    sample); at ``do_sample=False`` the samples are the argmax and it is :class:`Greedy`."""

    name = "sample-match"

    def check(self, sampling: SamplingParams, tree) -> None:
        return None

    def uses_noise(self, sampling: SamplingParams) -> bool:
        return sampling.do_sample

    def accept(self, tree, logits, sampling, noise, max_depth, proposal=None):
        return _walk(tree, target_choices(logits, sampling, noise), max_depth)


def noise_width(rule, vocab: int) -> int:
    """The uniforms per slot the round draws for ``rule``: its ``noise_width`` attribute when it sets one (at most
    ``vocab``), else ``vocab``."""
    width = getattr(rule, "noise_width", None)
    if width is None:
        return vocab
    if isinstance(width, bool) or not isinstance(width, int) or width < 1:
        raise ValueError(f"verifier={rule!r}: noise_width={width!r} must be a positive int (uniforms per slot).")
    return min(width, vocab)


def default_rule(sampling: SamplingParams) -> VerificationRule:
    """``Greedy()`` at ``do_sample=False``, else ``SampleMatch()``."""
    return SampleMatch() if sampling.do_sample else Greedy()


RULES: dict[str, type] = {"greedy": Greedy, "sample-match": SampleMatch}
"""Verification rules by name (the hydra ``verifier=`` group, the bench)."""


def register_rule(name: str, rule: type) -> type:
    """Make ``rule`` (a class implementing :class:`VerificationRule`) selectable as ``name``; returns it."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"register_rule: name must be a non-empty string, got {name!r}.")
    RULES[name] = rule
    return rule
