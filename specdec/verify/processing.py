"""The target's sampling distribution p at a node: its logits processed exactly as HF ``generate`` does
(temperature, top-h, top-k, top-p, min-p, typical, epsilon, eta: HF's own warpers in HF's order, in fp32; top-k as
:class:`TopKThreshold`, HF's warper with its selection in one kernel launch), and Gumbel noise to sample it.
"""

from __future__ import annotations

import torch
from transformers.generation.logits_process import (
    EpsilonLogitsWarper,
    EtaLogitsWarper,
    LogitsProcessorList,
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopHLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
    TypicalLogitsWarper,
)

from specdec.kernels.topk_mask import topk_mask
from specdec.types import SamplingParams

__all__ = ["TopKThreshold", "gumbel_from_uniform", "process_logits"]


class TopKThreshold(TopKLogitsWarper):
    """HF's ``TopKLogitsWarper`` (its arguments, checks and attributes), whose call computes the same scores with
    :func:`specdec.kernels.topk_mask.topk_mask`: on CUDA, for fp32 rows of up to 32768 entries, one Triton launch
    instead of ``torch.topk``, a compare and a ``masked_fill``; elsewhere HF's formula. As HF: ``k = min(top_k, V)``
    (``top_k`` already at least ``min_tokens_to_keep``), every score strictly below its row's ``k``-th largest set
    to ``filter_value``, returned as a new tensor."""

    def __call__(self, input_ids: torch.LongTensor | None, scores: torch.Tensor) -> torch.Tensor:
        return topk_mask(scores, min(self.top_k, scores.size(-1)), self.filter_value)


def _warpers(sampling: SamplingParams) -> LogitsProcessorList:
    """HF's warpers for ``sampling`` in the order of ``GenerationMixin._get_logits_processor``."""
    procs = LogitsProcessorList()
    if sampling.temperature != 1.0:
        procs.append(TemperatureLogitsWarper(sampling.temperature))
    if sampling.top_h is not None:
        procs.append(TopHLogitsWarper(top_h=sampling.top_h))
    if sampling.top_k:
        procs.append(TopKThreshold(top_k=sampling.top_k, min_tokens_to_keep=1))
    if sampling.top_p is not None and sampling.top_p < 1.0:
        procs.append(TopPLogitsWarper(top_p=sampling.top_p, min_tokens_to_keep=1))
    if sampling.min_p is not None:
        procs.append(MinPLogitsWarper(min_p=sampling.min_p, min_tokens_to_keep=1))
    if sampling.typical_p is not None and sampling.typical_p < 1.0:
        procs.append(TypicalLogitsWarper(mass=sampling.typical_p, min_tokens_to_keep=1))
    if sampling.epsilon_cutoff is not None and 0.0 < sampling.epsilon_cutoff < 1.0:
        procs.append(EpsilonLogitsWarper(epsilon=sampling.epsilon_cutoff, min_tokens_to_keep=1))
    if sampling.eta_cutoff is not None and 0.0 < sampling.eta_cutoff < 1.0:
        procs.append(EtaLogitsWarper(epsilon=sampling.eta_cutoff, min_tokens_to_keep=1))
    return procs


def process_logits(target_logits: torch.Tensor, sampling: SamplingParams) -> torch.Tensor:
    """HF-identical temperature / top-k / top-p processing of ``[..., V]`` logits, in fp32. Returns the same shape."""
    scores = target_logits.float()
    return _warpers(sampling)(None, scores.reshape(-1, scores.shape[-1])).view(scores.shape)


def gumbel_from_uniform(u: torch.Tensor) -> torch.Tensor:
    """Standard Gumbel noise ``-log(-log(u))`` from uniforms, with ``u`` clamped into the open interval (0, 1).

    ``argmax(log p + G)`` is an exact sample of p.
    """
    info = torch.finfo(u.dtype)
    return -torch.log(-torch.log(u.clamp(min=info.tiny, max=1.0 - info.eps / 2)))
