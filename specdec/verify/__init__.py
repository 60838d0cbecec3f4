"""Verification rules (``Greedy``, ``SampleMatch``, the ``VerificationRule`` protocol and its registry) and the
HF-identical processing of the target's logits they sample from. Notation: ``docs/trees.md``.
"""

from specdec.verify.processing import gumbel_from_uniform, process_logits
from specdec.verify.rules import (
    RULES,
    Greedy,
    SampleMatch,
    VerificationRule,
    default_rule,
    register_rule,
    target_choices,
)

__all__ = [
    "RULES",
    "Greedy",
    "SampleMatch",
    "VerificationRule",
    "default_rule",
    "gumbel_from_uniform",
    "process_logits",
    "register_rule",
    "target_choices",
]
