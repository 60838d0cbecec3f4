"""Goodput budget policy: pick each round's DDTree node budget among a few captured buckets.

The parts (``docs/trees.md#budget-chosen-by-goodput``), each with its own clean interface so that a decoding loop
can wire them in:

* :func:`ddtree_scores` / :func:`expected_accepts`: on the device, tensor ops only (no host read, shapes fixed by
  Python ints, so they can sit inside a captured round). The best-first DDTree node scores ``[B, budget]`` (the
  summed per-depth ``log q`` of each node's path, best first, ``-inf`` padding) and, per candidate budget ``n``,
  the drafter's expected number of accepted drafted tokens of the tree cut to its first ``n`` nodes,
  ``E(n) = sum_{i < n} exp(score_i)``.
* :class:`Calibration` (host): observed accepted tokens against that prediction, as exponentially decayed sums
  per budget shrunk towards a shared ratio, so predictions are scaled to reality.
* :class:`CostModel` (host): the round's cost in ms as a function of (batch rows ``B``, verified slots ``n``),
  from warm-up measurements (:func:`measure`): the measurements themselves on the measured grid (piecewise-linear
  in between), a least-squares ``a + b*B + c*B*n (+ d*T)`` outside it (``T`` = 1 for a tree round: the drafter).
* :func:`choose` (host): the budget that maximises expected committed tokens per ms, never below plain decoding.

Conventions: ``sizes`` are DDTree **budgets** (non-root nodes, ``DDTree(budget)``), strictly increasing, >= 1;
plain decoding (AR) is budget 0 and is always a candidate of :func:`choose` without being listed. The cost model
counts **slots** ``n = budget + 1`` (the root included), so AR costs ``cost(B, 1)``.
"""

from __future__ import annotations

import bisect
import logging
import math
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import nullcontext

import torch

from specdec.kernels.ddtree_build import best_first, topk_rows, triton_fits

__all__ = [
    "CLOCKS",
    "DETACHED",
    "AutoBudget",
    "Calibration",
    "CostModel",
    "budget_for",
    "check_clock",
    "check_sizes",
    "choose",
    "ddtree_scores",
    "expected_accepts",
    "goodputs",
    "measure",
]

logger = logging.getLogger(__name__)

_MIN_COST_MS = 1e-6  # floor of a predicted cost (an extrapolated linear fit may cross zero)
DETACHED = -1  # AutoBudget's plain decoding that leaves the drafter behind for the rest of the call


# -- sizes ------------------------------------------------------------------------------------------------------
def check_sizes(sizes: Sequence[int]) -> tuple[int, ...]:
    """The candidate budgets as a tuple: a non-empty, strictly increasing sequence of Python ints >= 1.

    Raises:
        ValueError: empty, not ints (bools refused), below 1, or not strictly increasing.
    """
    if isinstance(sizes, int | str | bytes) or not isinstance(sizes, Sequence | torch.Size):
        raise ValueError(f"sizes={sizes!r}: pass a sequence of budgets, e.g. (15, 31, 63).")
    sizes = tuple(sizes)
    if not sizes:
        raise ValueError("sizes is empty: pass at least one DDTree budget, e.g. (15, 31, 63).")
    for s in sizes:
        if isinstance(s, bool) or not isinstance(s, int) or s < 1:
            raise ValueError(f"sizes={sizes!r}: every size must be a Python int >= 1 (non-root nodes), got {s!r}.")
    for a, b in zip(sizes, sizes[1:], strict=False):
        if b <= a:
            raise ValueError(f"sizes={sizes!r} must be strictly increasing ({a} then {b}).")
    return sizes


CLOCKS = ("device", "wall")


def check_clock(clock: object) -> str:
    """``clock`` if it is one of :data:`CLOCKS` (what an adaptive budget times a round by), else ``ValueError``."""
    if not isinstance(clock, str) or clock not in CLOCKS:
        raise ValueError(
            f"clock={clock!r}: pass 'device' (the round's device time) or 'wall' (the host time between two round "
            f"reads)."
        )
    return clock


def budget_for(choice: int | None, sizes: Sequence[int]) -> int:
    """The budget of a :func:`choose` result: ``sizes[choice]``, or 0 (plain decoding) for ``None``."""
    sizes = check_sizes(sizes)
    return 0 if choice is None else sizes[choice]


def _int(name: str, value: object, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name}={value!r}: pass a Python int >= {low}.")
    return value


# -- 1. expected accepted tokens (device) ------------------------------------------------------------------------
def ddtree_scores(logq: torch.Tensor, *, budget: int, topk: int | None = None) -> torch.Tensor:
    """Best-first DDTree node scores: the ``budget`` largest path log-probabilities, sorted descending.

    The score of a node is ``sum_j log q_j(t_j)`` over its path (fp32 values summed in float64, as
    :func:`specdec.trees.build.ddtree_device` sums them), and the DDTree of budget ``n`` holds exactly the ``n``
    best of them, so column ``i`` is the score of the tree's ``i``-th node in pop order (equal scores may pick
    different nodes, never different values). ``ddtree_device`` does not return its scores; this recomputes them
    level by level (per depth, the ``budget`` best children of the kept nodes above: every child of equally
    scored parents has the same value, so the kept values are exact). Tensor ops only, shapes from Python ints:
    capture-safe. ``logq`` is not validated on the host (pass log-probabilities, no NaN or +inf). On CUDA (and
    under Triton's interpreter) it is two launches instead: the DDTree kernels' per-depth top-k and the heap's
    ``budget`` pops, which also write each popped prefix's score (the same float64 sums).

    The scores for the largest budget serve every smaller one: the policy's ``DDTree(n, topk)`` keeps
    ``min(topk, n)`` candidates per depth (``topk=None``: ``n``), and a node among the ``n`` best never has a rank
    ``>= n`` (its better-ranked siblings all come before it), so that cap removes none of them and the first
    ``n`` columns are ``DDTree(n, topk)``'s nodes. Pass the policy's ``topk``.

    Args:
        logq (torch.Tensor): ``[B, D, V]`` (or ``[D, V]``) per-depth log-probabilities, row ``d - 1`` = depth d.
        budget (int): number of scores (non-root nodes), >= 1: the largest candidate budget.
        topk (int | None): candidates per depth as in ``DDTree(budget, topk)``; None = ``budget``.

    Returns:
        torch.Tensor: ``[B, budget]`` float64 (``[budget]`` for a ``[D, V]`` input), descending, ``-inf`` past the
        reachable nodes (``k + k**2 + ... + k**D``).
    """
    if not isinstance(logq, torch.Tensor) or logq.dim() not in (2, 3):
        shape = tuple(logq.shape) if isinstance(logq, torch.Tensor) else type(logq).__name__
        raise ValueError(f"logq must be a [B, D, V] (or [D, V]) tensor, got {shape}.")
    if not logq.is_floating_point():
        raise ValueError(f"logq has dtype {logq.dtype}: pass float log-probabilities.")
    if logq.shape[-2] < 1 or logq.shape[-1] < 1:
        raise ValueError(f"logq has shape {tuple(logq.shape)}: it needs at least one depth and one token.")
    _int("budget", budget, 1)
    if topk is not None:
        _int("topk", topk, 1)
    single = logq.dim() == 2
    q = logq[None] if single else logq
    batch, depth_limit, vocab = q.shape
    k = min(budget if topk is None else topk, budget, vocab)
    reachable = sum(k**d for d in range(1, depth_limit + 1))
    if reachable >= budget and triton_fits(q[0], k):  # two launches: the per-depth top-k, the heap's pops
        vals, ids = topk_rows(q.flatten(0, 1).float(), k)
        scores = best_first(vals.view(batch, depth_limit, k), ids.view(batch, depth_limit, k), budget, scores=True)[3]
        return scores[0] if single else scores
    vals = q.float().topk(k, dim=-1).values.double()  # [B, D, k], descending (fp32 values, as the policy ranks)
    level = vals.new_zeros(batch, 1)  # the root's score
    levels = []
    for d in range(depth_limit):
        level = (level.unsqueeze(-1) + vals[:, d, None, :]).flatten(1)  # [B, kept * k]
        if level.shape[1] > budget:
            level = level.topk(budget, dim=1).values
        levels.append(level)
    scores = torch.cat(levels, dim=1)
    if scores.shape[1] >= budget:
        scores = scores.topk(budget, dim=1).values
    else:  # fewer reachable nodes than the budget: padding
        scores = scores.sort(dim=1, descending=True).values
        pad = scores.new_full((batch, budget - scores.shape[1]), float("-inf"))
        scores = torch.cat([scores, pad], dim=1)
    return scores[0] if single else scores


def expected_accepts(scores: torch.Tensor, sizes: Sequence[int]) -> torch.Tensor:
    """Expected accepted drafted tokens per candidate budget, ``E(n) = sum_{i < n} exp(score_i)``.

    Node ``i``'s path is accepted exactly when the target's continuation starts with it; for a drafter whose
    per-depth marginals are the target's (calibrated), that has probability ``exp(score_i)``, and the greedy walk
    accepts as many drafted tokens as the tree holds nodes on that continuation, so the expectation is the sum
    over nodes. Tensor ops only (one ``exp``, one ``cumsum``, slices at Python ints): capture-safe.

    Args:
        scores (torch.Tensor): ``[B, S]`` (or ``[S]``) node scores in best-first order, ``-inf`` padding, e.g.
            :func:`ddtree_scores` with ``budget = max(sizes)``.
        sizes (Sequence[int]): candidate budgets, strictly increasing, each <= ``S``.

    Returns:
        torch.Tensor: ``[B, len(sizes)]`` (or ``[len(sizes)]``) in the dtype of ``scores`` (not the bonus token:
        add 1 for the committed tokens per round).
    """
    sizes = check_sizes(sizes)
    if not isinstance(scores, torch.Tensor) or scores.dim() not in (1, 2) or not scores.is_floating_point():
        shape = (tuple(scores.shape), scores.dtype) if isinstance(scores, torch.Tensor) else type(scores).__name__
        raise ValueError(f"scores must be a float [B, S] (or [S]) tensor of best-first node scores, got {shape}.")
    if sizes[-1] > scores.shape[-1]:
        raise ValueError(
            f"sizes go up to {sizes[-1]} nodes but scores has {scores.shape[-1]} columns: compute the scores for "
            f"budget = max(sizes) (ddtree_scores(logq, budget={sizes[-1]}))."
        )
    cum = scores.exp().cumsum(dim=-1)
    return torch.stack([cum[..., n - 1] for n in sizes], dim=-1)


# -- 2. calibration (host) ---------------------------------------------------------------------------------------
class Calibration:
    """Scales the drafter's predicted accepted tokens to the accepted tokens observed, per candidate budget.

    Model: observed ≈ ``scale[s] * predicted`` for budget ``sizes[s]``. Per budget it keeps exponentially decayed
    sums of observed (``O_s``) and predicted (``P_s``) accepted drafted tokens, and one such pair over all budgets
    (``O``, ``P``); every update multiplies all sums by ``decay`` first, then adds to the budget used and to the
    shared pair. The scales are ratios of sums shrunk towards a prior:

        shared    r   = (O   + strength * prior) / (P   + strength)
        budget s  r_s = (O_s + strength * r)     / (P_s + strength)

    Why: a ratio of sums weighs rounds by their predicted tokens, so a round predicting almost nothing cannot blow
    the estimate up (an average of per-round ratios would); per budget, because a drafter's overconfidence grows
    in the low-probability nodes that only larger trees hold; shrunk to the shared ratio because a budget the
    chooser rarely picks has few observations of its own (with none, ``r_s = r``), and its stale sums decay back
    towards ``r`` while other budgets run. ``strength`` is the prior's weight in predicted tokens; ``decay``
    sets the memory (about ``1 / (1 - decay)`` updates).

    Args:
        sizes (Sequence[int]): the candidate budgets (as for :func:`choose`).
        decay (float): in ``(0, 1]``; 1 = no forgetting.
        prior (float): scale before any observation, > 0 (1 = trust the drafter).
        strength (float): weight of the prior (and of the shared ratio in a budget's scale), >= 0.
    """

    def __init__(self, sizes: Sequence[int], *, decay: float = 0.95, prior: float = 1.0, strength: float = 4.0):
        self.sizes = check_sizes(sizes)
        if not _finite(decay) or not 0.0 < decay <= 1.0:
            raise ValueError(f"decay={decay!r}: pass a float in (0, 1].")
        if not _finite(prior) or prior <= 0.0:
            raise ValueError(f"prior={prior!r}: pass a finite float > 0.")
        if not _finite(strength) or strength < 0.0:
            raise ValueError(f"strength={strength!r}: pass a finite float >= 0.")
        self.decay, self.prior, self.strength = float(decay), float(prior), float(strength)
        self.reset()

    def reset(self) -> None:
        """Forget every observation."""
        self.observed = [0.0] * len(self.sizes)
        self.predicted = [0.0] * len(self.sizes)
        self.total_observed = self.total_predicted = 0.0
        self.updates = 0

    def update(self, index: int, predicted: float | Sequence[float], observed: float | Sequence[float]) -> None:
        """Record one round run at budget ``sizes[index]``.

        Args:
            index (int): the budget used (index into ``sizes``); rounds of plain decoding are not recorded.
            predicted: the uncalibrated :func:`expected_accepts` at that budget, one float or one per batch row.
            observed: accepted drafted tokens (``num_path - 1``, the bonus excluded), matching ``predicted``.
        """
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(self.sizes):
            raise ValueError(f"index={index!r}: pass the index of the budget used, in [0, {len(self.sizes)}).")
        pred, obs = _floats("predicted", predicted), _floats("observed", observed)
        if len(pred) != len(obs):
            raise ValueError(f"predicted has {len(pred)} rows, observed {len(obs)}: pass one value per row.")
        d = self.decay
        self.observed = [o * d for o in self.observed]
        self.predicted = [p * d for p in self.predicted]
        self.observed[index] += sum(obs)
        self.predicted[index] += sum(pred)
        self.total_observed = self.total_observed * d + sum(obs)
        self.total_predicted = self.total_predicted * d + sum(pred)
        self.updates += 1

    def shared_scale(self) -> float:
        """The ratio over all budgets, ``r`` (the prior when nothing has been observed)."""
        den = self.total_predicted + self.strength
        return self.prior if den <= 0.0 else (self.total_observed + self.strength * self.prior) / den

    def scale(self, index: int) -> float:
        """The scale of budget ``sizes[index]``, ``r_s`` (the shared ratio when that budget has no observations)."""
        return self._scale(index, self.shared_scale())

    def scales(self) -> list[float]:
        """``[scale(0), ..., scale(K - 1)]`` (the shared ratio computed once)."""
        shared = self.shared_scale()
        return [self._scale(i, shared) for i in range(len(self.sizes))]

    def _scale(self, index: int, shared: float) -> float:
        den = self.predicted[index] + self.strength
        return shared if den <= 0.0 else (self.observed[index] + self.strength * shared) / den

    def apply(self, expected) -> list[list[float]]:
        """Calibrated expectations: ``expected [B, K]`` (host floats) times each budget's scale."""
        rows = _matrix(expected, len(self.sizes))
        scales = self.scales()
        return [[e * s for e, s in zip(row, scales, strict=True)] for row in rows]

    def __repr__(self) -> str:
        scales = ", ".join(f"{n}: {s:.3f}" for n, s in zip(self.sizes, self.scales(), strict=True))
        return f"Calibration({{{scales}}}, updates={self.updates}, decay={self.decay})"


# -- 3. cost model (host) ----------------------------------------------------------------------------------------
class CostModel:
    """The round's cost in ms as a function of (batch rows ``B``, verified slots ``n = budget + 1``).

    Fitted from warm-up measurements ``[(B, n, ms), ...]`` (repeats of a point are reduced to their median):

    * On the measured grid, the measurements themselves, and piecewise-linear interpolation between them (in ``n``
      along each measured ``B``, then in ``B`` between the two nearest measured ``B``). :func:`choose` asks for the
      captured buckets, which are exactly what warm-up measures, so there the model adds no error of its own, and
      a step in the real cost (a kernel's tiles or waves: 16 and 32 slots may cost the same, 64 more) is kept
      where a straight line would smear it over the buckets.
    * Outside it, a least-squares fit ``a + b*B + c*B*n`` (per-round overhead, per-row work, per-token work),
      plus ``d*T`` (``T = 1`` for a tree of more than one slot: the drafter's forward) when plain decoding and
      several tree sizes are measured;
      features the data cannot identify are dropped: a single measured ``B`` gives ``a + c*n`` (no dependence on
      ``B``: measure every batch size you run), a single ``n`` gives ``a + b*B``, a single point a constant.
      Predictions are floored at a tiny positive value.

    Args:
        samples: ``(B, n, ms)`` triples, ``B >= 1``, ``n >= 1`` ints, ``ms`` finite and > 0.
    """

    def __init__(self, samples: Iterable[tuple[int, int, float]]):
        groups: dict[tuple[int, int], list[float]] = {}
        for sample in samples:
            if not isinstance(sample, Sequence) or len(sample) != 3:
                raise ValueError(f"cost sample {sample!r}: pass (batch, nodes, ms) triples.")
            b, n, ms = sample
            _int("batch", b, 1)
            _int("nodes", n, 1)
            if not _finite(ms) or ms <= 0:
                raise ValueError(f"cost sample {sample!r}: ms must be a finite float > 0.")
            groups.setdefault((b, n), []).append(float(ms))
        if not groups:
            raise ValueError("CostModel needs at least one (batch, nodes, ms) measurement.")
        self.table = {key: statistics.median(v) for key, v in sorted(groups.items())}
        rows: dict[int, list[tuple[int, float]]] = {}
        for (b, n), ms in self.table.items():
            rows.setdefault(b, []).append((n, ms))
        self._rows = rows  # B -> [(n, ms)] sorted by n
        self._batches = sorted(rows)
        self.features, self.coefficients = self._fit_linear()
        self.rmse = math.sqrt(statistics.fmean((self.linear(b, n) - ms) ** 2 for (b, n), ms in self.table.items()))
        logger.debug("CostModel: %d points, linear %s = %s, rmse %.4f ms", len(self.table), self.features,
                     self.coefficients, self.rmse)  # fmt: skip

    @classmethod
    def fit(cls, samples: Iterable[tuple[int, int, float]]) -> CostModel:
        """Same as ``CostModel(samples)``."""
        return cls(samples)

    def _fit_linear(self) -> tuple[tuple[str, ...], tuple[float, ...]]:
        batches = {b for b, _ in self.table}
        nodes = {n for _, n in self.table}
        names = ["1"]
        if len(batches) > 1:
            names.append("B")
        if len(nodes) > 1:
            names.append("B*n" if len(batches) > 1 else "n")  # one measured B: nothing to scale by B
        if 1 in nodes and len(nodes - {1}) > 1:  # plain decoding (one slot) and several trees: a drafter term
            names.append("T")
        x = torch.tensor([_features(names, b, n) for b, n in self.table], dtype=torch.float64)
        y = torch.tensor(list(self.table.values()), dtype=torch.float64)[:, None]
        coef = torch.linalg.lstsq(x, y, driver="gelsd").solution[:, 0].tolist()  # CPU tensors: no device involved
        return tuple(names), tuple(coef)

    def linear(self, batch: int, nodes: int) -> float:
        """The least-squares model alone at (``batch``, ``nodes``) (floored at a tiny positive value)."""
        terms = _features(self.features, batch, nodes)
        return max(_MIN_COST_MS, sum(c * v for c, v in zip(self.coefficients, terms, strict=True)))

    def _along(self, batch: int, nodes: int) -> float | None:
        """Interpolation in n along the measured row of ``batch``; None outside its measured range."""
        row = self._rows[batch]
        ns = [n for n, _ in row]
        i = bisect.bisect_left(ns, nodes)
        if i < len(ns) and ns[i] == nodes:
            return row[i][1]
        if i == 0 or i == len(ns):
            return None
        (n0, c0), (n1, c1) = row[i - 1], row[i]
        return c0 + (c1 - c0) * (nodes - n0) / (n1 - n0)

    def predict(self, batch: int, nodes: int) -> float:
        """The round's cost in ms at ``batch`` rows and ``nodes`` slots (root included: AR is ``nodes = 1``)."""
        _int("batch", batch, 1)
        _int("nodes", nodes, 1)
        bs = self._batches
        i = bisect.bisect_left(bs, batch)
        if i < len(bs) and bs[i] == batch:
            got = self._along(batch, nodes)
            return got if got is not None else self.linear(batch, nodes)
        if 0 < i < len(bs):
            lo, hi = self._along(bs[i - 1], nodes), self._along(bs[i], nodes)
            if lo is not None and hi is not None:
                return lo + (hi - lo) * (batch - bs[i - 1]) / (bs[i] - bs[i - 1])
        return self.linear(batch, nodes)

    def __repr__(self) -> str:
        pairs = zip(self.features, self.coefficients, strict=True)
        terms = " + ".join(f"{c:.4g}*{f}" if f != "1" else f"{c:.4g}" for f, c in pairs)
        return f"CostModel({len(self.table)} points, outside: {terms} ms, rmse {self.rmse:.3g} ms)"


def measure(
    fn_by_bucket: Mapping[tuple[int, int], Callable[[], object]],
    repeats: int = 20,
    *,
    device: torch.device | str,
    warmup: int = 2,
) -> list[tuple[int, int, float]]:
    """Time a callable per bucket (e.g. a captured round's replay) and return ``[(B, n, median ms)]``.

    Each callable runs ``warmup`` times untimed, then ``repeats`` times, each call timed alone: on an accelerator
    (any ``device`` whose torch module has ``Event``, e.g. ``torch.cuda`` for a CUDA device) by timing events
    recorded around the call on the current stream, read after one synchronisation; on the CPU by
    ``time.perf_counter`` around the call. The device is synchronised before each bucket's timed calls.

    Args:
        fn_by_bucket: ``{(B, n): fn}``, ``n`` the slots the round verifies (budget + 1; 1 for AR).
        repeats (int): timed calls per bucket, >= 1.
        device (torch.device | str): where the callables run (decides the timer).
        warmup (int): untimed calls per bucket first, >= 0.

    Returns:
        list: ``(B, n, ms)`` per bucket, the median of its calls, in the mapping's order: ``CostModel(...)``'s input.
    """
    _int("repeats", repeats, 1)
    _int("warmup", warmup, 0)
    if not isinstance(fn_by_bucket, Mapping) or not fn_by_bucket:
        raise ValueError("fn_by_bucket must be a non-empty mapping {(batch, nodes): callable}.")
    dev = torch.device(device)
    module = _device_module(dev)
    events = module is not None and hasattr(module, "Event")
    context = module.device(dev) if module is not None and hasattr(module, "device") else nullcontext()
    out = []
    with context:
        for key, fn in fn_by_bucket.items():
            if not isinstance(key, tuple) or len(key) != 2:
                raise ValueError(f"bucket {key!r}: keys are (batch, nodes) pairs.")
            _int("batch", key[0], 1)
            _int("nodes", key[1], 1)
            if not callable(fn):
                raise ValueError(f"bucket {key!r}: {fn!r} is not callable.")
            for _ in range(warmup):
                fn()
            if module is not None:
                module.synchronize()
            times = []
            if events:
                pairs = []
                for _ in range(repeats):
                    start, end = module.Event(enable_timing=True), module.Event(enable_timing=True)
                    start.record()
                    fn()
                    end.record()
                    pairs.append((start, end))
                module.synchronize()
                times = [start.elapsed_time(end) for start, end in pairs]
            else:
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    fn()
                    if module is not None:
                        module.synchronize()
                    times.append((time.perf_counter() - t0) * 1e3)
            out.append((key[0], key[1], statistics.median(times)))
            logger.debug("measure %s: median %.4f ms over %d calls", key, out[-1][2], repeats)
    return out


def _device_module(dev: torch.device):
    """The torch module of an accelerator device (``torch.cuda`` for CUDA), None for the CPU."""
    if dev.type == "cpu":
        return None
    try:
        return torch.get_device_module(dev)
    except (RuntimeError, AttributeError) as err:
        raise ValueError(f"device {dev}: no torch device module to time it with ({err}).") from err


# -- 4. the choice (host) ----------------------------------------------------------------------------------------
def goodputs(expected, cost: CostModel, calib: Calibration | None, sizes: Sequence[int], batch: int | None = None):
    """Expected committed tokens per ms of each option: ``[AR, sizes[0], ..., sizes[K-1]]``.

    ``G(n) = sum_rows (1 + scale_n * E_row(n)) / cost(B, n + 1)`` and ``G(AR) = rows / cost(B, 1)``: every round
    commits the bonus token plus its accepted drafts. ``expected`` is ``[rows, K]`` host floats (the
    :func:`expected_accepts` of the round, read to the host); ``batch`` is the ``B`` the round runs with (default
    the number of rows; it may exceed them when the batch is padded to a captured bucket). ``calib=None`` uses
    the drafter's predictions as they are.
    """
    sizes = check_sizes(sizes)
    rows = _matrix(expected, len(sizes))
    if not rows:
        raise ValueError("expected has no rows: pass [B, K] expectations, one row per sequence.")
    batch = len(rows) if batch is None else _int("batch", batch, 1)
    if batch < len(rows):
        raise ValueError(f"batch={batch} < {len(rows)} rows of expected: batch is the round's B, at least the rows.")
    if not isinstance(cost, CostModel):
        raise ValueError(f"cost must be a CostModel, got {type(cost).__name__}.")
    if calib is not None:
        if not isinstance(calib, Calibration):
            raise ValueError(f"calib must be a Calibration or None, got {type(calib).__name__}.")
        if calib.sizes != sizes:
            raise ValueError(f"calib was made for sizes {calib.sizes}, not {sizes}.")
        rows = calib.apply(rows)
    out = [len(rows) / cost.predict(batch, 1)]
    for k, n in enumerate(sizes):
        out.append(sum(1.0 + row[k] for row in rows) / cost.predict(batch, n + 1))
    return out


def choose(
    expected,
    cost: CostModel,
    calib: Calibration | None,
    sizes: Sequence[int],
    batch: int | None = None,
    *,
    margin: float = 0.0,
) -> int | None:
    """The budget for the next round: an index into ``sizes``, or None for plain decoding (AR, one slot).

    One budget for the whole batch: the rows' trees are padded to a common slot count, so the cost depends on
    that common size only, and a per-row preference matters only through its contribution to the sum of the
    rows' committed tokens at that size. The goodput of each option is :func:`goodputs`; with ``g*`` the best,
    the choice is the **smallest** option (AR first, then increasing budgets) whose goodput is at least
    ``g* / (1 + margin)``. So ties go to the smaller tree (the cheaper round, fewer wasted slots), exact ties with
    AR go to AR, and a positive ``margin`` asks a larger tree to win by that relative amount. Never worse than
    AR: AR is a candidate, so the chosen option's estimated goodput is never below ``rows / cost(B, 1)``; when
    every tree's goodput is below it, the result is None.

    Args:
        expected: ``[rows, K]`` host floats (nested sequences or a CPU tensor): uncalibrated expected accepted
            drafted tokens per row and budget (:func:`expected_accepts`).
        cost (CostModel): the round's cost in ms.
        calib (Calibration | None): scales of the predictions (None: as they are).
        sizes (Sequence[int]): the candidate budgets, strictly increasing.
        batch (int | None): the round's ``B`` (default: the rows).
        margin (float): >= 0, relative goodput a larger option must gain (0: plain argmax, ties to the smaller).

    Returns:
        int | None: ``i`` for budget ``sizes[i]``, None for AR (``budget_for`` maps both to a budget).
    """
    if not _finite(margin) or margin < 0:
        raise ValueError(f"margin={margin!r}: pass a finite float >= 0.")
    g = goodputs(expected, cost, calib, sizes, batch)
    threshold = max(g) / (1.0 + margin)
    pick = next(i for i, v in enumerate(g) if v >= threshold)
    choice = None if pick == 0 else pick - 1
    if logger.isEnabledFor(logging.DEBUG):
        logger.debug("goodput (tokens/ms) AR %.4f, trees %s -> budget %d", g[0], [round(v, 4) for v in g[1:]],
                     budget_for(choice, sizes))  # fmt: skip
    return choice


# -- 5. the controller of a decoding loop (host) -----------------------------------------------------------------
class AutoBudget:
    """Chooses the budget of each round of one ``generate`` call (``DDTree(budget="auto")``).

    The loop asks :meth:`next_size` before each launch and reports each round it reads with :meth:`observe`: the
    round's budget, its own :func:`expected_accepts` up to the next size above its own (computed inside the round
    from its proposal and read with its tokens: no extra host read; the larger sizes extrapolated), the accepted
    drafts of each decoding row and the round's device time. Budget 0 is plain decoding (a round without a proposal
    that still feeds the drafter, ``RootOnly``). The costs are the rounds' own times (the first rounds try plain
    decoding and every size twice, the first run not counted, then each option's cost is the median of its last
    ``window`` rounds), the calibration comes from the accepted counts. Plain decoding proposes nothing, so after
    ``probe`` plain rounds in a row the smallest tree runs once to refresh the expectations (a probe); each probe
    after which the model still picks plain decoding doubles that gap (up to ``16 * probe``), and a tree chosen by
    the model resets it. Every choice is logged in ``decisions`` with its reason (``"explore"``: an option's first
    measurements, ``"probe"``, ``"model"``, ``"check"``: a close neighbour of the model's size, every ``check``
    model rounds, ``"detach"``, ``"detached"``, ``"start detached"``) and, for the model's, what it was made from,
    so that a test can check each against it.

    **What the model weighs.** One row: committed tokens per ms, ``(1 + scale_n E(n)) / cost(n)`` (plain decoding
    ``1 / cost(0)``), as :func:`goodputs`, ``E`` the expectation smoothed over recent tree rounds. A batch
    (``finish=True``, ``remaining`` given for more than one row): its rows' remaining tokens over the time to
    finish the call, which the slowest row sets, ``sum_b left_b / (max_b left_b / (1 + scale_n E_b(n)) *
    cost(n))`` (plain decoding: ``sum_b left_b / (max_b left_b * cost(0))``); a static batch runs every row until
    the last is done, so a tree that speeds up the average row but not the slowest one gains nothing, and the sum
    over rows (``finish=False``) kept trees where plain decoding finished sooner. ``E_b`` is row ``b``'s own
    smoothed expectation weighed by ``row_weight`` (0.5: halfway) against the rows' mean: one row's recent rounds
    alone overrate how slow it stays.

    **Detaching.** A plain round inside a drafter's loop still feeds the drafter (so that a tree can follow), which
    makes it dearer than plain decoding itself. The target's own plain round is a further option, :data:`DETACHED`
    (-1): it leaves the drafter behind for the rest of the call (its state is not used again in that call, and the
    next call prefills it anew). Its cost is measured on the last rounds of a call (``final``), where leaving the
    drafter behind costs nothing. When it beats every attached option in ``settle`` model choices in a row, the
    controller detaches. That verdict carries to the next calls only if detaching also wins at the long-run
    expectations (``long_smoothing``, over many rounds and calls): a call whose prompt drafts poorly detaches alone,
    and the next call starts attached. A call after one whose verdict carries starts detached, except every
    ``call_gap`` calls (doubling up to 8 while the probe is overruled) when it starts attached to look again; a
    tree chosen by the model ends that.

    **Ties go to the smaller option.** The model picks the smallest option whose value is within ``margin`` of
    the best: the largest of several noisy estimates is overrated (a larger tree's the most), and a round costs a
    little more than its device time says (each call discards the round launched ahead at its end).

    The decoding loop keeps one controller per engine (target, batch bucket), drafter and policy across calls
    (:meth:`resume` at each call): the sizes are measured once, not at every call.

    Choices lag the expectations by the rounds in flight (the loop launches one round ahead, and a round's
    expectations come with its tokens), so the choice weighs expectations smoothed over recent tree rounds (an
    exponential average, ``smoothing`` the weight of the past) rather than one round's: a single uncertain draft two
    rounds back says little about the next round, and acting on it alone made the choice flap between plain
    decoding and large trees.

    Args:
        sizes (Sequence[int]): candidate budgets, strictly increasing (plain decoding is always a candidate too).
        batch (int): the round's rows ``B`` (the bucket).
        window (int): recent rounds per option whose median is its cost.
        probe (int): plain rounds in a row before a tree round refreshes the expectations.
        smoothing (float): in [0, 1), the weight of the earlier rounds in the smoothed expectation (0: the last
            round's alone).
        settle (int): model choices in a row that detaching must win before the controller detaches (0: never).
        margin (float): >= 0, the relative value a larger option must gain over a smaller one (0: the argmax,
            ties to the smaller).
        long_smoothing (float): in [0, 1), the weight of the past in the long-run expectation that decides
            whether a detach verdict carries to the next calls.
        cold (int): >= 0, the first timed rounds of each option whose time is not counted (the first replays of a
            freshly captured round run cold and slower: counted, they made a size look dearer until it ran again,
            which it then never did). The loop itself passes no time for a round whose launch captured its graph
            or replayed it for the first time (``Round.elapsed``).
        check (int): >= 0, model rounds between two runs of a close neighbour of the chosen size (``"check"``; 0:
            never). A size the model does not run keeps a calibration that decays to the shared ratio, which
            misjudges it where the drafter's ratio differs by size; one round in ``check`` keeps it current.
        check_within (float): >= 0, how far below the chosen size's value (relative) a neighbour may be and still
            be checked.
        finish (bool): weigh a batch by the time to finish the call (its slowest row) rather than by the sum over
            its rows of tokens per ms.
        row_weight (float): in [0, 1], the weight of a row's own smoothed expectation against the rows' mean in
            that time (the rest on the mean).
        spread (float): >= 0, how many of its deviations the slowest row's rounds lie beyond their mean, in units
            of the expected largest of the decoding rows' standard normal draws (0: the rows' expected rounds alone).
            A row's accepted drafts vary from round to round while plain decoding's do not, so the last row of a
            large batch to finish takes more rounds than its expectation says.
        clock (str): what a round's time is (the loop reads the one named here and passes it to :meth:`observe`):
            ``"device"``, the round's own device time (timing events around its launch; on the CPU the launch's
            wall time); ``"wall"``, the host time between the read of the round before it and its own read, which
            also holds what the host does per round (reading and committing the tokens, launching the next round)
            wherever the device waits for it.
    """

    def __init__(self, sizes: Sequence[int], batch: int, *, window: int = 16, probe: int = 4,
                 smoothing: float = 0.8, settle: int = 4, margin: float = 0.03,
                 long_smoothing: float = 0.95, cold: int = 1, check: int = 16,
                 check_within: float = 0.2, finish: bool = True, row_weight: float = 0.5,
                 spread: float = 0.0, clock: str = "device") -> None:  # fmt: skip
        self.sizes = check_sizes(sizes)
        self.clock = check_clock(clock)
        self.batch = _int("batch", batch, 1)
        self.window = _int("window", window, 1)
        self.probe = _int("probe", probe, 1)
        for name, value in (("smoothing", smoothing), ("long_smoothing", long_smoothing)):
            if not _finite(value) or not 0 <= value < 1:
                raise ValueError(f"{name}={value!r}: pass a float in [0, 1).")
        if not _finite(margin) or margin < 0:
            raise ValueError(f"margin={margin!r}: pass a finite float >= 0.")
        self.smoothing, self.long_smoothing, self.margin = float(smoothing), float(long_smoothing), float(margin)
        self.settle = _int("settle", settle, 0)
        self.cold = _int("cold", cold, 0)
        self.check = _int("check", check, 0)
        if not _finite(check_within) or check_within < 0:
            raise ValueError(f"check_within={check_within!r}: pass a finite float >= 0.")
        self.check_within, self.since_check = float(check_within), 0
        if not isinstance(finish, bool):
            raise ValueError(f"finish={finish!r}: pass True or False.")
        self.finish = finish
        if not _finite(row_weight) or not 0 <= row_weight <= 1:
            raise ValueError(f"row_weight={row_weight!r}: pass a float in [0, 1].")
        self.row_weight = float(row_weight)
        if not _finite(spread) or spread < 0:
            raise ValueError(f"spread={spread!r}: pass a finite float >= 0.")
        self.spread = float(spread)
        # per size, smoothed moments of a row's committed tokens per round: the squared miss of its own prediction
        # and the squared prediction (their ratio: the relative variance of one round's yield)
        self.miss: list[list[float] | None] = [None] * len(self.sizes)
        self.row_expected: dict[int, list[float]] = {}  # per batch row of this call, its smoothed expectations
        self.timed: dict[int, int] = {}  # per option, its timed rounds not counted yet (``cold``)
        # the rows' mean calibrated expectation over many rounds and calls
        self.expected_long: list[float] | None = None
        self.carries = False  # this call's detach verdict holds at the long-run expectations too
        self.rows = 0  # decoding rows at the last tree round
        # a light prior (one predicted token): a drafter whose drafts are never accepted is believed within a few
        # rounds, so the larger trees are retried rarely
        self.calib = Calibration(self.sizes, strength=1.0)
        self.times: dict[int, list[float]] = {s: [] for s in (0, *self.sizes)}  # 0: plain decoding
        self.detached_times: list[float] = []  # the target's own plain rounds (DETACHED)
        self._costs: dict[int, float] = {}  # per option, the median of its times (dropped when one is added)
        self.expected: list[float] | None = None  # the rows' mean expectation per size, smoothed
        # per size, its expectation over the size below's (smoothed): a round computes its expectations only up to
        # the next size above its own, and the larger ones are extrapolated from the last computed by these
        self.growth: list[float | None] = [None] * len(self.sizes)
        self.chosen: list[int] = []
        self.in_flight: list[int] = []  # sizes launched and not observed yet
        self.probe_gap, self.probe_max = self.probe, 16 * self.probe  # plain rounds before the next probe
        self.detached = False  # this call left the drafter behind (plain decoding to its end)
        self.votes = 0  # model choices in a row that detaching won
        self.start_detached = False  # a recent call detached by the model's choice: the next starts detached
        self.verdict = False  # this call detached by the model's choice (not to measure the detached round)
        self.call_gap, self.calls_since_look = 1, 0  # calls that start detached between two that look again
        self.first_of_call = True
        # every choice: {"size", "reason"}, and for "model" / "detach" what it was made from: "costs" (ms per option,
        # 0 = plain decoding, -1 = detached), "expected" (the rows' smoothed mean per size), "rows", "scales" (the
        # calibration's) and "value" (committed tokens per ms per option, as ``goodputs`` weighs them)
        self.decisions: list[dict] = []

    def resume(self) -> None:
        """A new call of the same target, batch bucket and drafter: keep the measured costs and the calibration;
        unless a detach verdict carries, start the expectations from the long-run ones (the last call's last rounds
        say nothing of the new prompt: after a poorly drafted call, its expectations made the next call open with
        plain rounds, which propose nothing, and detach whatever its own drafts were) with the probe gap at its
        shortest; forget the rounds launched and never read (the last call's round launched ahead) and the last
        call's decisions."""
        self.in_flight = []
        self.decisions = []
        self.row_expected = {}  # the rows are the new call's
        # a verdict made on this call's prompts alone (its drafts were poor, trees win on the usual ones) does
        # not carry: the next call starts attached
        self.start_detached = self.start_detached or (self.verdict and self.carries)
        if self.expected_long is not None and not self.start_detached:
            scales = self.calib.scales()
            self.expected = [e / k if k > 0 else e for e, k in zip(self.expected_long, scales, strict=True)]
            self.probe_gap = self.probe
        self.carries = False
        self.detached = self.verdict = False  # the drafter was prefilled anew
        self.votes = 0
        self.first_of_call = True
        self.chosen = self.chosen[-self.probe_max :]  # enough to count the plain rounds in a row

    def _cost(self, size: int) -> float:
        """The median of the option's last ``window`` times, kept until the option's next time (``observe``): the
        choice before every round asks for every option's."""
        cost = self._costs.get(size)
        if cost is None:
            times = self.detached_times if size == DETACHED else self.times[size]
            cost = self._costs[size] = statistics.median(times[-self.window :])
        return cost

    def costs(self) -> dict[int, float]:
        """The round cost in ms of each option measured so far (budget -> median of its last ``window`` rounds;
        0 = plain decoding, -1 = detached)."""
        out = {s: self._cost(s) for s, t in self.times.items() if t}
        if self.detached_times:
            out[DETACHED] = self._cost(DETACHED)
        return out

    def _values(self, costs: Mapping[int, float], scales: Sequence[float],
                expected: Sequence[float] | None = None) -> dict[int, float]:  # fmt: skip
        """Committed tokens per ms of each option measured (``goodputs`` on the measured costs), at ``expected``
        (default: the smoothed expectations of recent rounds)."""
        rows, expected = self.rows, self.expected if expected is None else expected
        value = {o: rows / costs[o] for o in (0, DETACHED) if o in costs}
        for k, s in enumerate(self.sizes):
            value[s] = rows * (1.0 + scales[k] * expected[k]) / costs[s]
        return value

    def _extend(self, values: Sequence[float]) -> list[float]:
        """The expectations of the first sizes -> every size's: each size not computed is the size below times its
        learned growth (1 before any round computed both)."""
        out = list(values)
        for k in range(len(out), len(self.sizes)):
            out.append(out[k - 1] * (self.growth[k] or 1.0))
        return out

    def _finish_values(self, costs: Mapping[int, float], scales: Sequence[float], remaining: Mapping[int, int],
                       level: Sequence[float] | None = None) -> dict[int, float]:  # fmt: skip
        """A batch's committed tokens per ms of each option measured, over the time to finish the call: the rows'
        remaining tokens over the slowest row's rounds times the round's cost. Each row's rate is ``1 + scale *
        E``, ``E`` its own smoothed expectation weighed by ``row_weight`` against the rows' mean (one row's recent
        rounds alone overrate how slow it stays). ``level``: the rows' mean taken as that instead, each row
        scaled with it (the long-run check of a detach verdict)."""
        total = float(sum(remaining.values()))
        longest = max(remaining.values())
        value = {o: total / (longest * costs[o]) for o in (0, DETACHED) if o in costs}
        mean = self.expected
        live = sum(1 for left in remaining.values() if left > 0)
        z = _expected_max_normal(live) * self.spread if live > 1 else 0.0
        for k, s in enumerate(self.sizes):
            times = 1.0 if level is None or mean[k] <= 0 else level[k] / mean[k]
            spread = self._relative_variance(k) if z else 0.0
            rounds = 0.0
            for row, left in remaining.items():
                own = self.row_expected.get(row)
                e = times * (mean[k] if own is None else self.row_weight * own[k] + (1 - self.row_weight) * mean[k])
                rate = 1.0 + scales[k] * e
                # a row's rounds to commit ``left`` tokens: ``left / rate`` on average, with variance ``left * c /
                # rate`` (``c`` one round's relative variance); the slowest of ``live`` rows lies ``z`` deviations
                # out (plain decoding's rounds vary not at all)
                rounds = max(rounds, left / rate + z * math.sqrt(left * spread / rate))
            value[s] = total / (rounds * costs[s])
        return value

    def _relative_variance(self, index: int) -> float:
        """One round's relative variance of a row's committed tokens at size ``index`` (the nearest size measured
        where this one was not; 0 before any)."""
        for j in sorted(range(len(self.sizes)), key=lambda j: abs(j - index)):
            m = self.miss[j]
            if m is not None and m[1] > 0:
                return m[0] / m[1]
        return 0.0

    def next_size(self, remaining: Mapping[int, int] | None = None, final: bool = False) -> int:
        """The budget of the next round launched: a size, 0 (plain decoding that feeds the drafter) or
        :data:`DETACHED` (plain decoding without it, to the end of the call). ``remaining`` maps each decoding row
        to the tokens it still has to generate (a batch's time to finish: ``finish``), ``final`` says the call's
        last tokens are being decoded (leaving the drafter behind then costs
        nothing). Each choice is logged in ``decisions``."""
        first, self.first_of_call = self.first_of_call, False
        # options not timed yet, those never run first (a cold run's time is not counted: ``cold``)
        untried = sorted((s for s in self.times if not self.times[s] and s not in self.in_flight),
                         key=lambda s: self.timed.get(s, 0))  # fmt: skip
        last_tree = next((i + 1 for i in range(len(self.chosen) - 1, -1, -1) if self.chosen[i] > 0), 0)
        plain_run = len(self.chosen) - last_tree  # plain rounds since the last tree
        record: dict = {}
        if self.detached:  # the drafter was left behind: plain decoding to the end of the call
            size, reason = DETACHED, "detached"
        elif final and not self.detached_times and not untried and DETACHED not in self.in_flight:
            size, reason = DETACHED, "explore"  # the target's own plain round, measured where it costs nothing
        elif first and self.start_detached and self.calls_since_look < self.call_gap:
            self.calls_since_look += 1
            size, reason = DETACHED, "start detached"
        elif untried:  # measure every option once first
            size, reason = untried[0], "explore"
        elif self.expected is None or any(not t for t in self.times.values()):
            size, reason = self.sizes[0], "explore"  # measurements still in flight
        elif plain_run >= self.probe_gap:
            # plain rounds propose nothing: the smallest tree refreshes the expectations, ever more rarely while
            # the model keeps choosing plain decoding after it
            size, reason = self.sizes[0], "probe"
            self.probe_gap = min(2 * self.probe_gap, self.probe_max)
        else:
            # the objective of each option on the measured costs (what the cost model returns at its measured
            # points) and the calibrated expectations, in O(sizes x rows) host work: this runs before every round
            costs = self.costs()
            scales = self.calib.scales()
            if self.finish and remaining and len(remaining) > 1 and max(remaining.values()) > 0:
                value = self._finish_values(costs, scales, remaining)
                record["finish"] = {"remaining": dict(remaining),
                                    "row_expected": {r: list(self.row_expected[r]) for r in remaining
                                                     if r in self.row_expected}}  # fmt: skip
            else:
                value = self._values(costs, scales)
            attached = (0, *self.sizes)
            best = max(value[o] for o in attached)
            # the smallest option within ``margin`` of the best: the largest of several noisy estimates is
            # overrated (the larger trees' the most), and a larger round costs what its device time leaves out
            # (the launch a call's end discards)
            size = next(o for o in attached if value[o] * (1.0 + self.margin) >= best)
            detach_wins = DETACHED in value and value[DETACHED] > best
            reason = "model"
            self.votes = self.votes + 1 if detach_wins else 0
            if self.settle and self.votes >= self.settle:
                size, reason, self.detached, self.verdict = DETACHED, "detach", True, True
                if "finish" in record:  # each row as fast relative to the rows' mean as now, at the long-run mean
                    long = self._finish_values(costs, [1.0] * len(self.sizes), remaining, self.expected_long)
                else:
                    long = self._values(costs, [1.0] * len(self.sizes), self.expected_long)  # calibrated already
                self.carries = long[DETACHED] > max(long[o] for o in attached)
                record["carries"] = self.carries
            elif size:
                self.probe_gap = self.probe
                if self.start_detached:  # a call that looked again found a tree worth running
                    self.start_detached, self.call_gap, self.calls_since_look = False, 1, 0
                self.since_check += 1
                if self.check and self.since_check >= self.check:
                    # a size the model does not run is judged by a calibration that decays to the shared ratio:
                    # every ``check`` model rounds a close neighbour runs once, so its own ratio stays current
                    i = self.sizes.index(size)
                    near = [self.sizes[j] for j in (i - 1, i + 1) if 0 <= j < len(self.sizes)]
                    near = [o for o in near if value[o] * (1.0 + self.check_within) >= value[size]]
                    if near:
                        size, reason, self.since_check = max(near, key=value.__getitem__), "check", 0
            record.update(costs=costs, expected=list(self.expected), rows=self.rows, scales=scales, value=value)
        if first and self.start_detached and size != DETACHED:  # this call looks again
            self.calls_since_look = 0
            self.call_gap = min(2 * self.call_gap, 8)
        if size == DETACHED and reason in ("explore", "start detached"):
            self.detached = True
        self.decisions.append({"size": size, "reason": reason, **record})
        self.chosen.append(size)
        self.in_flight.append(size)
        return size

    def observe(self, size: int, expected, accepted: Sequence[int], ms: float | None,
                rows: Sequence[int] | None = None) -> None:  # fmt: skip
        """A round read: its budget (0: plain decoding, -1: detached), ``expected [rows, K]`` (host floats, the
        decoding rows; None for plain decoding), the accepted drafted tokens of each of those rows, its device
        time in ms (None: not timed), and which rows they are (``rows``, the batch indices that ``remaining`` uses:
        each row's own smoothed expectations for ``finish``)."""
        if size in self.in_flight:
            self.in_flight.remove(size)
        if size > 0 and expected is not None:
            index = self.sizes.index(size)
            width = len(self.sizes)
            matrix = expected if isinstance(expected, list) else _matrix(expected, width, partial=True)
            if matrix:
                # the rows' column sums in one pass; a malformed or non-finite value takes the checked path's error.
                # Trailing columns < 0 are sizes the round did not compute (it stops at the next size up).
                known = _known(matrix)
                try:
                    sums = [math.fsum(col) for col in zip(*matrix, strict=True)]
                    shaped = len(sums) == width and all(len(row) == width for row in matrix)
                    shaped = (
                        shaped
                        and all(_finite(v) for v in sums)
                        and all(
                            (not known or min(row[:known]) >= 0) and (known == width or max(row[known:]) < 0)
                            for row in matrix
                        )
                    )
                except (TypeError, ValueError):
                    shaped = False
                if not shaped:
                    matrix = _matrix(expected, width, partial=True)  # raises the clear error
                    known = _known(matrix)
                    sums = [math.fsum(col) for col in zip(*matrix, strict=True)]
                if known <= index:
                    raise ValueError(
                        f"expected has no value for the round's own size {size} (column {index}): a round computes "
                        f"its expectations at least up to its own size."
                    )
                self.calib.update(index, sums[index], float(sum(accepted)))
                mean = [v / len(matrix) for v in sums[:known]]
                for k in range(1, known):  # how much each size adds over the one below, smoothed
                    if mean[k - 1] > 0:
                        ratio = mean[k] / mean[k - 1]
                        old = self.growth[k]
                        self.growth[k] = ratio if old is None else self.smoothing * old + (1 - self.smoothing) * ratio
                mean = self._extend(mean)
                self.expected = _smooth(self.expected, mean, self.smoothing)
                scale, miss, square = self.calib.scale(index), 0.0, 0.0
                for row, got in zip(matrix, accepted, strict=False) if self.spread else ():
                    miss += (got - scale * row[index]) ** 2
                    square += (1.0 + scale * row[index]) ** 2
                if matrix and self.spread:  # only ``spread`` reads these moments
                    moments = [miss / len(matrix), square / len(matrix)]
                    self.miss[index] = _smooth(self.miss[index], moments, self.smoothing)
                if rows is not None and self.finish and len(rows) == len(matrix) > 1:
                    for row, values in zip(rows, matrix, strict=True):
                        own = self._extend(values[:known])
                        self.row_expected[row] = _smooth(self.row_expected.get(row), own, self.smoothing)
                calibrated = [k * e for k, e in zip(self.calib.scales(), mean, strict=True)]
                self.expected_long = _smooth(self.expected_long, calibrated, self.long_smoothing)
                self.rows = len(matrix)
        if ms is not None and _finite(ms) and ms > 0:
            times = self.detached_times if size == DETACHED else self.times.get(size)
            if times is not None and self.timed.get(size, 0) < self.cold:  # a cold run: not its usual cost
                self.timed[size] = self.timed.get(size, 0) + 1
            elif times is not None:
                times.append(float(ms))
                self._costs.pop(size, None)
                if len(times) > 2 * self.window:  # only the last ``window`` count
                    del times[: -self.window]


# -- helpers -----------------------------------------------------------------------------------------------------
def _expected_max_normal(n: int) -> float:
    """The expected largest of ``n`` standard normal draws (Blom's approximation)."""
    return statistics.NormalDist().inv_cdf((n - 0.375) / (n + 0.25))


def _smooth(past: list[float] | None, new: list[float], weight: float) -> list[float]:
    """Exponential average: ``weight`` on the past (None: start at ``new``)."""
    if past is None:
        return new
    return [weight * old + (1.0 - weight) * value for old, value in zip(past, new, strict=True)]


def _features(names: Sequence[str], batch: int, nodes: int) -> list[float]:
    value = {"1": 1.0, "B": float(batch), "n": float(nodes), "B*n": float(batch * nodes), "T": float(nodes > 1)}
    return [value[f] for f in names]


def _finite(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def _floats(name: str, values) -> list[float]:
    """One float or a sequence of them (a CPU tensor too) -> a non-empty list of finite floats >= 0."""
    if isinstance(values, torch.Tensor):
        if values.device.type != "cpu":
            raise ValueError(f"{name} is on {values.device}: read it to the host first.")
        values = values.reshape(-1).tolist()
    elif _finite(values):
        values = [values]
    if not isinstance(values, Sequence) or not values:
        raise ValueError(f"{name}={values!r}: pass a float >= 0 or a non-empty sequence of them.")
    out = []
    for v in values:
        if not _finite(v) or v < 0:
            raise ValueError(f"{name}: {v!r} is not a finite float >= 0.")
        out.append(float(v))
    return out


def _known(rows: Sequence[Sequence[float]]) -> int:
    """The leading columns computed (finite and >= 0) in the first of ``rows``."""
    return next((j for j, v in enumerate(rows[0]) if not (_finite(v) and v >= 0)), len(rows[0])) if rows else 0


def _matrix(expected, width: int, partial: bool = False) -> list[list[float]]:
    """``[rows, width]`` host floats (nested sequences or a CPU tensor) -> lists, checked: finite and >= 0, except
    (``partial``) trailing columns that are < 0 in every row (sizes a round did not compute)."""
    if isinstance(expected, torch.Tensor):
        if expected.device.type != "cpu":
            raise ValueError(f"expected is on {expected.device}: read it to the host first (one small copy per round).")
        if expected.dim() == 1:
            expected = expected[None]
        expected = expected.tolist()
    if not isinstance(expected, Sequence) or isinstance(expected, str | bytes):
        raise ValueError(f"expected must be [rows, {width}] floats, got {type(expected).__name__}.")
    rows = []
    for row in expected:
        if not isinstance(row, Sequence) or len(row) != width:
            raise ValueError(f"expected must be [rows, {width}] floats (one column per size), got a row {row!r}.")
        for v in row:
            if not _finite(v):
                raise ValueError(f"expected holds {v!r}: pass finite floats >= 0 (expected accepted tokens).")
        rows.append([float(v) for v in row])
    known = _known(rows) if partial else width
    for row in rows:
        if any(v < 0 for v in row[:known]) or any(v >= 0 for v in row[known:]):
            raise ValueError(
                f"expected holds a row {row!r}: pass finite floats >= 0 (expected accepted tokens)"
                + (
                    "; a column < 0 marks a size the round did not compute, and only trailing columns, the same in "
                    "every row, may."
                    if partial
                    else "."
                )
            )
    return rows
