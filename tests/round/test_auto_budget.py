"""``DDTree(budget="auto")``: the loop's choice of each round's budget (``specdec.budget.AutoBudget``) changes
no token (HF ``generate`` of each row alone is the expectation), and the controller picks what its goodput model
says on hand-made streams of rounds."""

from __future__ import annotations

import pytest
import torch
from models import tiny_model
from test_batch import check_rows, left_pad, prompts, sharp_drafter

import specdec
from specdec.budget import DETACHED, AutoBudget


@pytest.mark.parametrize("batch, lookahead", [(1, True), (3, True), (1, False), (3, False)])
def test_auto_budget_decodes_as_hf(batch, lookahead):
    target = tiny_model("llama", scale=2.0)
    drafter = sharp_drafter(target)
    rows = prompts(batch, seed=1)
    ids, mask = left_pad(rows)
    tree = specdec.DDTree(budget="auto", topk=3, sizes=(2, 6, 12), lookahead=lookahead)
    out = specdec.generate(target, ids, attention_mask=mask, drafter=drafter, tree=tree, max_new_tokens=24)
    check_rows(target, rows, out, 24)
    # plain decoding (0) and every size are tried once, then chosen by the model; one budget per batch round; the
    # call's last tokens may measure the target's own plain round (DETACHED, to the end of the call)
    budgets = out.stats.budgets
    assert set(budgets[:4]) == {0, 2, 6, 12} and set(budgets) <= {0, 2, 6, 12, DETACHED}
    if DETACHED in budgets:
        assert set(budgets[budgets.index(DETACHED) :]) == {DETACHED}, budgets
    assert len(out.stats.budgets) == out.stats.target_forwards - 1


def test_auto_budget_refusals():
    target = tiny_model("llama")
    ids = torch.tensor([[5, 6, 7, 8]])
    with pytest.raises(ValueError, match="proposes paths; use a fixed budget"):
        specdec.generate(target, ids, drafter=specdec.NGramDrafter(), tree=specdec.DDTree(budget="auto"))
    with pytest.raises(ValueError, match="strictly increasing"):
        specdec.DDTree(budget="auto", sizes=(15, 7))
    with pytest.raises(ValueError, match="or 'auto'"):
        specdec.DDTree(budget="big")
    with pytest.raises(ValueError, match="builds no tree itself"):
        specdec.DDTree(budget="auto").build(None, None, 1)


def _run(controller: AutoBudget, rounds: int, accepted_at: dict, cost_ms: dict, expected: list[float]) -> list[int]:
    """Drive the controller as the loop does (one round in flight): each round of budget s accepts
    ``accepted_at[s]`` drafts and costs ``cost_ms[s]`` (s = 0: plain decoding, no drafts, no expectations); the
    drafter predicts ``expected`` at every size."""
    chosen, pending = [], [controller.next_size()]
    for _ in range(rounds):
        pending.append(controller.next_size())
        size = pending.pop(0)
        controller.observe(size, [expected] if size > 0 else None, [accepted_at.get(size, 0)], cost_ms.get(size))
        chosen.append(size)
    return chosen


def _logged(controller: AutoBudget) -> list[tuple[int, str]]:
    return [(d["size"], d["reason"]) for d in controller.decisions]


def _model(controller: AutoBudget) -> list[int]:
    """The sizes the model chose (not the rounds that explore, probe or check)."""
    return [size for size, reason in _logged(controller) if reason == "model"]


def test_controller_picks_the_best_goodput():
    sizes = (1, 15, 63)
    expected = [0.9, 3.0, 3.4]  # calibrated drafter: what it predicts is what it accepts
    accepted = {0: 0, 1: 0.9, 15: 3.0, 63: 3.4}
    # goodput (1 + E) / ms: plain 1 / 0.9 = 1.11, size 1 -> 1.9 / 1.0, size 15 -> 4.0 / 1.2 = 3.33,
    # size 63 -> 4.4 / 2.0 = 2.2
    controller = AutoBudget(sizes, batch=1)
    chosen = _run(controller, 40, accepted, {0: 0.9, 1: 1.0, 15: 1.2, 63: 2.0}, expected)
    assert chosen[:4] == [0, 1, 15, 63] and _model(controller)[-20:] == [15] * 20
    # a neighbour is checked only within 20 % of the chosen size's value: 1 (1.9) and 63 (2.2) are far below 3.33
    assert "check" not in {r for _, r in _logged(controller)}, _logged(controller)
    # the same drafter on a target whose verify is flat in the node count: the largest tree wins
    controller = AutoBudget(sizes, batch=1)
    chosen = _run(controller, 40, accepted, {0: 1.0, 1: 1.0, 15: 1.0, 63: 1.0}, expected)
    assert _model(controller)[-20:] == [63] * 20


def test_a_cold_first_run_does_not_price_a_size_out():
    """Each option's first round runs cold (a freshly captured graph: 3 ms whatever its size), then at its usual
    cost, where 15 nodes is the best (4.0 tokens per 1.2 ms against 4.4 per 2.0 at 63). Counting the cold run, 15
    and the others keep their cold cost (their median of one) while 63, run as the last option, ..."""
    sizes = (1, 15, 63)
    expected = [0.9, 3.0, 3.4]
    accepted = {0: 0, 1: 0.9, 15: 3.0, 63: 3.4}
    usual = {0: 0.9, 1: 1.0, 15: 1.2, 63: 2.0}

    def drive(controller: AutoBudget, rounds: int) -> list[int]:
        runs: dict[int, int] = {}
        chosen, pending = [], [controller.next_size()]
        for _ in range(rounds):
            pending.append(controller.next_size())
            size = pending.pop(0)
            runs[size] = runs.get(size, 0) + 1
            ms = 3.0 if runs[size] == 1 else usual[size]
            controller.observe(size, [expected] if size > 0 else None, [accepted[size]], ms)
            chosen.append(size)
        return chosen

    assert drive(AutoBudget(sizes, batch=1), 40)[-20:] == [15] * 20
    # the same stream with the cold run counted never runs 15 again: the scenario is the one cold= guards against
    assert 15 not in drive(AutoBudget(sizes, batch=1, cold=0), 40)[-20:]


def test_a_neighbour_that_got_better_is_found_by_the_checks():
    """Size 3 wins while 15's drafts are accepted at the drafter's word (3: 2.3 tokens per 1.0 ms against 15: 2.3
    per 1.2); from round 100 the target accepts 1.8 times what the drafter predicts at 15 (3.34 per 1.2 ms, 21 %
    above 3). The model, never running 15, judges it by the shared ratio; the checks (a round of the neighbour
    every 16 model rounds) learn its own ratio, and the model moves to 15. Without checks it stays on 3."""
    sizes = (3, 15)

    def drive(controller: AutoBudget) -> list[int]:
        pending = [controller.next_size()]
        for i in range(300):
            pending.append(controller.next_size())
            size = pending.pop(0)
            accepted = {0: 0, 3: 1.3, 15: 1.3 if i < 100 else 2.34}[size]
            controller.observe(size, [[1.0, 1.3]] if size > 0 else None, [accepted], {0: 0.9, 3: 1.0, 15: 1.2}[size])
        return _model(controller)

    assert drive(AutoBudget(sizes, batch=1, settle=0, cold=0, check=0))[-50:] == [3] * 50
    model = drive(AutoBudget(sizes, batch=1, settle=0, cold=0))
    assert model[-50:] == [15] * 50, model


def test_controller_calibrates_an_overconfident_drafter():
    """The drafter predicts 3.4 accepted drafts at 63 nodes but the target accepts 0.5 there (1 at 15 nodes):
    with the observed counts, 15 nodes is the better round (2 / 1.2 against 1.5 / 1.4), though the prediction says
    63 (4.4 / 1.4)."""
    sizes = (1, 15, 63)
    controller = AutoBudget(sizes, batch=1)
    _run(controller, 80, {0: 0, 1: 0.5, 15: 1.0, 63: 0.5}, {0: 1.0, 1: 1.0, 15: 1.2, 63: 1.4}, [0.9, 3.0, 3.4])
    assert _model(controller)[-20:] == [15] * 20


def test_controller_is_steady_under_noisy_expectations():
    """Each round's expectations scatter around what the target accepts (each size's by its own factor 0.2..1.8,
    as one uncertain draft can): the smoothed choice stays on the best size (15 nodes: 4.0 / 1.2 tokens per ms
    against 4.4 / 2.0 at 63, 1.9 / 1.0 at 1, 1 / 0.9 plain) in most rounds instead of following each round's
    guess (acting on the last round's alone picks 15 in about 70 % of them)."""
    import random

    sizes = (1, 15, 63)
    gen = random.Random(0)
    controller = AutoBudget(sizes, batch=1)
    accepted, cost = {0: 0, 1: 0.9, 15: 3.0, 63: 3.4}, {0: 0.9, 1: 1.0, 15: 1.2, 63: 2.0}
    chosen, pending = [], [controller.next_size()]
    for _ in range(200):
        pending.append(controller.next_size())
        size = pending.pop(0)
        guess = [e * gen.uniform(0.2, 1.8) for e in (0.9, 3.0, 3.4)]
        controller.observe(size, [guess] if size else None, [accepted[size]], cost[size])
        chosen.append(size)
    assert chosen[20:].count(15) >= 0.9 * len(chosen[20:]), chosen


def test_controller_falls_back_to_plain_decoding_and_probes():
    """No draft is ever accepted and trees cost more than plain decoding: plain rounds, with a round of the
    smallest tree after ``probe`` plain rounds in a row (plain rounds propose nothing to choose from), the gap
    doubling after each probe that the model overrules, up to ``16 * probe`` (``settle=0``: never detaching)."""
    sizes = (1, 15, 63)
    controller = AutoBudget(sizes, batch=4, probe=2, settle=0)
    chosen = _run(controller, 200, {0: 0, 1: 0, 15: 0, 63: 0}, {0: 0.8, 1: 1.0, 15: 1.1, 63: 1.3}, [0.5, 2.0, 3.0])
    tail = chosen[-150:]
    assert tail.count(0) >= 140 and set(tail) <= {0, 1}, chosen
    runs = [len(r) for r in "".join("p" if c == 0 else "t" for c in chosen[8:]).split("t")[1:-1] if r]
    assert runs == sorted(runs) and runs[-1] == 32 and runs[0] <= 8, runs  # ..., 8, 16, 32, 32, ...
    reasons = [d["reason"] for d in controller.decisions]
    assert {d["size"] for d in controller.decisions if d["reason"] == "model"} == {0}
    assert all(d["reason"] in ("explore", "probe") for d in controller.decisions if d["size"]), reasons
    assert 5 <= reasons.count("probe") <= 8, reasons


def test_controller_detaches_the_drafter_where_trees_lose_and_looks_again_ever_more_rarely():
    """Losing trees, and the target's own plain round (detached, 0.5 ms) cheaper than the fed one (0.8 ms). The
    first call measures the detached round on its last tokens (``final``); the next call detaches at the fourth
    model choice in a row that detaching wins (``settle=4``) and stays detached to its end. Once a few calls have
    brought the long-run expectation down too, the verdict carries: later calls start detached, except the calls
    that look again, attached, with gaps of 1, 2, 4 and then 8 calls between them."""
    sizes = (1, 15, 63)
    controller = AutoBudget(sizes, batch=4, probe=2, cold=0)  # every time counts (no cold runs here)
    cost = {0: 0.8, 1: 1.0, 15: 1.1, 63: 1.3, DETACHED: 0.5}

    def call(rounds: int) -> list[int]:
        chosen, pending = [], [controller.next_size()]
        for i in range(rounds):
            pending.append(controller.next_size(final=i >= rounds - 3))
            size = pending.pop(0)
            controller.observe(size, [[0.5, 2.0, 3.0]] if size > 0 else None, [0], cost[size])
            chosen.append(size)
        return chosen

    first = call(40)
    assert DETACHED not in first[:-4] and first[-1] == DETACHED, first
    assert [d["reason"] for d in controller.decisions if d["size"] == DETACHED][0] == "explore"
    controller.resume()
    second = call(40)
    reasons = [d["reason"] for d in controller.decisions]
    at = reasons.index("detach")
    assert reasons[at - 3 : at] == ["model"] * 3 and set(second[at:]) == {DETACHED}, (reasons, second)
    starts = []
    for _ in range(30):
        controller.resume()
        starts.append(call(20)[0] != DETACHED)
    # the verdict carries once the long-run expectation agrees that trees lose (a few calls of this drafter)
    first = starts.index(False)
    assert first <= 4, starts
    looked = [i - first for i, attached in enumerate(starts) if attached and i > first]
    assert looked[:4] == [1, 4, 9, 18], (looked, starts)  # 1, then 2, 4, 8 detached calls between two looks
    assert controller.call_gap == 8, controller.call_gap


def test_a_detach_on_one_poorly_drafted_prompt_does_not_carry_to_the_next_call():
    """Trees win on the usual prompts (15 nodes: 4.0 tokens per 1.2 ms against 1 per 0.5 ms detached); then one
    call's prompt drafts poorly (the drafter expects, and the target accepts, almost nothing), so that call
    detaches. Its verdict does not hold at the long-run expectations, so the next call starts attached and runs
    trees again. A drafter that stays poor makes the verdict carry: then calls start detached."""
    sizes = (1, 15, 63)
    good, poor = [0.9, 3.0, 3.4], [0.02, 0.05, 0.06]
    cost = {0: 0.8, 1: 1.0, 15: 1.2, 63: 2.0, DETACHED: 0.5}
    controller = AutoBudget(sizes, batch=1, probe=2)

    def call(rounds: int, expected: list[float]) -> list[int]:
        chosen, pending = [], [controller.next_size()]
        for i in range(rounds):
            pending.append(controller.next_size(final=i >= rounds - 3))
            size = pending.pop(0)
            accepted = round(expected[sizes.index(size)]) if size > 0 else 0
            controller.observe(size, [expected] if size > 0 else None, [accepted], cost[size])
            chosen.append(size)
        return chosen

    for _ in range(4):  # the usual prompts: trees win, and the detached round is measured on the calls' ends
        assert call(40, good)[-10:-3] == [15] * 7
        controller.resume()
    hard = call(40, poor)
    reasons = [d["reason"] for d in controller.decisions]
    assert "detach" in reasons and hard[-1] == DETACHED, (reasons, hard)
    (verdict,) = [d for d in controller.decisions if d["reason"] == "detach"]
    assert verdict["carries"] is False, verdict
    controller.resume()
    after = call(40, good)
    assert after[0] != DETACHED and after[-10:-3] == [15] * 7, after
    # a drafter that stays poor: the long-run expectation falls, a verdict carries, and calls start detached
    starts = []
    for _ in range(12):
        controller.resume()
        starts.append(call(40, poor)[0])
    assert starts[:2].count(DETACHED) == 0 and starts[-6:].count(DETACHED) >= 3, starts


def test_a_call_after_a_poorly_drafted_one_opens_with_trees():
    """The fed plain round costs about what the detached one does (0.52 against 0.5 ms), so after a call whose
    drafts were poor, that call's last expectations would make the next call open with plain rounds (which propose
    nothing) until a probe. Each call not detached by a verdict that carries starts from the long-run
    expectations instead: the next call's first model choice is a tree."""
    sizes = (1, 15, 63)
    good, poor = [0.9, 3.0, 3.4], [0.02, 0.05, 0.06]
    cost = {0: 0.52, 1: 1.0, 15: 1.2, 63: 2.0, DETACHED: 0.5}
    controller = AutoBudget(sizes, batch=1, cold=0)

    def call(rounds: int, expected: list[float]) -> list[tuple[int, str]]:
        pending = [controller.next_size()]
        for i in range(rounds):
            pending.append(controller.next_size(final=i >= rounds - 3))
            size = pending.pop(0)
            accepted = round(expected[sizes.index(size)]) if size > 0 else 0
            controller.observe(size, [expected] if size > 0 else None, [accepted], cost[size])
        logged = _logged(controller)
        controller.resume()
        return logged

    for _ in range(6):
        call(40, good)
    assert ("detach" in {r for _, r in call(40, poor)}) and not controller.start_detached
    after = call(40, good)
    first = next(size for size, reason in after if reason == "model")
    assert first == 15, after


def test_a_batch_is_weighed_by_its_slowest_row():
    """Two rows: one drafts well (3 accepted per round of 15 nodes), one poorly (0.2). Summed over the rows a tree
    round commits 5.2 tokens per 1.2 ms (4.3 per ms) against 2 per 0.5 ms detached (4.0): trees. But the batch
    runs until its slowest row is done: that row commits 1 + 0.9 per round (its expectation shrunk halfway to the
    rows' mean 1.6), so 200 tokens take 100 / 1.9 rounds of 1.2 ms (3.2 tokens per ms) against 100 rounds of 0.5
    ms detached (4.0): the controller detaches (``finish=True``), and stays on trees with ``finish=False``."""
    cost = {0: 0.9, 15: 1.2, DETACHED: 0.5}

    def second_call(controller: AutoBudget) -> list[int]:
        for call in range(2):
            left = {0: 100, 1: 100}
            pending = [controller.next_size(left)]
            for i in range(30):
                pending.append(controller.next_size(left, final=call == 0 and i >= 27))
                size = pending.pop(0)
                expected = [[3.0], [0.2]] if size > 0 else None
                controller.observe(size, expected, [3.0, 0.2] if size > 0 else [0, 0], cost[size], rows=[0, 1])
                left = {0: left[0] - 1, 1: left[1] - 1}  # the rows' remaining tokens (equal here)
            if call == 0:
                controller.resume()
        return [d["size"] for d in controller.decisions]

    assert second_call(AutoBudget((15,), batch=2, cold=0, check=0))[-10:] == [DETACHED] * 10
    assert DETACHED not in second_call(AutoBudget((15,), batch=2, cold=0, check=0, finish=False))


def test_a_round_that_captures_or_replays_its_graph_first_is_not_timed():
    """A launch that captures its round's graph (warm-up runs and the capture) or replays it for the first time (the
    replay also uploads it) does not run at its usual cost, so the adaptive loop is told nothing of its time: each
    span bucket has graphs of its own, and an option priced by such a run would be chosen against for the call.
    Graphs are stood in for on the CPU by a replay that counts, around the round's own eager run."""
    from specdec.engine import Engine
    from specdec.runtime import Captured
    from specdec.target import TargetModel

    calls = []
    cap = Captured(lambda: calls.append(1), device=torch.device("cpu"), graph=False)
    assert cap.warm  # called eagerly: every call is as usual

    class Graph:
        def replay(self):
            calls.append(2)

    cap.use_graph, cap.graph = True, Graph()
    assert not cap.warm
    cap()
    assert cap.warm and cap.replays == 1 and calls == [2]

    target = tiny_model("qwen3", scale=2.0)
    drafter = sharp_drafter(target)
    ids = prompts(1, seed=3)[0][None]
    specdec.generate(target, ids, drafter=drafter, tree=specdec.DDTree(budget=6), max_new_tokens=8)
    engine = Engine.for_target(TargetModel.wrap(target), capacity=1)
    rnd = next(r for r in engine._rounds.values() if r.drafter is drafter)
    eager = rnd.captured

    class PretendGraph:  # the round's eager run, counted as replays of a captured graph
        use_graph, replays = True, 0
        warm = property(lambda self: self.replays > 0)

        def __call__(self):
            eager()
            self.replays += 1

    rnd.captured = PretendGraph()
    try:
        times = []
        with torch.no_grad():  # as generate runs its rounds
            for _ in range(3):
                ticket = rnd.launch(None)
                rnd.read(ticket)
                times.append(rnd.elapsed(ticket))
    finally:
        rnd.captured = eager
    assert times[0] is None and all(t is not None and t > 0 for t in times[1:]), times


def test_the_wall_clock_times_a_round_from_the_read_before_it(monkeypatch):
    """``DDTree(budget="auto", clock="wall")`` prices each round by the host time between the read of the round
    before it and its own read, each launch's host time moved to the round it launched (on the CPU a launch runs its
    round). The host clock is replaced by one whose n-th reading is ``n (n + 1) / 2`` ms and launch j (from 0) is
    said to take ``(j + 1) / 4`` ms, so every wall time is worked out here from the readings alone. The call's
    first round (the prefill ran before it) and the rounds around a launch that is not warm (its own and the one
    read while it was launched ahead) are not timed."""
    import importlib

    from specdec.engine import Engine, Round
    from specdec.target import TargetModel

    readings, launches = [], []  # launches: (the clock readings before it, its host ms)

    def clock():
        readings.append(len(readings) + 1)
        n = readings[-1]
        return n * (n + 1) / 2 / 1e3

    launch = Round.launch

    def launch_told(self, *args, **kwargs):  # launch 5 runs as a capture's would: not warm
        slot = launch(self, *args, **kwargs)
        self.launch_ms[slot] = (len(launches) + 1) / 4
        launches.append((len(readings), self.launch_ms[slot]))
        if len(launches) == 6:
            self.warm[slot] = False
        return slot

    monkeypatch.setattr(importlib.import_module("specdec.generate"), "_now", clock)
    monkeypatch.setattr(Round, "launch", launch_told)
    target = tiny_model("llama", scale=2.0)
    drafter = sharp_drafter(target)
    ids = prompts(1, seed=2)[0][None]
    tree = specdec.DDTree(budget="auto", topk=3, sizes=(2, 6), clock="wall")
    out = specdec.generate(target, ids, drafter=drafter, tree=tree, max_new_tokens=64)
    walls, rounds = out.stats.round_wall_ms, len(out.stats.budgets)
    assert len(readings) == 2 * rounds and len(walls) == rounds >= 8
    # round k (from 1) is launch k - 1; its read waits between readings 2k - 1 and 2k, and the launches made
    # after reading 2k - 2 fall in its interval
    want = [None] * rounds
    for k in range(2, rounds + 1):
        if k not in (5, 6):
            between = sum(ms for seen, ms in launches if seen == 2 * k - 2)
            want[k - 1] = (2 * k) * (2 * k + 1) / 2 - (2 * k - 2) * (2 * k - 1) / 2 - between + launches[k - 1][1]
    assert walls == pytest.approx(want), walls
    assert out.stats.round_wait_ms == pytest.approx([2.0 * k for k in range(1, rounds + 1)])
    assert out.stats.round_launch_ms == pytest.approx([ms for _, ms in launches[:rounds]])
    assert out.stats.budget_ms == walls  # what the controller was told
    engine = Engine.for_target(TargetModel.wrap(target), capacity=1)
    ctrl = engine._controllers[(id(drafter), tree)]
    # each option's recent times are the wall times of its own last timed rounds, in order
    for size, times in ctrl.times.items():
        own = [w for b, w in zip(out.stats.budgets, want, strict=True) if b == size and w is not None]
        assert times and times == pytest.approx(own[-len(times) :]), (size, times, own)

    monkeypatch.setattr(Round, "launch", launch)
    device = specdec.DDTree(budget="auto", topk=3, sizes=(2, 6))
    out = specdec.generate(target, ids, drafter=drafter, tree=device, max_new_tokens=64)
    # the device clock (on the CPU: each launch's own wall time) is what it is told; the wall times are still kept
    timed = [(t, w) for t, w in zip(out.stats.budget_ms, out.stats.round_wall_ms, strict=True) if t and w]
    assert timed and all(t != w for t, w in timed), timed


def test_the_clock_is_checked():
    with pytest.raises(ValueError, match=r"clock='gpu': pass 'device'.*or 'wall'"):
        specdec.DDTree(budget="auto", clock="gpu")
    with pytest.raises(ValueError, match="clock=1"):
        AutoBudget((3, 15), 1, clock=1)
    assert "clock='wall'" in repr(specdec.DDTree(budget="auto", clock="wall"))
    assert AutoBudget((3, 15), 1).clock == "device"
    assert specdec.DDTree(budget="auto", clock="wall").controller(2).clock == "wall"
    with pytest.raises(ValueError, match="lookahead must be True or False"):
        specdec.DDTree(budget="auto", lookahead="no")
    look = specdec.DDTree(budget="auto", sizes=(3, 15, 31), lookahead=True)
    assert "lookahead=True" in repr(look) and look.at(15).expect_upto == 31 and look.at(31).expect_upto == 31
    assert specdec.DDTree(budget="auto", sizes=(3, 15, 31)).at(15).expect_upto == 15
