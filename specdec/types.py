"""Shared data types of specdec: the tensors the round's stages pass to each other, sampling, stats, outputs.

Everything here is plain data; the stages live in ``specdec.drafters``, ``specdec.trees``, ``specdec.verify`` and
``specdec.state``, the round that composes them in ``specdec.engine``. Every tensor of the round's protocols carries
the batch dimension ``B`` first. Notation and conventions: ``docs/trees.md``.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

__all__ = [
    "Accept",
    "AcceptRow",
    "Continuation",
    "DeviceTree",
    "DraftTree",
    "GenerateOutput",
    "Proposal",
    "SamplingParams",
    "SpecStats",
    "TreeRow",
    "VerifyResult",
]


class Proposal(NamedTuple):
    """What a drafter hands the tree policy each round (tensors on the target's device, batch first).

    A drafter fills the fields it has; a tree policy says which it reads (``TreePolicy.reads``).

    Args:
        logq (torch.Tensor | None): ``[B, D, V]`` float per-depth log-probabilities (row d-1 = depth d) of the
            draft after each row's root (block drafters, small-LM drafters).
        paths (torch.Tensor | None): ``[B, M, L]`` int64 drafted continuations of the root, in priority order
            (retrieval drafters such as n-gram lookup).
        path_lengths (torch.Tensor | None): ``[B, M]`` int64 real tokens of each path (0 = empty).
        candidates (torch.Tensor | None): ``[B, N]`` int64 tokens of a candidate tree drafted inside the drafter
            (EAGLE-2's dynamic tree, ``docs/eagle3.md``): ``N = k + (L - 1) * k * k`` for ``k`` candidates per
            expanded node and ``L`` levels; candidate ``j`` lies at level 1 for ``j < k``, else at level
            ``2 + (j - k) // k**2``; within a level, ``k`` children of each expanded node in turn.
        parents (torch.Tensor | None): ``[B, N]`` int64 candidate index of each candidate's parent (-1: the root);
            always a smaller index.
        scores (torch.Tensor | None): ``[B, N]`` fp32 cumulative draft log-probability of each candidate (the sum
            over its path from the root); a child never scores above its parent.
    """

    logq: torch.Tensor | None = None
    paths: torch.Tensor | None = None
    path_lengths: torch.Tensor | None = None
    candidates: torch.Tensor | None = None
    parents: torch.Tensor | None = None
    scores: torch.Tensor | None = None


class TreeRow(NamedTuple):
    """One row's draft tree in ``S`` fixed slots (the unit the kernels work on).

    Args:
        tokens (torch.Tensor): ``[S]`` int64 node tokens; ``tokens[0]`` is the root; padding holds the root token.
        parents (torch.Tensor): ``[S]`` int64; ``parents[0] = -1``, ``parents[i] < i``; padding holds -1.
        depth (torch.Tensor): ``[S]`` int64; padding holds 0.
        valid (torch.Tensor): ``[S]`` bool, True for the real nodes ``0 .. n-1`` (always a prefix).
        num_nodes (torch.Tensor): 0-d int64, ``n``.
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    depth: torch.Tensor
    valid: torch.Tensor
    num_nodes: torch.Tensor


class DeviceTree(NamedTuple):
    """The round's draft trees, one per row, in ``S`` fixed slots: the fields of :class:`TreeRow` with a batch
    dimension (``tokens``, ``parents``, ``depth``, ``valid`` ``[B, S]``; ``num_nodes`` ``[B]``). Padding slots
    carry the root token, parent -1 and depth 0; they see only themselves and are never accepted.
    ``max_children`` is a bound on any node's number of children that the policy states (a Python int, None when
    unknown); rules that visit siblings rank by rank take that many steps (``S - 1`` without it).
    ``draft_probs`` (optional, ``[B, L, V]`` float32): the processed draft distribution a sampled policy drew the
    depth-d nodes from (row d - 1), which the rules that weigh q then read instead of processing ``logq`` again; the
    round keeps it only from specdec's own policies."""

    tokens: torch.Tensor
    parents: torch.Tensor
    depth: torch.Tensor
    valid: torch.Tensor
    num_nodes: torch.Tensor
    max_children: int | None = None
    draft_probs: torch.Tensor | None = None

    @classmethod
    def stack(cls, rows) -> DeviceTree:
        """Rows (:class:`TreeRow`, all of ``S`` slots) -> one batched tree."""
        return cls(*(torch.stack(field) for field in zip(*rows, strict=True)))

    def row(self, b: int) -> TreeRow:
        """Row ``b`` as a :class:`TreeRow`."""
        return TreeRow(self.tokens[b], self.parents[b], self.depth[b], self.valid[b], self.num_nodes[b])

    @property
    def num_slots(self) -> int:
        return self.tokens.shape[-1]


class AcceptRow(NamedTuple):
    """One row's accepted path, in ``P = max_depth + 1`` fixed slots.

    Args:
        path (torch.Tensor): ``[P]`` int64 node indices, root first; entries past ``num_path`` repeat the last.
        num_path (torch.Tensor): 0-d int64, accepted nodes including the root (= accepted drafts + 1).
        tokens (torch.Tensor): ``[P]`` int64: the accepted draft tokens, then the bonus; 0 past ``num_path``.
    """

    path: torch.Tensor
    num_path: torch.Tensor
    tokens: torch.Tensor


class Accept(NamedTuple):
    """A verification rule's result for the batch: :class:`AcceptRow`'s fields with a batch dimension
    (``path``, ``tokens`` ``[B, P]``; ``num_path`` ``[B]``)."""

    path: torch.Tensor
    num_path: torch.Tensor
    tokens: torch.Tensor

    @classmethod
    def stack(cls, rows) -> Accept:
        return cls(*(torch.stack(field) for field in zip(*rows, strict=True)))

    def row(self, b: int) -> AcceptRow:
        return AcceptRow(*(t[b] for t in self))


@dataclass(frozen=True)
class DraftTree:
    """A draft tree for one sequence, as a parent array. Node 0 is the root (last committed token).

    Args:
        tokens (torch.Tensor): ``[N]`` int64 token ids in node order; ``tokens[0]`` is the root token.
        parents (torch.Tensor): ``[N]`` int64 on CPU; ``parents[0] == -1`` and ``parents[i] < i``.

    Derived (computed once): ``depth`` ``[N]`` int64 CPU, ``depth[0] = 0``.
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    depth: torch.Tensor = field(init=False, repr=False)

    def __post_init__(self) -> None:
        parents = self.parents
        if parents.dim() != 1 or self.tokens.dim() != 1 or parents.numel() != self.tokens.numel():
            raise ValueError(
                f"DraftTree: tokens {tuple(self.tokens.shape)} and parents {tuple(parents.shape)} must be 1-D "
                "of the same length."
            )
        if parents.numel() == 0 or int(parents[0]) != -1:
            raise ValueError("DraftTree: node 0 must be the root (parents[0] == -1).")
        par = parents.tolist()
        depth = [0] * len(par)
        for i in range(1, len(par)):
            if not 0 <= par[i] < i:
                raise ValueError(f"DraftTree: parents[{i}] = {par[i]} must satisfy 0 <= parents[i] < i.")
            depth[i] = depth[par[i]] + 1
        object.__setattr__(self, "depth", torch.tensor(depth, dtype=torch.long))

    @property
    def num_nodes(self) -> int:
        return self.parents.numel()

    @property
    def max_depth(self) -> int:
        return int(self.depth.max())


@dataclass(frozen=True, kw_only=True)
class SamplingParams:
    """Target sampling parameters, processed exactly as HF ``generate`` does, with HF's warpers in HF's order
    (temperature, top-h, top-k, top-p, min-p, typical, epsilon, eta).

    Args:
        do_sample (bool): False = greedy. Default False.
        temperature (float): > 0. Default 1.0.
        top_k (int | None): keep the k most likely tokens; None or 0 disables. Default None.
        top_p (float | None): nucleus mass in (0, 1]; None or 1.0 disables. Default None.
        min_p, typical_p, epsilon_cutoff, eta_cutoff, top_h (float | None): HF's other warpers (None disables;
            HF's neutral values too); validated by HF's own warper classes.
    """

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    typical_p: float | None = None
    epsilon_cutoff: float | None = None
    eta_cutoff: float | None = None
    top_h: float | None = None

    def __post_init__(self) -> None:
        t, k, p = self.temperature, self.top_k, self.top_p
        if not _real(t):
            raise ValueError(f"temperature={t!r} must be a number (> 0 when do_sample=True).")
        object.__setattr__(self, "temperature", float(t))
        if self.do_sample and not t > 0:
            raise ValueError(f"temperature={float(t)} must be > 0 when do_sample=True (use do_sample=False).")
        whole = isinstance(k, numbers.Integral) or hasattr(k, "__index__")  # numpy / 0-d torch ints too
        if k is not None and (isinstance(k, bool) or not whole or k < 0):
            raise ValueError(f"top_k={k!r} must be an int >= 0 (0 or None disables it).")
        if p is not None and (not _real(p) or not 0.0 <= p <= 1.0):  # HF's range: 0 keeps the top token alone
            raise ValueError(f"top_p={p!r} must be in [0, 1] (1.0 or None disables it).")


def _real(value) -> bool:
    """A number (numpy and 0-d torch numbers too), not a bool or a string."""
    number = isinstance(value, numbers.Real) or hasattr(value, "__float__")
    return number and not isinstance(value, bool | str | bytes)


@dataclass(frozen=True)
class VerifyResult:
    """Outcome of verifying one tree.

    Args:
        path (tuple[int, ...]): accepted node indices, increasing, starting with the root 0.
        tokens (tuple[int, ...]): newly committed tokens: the accepted drafts (path[1:]) then the bonus.
    """

    path: tuple[int, ...]
    tokens: tuple[int, ...]

    @property
    def num_accepted(self) -> int:
        """Accepted draft tokens (root excluded)."""
        return len(self.path) - 1

    @property
    def bonus_token(self) -> int:
        return self.tokens[-1]


@dataclass
class SpecStats:
    """Statistics of one ``generate`` call.

    ``tau`` is committed tokens per target verify forward, bonus included (tau = 1 for plain decoding).
    ``accept_lengths[r]`` is the length of round r's accepted path, bonus included (so ``tau`` is its mean);
    ``accept_hist[a]`` counts rounds that accepted ``a`` drafted tokens. ``depth_accept[d]`` is the share of
    rounds that reached depth d+1. ``phase_ms`` holds wall time per phase (ms):
    prefill, draft (tree build included), build (the tree build alone, for drafters that build from
    distributions), verify (target forward), accept (the walk), commit; the whole round runs as one unit (one
    captured graph where graphs are used), timed as ``round``. ``path`` says how the round ran: ``"graph"``
    (replayed from a CUDA graph) or ``"eager"`` (called);
    ``captures`` counts the graph keys this call added (rounds and captured prefills built for a new drafter, tree,
    sampling, span bucket or batch bucket: each one CUDA graph where graphs are used, one compiled shape with
    ``compile``, a new eager round otherwise; 0 when every one was reused);
    ``capture_ms`` is the time this call spent warming up and capturing graphs (0 when they were reused) and
    ``compile_ms`` the first warm-up runs, where ``torch.compile`` compiles (with ``compile=True``).
    ``compile_fallbacks`` counts the compiled rounds this call used (one per drafter, tree, sampling and span
    bucket) that run uncompiled because compiling them failed (docs/api.md); 0 when every one compiled.
    ``capture_fallbacks`` counts the rounds this call used that run uncaptured because capturing them in a CUDA graph
    failed (an op the graph cannot hold, e.g. one that reads a device value on the host: a warning names it); 0 when
    every one was captured or graphs were not used.
    ``reused_tokens``: leading prompt tokens whose state the previous call left in storage (a prompt that continues
    that call's sequence on the same model, one sequence): they were not prefilled again.
    ``uncaptured`` says why the round ran neither captured nor compiled although it could have (a ``logits_processor``
    that reads the tree on the host); empty otherwise.

    For a batch, ``rows`` holds each sequence's own stats (its ``tau``, ``accept_lengths``, ``new_tokens``); the
    batch's ``accept_hist``, ``accept_lengths``, ``rounds`` and ``tau`` count every (sequence, round) pair in which
    the sequence was still decoding, ``new_tokens`` and ``tree_nodes`` are sums, and ``target_forwards`` counts the
    batch's forwards (prefill included). For one sequence ``rows`` is empty. ``budgets`` lists the budget each round
    ran with under ``DDTree(budget="auto")`` (empty otherwise), and ``budget_costs`` the round cost in ms its
    controller holds for each option at the end of the call (budget -> ms, 0 = plain decoding; the median of that
    option's last measured rounds, measured across calls of the same target and batch bucket; empty otherwise).
    ``budget_ms`` holds each of those rounds' time in ms as its controller was told it (its device time on CUDA, its
    ``round_wall_ms`` with ``clock="wall"``; None for a round not timed: the launch captured its graph or replayed
    it for the first time), in round order.
    ``round_wall_ms`` holds every round's wall time in ms, in round order: the host time from the read of the round
    before it to its own read, with each launch's host time moved to the round it launched (its own launch in,
    the launch ahead out: on the CPU a launch runs its round), which holds what the host did for it; None for the
    call's first round (the prefill ran before it) and wherever its launch or the launch ahead captured or first
    replayed a graph. ``round_wait_ms`` holds, per round, the host time its read waited for the device (and read
    the tokens): where it is near zero the device waited for the host instead; ``round_launch_ms`` the host time of
    each round's own launch.
    """

    rounds: int = 0
    new_tokens: int = 0
    accept_hist: list[int] = field(default_factory=list)
    accept_lengths: list[int] = field(default_factory=list)
    phase_ms: dict[str, float] = field(default_factory=dict)
    target_forwards: int = 0
    draft_forwards: int = 0
    tree_nodes: int = 0
    path: str = "eager"
    captures: int = 0
    capture_ms: float = 0.0
    compile_ms: float = 0.0
    compile_fallbacks: int = 0
    capture_fallbacks: int = 0
    uncaptured: str = ""
    reused_tokens: int = 0
    rows: list[SpecStats] = field(default_factory=list)
    budgets: list[int] = field(default_factory=list)
    budget_costs: dict[int, float] = field(default_factory=dict)
    budget_ms: list[float | None] = field(default_factory=list)
    round_wall_ms: list[float | None] = field(default_factory=list)
    round_wait_ms: list[float] = field(default_factory=list)
    round_launch_ms: list[float] = field(default_factory=list)

    @property
    def tau(self) -> float:
        committed = sum((a + 1) * n for a, n in enumerate(self.accept_hist))
        return committed / max(self.rounds, 1)

    @property
    def mean_accepted(self) -> float:
        return self.tau - 1.0

    @property
    def depth_accept(self) -> list[float]:
        rounds = max(self.rounds, 1)
        return [sum(self.accept_hist[d + 1 :]) / rounds for d in range(len(self.accept_hist) - 1)]

    def record(self, num_accepted: int) -> None:
        """Count one verify round that accepted ``num_accepted`` drafted tokens (its bonus token included later)."""
        if len(self.accept_hist) <= num_accepted:
            self.accept_hist.extend([0] * (num_accepted + 1 - len(self.accept_hist)))
        self.accept_hist[num_accepted] += 1
        self.accept_lengths.append(num_accepted + 1)
        self.rounds += 1

    def as_dict(self) -> dict:
        return {
            "rounds": self.rounds,
            "new_tokens": self.new_tokens,
            "tau": self.tau,
            "accept_hist": list(self.accept_hist),
            "accept_lengths": list(self.accept_lengths),
            "depth_accept": self.depth_accept,
            "phase_ms": dict(self.phase_ms),
            "target_forwards": self.target_forwards,
            "draft_forwards": self.draft_forwards,
            "tree_nodes": self.tree_nodes,
            "path": self.path,
            "captures": self.captures,
            "capture_ms": self.capture_ms,
            "compile_ms": self.compile_ms,
            "compile_fallbacks": self.compile_fallbacks,
            "capture_fallbacks": self.capture_fallbacks,
            "rows": [row.as_dict() for row in self.rows],
            "budgets": list(self.budgets),
            "budget_ms": list(self.budget_ms),
            "round_wall_ms": list(self.round_wall_ms),
            "round_wait_ms": list(self.round_wait_ms),
            "round_launch_ms": list(self.round_launch_ms),
        }


@dataclass(frozen=True)
class Continuation:
    """What a single-sequence ``generate`` call left in the target's storage, returned as ``past_key_values``:
    passing it to the next call (with the whole sequence as ``input_ids``, as HF's continuation takes it) prefills
    only the tokens the storage does not hold (all but at most the last of ``tokens``). The storage is the
    engine's own (``docs/api.md``, multi-turn): a later call on the same model and batch size overwrites it, and
    then the continuation prefills from scratch (same tokens).

    Args:
        tokens (torch.Tensor): ``[n]`` the sequence of the call (prompt + output), on the target's device.
    """

    tokens: torch.Tensor

    @property
    def length(self) -> int:
        return int(self.tokens.shape[0])

    def get_seq_length(self) -> int:
        """HF ``Cache`` spelling of :attr:`length`."""
        return self.length


@dataclass
class GenerateOutput:
    """``sequences`` ``[B, T_prompt + n_new]`` (prompts included, as HF returns) and ``stats``; with
    ``output_scores`` / ``output_logits``, ``scores`` / ``logits`` as HF returns them: a tuple with one ``[B, V]``
    fp32 tensor per generated position (processed scores / raw target logits), else None. ``past_key_values``
    (one sequence): a :class:`Continuation` to pass to the next call as HF's continuation, else None."""

    sequences: torch.Tensor
    stats: SpecStats
    scores: tuple[torch.Tensor, ...] | None = None
    logits: tuple[torch.Tensor, ...] | None = None
    past_key_values: object | None = None
