"""Sample-and-match: lossless tree verification at any temperature.

One target sample is drawn per node from p (the node's logits processed exactly as HF ``generate`` does:
temperature, then top-k, then top-p, using HF's own warpers); the walk then follows the samples. Every
emitted token is a genuine sample of the target at its position, whatever the tree.
"""

from __future__ import annotations

import torch
from transformers.generation.logits_process import (
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from specdec.types import DraftTree, SamplingParams, VerifyResult
from specdec.verify.greedy import walk_tree

__all__ = ["process_logits", "sample_tokens", "verify_sample"]


def _warpers(sampling: SamplingParams) -> LogitsProcessorList:
    procs = LogitsProcessorList()
    if sampling.temperature != 1.0:
        procs.append(TemperatureLogitsWarper(sampling.temperature))
    if sampling.top_k:
        procs.append(TopKLogitsWarper(top_k=sampling.top_k, min_tokens_to_keep=1))
    if sampling.top_p is not None and sampling.top_p < 1.0:
        procs.append(TopPLogitsWarper(top_p=sampling.top_p, min_tokens_to_keep=1))
    return procs


def process_logits(target_logits: torch.Tensor, sampling: SamplingParams) -> torch.Tensor:
    """HF-identical temperature / top-k / top-p processing of ``[N, V]`` logits, in fp32. Returns ``[N, V]``."""
    scores = target_logits.float()
    return _warpers(sampling)(None, scores)


def sample_tokens(
    target_logits: torch.Tensor, sampling: SamplingParams, generator: torch.Generator | None
) -> torch.Tensor:
    """One token per row (``[N]``): argmax if ``not sampling.do_sample``, else a sample of processed p."""
    if not sampling.do_sample:
        return target_logits.argmax(dim=-1)
    probs = torch.softmax(process_logits(target_logits, sampling), dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def verify_sample(
    tree: DraftTree, target_logits: torch.Tensor, sampling: SamplingParams, generator: torch.Generator | None
) -> VerifyResult:
    """Sample-and-match rule. ``target_logits`` ``[N, V]``; ``generator`` on the logits' device."""
    return walk_tree(tree, sample_tokens(target_logits, sampling, generator).tolist())
