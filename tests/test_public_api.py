"""The public surface is deliberate: pin ``__all__`` of the package and its subpackages."""

import importlib

import pytest

PUBLIC = {
    "specdec": [
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
    ],
    "specdec.trees": [
        "TREES",
        "Chain",
        "DDTree",
        "DynamicTree",
        "GumbelTopKTree",
        "SampledChain",
        "SampledTrees",
        "StochasticDDTree",
        "TreePolicy",
        "ancestor_mask",
        "ancestor_matrix",
        "chain_device",
        "chain_from_path",
        "ddtree_device",
        "register_tree",
        "rerank_candidates",
        "tree_attention_bias",
        "tree_position_ids",
        "trie_device",
    ],
    "specdec.verify": [
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
    ],
}


def _isort_style(name: str) -> tuple[int, str]:
    """The order ruff's RUF022 keeps ``__all__`` in: SCREAMING_CASE, then CamelCase, then the rest."""
    return (0 if name.isupper() else 1 if name[:1].isupper() else 2, name)


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_public_api_is_pinned(module):
    mod = importlib.import_module(module)
    assert sorted(mod.__all__) == sorted(PUBLIC[module])
    assert list(mod.__all__) == sorted(mod.__all__, key=_isort_style)
    for name in mod.__all__:
        assert hasattr(mod, name)


def test_submodules_read_as_attributes_load():
    """``import specdec; specdec.drafters.NGramDrafter`` works as it reads, in a fresh interpreter (nothing imported
    the submodule before); an unknown name is still an AttributeError."""
    import subprocess
    import sys

    code = (
        "import specdec\n"
        "assert specdec.drafters.NGramDrafter.__name__ == 'NGramDrafter'\n"
        "assert callable(specdec.generate) and specdec.verify.Greedy.__name__ == 'Greedy'\n"
        "try:\n    specdec.no_such_thing\nexcept AttributeError as e:\n    assert 'no_such_thing' in str(e)\n"
        "else:\n    raise SystemExit('no AttributeError')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
