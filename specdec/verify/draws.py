"""What the rules that weigh the draft distribution share: the target's and the drafter's processed
distributions, uniforms read from the round's noise, one-uniform categorical draws, and the accepted path that
ends at a given node. Tensor ops only, shapes fixed by the tree's slots (``docs/verification.md``).

Every rule here reads at most four uniforms of a slot's ``V`` (so ``V >= 4``): ``uniform(noise, 0)`` is the slot's
acceptance test (each node is tested at most once), ``uniform(noise, 1)`` the categorical draw made at the slot
when the walk ends there (a residual or the bonus). Two float32 uniforms make one float64 uniform with 48 random
bits, so a token's probability is resolved to ~1e-14 instead of the 2**-24 grid of one float32 draw.
"""

from __future__ import annotations

import torch

from specdec.types import Accept, DeviceTree, Proposal, SamplingParams
from specdec.verify.processing import process_logits

__all__ = [
    "WeighsQ",
    "accept_at",
    "categorical",
    "draft_logprobs",
    "node_proposals",
    "target_probs",
    "uniform",
]

_GRID = 2.0**-24  # spacing of torch.rand's float32 uniforms


def target_probs(logits: torch.Tensor, sampling: SamplingParams) -> torch.Tensor:
    """The target's sampling distribution ``p`` at every node: HF's temperature / top-k / top-p (float64)."""
    return torch.softmax(process_logits(logits, sampling).double(), dim=-1)


def draft_logprobs(logq: torch.Tensor, sampling: SamplingParams | None) -> torch.Tensor:
    """The draft distribution a sampled policy draws from: ``logq`` processed with the call's temperature, top-k
    and top-p exactly as the target's logits are (``process_logits``), renormalised (fp32 log-probabilities,
    ``-inf`` outside its support). ``sampling=None`` (a policy used without ``generate``): ``logq`` as is."""
    scores = logq.float() if sampling is None else process_logits(logq, sampling)
    return torch.log_softmax(scores, dim=-1)


def node_proposals(tree: DeviceTree, proposal: Proposal | None, sampling: SamplingParams) -> torch.Tensor:
    """The draft distribution each node was drawn from, ``[B, S, V]`` float64: row ``depth - 1`` of the processed
    ``logq`` (DFlash-style per-depth ``q``: every depth-d node shares it); zeros at the root and padding."""
    if proposal is None or proposal.logq is None:
        raise ValueError("this rule weighs the draft distribution: the drafter must provide logq")
    q = torch.exp(draft_logprobs(proposal.logq, sampling).double())  # [B, D, V]
    rows = (tree.depth - 1).clamp(0, q.shape[1] - 1)  # [B, S]
    per_node = q.gather(1, rows[..., None].expand(-1, -1, q.shape[-1]))
    return per_node * (tree.valid & (tree.depth > 0))[..., None]


def uniform(noise: torch.Tensor, k: int) -> torch.Tensor:
    """The ``k``-th float64 uniform in [0, 1) of every slot, ``[B, S]``, from the float32 uniforms ``noise[..., 2k]``
    and ``noise[..., 2k + 1]``."""
    u = noise[..., 2 * k].double() + noise[..., 2 * k + 1].double() * _GRID
    return u.clamp(max=1.0 - 2.0**-52)


def categorical(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One draw per row of the distribution ``probs [..., V]`` (non-negative, any positive total: the mass is
    normalised here) by inverse CDF at ``u [...]``. A zero-probability token is never drawn."""
    cdf = probs.cumsum(-1)
    total = cdf[..., -1:]
    index = (cdf <= u[..., None] * total).sum(-1)
    last = (cdf < total).sum(-1)  # the last token of positive probability (rounding of the cumulative sum)
    return torch.minimum(index, last)


def accept_at(tree: DeviceTree, node: torch.Tensor, bonus: torch.Tensor, max_depth: int) -> Accept:
    """The :class:`~specdec.types.Accept` whose path runs from the root to ``node [B]`` and whose last token is
    ``bonus [B]``, in ``max_depth + 1`` slots."""
    steps = max_depth + 1
    up = [node]
    for _ in range(max_depth):
        up.append(tree.parents.gather(1, up[-1][:, None]).squeeze(1).clamp(min=0))
    up = torch.stack(up, 1)  # [B, P]: the ancestor s levels above ``node`` (the root repeated past it)
    depth = tree.depth.gather(1, node[:, None])  # [B, 1]
    d = torch.arange(steps, device=node.device)[None]
    return accept_path(tree, torch.where(d <= depth, up.gather(1, (depth - d).clamp(min=0)), node[:, None]), bonus)


def forward_path(nxt: torch.Tensor, max_depth: int) -> torch.Tensor:
    """``[B, max_depth + 1]``: the walk from the root along ``nxt [B, S]`` (each node's accepted child, the node
    itself where none), slot ``d`` holding ``nxt^d(0)``; past the walk's end the end node repeats.

    By pointer doubling: the powers ``nxt^(2^j)`` (``max_depth.bit_length()`` of them, one gather each past the
    first) composed by the bits of ``d`` (a device arange), no host reads."""
    steps = max_depth + 1
    d = torch.arange(steps, device=nxt.device)
    path = torch.zeros(nxt.shape[0], steps, dtype=nxt.dtype, device=nxt.device)  # nxt^0(0) = the root
    power = nxt  # nxt^(2^j)
    for j in range(max_depth.bit_length()):
        if j:
            power = power.gather(1, power)
        path = torch.where((d & (1 << j)) != 0, power.gather(1, path), path)
    return path


def accept_path(tree: DeviceTree, path: torch.Tensor, bonus: torch.Tensor) -> Accept:
    """The :class:`~specdec.types.Accept` of the walk ``path [B, P]`` from the root (past its end the end node
    repeated, as :func:`forward_path` gives it) whose last token is ``bonus [B]``: :func:`accept_at` at the path's
    end."""
    depth = tree.depth.gather(1, path[:, -1:])  # [B, 1]
    d = torch.arange(path.shape[1], device=path.device)[None]
    after = tree.tokens.gather(1, path).roll(-1, 1)  # token of the next path node (read where d < depth only)
    tokens = torch.where(d < depth, after, torch.where(d == depth, bonus[:, None], 0))
    return Accept(path=path, num_path=depth[:, 0] + 1, tokens=tokens)


class WeighsQ:
    """The skeleton of a rule that weighs the draft distribution: at ``do_sample=False`` the greedy walk; else the
    target's processed distribution ``p [B, S, V]`` and each node's ``q`` (from the proposal), handed to
    :meth:`verify` with the round's uniforms. Subclasses set ``name`` and define ``check`` and ``verify``."""

    def uses_noise(self, sampling: SamplingParams) -> bool:
        return sampling.do_sample

    def accept(self, tree: DeviceTree, logits: torch.Tensor, sampling: SamplingParams, noise, max_depth: int,
               proposal: Proposal | None = None) -> Accept:  # fmt: skip
        if not sampling.do_sample:
            from specdec.verify.rules import Greedy

            return Greedy().accept(tree, logits, sampling, noise, max_depth)
        p = target_probs(logits, sampling)
        q = node_proposals(tree, proposal, sampling) if tree.num_slots > 1 else torch.zeros_like(p)
        return self.verify(tree, p, q, noise, max_depth)

    def verify(self, tree: DeviceTree, p: torch.Tensor, q: torch.Tensor, noise: torch.Tensor, max_depth: int) -> Accept:
        raise NotImplementedError
