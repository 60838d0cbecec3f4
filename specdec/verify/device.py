"""Verification as device tensor ops: the target's choice per node and the accepted path, without host reads.

Same results as :func:`specdec.verify.greedy.walk_tree` over :func:`specdec.verify.sampling.sample_tokens`, for
trees in fixed slots (:class:`specdec.trees.device.DeviceTree`): every output shape depends only on Python ints,
so the functions can be captured in a CUDA graph; they run unchanged on CPU. Sampling draws by Gumbel-max from
uniforms the caller supplies (drawn with the run's generator outside any graph): ``argmax(log p + G)`` with
``G = -log(-log(U))`` is an exact sample of p, the node's HF-processed distribution.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from specdec.trees.device import DeviceTree
from specdec.types import SamplingParams
from specdec.verify.sampling import process_logits

__all__ = ["DeviceAccept", "accept_device", "gumbel_from_uniform", "target_choices"]


class DeviceAccept(NamedTuple):
    """The accepted path of one tree, in ``P = max_depth + 1`` fixed slots.

    Args:
        path (torch.Tensor): ``[P]`` int64 node indices, root first; entries past ``num_path`` repeat the last.
        num_path (torch.Tensor): 0-d int64, accepted nodes including the root (= accepted drafts + 1).
        tokens (torch.Tensor): ``[P]`` int64: the accepted draft tokens, then the bonus; 0 past ``num_path``.
    """

    path: torch.Tensor
    num_path: torch.Tensor
    tokens: torch.Tensor


def gumbel_from_uniform(u: torch.Tensor) -> torch.Tensor:
    """Standard Gumbel noise ``-log(-log(u))`` from uniforms, with ``u`` clamped into the open interval (0, 1).

    Args:
        u (torch.Tensor): float uniforms in [0, 1], any shape.

    Returns:
        torch.Tensor: same shape and dtype, finite.
    """
    info = torch.finfo(u.dtype)
    return -torch.log(-torch.log(u.clamp(min=info.tiny, max=1.0 - info.eps / 2)))


def target_choices(logits: torch.Tensor, sampling: SamplingParams, noise: torch.Tensor | None = None) -> torch.Tensor:
    """The target's token at each node: its argmax, or a sample of its HF-processed distribution.

    Args:
        logits (torch.Tensor): ``[S, V]`` target logits, one row per slot.
        sampling (SamplingParams): greedy (first maximum, as ``torch.argmax``) unless ``do_sample``; then
            temperature, top-k and top-p are applied as HF does and one token is drawn per row by Gumbel-max.
        noise (torch.Tensor | None): ``[S, V]`` fp32 uniforms in [0, 1]; required when ``sampling.do_sample``.

    Returns:
        torch.Tensor: ``[S]`` int64 on ``logits.device``.
    """
    if logits.dim() != 2:
        raise ValueError(f"logits must be [S, V], got {tuple(logits.shape)}; index one sequence.")
    if not sampling.do_sample:
        return logits.argmax(dim=-1)
    if noise is None or noise.shape != logits.shape:
        got = None if noise is None else tuple(noise.shape)
        raise ValueError(
            f"do_sample=True needs noise of shape {tuple(logits.shape)} (uniforms from the run's generator), got {got}."
        )
    log_p = torch.log_softmax(process_logits(logits, sampling), dim=-1)  # [S, V] fp32, -inf outside the support
    return (log_p + gumbel_from_uniform(noise.float())).argmax(dim=-1)


def accept_device(tree: DeviceTree, choices: torch.Tensor, ancestors: torch.Tensor, *, max_depth: int) -> DeviceAccept:
    """Walk the tree along the target's choices: the greedy / sample-and-match acceptance, as device ops.

    A node is accepted when it and every non-root ancestor carry their parent's choice (among siblings with
    equal tokens only the first counts, as in :func:`~specdec.verify.greedy.walk_tree`); padding never is.

    Args:
        tree (DeviceTree): ``S`` slots.
        choices (torch.Tensor): ``[S]`` int64, the target's token at each slot (:func:`target_choices`).
        ancestors (torch.Tensor): ``[S, S]`` bool from :func:`specdec.trees.device.ancestor_matrix`.
        max_depth (int): an upper bound on the depth of the real nodes, >= 0; sets ``P = max_depth + 1``.

    Returns:
        DeviceAccept: the path, its length and the new tokens (accepted drafts + bonus).
    """
    if isinstance(max_depth, bool) or not isinstance(max_depth, int) or max_depth < 0:
        raise ValueError(f"max_depth={max_depth!r}: pass a Python int >= 0 (the deepest node's depth).")
    slots = tree.tokens.numel()
    device = tree.tokens.device
    index = torch.arange(slots, device=device)
    parent = tree.parents.clamp(min=0)
    same = (tree.parents.unsqueeze(-1) == tree.parents) & (tree.tokens.unsqueeze(-1) == tree.tokens) & tree.valid
    first = ~(same & (index < index.unsqueeze(-1))).any(-1)  # no earlier sibling with the same token
    good = (tree.tokens == choices[parent]) & first & (index > 0) | (index == 0)
    accepted = tree.valid & ~(ancestors & ~good).any(-1)  # [S]: a chain from the root
    num_path = accepted.sum()
    steps = max_depth + 1
    spot = torch.where(accepted, tree.depth.clamp(max=steps), steps)  # slot `steps` collects the rest
    path = torch.zeros(steps + 1, dtype=torch.long, device=device).scatter_(0, spot, index * accepted)
    path = path[:steps].cummax(0).values  # accepted indices increase with depth: repeat the last one
    last = path[-1]
    j = torch.arange(steps, device=device)
    drafts = tree.tokens[path[(j + 1).clamp(max=steps - 1)]]
    bonus = choices.gather(0, last.view(1))  # a 0-d index would read it on the host
    tokens = torch.where(j < num_path - 1, drafts, torch.where(j == num_path - 1, bonus, 0))
    return DeviceAccept(path=path, num_path=num_path, tokens=tokens)
