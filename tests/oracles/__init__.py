"""Independent test oracles: HF's own logits warpers, planted-bug variants of them, and a goodness-of-fit test.

The reference distribution of every sampling test comes from HF (its warpers built here in the order HF's
``generate`` applies them, or the processed scores HF ``generate`` itself returns), never from specdec. The
``wrong_*`` processings are the realistic bugs a reimplementation could make; each chi-square test checks by
Monte Carlo that its sample size rejects them (power) while the right distribution passes (false alarms).
"""

from __future__ import annotations

import torch
from transformers.generation.logits_process import (
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

ALPHA = 0.005  # significance level of every goodness-of-fit test (Monte-Carlo false alarms stay <= 1 %)


def hf_warpers(temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None):
    """The warpers HF ``generate(do_sample=True)`` builds, in its order: temperature, top-k, top-p."""
    procs = LogitsProcessorList()
    if temperature != 1.0:
        procs.append(TemperatureLogitsWarper(temperature))
    if top_k:
        procs.append(TopKLogitsWarper(top_k=top_k, min_tokens_to_keep=1))
    if top_p is not None and top_p < 1.0:
        procs.append(TopPLogitsWarper(top_p=top_p, min_tokens_to_keep=1))
    return procs


def hf_probs(logits: torch.Tensor, temperature: float = 1.0, top_k=None, top_p=None) -> torch.Tensor:
    """HF's sampling distribution ``[..., V]`` (float64) of raw logits ``[..., V]``."""
    flat = logits.reshape(-1, logits.shape[-1]).float()
    scores = hf_warpers(temperature, top_k, top_p)(None, flat)
    return torch.softmax(scores.double(), -1).reshape(logits.shape)


def _top_p_without_crossing(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """Planted bug: keep the tokens whose cumulative mass stays <= top_p, dropping the one that crosses it."""
    probs = scores.softmax(-1)
    sorted_p, order = probs.sort(-1, descending=True)
    drop_sorted = sorted_p.cumsum(-1) > top_p
    drop_sorted[..., 0] = False
    drop = drop_sorted.scatter(-1, order, drop_sorted)
    return scores.masked_fill(drop, float("-inf"))


def wrong_probs(logits: torch.Tensor, bug: str, temperature: float = 1.0, top_k=None, top_p=None) -> torch.Tensor:
    """Sampling distribution ``[..., V]`` of one planted bug.

    Bugs: ``"temperature_inverted"`` (logits x T), ``"temperature_off"`` (T x 1.25), ``"top_p_crossing_dropped"``
    (the token that crosses the top-p mass is removed), ``"top_p_before_top_k"`` (the two cuts swapped).
    """
    flat = logits.reshape(-1, logits.shape[-1]).float()
    if bug == "temperature_inverted":
        scores = hf_warpers(1.0 / temperature, top_k, top_p)(None, flat)
    elif bug == "temperature_off":
        scores = hf_warpers(temperature * 1.25, top_k, top_p)(None, flat)
    elif bug == "top_p_crossing_dropped":
        scores = hf_warpers(temperature, top_k)(None, flat)
        if top_p is not None and top_p < 1.0:
            scores = _top_p_without_crossing(scores, top_p)
    elif bug == "top_p_before_top_k":
        scores = hf_warpers(temperature)(None, flat)
        scores = hf_warpers(top_p=top_p)(None, scores)
        scores = hf_warpers(top_k=top_k)(None, scores)
    else:
        raise ValueError(f"unknown bug {bug!r}")
    return torch.softmax(scores.double(), -1).reshape(logits.shape)


BUGS = ("temperature_inverted", "temperature_off", "top_p_crossing_dropped", "top_p_before_top_k")


def gof_pvalues(counts: torch.Tensor, probs: torch.Tensor, min_expected: float = 5.0) -> torch.Tensor:
    """Goodness of fit of count vectors ``[R, C]`` to one distribution ``[C]``; returns p-values ``[R]``.

    Two tests, each at half the level (union bound): Pearson's chi-square with cells of expectation below
    ``min_expected`` pooled, and a per-cell Poisson tail test with a Bonferroni correction (it catches one
    dropped or inflated token that the chi-square dilutes over many cells). A count in a cell of probability
    0 gives p = 0.
    """
    counts = counts.double().reshape(-1, probs.shape[-1])
    probs = probs.double()
    n = counts.sum(-1, keepdim=True)  # [R, 1]
    expected = probs * n
    outside = (counts[:, probs == 0] > 0).any(-1)
    big = probs * n.max() >= min_expected
    obs = torch.cat([counts[:, big], counts[:, ~big & (probs > 0)].sum(-1, keepdim=True)], -1)
    exp = torch.cat([expected[:, big], expected[:, ~big & (probs > 0)].sum(-1, keepdim=True)], -1)
    keep = exp[0] > 0
    obs, exp = obs[:, keep], exp[:, keep]
    dof = max(obs.shape[-1] - 1, 1)
    stat = ((obs - exp) ** 2 / exp).sum(-1)
    p_chi2 = torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), stat / 2)
    # per cell: P(X <= k) = Q(k + 1, lam) and P(X >= k) = P(k, lam) for X ~ Poisson(lam)
    cells = probs > 0
    lam, k = expected[:, cells], counts[:, cells]
    low = torch.special.gammaincc(k + 1, lam)
    high = torch.where(k > 0, torch.special.gammainc(k.clamp(min=1), lam), torch.ones_like(lam))
    p_cell = (2 * torch.minimum(low, high).min(-1).values * int(cells.sum())).clamp(max=1.0)
    p = (2 * torch.minimum(p_chi2, p_cell)).clamp(max=1.0)
    return torch.where(outside, torch.zeros_like(p), p)


def gof_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """p-value of one count vector ``[C]`` against ``probs [C]`` (see :func:`gof_pvalues`)."""
    return float(gof_pvalues(counts[None], probs)[0])


def multinomial_counts(probs: torch.Tensor, n: int, trials: int, generator: torch.Generator) -> torch.Tensor:
    """``trials`` multinomial count vectors ``[trials, C]`` of ``n`` draws each, by sequential binomials."""
    probs = probs.double().clamp(min=0)
    tail = probs.flip(0).cumsum(0).flip(0)  # mass of cells c.. end
    left = torch.full((trials,), float(n), dtype=torch.float64)
    counts = torch.zeros(trials, probs.numel(), dtype=torch.float64)
    for c in range(probs.numel()):
        if probs[c] == 0:
            continue
        share = float((probs[c] / tail[c]).clamp(max=1.0))
        counts[:, c] = torch.binomial(left, torch.full_like(left, share), generator=generator)
        left = left - counts[:, c]
    return counts


def rejection_rate(sample_probs: torch.Tensor, test_probs: torch.Tensor, n: int, *, trials: int = 2000, seed=0):
    """Monte-Carlo share of ``trials`` samples of size ``n`` from ``sample_probs`` that the test at ``ALPHA``
    rejects against ``test_probs`` (power if they differ, false-alarm rate if they are equal)."""
    counts = multinomial_counts(sample_probs, n, trials, torch.Generator().manual_seed(seed))
    return float((gof_pvalues(counts, test_probs) < ALPHA).double().mean())


def power_report(true_probs: torch.Tensor, wrong: dict[str, torch.Tensor], n: int, trials: int = 2000) -> dict:
    """Monte-Carlo false-alarm rate and power against each planted bug for a test of sample size ``n``."""
    report = {"false_alarm": rejection_rate(true_probs, true_probs, n, trials=trials)}
    for i, (bug, probs) in enumerate(wrong.items()):
        report[bug] = rejection_rate(probs, true_probs, n, trials=trials, seed=i + 1)
    return report


def assert_powerful(report: dict) -> None:
    """The test rejects every planted bug with probability >= 0.99 and the truth with probability <= 0.01."""
    assert report["false_alarm"] <= 0.01, report
    weak = {bug: rate for bug, rate in report.items() if bug != "false_alarm" and rate < 0.99}
    assert not weak, report
