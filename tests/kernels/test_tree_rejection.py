"""``tree_rejection``: the Triton round of recursive rejection sampling (``tree_rejection_round``: the setup and the
sibling-rank loop in one launch), interpreter on CPU and compiled on GPU, equals its torch reference, directly and
through ``recursive_rejection``.

The reference itself is held to the one-slot-at-a-time definition by
``tests/verify/test_multidraft.py::test_rank_by_rank_equals_the_one_slot_at_a_time_definition`` (through
``recursive_rejection``, which calls the round's dispatch); the default tier here checks the dispatch: its argument
refusals (and the Triton wrapper's block sizes), the reference on CPU (a round with no residual mass keeps ``r =
p``) and the ``Backends`` field reaching it.

The interpreted comparisons (the ``interpreter`` tier) run in one subprocess with ``TRITON_INTERPRET=1``, as in
``test_tree_accept.py``: this file, run as a script, reads the rounds the tests wrote (and the round's arguments,
captured from ``recursive_rejection``'s call), runs the Triton round with ``torch.empty`` poisoned, and saves the
outputs for the tests here to compare with the reference: ``nxt`` exactly, ``r`` to 1e-12 (the residual mass is
summed in another order), and the accepted path, its length and tokens exactly. The round runs with the tree's
stated ``max_children`` and with the other bound (None, ``K = S - 1``, or the tree's width), with the default
vocabulary block and, at V = 1500, with blocks of 256 (six blocks), and a third of the rounds also with the setup
scanning the slots in blocks of 4; then a round where every drawable child is rejected with no residual mass (``r``
stays ``p``), and ``impl="auto"`` under the interpreter (Triton). Rounds: random trees of at most ``K`` children per
node (duplicate siblings, padding, ragged sizes), a draft with a cut support, a target close to it (deep accepts),
both replacement modes, ``B`` in {1, 3}, ``K`` in {1, 3, 8}, ``V`` in {8, 1500}, every other round with
``max_children`` None.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from unittest import mock

import pytest
import torch
from kernel_harness import capture_without_host_reads, interpreted_outputs, poison_empty

import specdec.verify.multidraft as multidraft
from specdec.kernels.tree_rejection import round_setup, tree_rejection_round, tree_rejection_round_reference
from specdec.types import DeviceTree
from specdec.verify.draws import uniforms

POISON = -987654321  # what torch.empty's integer outputs hold in the interpreter process until written
ROUND_ARG_NAMES = ("tree_tokens", "tree_parents", "tree_depth", "tree_valid", "p", "q", "test", "max_children",
                   "replacement")  # fmt: skip
SMALL_BLOCK = 256  # the interpreted rounds at V = 1500 also run with this vocabulary block (six blocks)
SMALL_SLOT_BLOCK = 4  # a third of the interpreted rounds also scan the slots in blocks of 4


# --- rounds -------------------------------------------------------------------------------------------------------


def random_round(gen: torch.Generator, batch: int, width: int, vocab: int, replacement: bool,
                 slots: int | None = None) -> dict:  # fmt: skip
    """A batch of random trees whose nodes have at most ``width`` children (``max_children = width``; some nodes
    fill all ``width`` ranks), up to 4 levels deep, with duplicate siblings (tokens from a pool of 6), padding and
    ragged sizes; a target ``p`` and, per node, the draft ``q`` it was drawn from: its parent's ``p`` perturbed
    (deep accepts) with a cut support (tokens drafted there are no draws)."""
    if slots is None:
        slots = int(torch.randint(max(2, width), 2 * width + 8, (1,), generator=gen))
    depth = 4
    pool = torch.randperm(vocab, generator=gen)[:6]
    tokens = pool[torch.randint(len(pool), (batch, slots), generator=gen)]
    parents = torch.full((batch, slots), -1)
    depths = torch.zeros(batch, slots, dtype=torch.long)
    sizes = torch.randint(1, slots + 1, (batch,), generator=gen)
    sizes[0] = slots  # one row without padding (where the tree fills the slots)
    for b in range(batch):
        kids = [0] * slots
        for j in range(1, int(sizes[b])):
            eligible = [i for i in range(j) if depths[b, i] < depth and kids[i] < width]
            if not eligible:  # a full tree (K = 1: a chain of depth + 1 nodes)
                sizes[b] = j
                break
            first = float(torch.rand((), generator=gen)) < 0.5
            pick = 0 if first else int(torch.randint(len(eligible), (1,), generator=gen))
            parents[b, j] = eligible[pick]  # half the time the first open node: wide nodes
            depths[b, j] = depths[b, parents[b, j]] + 1
            kids[eligible[pick]] += 1
    valid = torch.arange(slots) < sizes[:, None]
    tokens = torch.where(valid, tokens, tokens[:, :1])
    logits = torch.randn(batch, slots, vocab, generator=gen, dtype=torch.float64)
    p = torch.softmax(logits, -1)
    spread = 0.3 + 1.2 * float(torch.rand((), generator=gen))
    q_logits = logits + spread * torch.randn(batch, slots, vocab, generator=gen, dtype=torch.float64)
    q_logits[..., : max(vocab // 4, 1)] = -torch.inf
    q = torch.softmax(q_logits, -1).gather(1, parents.clamp(min=0)[..., None].expand(-1, -1, vocab))  # per parent
    q = q * (valid & (depths > 0))[..., None]
    noise = torch.rand(batch, slots, 8, generator=gen)
    return dict(tokens=tokens, parents=parents, depth=depths, valid=valid, num_nodes=sizes, max_children=width,
                width=width, p=p, q=q, noise=noise, max_depth=depth, replacement=replacement)  # fmt: skip


def _tree(case: dict, device: str = "cpu") -> DeviceTree:
    fields = [case[k].to(device) for k in ("tokens", "parents", "depth", "valid", "num_nodes")]
    return DeviceTree(*fields, max_children=case["max_children"])


def run_round(case: dict, impl: str, device: str = "cpu"):
    """``recursive_rejection`` on the round with ``tree_rejection_round`` forced to ``impl``; returns the
    ``(path, num_path, tokens)`` and the round's call: its arguments (``ROUND_ARG_NAMES``, on the CPU), the tree's
    ``width`` and the device they were on."""
    calls = []

    def spy(*args, **kwargs):
        calls.append(dict(zip(ROUND_ARG_NAMES, args, strict=True)))
        return tree_rejection_round(*args, **kwargs)

    p, q, noise = (case[k].to(device) for k in ("p", "q", "noise"))
    with (mock.patch.object(multidraft, "tree_rejection_round", spy),
          mock.patch.object(multidraft, "_REJECTION_IMPL", impl)):  # fmt: skip
        out = multidraft.recursive_rejection(_tree(case, device), p, q, noise, case["max_depth"], case["replacement"])
    assert len(calls) == 1
    call = {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in calls[0].items()}
    call = {**call, "width": case["width"], "device": calls[0]["p"].device.type}
    return tuple(t.cpu() for t in (out.path, out.num_path, out.tokens)), call


def round_args(call: dict, device: str = "cpu", max_children="stated") -> list:
    """The round's arguments (``max_children`` as stated, or the value given)."""
    c = {**call, **({} if max_children == "stated" else {"max_children": max_children})}
    return [v.to(device) if isinstance(v, torch.Tensor) else v for v in (c[k] for k in ROUND_ARG_NAMES)]


def round_args_f32(call: dict) -> list:
    """The round's arguments with ``p`` and ``q`` in float32, the dtype the rules pass (the uniforms stay float64)."""
    return [v.float() if name in ("p", "q") else v for name, v in zip(ROUND_ARG_NAMES, round_args(call), strict=True)]


def float64_test(args: list) -> list:
    """``args`` (``ROUND_ARG_NAMES``) with a ``[B, S, 2]`` float32 ``test`` (the halves the rules pass) made into its
    float64 uniforms by ``draws.uniforms``, as the reference takes them."""
    return [uniforms(a, 1)[..., 0] if k == "test" and a.dim() == 3 else a
            for k, a in zip(ROUND_ARG_NAMES, args, strict=True)]  # fmt: skip


def reference_round(*args):
    """The reference round on the arguments (a ``[B, S, 2]`` ``test`` made float64 first)."""
    return tree_rejection_round_reference(*float64_test(list(args)))


DEPTH_ROWS = 3  # the per-depth q of the by-depth rounds: depths 4 (and deeper) read the last row


def by_depth_args(call: dict, seed: int) -> tuple[list, torch.Tensor]:
    """The round's arguments with ``q`` replaced by a random per-depth ``q [B, DEPTH_ROWS, V]`` (a cut support, as
    the rounds') and ``test`` a strided column of a wider tensor, for ``q_by_depth=True``; and the ``[B, S, V]`` q
    each slot reads, built slot by slot (row ``min(max(depth - 1, 0), DEPTH_ROWS - 1)``)."""
    gen = torch.Generator().manual_seed(seed)
    args = dict(zip(ROUND_ARG_NAMES, round_args(call), strict=True))
    batch, slots, vocab = args["p"].shape
    logits = torch.randn(batch, DEPTH_ROWS, vocab, generator=gen, dtype=torch.float64)
    logits[..., : max(vocab // 4, 1)] = -torch.inf
    rows = torch.softmax(logits, -1)
    wide = torch.rand(batch, slots, 3, generator=gen, dtype=torch.float64)
    wide[..., 1] = float64_test([args[k] for k in ROUND_ARG_NAMES])[ROUND_ARG_NAMES.index("test")]
    slot_q = torch.empty(batch, slots, vocab, dtype=torch.float64)
    for b in range(batch):
        for s in range(slots):
            slot_q[b, s] = rows[b, min(max(int(args["tree_depth"][b, s]) - 1, 0), DEPTH_ROWS - 1)]
    args.update(q=rows, test=wide[..., 1])
    return [args[k] for k in ROUND_ARG_NAMES], slot_q


def check_round(call: dict, got: tuple[torch.Tensor, torch.Tensor], max_children="stated") -> None:
    """``got = (r, nxt)`` equals the round's reference: ``nxt`` exactly, ``r`` to 1e-12."""
    want_r, want_nxt = reference_round(*round_args(call, max_children=max_children))
    r, nxt = (t.cpu() for t in got)
    assert nxt.dtype == torch.long and r.dtype == torch.float64 and r.shape == want_r.shape
    assert torch.equal(nxt, want_nxt)
    assert not r.isnan().any()
    assert torch.allclose(r, want_r, rtol=1e-12, atol=1e-15), (r - want_r).abs().max()


def other_bound(call: dict):
    """The round's other ``max_children``: None where the tree states one, else the tree's width."""
    return None if call["max_children"] is not None else call["width"]


def rounds(seed: int = 0, per_setting: int = 2) -> list[dict]:
    """``per_setting`` random rounds for each replacement mode, B in {1, 3}, K in {1, 3, 8}, V in {8, 1500}; every
    other round's tree states no ``max_children`` (``K = S - 1``)."""
    gen = torch.Generator().manual_seed(seed)
    cases = [random_round(gen, batch, width, vocab, replacement)
             for replacement in (True, False) for batch in (1, 3) for width in (1, 3, 8) for vocab in (8, 1500)
             for _ in range(per_setting)]  # fmt: skip
    for case in cases[1::2]:
        case["max_children"] = None
    return cases


def mass_zero_case() -> dict:
    """A round (with replacement) where every drawable child is rejected and leaves no residual mass (each child's
    ``q`` twice its parent's ``p``, every uniform 0.9): ``r`` must stay ``p``. The root has three children, the
    first of them one."""
    gen = torch.Generator().manual_seed(9)
    batch, slots, vocab = 2, 5, 40
    p = torch.softmax(torch.randn(batch, slots, vocab, generator=gen, dtype=torch.float64), -1)
    parents = torch.tensor([-1, 0, 0, 0, 1]).expand(batch, -1).contiguous()
    return dict(tree_tokens=torch.randint(vocab, (batch, slots), generator=gen), tree_parents=parents,
                tree_depth=torch.tensor([0, 1, 1, 1, 2]).expand(batch, -1).contiguous(),
                tree_valid=torch.ones(batch, slots, dtype=torch.bool), p=p, q=2.0 * p[:, [0, 0, 0, 0, 1]],
                test=torch.full((batch, slots), 0.9, dtype=torch.float64), max_children=3, replacement=True,
                width=3)  # fmt: skip


def reference_rounds(cases: list[dict]) -> list[tuple]:
    return [run_round(case, "torch") for case in cases]


def assert_rounds_exercise_the_loop(expected: list[tuple]) -> None:
    """The rounds accept deep paths and reject first children; rejections reduce ``r``; with ``K > 1``, later
    ranks are accepted after earlier ones were rejected."""
    lengths = torch.cat([out[1].reshape(-1) for out, _ in expected])
    assert (lengths >= 3).any() and (lengths == 1).any()
    later = reduced = 0
    for _, call in expected:
        args = float64_test(round_args(call))
        r, nxt = reference_round(*args)
        table = round_setup(*(a for name, a in zip(ROUND_ARG_NAMES, args, strict=True) if name != "p"))["table"]
        reduced += int((r != call["p"]).any(-1).sum())
        later += int((nxt[..., None] == table[..., 1:]).any(-1).sum())
    assert reduced > 0 and later > 0


# --- the dispatcher (default tier) --------------------------------------------------------------------------------


def _valid_round_args() -> dict:
    case = random_round(torch.Generator().manual_seed(4), 2, 3, 40, False, slots=7)
    return dict(tree_tokens=case["tokens"], tree_parents=case["parents"], tree_depth=case["depth"],
                tree_valid=case["valid"], p=case["p"], q=case["q"], test=torch.rand(2, 7, dtype=torch.float64),
                max_children=3, replacement=False)  # fmt: skip


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (dict(p=torch.zeros(2, 7, 40, dtype=torch.float16)), "p must be"),
        (dict(p=torch.zeros(7, 40, dtype=torch.float64)), "p must be"),
        (dict(p=torch.zeros(2, 7, 0, dtype=torch.float64)), "p must be"),
        (dict(q=torch.zeros(2, 7, 41, dtype=torch.float64)), "q must be"),
        (dict(q=torch.zeros(2, 7, 40)), "q must be"),  # float32 q beside float64 p
        (dict(p=torch.zeros(2, 7, 40)), "q must be"),  # float32 p beside float64 q
        (dict(tree_tokens=torch.zeros(2, 7, dtype=torch.int32)), "tree_tokens must be"),
        (dict(tree_parents=torch.zeros(2, 6, dtype=torch.long)), "tree_parents must be"),
        (dict(tree_depth=torch.zeros(2, 7)), "tree_depth must be"),
        (dict(tree_valid=torch.zeros(2, 7, dtype=torch.long)), "tree_valid must be"),
        (dict(tree_valid=torch.zeros(2, 8, dtype=torch.bool)), "tree_valid must be"),
        (dict(test=torch.zeros(2, 7)), "test must be"),
        (dict(test=torch.zeros(2, 7, 2, dtype=torch.float64)), "test must be"),
        (dict(test=torch.zeros(2, 7, 3)), "test must be"),
        (dict(max_children=0), "max_children"),
        (dict(max_children=2.0), "max_children"),
        (dict(replacement=0), "replacement"),
        (dict(test=torch.zeros(2, 7, dtype=torch.float64, device="meta")), "test is on meta"),
        (dict(tree_tokens=torch.zeros(2, 7, dtype=torch.long, device="meta")), "tree_tokens is on meta"),
    ],
)
def test_bad_round_arguments_are_refused(change, match):
    args = {**_valid_round_args(), **change}
    with pytest.raises(ValueError, match=match):
        tree_rejection_round(*(args[k] for k in ROUND_ARG_NAMES))


@pytest.mark.parametrize(("change", "match"), [(dict(block=3), "block=3"), (dict(slot_block=6), "slot_block=6")])
def test_triton_round_refuses_blocks_not_powers_of_two(change, match):
    pytest.importorskip("triton")
    from specdec.kernels.tree_rejection.triton import tree_rejection_round_triton

    args = _valid_round_args()
    with pytest.raises(ValueError, match=match):  # refused before any launch: no device needed
        tree_rejection_round_triton(*(args[k] for k in ROUND_ARG_NAMES), **change)


def test_round_auto_is_the_reference_on_cpu_and_triton_is_refused():
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("checks the CPU dispatch without the interpreter")
    args = [_valid_round_args()[k] for k in ROUND_ARG_NAMES]
    r, nxt = tree_rejection_round(*args)
    want = reference_round(*args)
    assert torch.equal(r, want[0]) and torch.equal(nxt, want[1])
    with pytest.raises(ValueError, match="GPU"):
        tree_rejection_round(*args, impl="triton")
    with pytest.raises(ValueError, match="impl"):
        tree_rejection_round(*args, impl="reference")
    zero = mass_zero_case()
    r, nxt = tree_rejection_round(*round_args(zero))
    assert torch.equal(r, zero["p"])  # no residual mass: r stays p
    assert torch.equal(nxt, torch.arange(5).expand(2, -1))  # nothing accepted


def test_round_by_depth_equals_the_round_over_each_slots_row():
    # q_by_depth=True reads each slot's row of a per-depth q: the same round as the [B, S, V] q built slot by slot
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("checks the CPU dispatch without the interpreter")
    _, call = run_round(random_round(torch.Generator().manual_seed(22), 3, 3, 40, False), "torch")
    args, slot_q = by_depth_args(call, 0)
    assert int(call["tree_depth"].max()) > DEPTH_ROWS  # the deepest nodes read the last row (the clamp)
    r, nxt = tree_rejection_round(*args, q_by_depth=True)
    want = reference_round(*[slot_q if k == "q" else a for k, a in zip(ROUND_ARG_NAMES, args,
                                                                                      strict=True)])  # fmt: skip
    assert torch.equal(r, want[0]) and torch.equal(nxt, want[1])


@pytest.mark.parametrize(
    ("q", "match"),
    [
        (torch.zeros(2, 3, 41, dtype=torch.float64), "q_by_depth=True: q must be"),
        (torch.zeros(2, 0, 40, dtype=torch.float64), "q_by_depth=True: q must be"),
        (torch.zeros(1, 3, 40, dtype=torch.float64), "q_by_depth=True: q must be"),
        (torch.zeros(2, 3, 40), "q_by_depth=True: q must be"),
    ],
)
def test_bad_by_depth_q_is_refused(q, match):
    args = {**_valid_round_args(), "q": q}
    with pytest.raises(ValueError, match=match):
        tree_rejection_round(*(args[k] for k in ROUND_ARG_NAMES), q_by_depth=True)
    with pytest.raises(ValueError, match="q_by_depth=1"):
        tree_rejection_round(*(_valid_round_args()[k] for k in ROUND_ARG_NAMES), q_by_depth=1)


def test_backends_field_reaches_the_dispatch():
    from specdec.backends import Backends, use

    with use(Backends(tree_rejection="torch")):
        assert multidraft._REJECTION_IMPL == "torch"
    with pytest.raises(ValueError, match="tree_rejection"):
        Backends(tree_rejection="cuda")


# --- Triton through the interpreter ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory) -> dict:
    pytest.importorskip("triton")
    cases = rounds()
    expected = reference_rounds(cases)
    calls = [{k: v for k, v in call.items() if k != "device"} for _, call in expected]
    data = {"cases": cases, "calls": calls, "mass_zero": mass_zero_case()}
    out = interpreted_outputs(__file__, tmp_path_factory.mktemp("tree_rejection"), data)
    return {**out, "expected": expected}


@pytest.mark.interpreter
def test_interpreted_round_equals_reference(interpreted):
    # the stated max_children (or None) and the other bound; at V = 1500 also with several vocabulary blocks
    assert_rounds_exercise_the_loop(interpreted["expected"])
    assert all(call["test"].shape[-1] == 2 and call["test"].dtype == torch.float32 for call in interpreted["calls"])
    small_blocks = 0
    for call, got, other, small in zip(interpreted["calls"], interpreted["round"], interpreted["round_other"],
                                       interpreted["round_small_block"], strict=True):  # fmt: skip
        check_round(call, got)
        check_round(call, other, other_bound(call))
        if small is not None:
            check_round(call, small)
            small_blocks += 1
    assert small_blocks == len(interpreted["calls"]) // 2
    for call, got in zip(interpreted["calls"][::3], interpreted["round_small_slot_block"], strict=True):
        check_round(call, got)  # the setup's scan over several blocks of slots


@pytest.mark.interpreter
def test_interpreted_float32_round_equals_float32_reference(interpreted):
    # the rules' dtype: p, q, r and the residual sums in float32 (default block, and blocks of 256 at V = 1500)
    count = 0
    for call, got, small in zip(interpreted["calls"], interpreted["round_f32"], interpreted["round_f32_small_block"],
                                strict=True):  # fmt: skip
        want_r, want_nxt = reference_round(*round_args_f32(call))
        for r, nxt in [got] + ([small] if small is not None else []):
            assert r.dtype == torch.float32 and torch.equal(nxt, want_nxt)
            assert torch.allclose(r, want_r, rtol=1e-5, atol=1e-9), (r - want_r).abs().max()
            count += 1
    assert count == len(interpreted["calls"]) * 3 // 2


@pytest.mark.interpreter
def test_interpreted_round_reads_each_slots_depth_row(interpreted):
    # q_by_depth=True (one q row per depth, read in place; test strided) against the reference over the [B, S, V]
    # q built slot by slot, float64 and float32
    for i, (call, got, got32) in enumerate(zip(interpreted["calls"], interpreted["round_by_depth"],
                                               interpreted["round_by_depth_f32"], strict=True)):  # fmt: skip
        args, slot_q = by_depth_args(call, i)
        want_r, want_nxt = reference_round(
            *[slot_q if k == "q" else a for k, a in zip(ROUND_ARG_NAMES, args, strict=True)])
        assert torch.equal(got[1], want_nxt)
        assert torch.allclose(got[0], want_r, rtol=1e-12, atol=1e-15), (got[0] - want_r).abs().max()
        want_r, want_nxt = reference_round(
            *[(slot_q if k == "q" else a).float() if k in ("p", "q") else a
              for k, a in zip(ROUND_ARG_NAMES, args, strict=True)])  # fmt: skip
        assert torch.equal(got32[1], want_nxt)
        assert torch.allclose(got32[0], want_r, rtol=1e-5, atol=1e-9), (got32[0] - want_r).abs().max()


@pytest.mark.interpreter
def test_interpreted_round_keeps_p_without_residual_mass(interpreted):
    zero, (r, nxt) = interpreted["mass_zero"], interpreted["mass_zero_out"]
    check_round(zero, (r, nxt))
    assert torch.equal(r, zero["p"]) and torch.equal(nxt, torch.arange(5).expand(2, -1))


@pytest.mark.interpreter
def test_interpreted_rounds_equal_reference_rounds(interpreted):
    # recursive_rejection with the kernel: the same accepted paths, lengths, tokens (and bonus) as with the reference
    for i, ((want, _), got) in enumerate(zip(interpreted["expected"], interpreted["rounds"], strict=True)):
        for name, a, b in zip(("path", "num_path", "tokens"), want, got, strict=True):
            assert torch.equal(a, b), (i, name)


@pytest.mark.interpreter
def test_interpreted_auto_dispatch(interpreted):
    assert interpreted["auto_impl"] == "triton"  # under TRITON_INTERPRET=1 "auto" runs Triton
    check_round(interpreted["calls"][0], interpreted["auto_out"])


def _run_interpreted(folder: Path) -> None:
    """Subprocess entry: the Triton outputs of the saved rounds through the interpreter, saved beside them."""
    from specdec.kernels.tree_rejection import triton as kernels

    data = torch.load(folder / "cases.pt")
    poison_empty(POISON)
    calls = data["calls"]
    out = {
        "round": [kernels.tree_rejection_round_triton(*round_args(call)) for call in calls],
        "round_other": [
            kernels.tree_rejection_round_triton(*round_args(call, max_children=other_bound(call))) for call in calls
        ],
        "round_small_block": [
            kernels.tree_rejection_round_triton(*round_args(call), block=SMALL_BLOCK)
            if call["p"].shape[-1] > SMALL_BLOCK
            else None
            for call in calls
        ],  # fmt: skip
        "round_small_slot_block": [
            kernels.tree_rejection_round_triton(*round_args(call), slot_block=SMALL_SLOT_BLOCK) for call in calls[::3]
        ],
        "round_f32": [kernels.tree_rejection_round_triton(*round_args_f32(call)) for call in calls],
        "round_f32_small_block": [
            kernels.tree_rejection_round_triton(*round_args_f32(call), block=SMALL_BLOCK)
            if call["p"].shape[-1] > SMALL_BLOCK
            else None
            for call in calls
        ],  # fmt: skip
        "round_by_depth": [
            kernels.tree_rejection_round_triton(*by_depth_args(call, i)[0], q_by_depth=True)
            for i, call in enumerate(calls)
        ],
        "round_by_depth_f32": [
            kernels.tree_rejection_round_triton(
                *[a.float() if k in ("p", "q") else a for k, a in zip(ROUND_ARG_NAMES, by_depth_args(call, i)[0],
                                                                       strict=True)], q_by_depth=True)
            for i, call in enumerate(calls)
        ],  # fmt: skip
        "rounds": [run_round(case, "triton")[0] for case in data["cases"]],
        "mass_zero_out": kernels.tree_rejection_round_triton(*round_args(data["mass_zero"])),
    }
    triton_round = kernels.tree_rejection_round_triton
    with mock.patch.object(kernels, "tree_rejection_round_triton", side_effect=triton_round) as spy:
        out["auto_out"] = tree_rejection_round(*round_args(calls[0]))
    out["auto_impl"] = "triton" if spy.call_count else "torch"
    torch.save(out, folder / "outputs.pt")


# --- compiled on CUDA ---------------------------------------------------------------------------------------------


def _needs_cuda() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")


@pytest.mark.gpu
@pytest.mark.parametrize("group", ["rounds-0", "rounds-1", "rounds-2", "rounds-3", "full-vocab"])
def test_compiled_equals_reference_on_cuda(group):
    # five groups; each compiles the kernel for new vocabulary blocks and dtypes (the tree's width is a loop bound,
    # not a compiled constant): 3-47 s per group on an H200 in the suite (78-228 s while the width was unrolled)
    _needs_cuda()
    if group.startswith("rounds"):
        cases = rounds(seed=1, per_setting=4)[int(group[-1]) :: 4]
    else:
        gen = torch.Generator().manual_seed(2)
        cases = [random_round(gen, batch, 8, 151936, replacement) for batch in (1, 3) for replacement in (True, False)]
    for case in cases:
        want, call = run_round(case, "torch")
        got, cuda_call = run_round(case, "triton", "cuda")
        for a, b in zip(want, got, strict=True):
            assert torch.equal(a, b)
        assert cuda_call["device"] == "cuda"
        args, slot_q = by_depth_args(call, 0)
        want = reference_round(*[slot_q if k == "q" else a
                                                for k, a in zip(ROUND_ARG_NAMES, args, strict=True)])  # fmt: skip
        got = tree_rejection_round(*[a.cuda() if isinstance(a, torch.Tensor) else a for a in args], q_by_depth=True,
                                   impl="triton")  # fmt: skip
        assert torch.equal(got[1].cpu(), want[1])
        assert torch.allclose(got[0].cpu(), want[0], rtol=1e-12, atol=1e-15)
        for bound in ("stated", other_bound(call)):
            check_round(call, tree_rejection_round(*round_args(call, "cuda", bound), impl="triton"), bound)
            check_round(call, tree_rejection_round(*round_args(call, "cuda", bound)), bound)  # auto: Triton on CUDA
            check_round(call, tree_rejection_round(*round_args(call, "cuda", bound), impl="torch"), bound)
    if group != "rounds-0":
        return
    zero = mass_zero_case()
    r, nxt = tree_rejection_round(*round_args(zero, "cuda"), impl="triton")
    check_round(zero, (r, nxt))
    assert torch.equal(r.cpu(), zero["p"])


@pytest.mark.gpu
@pytest.mark.parametrize("replacement", [True, False], ids=["with", "without"])
@pytest.mark.parametrize("bound", ["stated", None], ids=["stated", "none"])
def test_compiled_round_replays_in_a_cuda_graph(replacement, bound):
    # The fused round (setup and loop in one launch): one capture, new rounds' arguments copied in, replays.
    _needs_cuda()
    gen = torch.Generator().manual_seed(5)
    calls = [run_round(random_round(gen, 3, 8, 1500, replacement, slots=20), "torch")[1] for _ in range(8)]
    static = round_args(calls[0], "cuda", bound)
    graph, (r, nxt) = capture_without_host_reads(lambda: tree_rejection_round(*static, impl="triton"))
    for call in calls:
        for buffer, value in zip(static, round_args(call, max_children=bound), strict=True):
            if isinstance(buffer, torch.Tensor):
                buffer.copy_(value)
        graph.replay()
        check_round(call, (r.clone(), nxt.clone()), bound)


if __name__ == "__main__":
    _run_interpreted(Path(sys.argv[1]))
