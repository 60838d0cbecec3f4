"""Drafters: propose draft trees from the committed tokens (protocol in ``base.py``)."""

from specdec.drafters.base import Drafter
from specdec.drafters.dflash import DFlashDrafter
from specdec.drafters.eagle3 import Eagle3Drafter
from specdec.drafters.model import ModelDrafter
from specdec.drafters.mtp import MTPDrafter
from specdec.drafters.ngram import NGramDrafter, NGramDrafterConfig

__all__ = [
    "DRAFTERS",
    "DFlashDrafter",
    "Drafter",
    "Eagle3Drafter",
    "MTPDrafter",
    "ModelDrafter",
    "NGramDrafter",
    "NGramDrafterConfig",
]

DRAFTERS: dict[str, type] = {"model": ModelDrafter, "mtp": MTPDrafter, "ngram": NGramDrafter}
