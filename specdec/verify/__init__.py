"""Verification rules: pure functions from (tree, target logits, sampling params, generator) to VerifyResult.

Notation (``docs/trees.md``): p = target distribution at a node after HF logits processing.
"""

from specdec.verify.device import DeviceAccept, accept_device, gumbel_from_uniform, target_choices
from specdec.verify.greedy import verify_greedy, walk_tree
from specdec.verify.sampling import process_logits, sample_tokens, verify_sample

__all__ = [
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
]


def verify(tree, target_logits, sampling, generator=None):
    """Dispatch on ``sampling.do_sample``: greedy walk or sample-and-match."""
    if sampling.do_sample:
        return verify_sample(tree, target_logits, sampling, generator)
    return verify_greedy(tree, target_logits)
