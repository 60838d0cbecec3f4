"""Block verification (Sun et al., ICLR 2025): a sampled chain verified jointly, not token by token."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec.types import Accept, DeviceTree, SamplingParams
from specdec.verify.draws import WeighsQ, accept_path, categorical, constant_arange, uniforms
from specdec.verify.multidraft import check_sampled_policy
from specdec.verify.rules import register_rule
from specdec.verify.traversal import kernel_runs, traversal_verify

__all__ = ["BlockVerification", "block_verify"]


def block_verify(tree: DeviceTree, p: torch.Tensor, q: torch.Tensor, noise: torch.Tensor, max_depth: int) -> Accept:
    """Block verification of chains (slot i = depth i, ``n`` real drafts per row).

    Forward: ``w_0 = 1``, ``w_i = min(1, w_{i-1} p_{i-1}(x_i) / q_i(x_i))`` (the prefix's capped likelihood ratio).
    For ``i < n`` the residual ``R_i = max(0, w_i p_i - q_{i+1})`` (after the prefix ``x_1..x_i``) and
    ``h_i = |R_i| / (|R_i| + 1 - w_i)``; ``h_n = w_n``. Backward: the accepted length is the largest ``i`` with
    ``eta_i <= h_i`` (0 if none); the next token is drawn from ``p_n`` if ``i = n``, else from ``norm(R_i)``.

    Args:
        tree (DeviceTree): chains ``[B, S]``.
        p (torch.Tensor): ``[B, S, V]`` float32 (or float64) target distribution at each node.
        q (torch.Tensor): ``[B, S, V]`` draft distribution of each node, p's dtype (read at the drafts only).
        noise (torch.Tensor): ``[B, S, >= 4]`` uniforms (``draws.uniform`` 0: ``eta_i`` at slot i, 1: the final
            draw).
        max_depth (int): the deepest node; the result has ``max_depth + 1`` slots.
    """
    slots, vocab = p.shape[1:]
    tiny = torch.finfo(p.dtype).tiny
    drafts = tree.num_nodes - 1  # [B]
    index = constant_arange(slots, p.device)
    tokens = tree.tokens[:, 1:, None]
    ratio = p[:, :-1].gather(2, tokens)[..., 0] / q[:, 1:].gather(2, tokens)[..., 0].clamp(min=tiny)  # [B, S-1]
    # w_i = min(1, w_{i-1} ratio_{i-1}) is exp(L_i - max_{j <= i} L_j) with L the prefix sums of log ratio (L_0 = 0):
    # a running product capped at 1 in one cumulative sum and one cumulative max (float64, [B, S]); past the drafts
    # (invalid slots, a suffix of the chain) log ratio is -inf, so w is 0 there as the capped product's where gave
    steps = ratio.double().log().masked_fill(~tree.valid[:, 1:], -torch.inf)
    logs = torch.nn.functional.pad(steps, (1, 0)).cumsum(1)  # [B, S]
    w = torch.exp(logs - logs.cummax(1).values)  # [B, S], exactly 1 where the prefix is at its running maximum
    residual = (w[:, :-1, None].to(p.dtype) * p[:, :-1] - q[:, 1:]).clamp(min=0.0)  # [B, S-1, V]: R_i for i < S-1
    mass = torch.nn.functional.pad(residual.sum(-1), (0, 1))  # [B, S] (slot S-1 is never a residual's)
    h = torch.where(w >= 1.0, 1.0, mass / (mass + 1.0 - w).clamp(min=tiny))
    last = index == drafts[:, None]  # [B, S]
    h = torch.where(last, w, h)
    # backward pass: the longest prefix whose test passes (slot 0 always passes)
    u = uniforms(noise, 2)
    passed = ((u[..., 0] <= h) | (index == 0)) & (index <= drafts[:, None])
    tau = (passed * index).amax(1)
    final = u[..., 1].gather(1, tau[:, None])[:, 0]
    at = tau[:, None, None].expand(-1, 1, vocab)
    if slots == 1:  # the root alone (plain decoding): the draw is p's
        dist = p[:, 0]
    else:
        dist = torch.where((tau == drafts)[:, None], p.gather(1, at)[:, 0],
                           residual.gather(1, at.clamp(max=slots - 2))[:, 0])  # fmt: skip
    bonus = categorical(dist, final)
    # the chain's path: slot d is depth d, so the walk to slot tau is 0 .. tau (tau repeated past it)
    path = torch.minimum(constant_arange(max_depth + 1, p.device)[None], tau[:, None])
    return accept_path(tree, path, bonus)


@dataclass(frozen=True)
class BlockVerification(WeighsQ):
    """Block verification: the drafted chain is accepted jointly, the longest prefix whose capped likelihood
    ratio passes a backward sequence of tests (``block_verify``); never fewer tokens in expectation than speculative
    sampling, optimal for one chain.

    Exact for ``SampledChain`` only (other policies are refused by name). Where traversal verification's Triton
    round runs (CUDA, ``Backends(tree_traversal=...)``) the chain goes through it (traversal on a chain is block
    verification, token for token); elsewhere ``block_verify``'s tensor ops. q as in
    :class:`~specdec.verify.SpeculativeSampling`. At ``do_sample=False`` (one-hot q and p) ``w_i`` is 1 while the
    drafts are p's argmax and 0 after, every residual is p's argmax: the rule is
    :class:`~specdec.verify.Greedy`.
    """

    name = "block"

    def check(self, sampling: SamplingParams, tree) -> None:
        check_sampled_policy("BlockVerification()", sampling, tree, {"SampledChain": ""})

    def verify(self, tree: DeviceTree, p: torch.Tensor, q: torch.Tensor, noise, max_depth: int) -> Accept:
        if kernel_runs(p):  # a chain is a tree: traversal's Triton round is block verification there, in 3 launches
            return traversal_verify(tree, p, q, noise, max_depth, replacement=True)
        return block_verify(tree, p, q, noise, max_depth)


register_rule("block", BlockVerification)
