"""``DDTree(budget="auto")`` without collapse: a bounded set of graph keys, built when a span bucket is first met
(``SpecStats.captures`` counts a call's new ones, so a steady workload captures nothing after its warm-up pass),
and choices that follow the policy's own cost model, on measured CPU costs and on costs injected mid-run.

Counted, never timed: the costs a test checks are the ones the controller logged (``AutoBudget.decisions``) or
the ones the test injected itself. Expected tokens come from HF ``generate`` of each row alone.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

import torch
from models import tiny_model
from test_batch import check_rows, left_pad
from test_round import sharp_drafter

import specdec
from specdec.budget import DETACHED, AutoBudget
from specdec.trees.policies import AutoStep

SIZES = (2, 6, 12)
SPAN_LENGTHS = (236, 241, 230)  # + 40 new tokens: every row crosses the first span bucket (256 slots)


def _long_prompts(seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(4, 128, (n,), generator=gen) for n in SPAN_LENGTHS]


class _Scripted:
    """A controller that tries plain decoding and every size once, then runs ``tail`` (no cost model)."""

    def __init__(self, sizes: tuple[int, ...], tail: int) -> None:
        self.sizes, self.tail, self.calls = sizes, tail, 0

    def next_size(self, remaining=None, final=False) -> int:
        options = (0, *self.sizes)
        size = options[self.calls] if self.calls < len(options) else self.tail
        self.calls += 1
        return size

    def observe(self, size, expected, accepted, ms, rows=None) -> None:
        pass


@dataclass(frozen=True, repr=False)
class _ScriptedTree(specdec.DDTree):
    tail: int = 0

    def controller(self, batch: int) -> _Scripted:
        return _Scripted(self.sizes, self.tail)


def test_second_pass_over_new_prompts_captures_nothing():
    """Warm-up pass, then different prompts of the same lengths: no new round or prefill, though the second pass
    chooses a size the first never ran at the second span bucket (its choices are scripted to differ). Each
    call's rows equal HF alone."""
    target = tiny_model("llama", scale=2.0)
    drafter = sharp_drafter(target)
    first, second = _long_prompts(1), _long_prompts(2)
    ids, mask = left_pad(first)
    warm = specdec.generate(target, ids, attention_mask=mask, drafter=drafter, max_new_tokens=40,
                            tree=_ScriptedTree(budget="auto", topk=3, sizes=SIZES, tail=0))  # fmt: skip
    # every option (plain fed and detached, and each size) at both span buckets (256, 512), plus the prefill: the
    # whole bounded set, built up front
    assert warm.stats.captures == 2 * (len(SIZES) + 2) + 1, warm.stats.captures
    assert warm.stats.budgets[4:] == [0] * (len(warm.stats.budgets) - 4)
    ids, mask = left_pad(second)
    out = specdec.generate(target, ids, attention_mask=mask, drafter=drafter, max_new_tokens=40,
                           tree=_ScriptedTree(budget="auto", topk=3, sizes=SIZES, tail=12))  # fmt: skip
    assert out.stats.captures == 0, out.stats.captures
    assert out.stats.budgets[4:] == [12] * (len(out.stats.budgets) - 4)
    check_rows(target, second, out, 40)
    # the real controller after the same warm-up: nothing new either
    third = _long_prompts(3)
    ids, mask = left_pad(third)
    auto = specdec.generate(target, ids, attention_mask=mask, drafter=drafter, max_new_tokens=40,
                            tree=specdec.DDTree(budget="auto", topk=3, sizes=SIZES))  # fmt: skip
    assert auto.stats.captures == 0 and auto.stats.as_dict()["captures"] == 0


def test_captures_counts_new_keys_of_fixed_policies():
    """A fixed budget: the first call builds its round and prefill, the same call again builds nothing, another
    budget builds one round."""
    target = tiny_model("llama", scale=2.0)
    drafter = sharp_drafter(target)
    ids = torch.randint(4, 128, (1, 9), generator=torch.Generator().manual_seed(4))
    calls = [specdec.generate(target, ids, drafter=drafter, tree=specdec.DDTree(budget=b, topk=3), max_new_tokens=8)
             for b in (5, 5, 7)]  # fmt: skip
    assert [c.stats.captures for c in calls] == [2, 0, 1]


# -- choices against the controller's own cost model ---------------------------------------------------------
def _values(decision: dict) -> dict[int, float]:
    """Committed tokens per ms of each option, recomputed from what the decision logged (``docs/trees.md``)."""
    costs, rows, scales = decision["costs"], decision["rows"], decision["scales"]
    if "finish" in decision:  # a batch: the rows' remaining tokens over the time the slowest row takes
        left, own = decision["finish"]["remaining"], decision["finish"]["row_expected"]
        total, longest = sum(left.values()), max(left.values())
        out = {o: total / (longest * costs[o]) for o in (0, DETACHED) if o in costs}
        for k, size in enumerate(SIZES):
            mean = decision["expected"][k]
            rates = {r: 1.0 + scales[k] * (mean if r not in own else (own[r][k] + mean) / 2) for r in left}
            out[size] = total / (max(left[r] / rates[r] for r in left) * costs[size])
        return out
    out = {o: rows / costs[o] for o in (0, DETACHED) if o in costs}
    for k, size in enumerate(SIZES):
        out[size] = rows * (1.0 + scales[k] * decision["expected"][k]) / costs[size]
    return out


def _check_model_decisions(decisions: list[dict]) -> list[int]:
    """Every "model" choice is the smallest attached option within 3 % of the best objective, never one that
    its model says loses to plain decoding, and the drafter is detached only where detaching beat every attached
    option; returns the sizes chosen by the model."""
    chosen = []
    for d in decisions:
        if d["reason"] not in ("model", "detach"):
            continue
        g = _values(d)
        for option, value in g.items():
            assert abs(value - d["value"][option]) <= 1e-9 * max(1.0, value), (d, g)
        best = max(g[o] for o in (0, *SIZES))
        want = next(o for o in (0, *SIZES) if g[o] * 1.03 >= best)  # within the documented 3 % margin
        if d["reason"] == "detach":
            assert d["size"] == DETACHED and g[DETACHED] > best, (d, g)
            continue
        assert d["size"] == want, (d, g)
        assert g[d["size"]] >= g[0], (d, g)  # never a tree its cost model says loses to plain decoding
        chosen.append(d["size"])
    return chosen


@dataclass(frozen=True, repr=False)
class _SpyTree(specdec.DDTree):
    """``DDTree(budget="auto")`` whose controllers are kept (``made``), optionally with injected round costs:
    ``inject(size, round_index) -> ms`` replaces the measured time of each round read."""

    made: list = field(default=None, compare=False)
    inject: object = field(default=None, compare=False)

    def controller(self, batch: int) -> AutoBudget:
        ctrl = _Injected(self.sizes, batch, self.inject) if self.inject else AutoBudget(self.sizes, batch)
        self.made.append(ctrl)
        return ctrl


class _Injected(AutoBudget):
    def __init__(self, sizes, batch, inject) -> None:
        super().__init__(sizes, batch)
        self.inject, self.read, self.costs_seen = inject, 0, {s: [] for s in (0, DETACHED, *sizes)}
        self.costs_at: list[dict] = []  # per decision: each option's injected costs observed before it
        self.runs: dict[int, int] = {}

    def next_size(self, remaining=None, final=False) -> int:
        self.costs_at.append({s: list(v) for s, v in self.costs_seen.items()})
        return super().next_size(remaining, final)

    def observe(self, size, expected, accepted, ms, rows=None) -> None:
        ms = self.inject(size, self.read)
        self.read += 1
        self.runs[size] = self.runs.get(size, 0) + 1
        if self.runs[size] > self.cold:  # an option's first ``cold`` times are documented as not counted
            self.costs_seen[size].append(ms)
        super().observe(size, expected, accepted, ms, rows)


def test_cpu_choices_never_lose_to_plain_decoding_by_their_own_model():
    """CPU, fp32, measured round times: each choice the model makes is the best goodput of its own logged costs
    and expectations, never a tree it predicts to lose to plain decoding. Tokens equal HF."""
    target = tiny_model("llama", scale=2.0)
    drafter = sharp_drafter(target)
    rows = [torch.randint(4, 128, (n,), generator=torch.Generator().manual_seed(n)) for n in (7, 11)]
    ids, mask = left_pad(rows)
    made: list = []
    out = specdec.generate(target, ids, attention_mask=mask, drafter=drafter, max_new_tokens=48,
                           tree=_SpyTree(budget="auto", topk=3, sizes=SIZES, made=made))  # fmt: skip
    check_rows(target, rows, out, 48)
    (ctrl,) = made
    chosen = _check_model_decisions(ctrl.decisions)
    assert chosen, [d["reason"] for d in ctrl.decisions]
    assert [d["size"] for d in ctrl.decisions][: len(out.stats.budgets)] == out.stats.budgets


def test_choices_follow_injected_costs_that_change_mid_run():
    """Injected costs: trees cheap for the first 24 rounds read (a tree wins), then ten times dearer (plain
    decoding wins). Every model choice equals the brute-force best of the test's own cost medians (the last 16
    injected costs of each option) with the logged expectations, and both regimes are reached. The call's last
    rounds measure the target's own plain round (detached, 0.6 ms); the next call, where it beats the fed plain
    round (1 ms) in four model choices in a row, detaches the drafter to its end."""
    target = tiny_model("llama", scale=2.0)
    drafter = sharp_drafter(target)
    ids = torch.randint(4, 128, (1, 9), generator=torch.Generator().manual_seed(8))

    def inject(size: int, index: int) -> float:
        if size <= 0:
            return 1.0 if size == 0 else 0.6
        return (0.9 + 0.01 * size) if index < 24 else (10.0 + 0.1 * size)

    made: list = []
    out = specdec.generate(target, ids, drafter=drafter, max_new_tokens=120,
                           tree=_SpyTree(budget="auto", topk=3, sizes=SIZES, made=made, inject=inject))  # fmt: skip
    check_rows(target, [ids[0]], out, 120)
    (ctrl,) = made

    def check_against_injected(decisions, costs_at) -> int:
        model = 0
        for d, seen in zip(decisions, costs_at, strict=False):
            if d["reason"] not in ("model", "detach"):
                continue
            model += 1
            costs = {s: statistics.median(v[-16:]) for s, v in seen.items() if v}
            assert costs == d["costs"], (costs, d["costs"])
            g = _values({**d, "costs": costs})
            best = max(g[o] for o in (0, *SIZES))
            if d["reason"] == "model":
                # the smallest option within the documented 3 % margin of the best
                assert d["size"] == next(o for o in (0, *SIZES) if g[o] * 1.03 >= best), (d, g)
        return model

    model = check_against_injected(ctrl.decisions, ctrl.costs_at)
    chosen = _check_model_decisions(ctrl.decisions)
    assert model > 10 and any(chosen) and 0 in chosen, chosen
    # after the costs changed and the window forgot the cheap trees, plain decoding stays the model's choice
    assert chosen[-5:] == [0] * 5, chosen
    # the call's last tokens measured the detached round (the drafter left behind where it costs nothing)
    reasons = [d["reason"] for d in ctrl.decisions]
    first = out.stats.budgets.index(DETACHED)
    assert set(out.stats.budgets[first:]) == {DETACHED} and reasons[first] == "explore", reasons
    assert len(out.stats.budgets) - first <= 16, out.stats.budgets  # the call's last tokens only (path_len 13)
    # the drafter's state was left behind, so the next call (the conversation continued) prefills it anew, and
    # its output equals HF's; there, detaching wins and the drafter is detached after four model choices
    more = torch.cat([out.sequences, torch.randint(4, 128, (1, 3), generator=torch.Generator().manual_seed(9))], 1)
    ctrl.costs_at = []
    again = specdec.generate(target, more, drafter=drafter, max_new_tokens=40,
                             tree=_SpyTree(budget="auto", topk=3, sizes=SIZES, made=made, inject=inject))  # fmt: skip
    check_rows(target, [more[0]], again, 40)
    assert again.stats.reused_tokens == 0
    assert len(made) == 1  # the same controller, resumed
    check_against_injected(ctrl.decisions, ctrl.costs_at)
    _check_model_decisions(ctrl.decisions)
    reasons = [d["reason"] for d in ctrl.decisions]
    first = again.stats.budgets.index(DETACHED)
    # the fourth model choice in a row that detaching wins detaches (the first three still pick plain decoding)
    assert reasons[first] == "detach" and reasons[first - 3 : first] == ["model"] * 3, reasons
    assert set(again.stats.budgets[first:]) == {DETACHED}, again.stats.budgets
    # a later call starts detached (the model's verdict stands), and equals HF
    third = specdec.generate(target, ids, drafter=drafter, max_new_tokens=12,
                             tree=_SpyTree(budget="auto", topk=3, sizes=SIZES, made=made, inject=inject))  # fmt: skip
    check_rows(target, [ids[0]], third, 12)
    assert set(third.stats.budgets) == {DETACHED} and ctrl.decisions[0]["reason"] == "start detached"
    # the call reports the controller's cost of each option: the median of its last 16 injected costs
    want = {s: statistics.median(v[-16:]) for s, v in ctrl.costs_seen.items() if v}
    assert third.stats.budget_costs == want, (third.stats.budget_costs, want)


def test_the_controller_and_its_costs_persist_across_calls():
    """A second call of the same target, batch bucket, drafter and policy reuses the controller: its costs are
    measured already, so it explores nothing (every choice is the model's or a probe) and its decisions are this
    call's alone. Tokens equal HF."""
    target = tiny_model("llama", scale=2.0)
    drafter = sharp_drafter(target)
    made: list = []
    tree = _SpyTree(budget="auto", topk=3, sizes=SIZES, made=made)
    ids = torch.randint(4, 128, (1, 9), generator=torch.Generator().manual_seed(11))
    first = specdec.generate(target, ids, drafter=drafter, tree=tree, max_new_tokens=40)
    assert {d["reason"] for d in made[0].decisions} >= {"explore", "model"}
    other = torch.randint(4, 128, (1, 9), generator=torch.Generator().manual_seed(12))
    second = specdec.generate(target, other, drafter=drafter, tree=tree, max_new_tokens=40)
    check_rows(target, [other[0]], second, 40)
    assert len(made) == 1 and first.stats.budgets[:4] == [0, *SIZES]
    reasons = [d["reason"] for d in made[0].decisions]
    assert reasons and "explore" not in reasons and len(reasons) <= len(second.stats.budgets) + 1, reasons



_COMPUTED: list = []  # the expectations each auto round computed, in launch order


@dataclass(frozen=True, repr=False)
class _RecordingStep(AutoStep):
    def build_expecting(self, proposal, root, depth, noise=None):
        tree, expected = super().build_expecting(proposal, root, depth, noise)
        _COMPUTED.append(expected.clone())
        return tree, expected


@dataclass(frozen=True, repr=False)
class _RecordingTree(_SpyTree):
    def at(self, budget: int):
        step = super().at(budget)
        return _RecordingStep(budget=budget, topk=self.topk, expect_sizes=self.sizes) if budget else step


def test_the_controller_reads_the_expectations_each_round_computed():
    """The expectations ride in the round's one output copy (float64 bits in int64 columns): each one the
    controller observes equals, bit for bit, what that round's policy computed, rows in batch order."""
    _COMPUTED.clear()
    target = tiny_model("llama", scale=2.0)
    drafter = sharp_drafter(target)
    rows = [torch.randint(4, 128, (n,), generator=torch.Generator().manual_seed(n)) for n in (6, 10)]
    ids, mask = left_pad(rows)
    made: list = []
    seen: list = []

    class Observed(AutoBudget):
        def observe(self, size, expected, accepted, ms, rows=None):
            if size > 0:
                seen.append((expected, rows))
            super().observe(size, expected, accepted, ms, rows)

    @dataclass(frozen=True, repr=False)
    class Tree(_RecordingTree):
        def controller(self, batch):
            ctrl = Observed(self.sizes, batch)
            self.made.append(ctrl)
            return ctrl

    out = specdec.generate(target, ids, attention_mask=mask, drafter=drafter, max_new_tokens=32,
                           tree=Tree(budget="auto", topk=3, sizes=SIZES, made=made))  # fmt: skip
    check_rows(target, rows, out, 32)
    assert seen and len(_COMPUTED) >= len(seen)
    for (expected, live), computed in zip(seen, _COMPUTED, strict=False):
        assert expected == computed[live].tolist(), (expected, computed)


class _Told(AutoBudget):
    """An auto budget controller that keeps each round's time as the loop told it."""

    def __init__(self, sizes, batch) -> None:
        super().__init__(sizes, batch)
        self.told: list = []

    def observe(self, size, expected, accepted, ms, rows=None):
        self.told.append((size, ms))
        super().observe(size, expected, accepted, ms, rows)


@dataclass(frozen=True, repr=False)
class _ToldTree(specdec.DDTree):
    made: list = field(default=None, compare=False)

    def controller(self, batch: int) -> AutoBudget:
        self.made.append(_Told(self.sizes, batch))
        return self.made[-1]


def test_stats_hold_each_rounds_budget_and_the_time_its_controller_was_told():
    target = tiny_model("llama", scale=2.0)
    drafter = sharp_drafter(target)
    ids = torch.randint(4, 128, (1, 9), generator=torch.Generator().manual_seed(3))
    made: list = []
    tree = _ToldTree(budget="auto", topk=3, sizes=SIZES, made=made)
    specdec.generate(target, ids, drafter=drafter, tree=tree, max_new_tokens=24)  # graphs and kernels warm
    out = specdec.generate(target, ids, drafter=drafter, tree=tree, max_new_tokens=24)
    check_rows(target, [ids[0]], out, 24)
    told = made[-1].told[-len(out.stats.budgets) :]  # this call's rounds (the controller is kept across calls)
    assert list(zip(out.stats.budgets, out.stats.budget_ms, strict=True)) == told
    assert any(ms is not None and ms > 0 for _, ms in told), told
    assert out.stats.as_dict()["budget_ms"] == out.stats.budget_ms
