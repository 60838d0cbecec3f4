"""specdec: exact, composable speculative decoding for HuggingFace causal LMs.

``specdec.generate(target, input_ids, drafter=..., tree=...)`` is a lossless drop-in for ``target.generate``.
"""

from specdec.drafters import DFlashDrafter, ModelDrafter, NGramDrafter
from specdec.generate import SpeculativeModel, generate
from specdec.types import Chain, DDTree, DraftTree, GenerateOutput, SamplingParams, SpecStats, VerifyResult

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
