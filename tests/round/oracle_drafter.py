"""A test drafter that knows the target's greedy continuation and plants mistakes on a schedule.

The continuation comes from HF ``model.generate(do_sample=False)`` (the oracle), computed before the run. Each
round the drafter reads the true next ``D`` tokens after its root (the root sits at position ``prefix``, so the
true token at depth d is ``continuation[prefix + d]``) and proposes them, except that round ``r`` plants a
mistake chosen by ``schedule[r % len(schedule)] = (kind, depth)``:

- ``HARD``: at ``depth`` the true token is out of reach (logq: a decoy first, the true token last, beyond any
  tree's top-k; paths: a decoy in its place), so exactly ``depth - 1`` drafts can be accepted;
- ``SOFT``: at ``depth`` a decoy is the first choice and the true token the second (logq) or the second path
  (paths): a chain accepts ``depth - 1`` drafts, a tree that keeps siblings accepts all ``D`` through the sibling;
- ``SHORT`` (paths only; logq treats it as ``HARD``): the drafted path stops after ``depth - 1`` true tokens;
- depth ``D + 1`` plants nothing: all ``D`` drafts are accepted.

So a run of a full schedule accepts every length ``0 .. D``. The state logs every round (kind, depth, accepted
nodes) in a tensor (``OracleState.rounds_log``), all as tensor ops inside the round, so a test can check the
accept length of each round against what the schedule implies (:func:`expected_accept`).
"""

from __future__ import annotations

import torch

from specdec.trees import Chain
from specdec.types import Accept, Proposal

__all__ = [
    "HARD",
    "NONE",
    "SHORT",
    "SOFT",
    "OracleDrafter",
    "OracleState",
    "expected_accept",
    "full_schedule",
]

NONE, HARD, SOFT, SHORT = 0, 1, 2, 3
_LOG_ROUNDS = 512

# Per-depth weights of the logq proposal before normalisation: the true token, a decoy and a runner-up, every other
# token _REST (tied), and _OUT for a true token put out of reach.
_TRUE, _DECOY, _RUNNER_UP, _REST, _OUT = 0.9, 0.6, 0.3, 1e-9, 1e-13


def full_schedule(depth: int, kinds=(HARD, SOFT)) -> list[tuple[int, int]]:
    """Every kind at every depth ``1 .. D`` (interleaved: kind by kind at each depth), then a round without a
    mistake: a run of ``len`` rounds accepts every length ``0 .. D``."""
    plan = [(kind, d) for d in range(1, depth + 1) for kind in kinds]
    return [*plan, (NONE, depth + 1)]


def expected_accept(kind: int, plant: int, depth: int, *, siblings: bool) -> int:
    """Drafts a round accepts: ``depth`` if nothing was planted or (``siblings``) the tree kept the true token
    next to a SOFT decoy, else ``plant - 1``."""
    if kind == NONE or plant > depth or (kind == SOFT and siblings):
        return depth
    return plant - 1


class OracleDrafter:
    """Proposes the target's greedy continuation with planted mistakes (see the module docstring).

    Args:
        continuation (torch.Tensor): ``[T]`` int64, prompt followed by the target's greedy tokens (HF); it must
            reach ``D`` tokens past the last root of the run (positions past its end repeat its last token).
        depth (int): ``D``, the deepest draft (capped by the tree policy's ``max_depth``).
        schedule (list[tuple[int, int]] | None): ``(kind, depth)`` per round, cycled; default
            :func:`full_schedule`.
        paths (bool): propose drafted paths (``Proposal.paths``) instead of per-depth log-probabilities.
        vocab (int): the target's vocabulary.
    """

    target_layer_ids = None

    def __init__(self, continuation: torch.Tensor, *, depth: int = 4, schedule=None, paths: bool = False,
                 vocab: int = 128) -> None:  # fmt: skip
        self.continuation = continuation.view(-1).long()
        self.depth = depth
        self.schedule = list(schedule) if schedule is not None else full_schedule(depth)
        self.paths = paths
        self.vocab = vocab
        self.num_forwards = 0
        self.default_tree = Chain(k=depth)
        self.state: OracleState | None = None

    @property
    def provides(self) -> tuple[str, ...]:
        return ("paths",) if self.paths else ("logq",)

    def validate(self, target, tree) -> None:
        if target.vocab_size != self.vocab:
            raise ValueError(f"OracleDrafter: vocabulary {self.vocab} != the target's {target.vocab_size}")

    def reset(self) -> None:
        return None

    def draft_depth(self, tree) -> int:
        return min(self.depth, tree.max_depth)

    def window(self, tree) -> int:
        return 1

    def forwards_per_round(self, tree) -> int:
        return 0

    def attach(self, target, capacity: int, batch: int = 1) -> OracleState:
        assert batch == 1, "the oracle drafter plans the rounds of one sequence"
        self.state = OracleState(self, target.device)
        return self.state


class OracleState:
    """The drafter's round code: the continuation, the schedule and a log of the rounds, as device tensors."""

    def __init__(self, drafter: OracleDrafter, device) -> None:
        self.drafter = drafter
        self.continuation = drafter.continuation.to(device)
        self.plan = torch.tensor(drafter.schedule, dtype=torch.long, device=device).view(-1, 2)  # [R, 2]
        self.paths = drafter.paths
        self.vocab = drafter.vocab
        self.round = torch.zeros((), dtype=torch.long, device=device)
        # per round: kind, planted depth, accepted nodes (root included), prefix
        self.log = torch.full((_LOG_ROUNDS, 4), -1, dtype=torch.long, device=device)

    def refresh(self) -> None:
        return None

    def prefill(self, input_ids: torch.Tensor, hidden: torch.Tensor | None) -> None:
        self.round.zero_()
        self.log.fill_(-1)

    @property
    def rounds_log(self) -> list[tuple[int, int, int]]:
        """``(kind, planted depth, accepted drafts)`` of every round run since the prefill (host read)."""
        rows = self.log[: int(self.round)].tolist()
        return [(kind, plant, num_path - 1) for kind, plant, num_path, _ in rows]

    def _truth(self, prefix: torch.Tensor, depth: int) -> torch.Tensor:
        """``[depth]`` true tokens after the root at ``prefix``."""
        steps = prefix + 1 + torch.arange(depth, device=prefix.device)
        return self.continuation[steps.clamp(max=self.continuation.numel() - 1)]

    def _plant(self) -> tuple[torch.Tensor, torch.Tensor]:
        row = self.plan[self.round % self.plan.shape[0]]
        return row[0], row[1]

    def propose(self, root: torch.Tensor, prefix: torch.Tensor, depth: int, span: int) -> Proposal:
        kind, plant = self._plant()
        rows = [self._row(p, depth, kind, plant) for p in prefix]
        if self.paths:
            return Proposal(paths=torch.stack([r[0] for r in rows]), path_lengths=torch.stack([r[1] for r in rows]))
        return Proposal(logq=torch.stack(rows))

    def _row(self, prefix: torch.Tensor, depth: int, kind: torch.Tensor, plant: torch.Tensor):
        truth = self._truth(prefix, depth)  # [D]
        d = torch.arange(1, depth + 1, device=truth.device)
        at = d == plant  # [D]: the planted depth (none when plant > D)
        decoy = (truth + 1) % self.vocab
        runner = (truth + 2) % self.vocab
        if self.paths:
            # path 0: the truth with a decoy at the plant (HARD, SOFT) or cut before it (SHORT); path 1: the truth
            # (SOFT only; empty otherwise); path 2: the decoy path again (a duplicate the trie must merge).
            first = torch.where(at & (kind != SHORT), decoy, truth)
            full = torch.full((), depth, device=truth.device)
            length0 = torch.where((kind == SHORT) & (plant <= depth), plant - 1, full)
            length1 = torch.where(kind == SOFT, full, 0)
            paths = torch.stack([first, truth, first])
            return paths, torch.stack([length0, length1, length0])
        # logq: the truth first, the decoy second, one runner-up; at the plant the decoy leads, the truth is second
        # (SOFT) or last (HARD, SHORT)
        logq = torch.full((depth, self.vocab), _REST, device=truth.device).log()
        soft, hard = at & (kind == SOFT), at & (kind != SOFT)
        p_true = torch.where(soft, _RUNNER_UP, torch.where(hard, _OUT, _TRUE))
        p_decoy = torch.where(at, _DECOY, 0.05)
        p_runner = torch.where(at, 0.01, 0.02)
        rows = torch.arange(depth, device=truth.device)
        logq[rows, runner] = p_runner.log()
        logq[rows, decoy] = p_decoy.log()
        logq[rows, truth] = p_true.log()
        return torch.log_softmax(logq, dim=-1)

    def commit(self, accept: Accept, hidden: torch.Tensor | None, prefix: torch.Tensor) -> None:
        kind, plant = self._plant()
        entry = torch.stack([kind, plant, accept.num_path[0], prefix[0]])
        self.log.index_copy_(0, self.round.clamp(max=_LOG_ROUNDS - 1).view(1), entry[None])
        self.round.add_(1)
