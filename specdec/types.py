"""Shared frozen dataclasses of specdec: trees, tree specs, sampling, verify results, stats, outputs.

Everything here is plain data; the algorithms live in ``specdec.trees``, ``specdec.verify`` and
``specdec.generate``. Notation and conventions: ``docs/trees.md``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

__all__ = [
    "Chain",
    "DDTree",
    "DecodeContext",
    "DraftTree",
    "GenerateOutput",
    "SamplingParams",
    "SpecStats",
    "TreeSpec",
    "VerifyResult",
]


@dataclass(frozen=True)
class Chain:
    """A chain of ``k`` draft tokens (the classic linear speculation): ``Chain(4)`` or ``Chain(k=4)``.

    Args:
        k (int): number of drafted tokens per round (non-root nodes), >= 1.
    """

    k: int = 4

    def __post_init__(self) -> None:
        if isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 1:
            raise ValueError(f"Chain(k={self.k!r}): k must be an int >= 1 (number of drafted tokens per round).")

    @property
    def budget(self) -> int:
        """Number of non-root nodes the tree may hold."""
        return self.k

    @property
    def topk(self) -> int:
        return 1


@dataclass(frozen=True)
class DDTree:
    """Best-first draft tree (DDTree): the ``budget`` most likely root-to-node prefixes: ``DDTree(15)``.

    Args:
        budget (int): number of non-root nodes (verify length = budget + 1), >= 1.
        topk (int | None): candidates per depth; ``None`` means ``budget`` (the reference behaviour).
    """

    budget: int = 15
    topk: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.budget, bool) or not isinstance(self.budget, int) or self.budget < 1:
            raise ValueError(f"DDTree(budget={self.budget!r}): budget must be an int >= 1 (non-root nodes).")
        if self.topk is not None and (isinstance(self.topk, bool) or not isinstance(self.topk, int) or self.topk < 1):
            raise ValueError(f"DDTree(topk={self.topk!r}): topk must be an int >= 1, or None for topk = budget.")

    @property
    def effective_topk(self) -> int:
        return self.budget if self.topk is None else min(self.topk, self.budget)


TreeSpec = Chain | DDTree


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
    """Target sampling parameters, processed exactly as HF ``generate`` does (temperature, top-k, top-p).

    Args:
        do_sample (bool): False = greedy. Default False.
        temperature (float): > 0. Default 1.0.
        top_k (int | None): keep the k most likely tokens; None or 0 disables. Default None.
        top_p (float | None): nucleus mass in (0, 1]; None or 1.0 disables. Default None.
    """

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self) -> None:
        if self.do_sample and not self.temperature > 0:
            raise ValueError(f"temperature={self.temperature} must be > 0 when do_sample=True (use do_sample=False).")
        if self.top_k is not None and self.top_k < 0:
            raise ValueError(f"top_k={self.top_k} must be >= 0 (0 or None disables it).")
        if self.top_p is not None and not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p={self.top_p} must be in (0, 1] (1.0 or None disables it).")


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
class DecodeContext:
    """What the loop tells a drafter each round (owned by the loop; drafters only read it).

    Args:
        input_ids (torch.Tensor): ``[1, T]`` committed tokens; the last one is the root of the next tree.
        target_hidden (torch.Tensor | None): ``[1, R, L*H]`` concatenated taps of the target layers the drafter
            asked for, for the R committed tokens the target processed in its last forward (the prompt after
            prefill; the accepted path after a round). Their positions are ``T-1-R .. T-2``.
        generator (torch.Generator | None): the run's random generator.
        timer: the loop's ``specdec.timing.PhaseTimer`` (drafters time their tree build with ``ctx.timer("build")``);
            None outside the loop.
    """

    input_ids: torch.Tensor
    target_hidden: torch.Tensor | None = None
    generator: torch.Generator | None = None
    timer: object | None = None

    @property
    def length(self) -> int:
        return self.input_ids.shape[-1]


@dataclass
class SpecStats:
    """Statistics of one ``generate`` call.

    ``tau`` is committed tokens per target verify forward, bonus included (tau = 1 for plain decoding).
    ``accept_lengths[r]`` is the length of round r's accepted path, bonus included (so ``tau`` is its mean);
    ``accept_hist[a]`` counts rounds that accepted ``a`` drafted tokens. ``depth_accept[d]`` is the share of
    rounds that reached depth d+1. ``phase_ms`` holds wall time per phase (ms):
    prefill, draft (tree build included), build (the tree build alone, for drafters that build from
    distributions), verify (target forward), accept (the walk), commit; on the fast path the whole round is one
    captured graph, timed as ``round``. ``path`` says which engine ran (``"fast"`` or ``"eager"``);
    ``capture_ms`` is the time this call spent warming up and capturing graphs (0 when they were reused) and
    ``compile_ms`` the first warm-up runs, where ``torch.compile`` compiles (with ``compile=True``).
    ``compile_fallbacks`` counts the compiled rounds this call used (one per drafter, tree, sampling and span
    bucket) that run uncompiled because compiling them failed (docs/api.md); 0 when every one compiled.
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
    capture_ms: float = 0.0
    compile_ms: float = 0.0
    compile_fallbacks: int = 0

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
            "capture_ms": self.capture_ms,
            "compile_ms": self.compile_ms,
            "compile_fallbacks": self.compile_fallbacks,
        }


@dataclass
class GenerateOutput:
    """``sequences`` ``[1, T_prompt + n_new]`` (prompt included, as HF returns) and ``stats``."""

    sequences: torch.Tensor
    stats: SpecStats
