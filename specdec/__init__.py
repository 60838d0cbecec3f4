"""specdec: exact, composable speculative decoding for HuggingFace causal LMs.

``specdec.generate(target, input_ids, drafter=..., tree=...)`` is a lossless drop-in for ``target.generate``.

The names below load on first use, so ``python -m specdec --help`` and ``import specdec.cli`` stay free of torch
and transformers.
"""

import importlib as _importlib
import importlib.util  # noqa: F401 - _importlib.util for the submodule lookup in __getattr__
import sys as _sys
import types as _types  # not `types`: the package attribute `types` is the submodule specdec.types
import typing as _typing

if _typing.TYPE_CHECKING:
    from specdec.backends import Backends
    from specdec.drafters import DFlashDrafter, Eagle3Drafter, ModelDrafter, MTPDrafter, NGramDrafter
    from specdec.generate import SpeculativeModel, generate
    from specdec.trees import (
        TREES,
        Chain,
        DDTree,
        DynamicTree,
        GumbelTopKTree,
        SampledChain,
        SampledTrees,
        StochasticDDTree,
        TreePolicy,
        register_tree,
    )
    from specdec.types import DraftTree, GenerateOutput, SamplingParams, SpecStats, VerifyResult
    from specdec.verify import (
        RULES,
        BlockVerification,
        Greedy,
        MultiDraftRejection,
        SampleMatch,
        SpeculativeSampling,
        TraversalVerification,
        VerificationRule,
        register_rule,
    )

__all__ = [
    "RULES",
    "TREES",
    "Backends",
    "BlockVerification",
    "Chain",
    "DDTree",
    "DFlashDrafter",
    "DraftTree",
    "DynamicTree",
    "Eagle3Drafter",
    "GenerateOutput",
    "Greedy",
    "GumbelTopKTree",
    "MTPDrafter",
    "ModelDrafter",
    "MultiDraftRejection",
    "NGramDrafter",
    "SampleMatch",
    "SampledChain",
    "SampledTrees",
    "SamplingParams",
    "SpecStats",
    "SpeculativeModel",
    "SpeculativeSampling",
    "StochasticDDTree",
    "TraversalVerification",
    "TreePolicy",
    "VerificationRule",
    "VerifyResult",
    "generate",
    "register_rule",
    "register_tree",
]

__version__ = "0.1.0"

_RULE_NAMES = (
    "RULES",
    "BlockVerification",
    "Greedy",
    "MultiDraftRejection",
    "SampleMatch",
    "SpeculativeSampling",
    "TraversalVerification",
    "VerificationRule",
    "register_rule",
)
_HOME = {  # name -> the module it loads from (__all__ and the registries of trees and rules)
    "Backends": "specdec.backends",
    **dict.fromkeys(
        ("DFlashDrafter", "Eagle3Drafter", "MTPDrafter", "ModelDrafter", "NGramDrafter"), "specdec.drafters"
    ),
    **dict.fromkeys(("SpeculativeModel", "generate"), "specdec.generate"),
    **dict.fromkeys(
        ("TREES", "Chain", "DDTree", "DynamicTree", "GumbelTopKTree", "SampledChain", "SampledTrees",
         "StochasticDDTree", "TreePolicy", "register_tree"),
        "specdec.trees",
    ),
    **dict.fromkeys(("DraftTree", "GenerateOutput", "SamplingParams", "SpecStats", "VerifyResult"), "specdec.types"),
    **dict.fromkeys(_RULE_NAMES, "specdec.verify"),
}


def __getattr__(name: str):
    home = _HOME.get(name)
    if home is None:
        # a submodule read as an attribute (``specdec.drafters.NGramDrafter``) loads as it would after an import
        if not name.startswith("_") and _importlib.util.find_spec(f"{__name__}.{name}") is not None:
            return _importlib.import_module(f"{__name__}.{name}")
        raise AttributeError(f"module 'specdec' has no attribute {name!r}")
    value = getattr(_importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


class _Package(_types.ModuleType):
    """``specdec.generate`` is the function, also once the submodule of that name is imported (the import system
    would otherwise rebind the package attribute to the submodule, which stays in ``sys.modules``)."""

    def __setattr__(self, name: str, value) -> None:
        if isinstance(value, _types.ModuleType) and _HOME.get(name) == value.__name__:
            return  # the name resolves through __getattr__ on first use
        super().__setattr__(name, value)


_sys.modules[__name__].__class__ = _Package
