"""The public surface is deliberate: pin ``__all__`` of the package and its subpackages."""

import importlib

import pytest

PUBLIC = {
    "specdec": [
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
    ],
    "specdec.verify": [
        "DeviceAccept",
        "accept_device",
        "gumbel_from_uniform",
        "process_logits",
        "sample_tokens",
        "target_choices",
        "verify",
        "verify_greedy",
        "verify_sample",
        "walk_tree",
    ],
}


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_public_api_is_pinned(module):
    mod = importlib.import_module(module)
    assert sorted(mod.__all__) == sorted(PUBLIC[module])
    assert list(mod.__all__) == sorted(mod.__all__)
    for name in mod.__all__:
        assert hasattr(mod, name)
