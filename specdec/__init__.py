"""specdec: exact, composable speculative decoding for HuggingFace causal LMs.

``specdec.generate(target, input_ids, drafter=..., tree=...)`` is a lossless drop-in for ``target.generate``.
"""

from specdec.drafters import DFlashDrafter, ModelDrafter, NGramDrafter
from specdec.generate import SpeculativeModel, generate
from specdec.trees import TREES, Chain, DDTree, TreePolicy, register_tree
from specdec.types import DraftTree, GenerateOutput, SamplingParams, SpecStats, VerifyResult
from specdec.verify import RULES, Greedy, SampleMatch, VerificationRule, register_rule

__all__ = [
    "Chain",
    "DDTree",
    "DFlashDrafter",
    "DraftTree",
    "GenerateOutput",
    "ModelDrafter",
    "NGramDrafter",
    "SamplingParams",
    "SpecStats",
    "SpeculativeModel",
    "VerifyResult",
    "generate",
]

__version__ = "0.1.0"
