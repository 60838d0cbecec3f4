"""What the rules that weigh the draft distribution share: the target's and the drafter's processed
distributions, uniforms read from the round's noise, one-uniform categorical draws, and the accepted path that
ends at a given node. Tensor ops only, shapes fixed by the tree's slots (``docs/verification.md``).

Every rule here reads at most four uniforms of a slot (``NOISE_WIDTH``; the round draws only those, ``[B, S, 4]``):
``uniform(noise, 0)`` is the slot's acceptance test (each node is tested at most once), ``uniform(noise, 1)`` the
categorical draw made at the slot when the walk ends there (a residual or the bonus). Two float32 uniforms make one
float64 uniform with 48 random bits, so a token's probability is resolved to ~1e-14 instead of the 2**-24 grid of
one float32 draw.

Precision: ``p`` and ``q`` are float32 ``[B, S, V]`` (the target's own sampling distribution is HF's float32
softmax of its processed float32 scores, the same tensor here), the residuals and their masses too; what needs
more than float32 is done in float64 on small tensors: the uniforms and the acceptance products ``u * q(x)``
(``[B, S]``), and the inverse-CDF of :func:`categorical` (the cumulative sum of one row per draw, where float32 would
round away the tokens whose probability is below half an ulp of the running sum). The argument:
``docs/verification.md`` ("Precision").
"""

from __future__ import annotations

import torch

from specdec.types import Accept, DeviceTree, Proposal, SamplingParams
from specdec.verify.processing import process_logits

__all__ = [
    "NOISE_WIDTH",
    "WeighsQ",
    "accept_at",
    "categorical",
    "constant_arange",
    "depth_proposals",
    "draft_logprobs",
    "draft_probs",
    "exponential_keys",
    "node_proposals",
    "rows_by_depth",
    "slot_uniform",
    "target_probs",
    "uniform",
    "uniforms",
]

_GRID = 2.0**-24  # spacing of torch.rand's float32 uniforms
NOISE_WIDTH = 4
"""The float32 uniforms per slot the rules that weigh q read (two float64 uniforms): the round draws ``[B, S, 4]``."""
_BITS: dict[tuple[int, torch.device, bool], torch.Tensor] = {}  # forward_path's constants per (steps, device)


def target_probs(logits: torch.Tensor, sampling: SamplingParams) -> torch.Tensor:
    """The target's sampling distribution ``p`` at every node: HF's temperature / top-k / top-p, then HF's float32
    softmax (the distribution HF ``generate`` samples from)."""
    return torch.softmax(process_logits(logits, sampling), dim=-1)


def draft_logprobs(logq: torch.Tensor, sampling: SamplingParams | None) -> torch.Tensor:
    """The draft distribution a sampled policy draws from: ``logq`` processed with the call's temperature, top-k
    and top-p exactly as the target's logits are (``process_logits``), renormalised (fp32 log-probabilities,
    ``-inf`` outside its support). ``sampling=None`` (a policy used without ``generate``): ``logq`` as is."""
    scores = logq.float() if sampling is None else process_logits(logq, sampling)
    return torch.log_softmax(scores, dim=-1)


def draft_probs(logq: torch.Tensor, sampling: SamplingParams | None) -> torch.Tensor:
    """``exp(draft_logprobs(logq, sampling))`` in one softmax (float32, zeros outside q's support)."""
    scores = logq.float() if sampling is None else process_logits(logq, sampling)
    return torch.softmax(scores, dim=-1)


def exponential_keys(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Keys ``probs / log(u) <= 0`` whose increasing order is a Gumbel-top-k draw from ``probs`` (sampling without
    replacement, in draw order; the first key alone a sample of ``probs``): ``-log(u)`` is a standard exponential
    ``E``, ``probs / E`` the inverse of an exponential of rate ``probs``, and the race of those is won by token ``j``
    with probability ``probs[j] / sum(probs)`` (the Gumbel-max trick ``log probs - log E`` in another monotone
    form, two ops instead of six). Tokens outside the support key ``-0.0``: after every token inside it."""
    return probs / torch.log(u)


def depth_proposals(tree: DeviceTree, proposal: Proposal | None, sampling: SamplingParams) -> torch.Tensor:
    """The draft distribution of each depth, ``[B, D, V]`` float32: the processed ``logq`` (DFlash-style per-depth
    ``q``: every depth-d node was drawn from row ``d - 1``). A tree that carries the distribution its policy drew
    from (``tree.draft_probs``) gives it as is: the same rows, processed once."""
    q = tree.draft_probs
    if q is None:
        if proposal is None or proposal.logq is None:
            raise ValueError("this rule weighs the draft distribution: the drafter must provide logq")
        q = draft_probs(proposal.logq, sampling)
    return q


def rows_by_depth(q: torch.Tensor, depth: torch.Tensor) -> torch.Tensor:
    """``[B, S, V]``: slot ``s``'s row of the per-depth ``q [B, D, V]``, row ``clamp(depth_s - 1, 0, D - 1)`` (the
    root and depth 1 share row 0)."""
    rows = (depth - 1).clamp(0, q.shape[1] - 1)
    return q.gather(1, rows[..., None].expand(-1, -1, q.shape[-1]))


def node_proposals(tree: DeviceTree, proposal: Proposal | None, sampling: SamplingParams) -> torch.Tensor:
    """The draft distribution each node was drawn from, ``[B, S, V]`` float32: row ``depth - 1`` of
    :func:`depth_proposals`. The root and padding slots hold depth 1's row: no rule reads q there (a node's q is
    read only where it is a real child)."""
    return rows_by_depth(depth_proposals(tree, proposal, sampling), tree.depth)


def uniform(noise: torch.Tensor, k: int) -> torch.Tensor:
    """The ``k``-th float64 uniform in [0, 1) of every slot, ``[B, S]``, from the float32 uniforms ``noise[..., 2k]``
    and ``noise[..., 2k + 1]``."""
    u = noise[..., 2 * k].double() + noise[..., 2 * k + 1].double() * _GRID
    return u.clamp(max=1.0 - 2.0**-52)


def uniforms(noise: torch.Tensor, n: int) -> torch.Tensor:
    """The first ``n`` float64 uniforms of every slot at once, ``[..., n]``: ``[..., k]`` is ``uniform(noise, k)``
    (three ops for all of them)."""
    pairs = noise[..., : 2 * n].double().unflatten(-1, (n, 2))
    return torch.add(pairs[..., 0], pairs[..., 1], alpha=_GRID).clamp(max=1.0 - 2.0**-52)


def slot_uniform(u: torch.Tensor) -> torch.Tensor:
    """Each slot's float64 uniform ``[B, S]`` from ``u``: ``u`` itself (``[B, S]`` float64) or made of its ``[B, S, 2]``
    float32 halves (:func:`uniforms`), the two forms the rules' kernels take."""
    return u if u.dim() == 2 else uniforms(u, 1)[..., 0]


def categorical(probs: torch.Tensor, u: torch.Tensor, *, draws: bool = False) -> torch.Tensor:
    """One draw per row of the distribution ``probs [..., V]`` (non-negative, any positive total: the mass is
    normalised here) by inverse CDF at ``u [...]`` in ``[0, 1 - 2**-52]`` (``draws``: ``u [..., m]``, ``m`` draws per
    row from one cumulative sum, ``[..., m]``). A zero-probability token is never drawn.

    The cumulative sum is float64 whatever ``probs``' dtype: in float32 a token whose probability is below half an
    ulp of the running sum (``2**-25`` once it passes 1/2) adds nothing to it, so past the first half of the mass
    such tokens could never be drawn (a large vocabulary's tail can hold percents of the mass that way)."""
    cdf = probs.cumsum(-1, dtype=torch.float64)
    at = (u if draws else u[..., None]) * cdf[..., -1:]
    # the entries <= u * total: the drawn token k has cdf[k - 1] <= u * total < cdf[k], so p[k] > 0, and k < V since
    # u * total < total for u <= 1 - 2**-52 (the uniforms' bound: total (1 - 2**-52) is at least an ulp below total)
    out = torch.searchsorted(cdf, at, right=True)
    return out if draws else out[..., 0]


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
    bits = _bit_masks(steps, nxt.device)  # [bits, steps]: bit j of d
    if not max_depth:
        return torch.zeros(nxt.shape[0], steps, dtype=nxt.dtype, device=nxt.device)
    path = nxt[:, :1] * bits[0]  # nxt^(d & 1)(0): nxt(0) where bit 0 is set, the root (0) elsewhere
    power = nxt  # nxt^(2^j)
    for j in range(1, max_depth.bit_length()):
        power = power.gather(1, power)
        path = torch.where(bits[j], power.gather(1, path), path)
    return path


def constant_arange(n: int, device: torch.device) -> torch.Tensor:
    """``torch.arange(n)`` on ``device``, made once and kept (a constant of the captured round)."""
    return _bit_masks(n, device, arange=True)


def _bit_masks(steps: int, device: torch.device, arange: bool = False) -> torch.Tensor:
    """``[steps.bit_length(), steps]`` bool, row j: bit j of ``0 .. steps - 1`` (``arange``: ``0 .. steps - 1``
    itself, int64); made once per (steps, device) and kept (a constant of the captured round, not re-made by it)."""
    key = (steps, torch.device(device), arange)
    if key not in _BITS:
        d = torch.arange(steps, device=device)
        _BITS[key] = d if arange else torch.stack([(d >> j) & 1 == 1 for j in range(max(steps.bit_length(), 1))])
    return _BITS[key]


def accept_path(tree: DeviceTree, path: torch.Tensor, bonus: torch.Tensor) -> Accept:
    """The :class:`~specdec.types.Accept` of the walk ``path [B, P]`` from the root (past its end the end node
    repeated, as :func:`forward_path` gives it) whose last token is ``bonus [B]``: :func:`accept_at` at the path's
    end."""
    depth = tree.depth.gather(1, path[:, -1:])  # [B, 1]
    d = constant_arange(path.shape[1], path.device)[None]
    after = tree.tokens.gather(1, path).roll(-1, 1)  # token of the next path node (read where d < depth only)
    tokens = torch.where(d < depth, after, bonus[:, None] * (d == depth))
    return Accept(path=path, num_path=depth[:, 0] + 1, tokens=tokens)


class WeighsQ:
    """The skeleton of a rule that weighs the draft distribution: at ``do_sample=False`` the greedy walk; else the
    target's processed distribution ``p [B, S, V]`` and each node's ``q`` (from the proposal), handed to
    :meth:`verify` with the round's uniforms. Subclasses set ``name`` and define ``check`` and ``verify``."""

    noise_width = NOISE_WIDTH  # the round draws [B, S, 4] uniforms for these rules, not [B, S, V]
    q_by_depth = False  # True: verify takes q as one row per depth, [B, D, V] (depth_proposals), not [B, S, V]

    def uses_noise(self, sampling: SamplingParams) -> bool:
        return sampling.do_sample

    def accept(self, tree: DeviceTree, logits: torch.Tensor, sampling: SamplingParams, noise, max_depth: int,
               proposal: Proposal | None = None) -> Accept:  # fmt: skip
        if not sampling.do_sample:
            from specdec.verify.rules import Greedy

            return Greedy().accept(tree, logits, sampling, noise, max_depth)
        p = target_probs(logits, sampling)
        if tree.num_slots == 1:
            q = p  # the root alone: q unread
        else:
            q = (depth_proposals if self.q_by_depth else node_proposals)(tree, proposal, sampling)
        return self.verify(tree, p, q, noise, max_depth)

    def verify(self, tree: DeviceTree, p: torch.Tensor, q: torch.Tensor, noise: torch.Tensor, max_depth: int) -> Accept:
        raise NotImplementedError
