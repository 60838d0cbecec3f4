"""Speculative sampling (Leviathan et al. 2023; Chen et al. 2023) over a chain sampled from q."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec.types import Accept, DeviceTree, SamplingParams
from specdec.verify.draws import WeighsQ
from specdec.verify.multidraft import check_sampled_policy, recursive_rejection
from specdec.verify.rules import register_rule

__all__ = ["SpeculativeSampling"]


@dataclass(frozen=True)
class SpeculativeSampling(WeighsQ):
    """Speculative sampling: accept the drafted ``x_d ~ q_d`` with probability ``min(1, p(x_d) / q_d(x_d))``, walk on
    while accepted; at the first rejection draw the next token from ``norm(max(0, p - q_d))``; after a full accept
    draw the bonus from p at the last node.

    Exact for ``SampledChain`` only (the drafts must be samples of the q the rule weighs; other policies are
    refused by name). q is the drafter's ``logq`` processed with the call's temperature / top-k / top-p, the same
    q the policy sampled from. At ``do_sample=False`` q is the one-hot of the drafter's argmax chain and p the
    target's: a draft is accepted iff it is p's argmax and the residual after a rejection is p's argmax, i.e. the
    rule is :class:`~specdec.verify.Greedy` (token-identical to the target's greedy ``generate``).
    """

    name = "speculative-sampling"
    q_by_depth = True  # verify takes q as one row per depth (the round kernel reads each child's row in place)

    def check(self, sampling: SamplingParams, tree) -> None:
        check_sampled_policy("SpeculativeSampling()", sampling, tree, {"SampledChain": ""})

    def verify(self, tree: DeviceTree, p: torch.Tensor, q: torch.Tensor, noise, max_depth: int) -> Accept:
        return recursive_rejection(tree, p, q, noise, max_depth, replacement=True, q_by_depth=self.q_by_depth)


register_rule("speculative-sampling", SpeculativeSampling)
