"""What a tree policy and a verification rule return, checked at the protocol boundary (``docs/extending.md``).

Two kinds of check, so that a policy or rule of a user's can never change which tokens are output unnoticed:

- **On the host, every call where it is cheap**: the types, shapes and dtypes of the :class:`~specdec.types.
  DeviceTree` a policy builds and the :class:`~specdec.types.Accept` a rule returns (read off the tensors'
  metadata, no device read; inside a captured round they run when the round is traced).
- **On the device, as tensor ops inside the round**: the value invariants (``parents[i] < i``, ``depth`` = its
  parent's + 1, padding, ``num_nodes``, token range; the accepted path a chain of real nodes from the root whose
  draft tokens are the tree's, ``num_path`` in range). They make a bitmask per sequence that the round writes
  beside its tokens, so it travels with the round's one host read (capture stays possible); the loop raises
  :class:`ProtocolError` naming the policy or rule, the field and the fix.

The built-in policies and rules are not checked on the device (they are tested on random trees against these same
invariants, ``tests/test_protocol_validation.py``), so they pay nothing; a policy or rule defined elsewhere is.
"""

from __future__ import annotations

import torch

from specdec.types import Accept, DeviceTree, Proposal

__all__ = [
    "ProtocolError",
    "accept_flags",
    "check_accept",
    "check_proposal",
    "check_tree",
    "describe_flags",
    "proposal_flags",
    "sanitized_accept",
    "sanitized_tree",
    "tree_flags",
    "trusted",
]

# bit -> (field, what is wrong, the fix)
TREE_BITS = {
    1: ("parents", "a node's parent is not an earlier slot (parents[i] < i, parents[0] = -1)",
        "order the nodes so that every parent comes before its children"),
    2: ("depth", "depth disagrees with parents (depth[0] = 0, depth[i] = depth[parents[i]] + 1)",
        "derive depth from parents"),
    4: ("valid", "the real nodes are not a prefix of the slots starting at the root",
        "put the real nodes first and padding after them"),
    8: ("num_nodes", "num_nodes is not the number of real slots (valid.sum())", "set num_nodes = valid.sum(-1)"),
    16: ("tokens", "a real node's token is outside the vocabulary", "draft tokens in [0, vocab_size)"),
    32: ("padding", "a padding slot has a parent or a depth", "padding slots carry parent -1 and depth 0"),
    64: ("parents", "a real node's parent is a padding slot", "parents must be real nodes"),
    128: ("tokens", "slot 0 does not hold the round's root token (tokens[:, 0] != root)",
          "put the root passed to build() in slot 0"),
}  # fmt: skip
ACCEPT_BITS = {
    256: ("num_path", "num_path is outside [1, max_depth + 1] or beyond the tree's real nodes",
          "num_path counts the accepted nodes including the root"),
    512: ("path", "the accepted path is not a chain of real nodes from the root (path[0] = 0, "
          "parents[path[d + 1]] = path[d])", "walk the tree from the root"),
    1024: ("tokens", "an accepted draft token differs from the tree's token at that node",
           "tokens[d] = tree.tokens[path[d + 1]] for the accepted drafts"),
    2048: ("tokens", "the bonus token is outside the vocabulary", "the bonus is a token id in [0, vocab_size)"),
}  # fmt: skip
PROPOSAL_BITS = {
    4096: ("logq", "a drafted log-probability is above 0 (not a log-probability: the trees are built from scores "
           "<= 0)", "return log_softmax over the vocabulary (torch.log_softmax(logits, -1))"),
    8192: ("logq", "a drafted log-probability is NaN (a tree built from it, and the auto budget's expectations, "
           "would be meaningless)", "return log-probabilities that are finite or -inf: log_softmax of finite logits"),
}  # fmt: skip
LOGQ_SLACK = 1e-3  # a log-probability this far above 0 is rounding, not a broken drafter


def proposal_flags(proposal: Proposal, batch: int, device: torch.device) -> torch.Tensor:
    """``[B]`` int64: the :data:`PROPOSAL_BITS` each sequence's proposal breaks (0: none). Tensor ops only."""
    if proposal.logq is None:
        return torch.zeros(batch, dtype=torch.long, device=device)
    logq = proposal.logq.float().flatten(1)
    return (logq > LOGQ_SLACK).any(1).long() * 4096 | logq.isnan().any(1).long() * 8192


class ProtocolError(ValueError):
    """A tree policy or verification rule returned something that breaks the round's protocol."""


def trusted(obj) -> bool:
    """Whether ``obj`` (a policy or rule) is one of specdec's own, whose device invariants are not checked."""
    return type(obj).__module__.startswith("specdec.")


def _where(obj) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


def _check_tensor(owner: str, name: str, t, shape: tuple[int, ...], dtypes: tuple[torch.dtype, ...]) -> None:
    if not isinstance(t, torch.Tensor):
        raise ProtocolError(f"{owner} returned {name} as {type(t).__name__}: return a torch.Tensor of shape "
                            f"{list(shape)} ({', '.join(str(d) for d in dtypes)}) on the round's device.")  # fmt: skip
    if tuple(t.shape) != shape:
        raise ProtocolError(f"{owner} returned {name} of shape {list(t.shape)}; the round needs {list(shape)}: "
                            "one row per sequence, one column per slot (a round is built once per policy value: "
                            "a policy whose settings changed since must be a new object).")  # fmt: skip
    if t.dtype not in dtypes:
        raise ProtocolError(f"{owner} returned {name} as {t.dtype}; the round needs "
                            f"{' or '.join(str(d) for d in dtypes)}: convert it (e.g. .long()).")  # fmt: skip


def check_tree(policy, tree, batch: int, slots: int) -> None:
    """The host checks of a policy's trees: a :class:`DeviceTree` of ``[batch, slots]`` int64 fields (``valid``
    bool, ``num_nodes`` ``[batch]``)."""
    owner = f"tree policy {_where(policy)}"
    if not isinstance(tree, DeviceTree):
        raise ProtocolError(f"{owner} returned {type(tree).__name__} from build(); return a specdec.types.DeviceTree "
                            "(DeviceTree.stack of TreeRows, or the five [B, S] tensors).")  # fmt: skip
    long = (torch.int64,)
    for name in ("tokens", "parents", "depth"):
        _check_tensor(owner, name, getattr(tree, name), (batch, slots), long)
    _check_tensor(owner, "valid", tree.valid, (batch, slots), (torch.bool,))
    _check_tensor(owner, "num_nodes", tree.num_nodes, (batch,), (torch.int64, torch.int32))


def check_proposal(drafter, proposal, batch: int, vocab: int) -> None:
    """The host checks of a drafter's proposal: a :class:`~specdec.types.Proposal` whose ``logq`` is a float
    ``[batch, D >= 1, vocab]`` tensor (the target's vocabulary: a drafter over another vocabulary maps its ids
    first) and whose ``paths`` / ``path_lengths`` are int64 ``[batch, M, L]`` / ``[batch, M]``. The token values
    of the tree the policy builds from it are checked on the device (``tree_flags``)."""
    owner = f"drafter {_where(drafter)}"
    if not isinstance(proposal, Proposal):
        raise ProtocolError(f"{owner} returned {type(proposal).__name__} from propose(); return a "
                            "specdec.types.Proposal (logq and/or paths).")  # fmt: skip
    if proposal.logq is not None:
        q = proposal.logq
        if not isinstance(q, torch.Tensor):
            raise ProtocolError(f"{owner} returned logq as {type(q).__name__}: return a float torch.Tensor "
                                f"[{batch}, D, {vocab}] on the round's device.")  # fmt: skip
        if q.dim() != 3 or q.shape[0] != batch or q.shape[1] < 1 or q.shape[2] != vocab:
            raise ProtocolError(f"{owner} returned logq of shape {list(q.shape)}; the round needs [{batch}, D, "
                                f"{vocab}]: one row per sequence, D >= 1 depths, the target's vocabulary of {vocab} "
                                "(map a draft vocabulary's ids to the target's first).")  # fmt: skip
        if not q.is_floating_point():
            raise ProtocolError(f"{owner} returned logq as {q.dtype}: return float log-probabilities.")
    if proposal.paths is not None:
        paths, lengths = proposal.paths, proposal.path_lengths
        _check_tensor(owner, "paths", paths, (batch, *tuple(getattr(paths, "shape", (0, 0, 0)))[1:3]),
                      (torch.int64,))  # fmt: skip
        if paths.dim() != 3 or paths.shape[1] < 1:
            raise ProtocolError(f"{owner} returned paths of shape {list(paths.shape)}; the round needs "
                                f"[{batch}, M, L] int64 with M >= 1 (a round without a draft: one path of length "
                                "0, path_lengths 0).")  # fmt: skip
        _check_tensor(owner, "path_lengths", lengths, (batch, paths.shape[1]), (torch.int64,))


def check_accept(rule, accept, batch: int, steps: int) -> None:
    """The host checks of a rule's result: an :class:`Accept` of ``path`` / ``tokens`` ``[batch, steps]`` and
    ``num_path`` ``[batch]``, int64."""
    owner = f"verification rule {_where(rule)}"
    if not isinstance(accept, Accept):
        raise ProtocolError(f"{owner} returned {type(accept).__name__} from accept(); return a specdec.types.Accept "
                            "(path, num_path, tokens).")  # fmt: skip
    _check_tensor(owner, "path", accept.path, (batch, steps), (torch.int64,))
    _check_tensor(owner, "tokens", accept.tokens, (batch, steps), (torch.int64,))
    _check_tensor(owner, "num_path", accept.num_path, (batch,), (torch.int64,))


def tree_flags(tree: DeviceTree, vocab: int, root: torch.Tensor | None = None) -> torch.Tensor:
    """``[B]`` int64: the :data:`TREE_BITS` each sequence's tree breaks (0: none), ``root`` (``[B]``) the token slot 0
    must hold. Tensor ops only."""
    parents, depth, valid = tree.parents, tree.depth, tree.valid
    slots = parents.shape[1]
    index = torch.arange(slots, device=parents.device)[None]
    zero = torch.zeros_like(parents[:, 0])
    real_child = valid & (index > 0)
    safe = parents.clamp(0, slots - 1)
    flags = zero.clone()
    order = (real_child & ((parents >= index) | (parents < 0))).any(1) | (parents[:, 0] != -1)
    flags |= order.long() * 1
    parent_depth = depth.gather(1, safe)
    flags |= ((real_child & (depth != parent_depth + 1)).any(1) | (depth[:, 0] != 0)).long() * 2
    prefix = valid[:, :1] & (valid[:, 1:] <= valid[:, :-1]).all(1, keepdim=True)
    flags |= (~prefix[:, 0]).long() * 4
    flags |= (tree.num_nodes.long() != valid.sum(1)).long() * 8
    flags |= (valid & ((tree.tokens < 0) | (tree.tokens >= vocab))).any(1).long() * 16
    flags |= (~valid & ((parents != -1) | (depth != 0))).any(1).long() * 32
    flags |= (real_child & ~valid.gather(1, safe)).any(1).long() * 64
    if root is not None:
        flags |= (tree.tokens[:, 0] != root).long() * 128
    return flags


def accept_flags(accept: Accept, tree: DeviceTree, vocab: int) -> torch.Tensor:
    """``[B]`` int64: the :data:`ACCEPT_BITS` each sequence's accepted path breaks (0: none). Tensor ops only."""
    path, tokens, num_path = accept.path, accept.tokens, accept.num_path
    steps, slots = path.shape[1], tree.parents.shape[1]
    flags = torch.zeros_like(num_path)
    bad_count = (num_path < 1) | (num_path > steps) | (num_path > tree.num_nodes.long())
    flags |= bad_count.long() * 256
    d = torch.arange(steps, device=path.device)[None]
    live = d < num_path[:, None]  # the accepted nodes (root first)
    inside = (path >= 0) & (path < slots)
    safe = path.clamp(0, slots - 1)
    real = tree.valid.gather(1, safe)
    parent = tree.parents.gather(1, safe)
    chained = torch.ones_like(live)
    chained[:, 1:] = parent[:, 1:] == path[:, :-1]
    broken = (live & (~inside | ~real | ~chained)).any(1) | (path[:, 0] != 0)
    flags |= broken.long() * 512
    drafts = d < (num_path[:, None] - 1)  # tokens[d] is the node path[d + 1]'s token for the accepted drafts
    tree_tokens = tree.tokens.gather(1, safe.roll(-1, 1))
    flags |= (drafts & (tokens != tree_tokens)).any(1).long() * 1024
    bonus = tokens.gather(1, (num_path - 1).clamp(0, steps - 1)[:, None])[:, 0]
    flags |= ((bonus < 0) | (bonus >= vocab)).long() * 2048
    return flags


def sanitized_tree(tree: DeviceTree, vocab: int, depth: int) -> DeviceTree:
    """``tree`` with every index clamped into range (tokens, parents before their child, depth), so that a round
    over a tree that breaks the protocol runs to its read (where the flags raise) instead of failing inside a kernel
    or a recurrent layer's tree walk."""
    slots = tree.parents.shape[1]
    before = torch.arange(slots, device=tree.parents.device) - 1  # a parent comes before its child (hybrid walks check)
    return tree._replace(
        tokens=tree.tokens.clamp(0, vocab - 1),
        parents=torch.minimum(tree.parents.clamp(min=-1), before),
        depth=tree.depth.clamp(0, depth),
        num_nodes=tree.num_nodes.clamp(1, slots),
    )


def sanitized_accept(accept: Accept, vocab: int, slots: int) -> Accept:
    """``accept`` with every index clamped into range, for the same reason."""
    steps = accept.path.shape[1]
    return Accept(
        path=accept.path.clamp(0, slots - 1),
        num_path=accept.num_path.clamp(1, steps),
        tokens=accept.tokens.clamp(0, vocab - 1),
    )


def describe_flags(flags: int, policy, rule, drafter=None) -> str:
    """The message of a nonzero bitmask: which policy or rule (or the drafter whose proposal a built-in policy
    turned into that tree), which field, what is wrong, the fix."""
    parts = []
    tree_owner = f"tree policy {_where(policy)}"
    if drafter is not None and trusted(policy) and not trusted(drafter):
        tree_owner = f"drafter {_where(drafter)} (its proposal, through {tree_owner})"
    owners = [(TREE_BITS, tree_owner), (ACCEPT_BITS, f"verification rule {_where(rule)}")]
    if drafter is not None:
        owners.insert(0, (PROPOSAL_BITS, f"drafter {_where(drafter)}"))
    for bits, owner in owners:
        for bit, (field, wrong, fix) in bits.items():
            if flags & bit:
                parts.append(f"{owner}: {field}: {wrong}; fix: {fix}")
    return "; ".join(parts) + ". The round's output was discarded (the next call starts afresh)."
