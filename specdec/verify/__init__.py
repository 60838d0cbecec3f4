"""Verification rules (``Greedy``, ``SampleMatch``, the ``VerificationRule`` protocol and its registry; the rules
that weigh the draft distribution: ``SpeculativeSampling``, ``MultiDraftRejection``, ``BlockVerification``,
``TraversalVerification``) and the HF-identical processing of the target's logits they sample from. Notation:
``docs/trees.md``; arguments: ``docs/verification.md``.
"""

from specdec.verify.block import BlockVerification
from specdec.verify.multidraft import MultiDraftRejection
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
from specdec.verify.speculative import SpeculativeSampling
from specdec.verify.traversal import TraversalVerification

__all__ = [
    "RULES",
    "BlockVerification",
    "Greedy",
    "MultiDraftRejection",
    "SampleMatch",
    "SpeculativeSampling",
    "TraversalVerification",
    "VerificationRule",
    "default_rule",
    "gumbel_from_uniform",
    "process_logits",
    "register_rule",
    "target_choices",
]
