"""``tree_traversal``: the Triton round of traversal verification (``traversal_round``: a setup launch and a walk
launch), interpreter on CPU and compiled on GPU, equals its torch reference, directly and through
``TraversalVerification``.

The reference is held to the rule's definition by ``tests/verify/test_traversal.py`` (HF's distributions, chi-square;
on a chain token for token ``block_verify``; the post-order against a host depth-first walk), which runs it through
the same dispatch. The default tier here checks the dispatch: its argument refusals (and the Triton wrapper's
block), the reference on CPU, the ``Backends`` field reaching it and the slot bound.

The interpreted comparisons (the ``interpreter`` tier) run in one subprocess with ``TRITON_INTERPRET=1``
(``kernel_harness.interpreted_outputs``): this file, run as a script, reads the rounds the tests wrote, runs the
Triton round with ``torch.empty`` poisoned, and saves the outputs for the tests here to compare with the reference:
the accepted path, its length and its tokens (the bonus included) exactly, and the end node's distribution (the
bonus's: a corrected target where the end node had a child rejected) to rounding. Rounds: random trees (wide and deep,
duplicate siblings, padding, ragged sizes), a draft ``q`` per parent with a cut support (some nodes no draw) and a
target close to it (deep accepts), both replacement modes, float64 and float32, ``B`` in {1, 3, 200}, ``V`` in {8, 1500}
(at 1500 also with blocks of 256: six blocks per pass), ``p`` and ``q`` as strided views; a round where no node
passes its test and every residual is 0 (the root keeps ``p``; the bonus is drawn from it); a bonus uniform exactly
at a boundary of the cumulative sum (HF's ``searchsorted(..., right=True)``); and ``impl="auto"`` under
the interpreter; and ``BlockVerification`` over sampled chains, which runs this round where it runs, against
``block_verify``. Three of the rounds hold 200 rows of 8 tokens each (one with a q of each node's own), so that the
rarer branches (a corrected target read by a later sibling's weight, a repeated sibling, a residual drawn from)
decide some outcomes.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from unittest import mock

import pytest
import torch
from kernel_harness import capture_without_host_reads, interpreted_outputs, poison_empty

import specdec
import specdec.verify.traversal as traversal
from specdec.kernels.tree_traversal import MAX_SLOTS, traversal_round, traversal_round_reference

POISON = -987654321  # what torch.empty's integer outputs hold in the interpreter process until written
ARG_NAMES = ("tokens", "parents", "depth", "valid", "p", "q", "test", "final", "max_depth", "replacement")
SMALL_BLOCK = 256  # the interpreted rounds at V = 1500 also run with this vocabulary block (six blocks)


# --- rounds -------------------------------------------------------------------------------------------------------


def random_round(gen: torch.Generator, batch: int, width: int, vocab: int, replacement: bool, dtype=torch.float64,
                 strided: bool = False, slots: int | None = None, own_q: bool = False) -> dict:  # fmt: skip
    """A batch of random trees whose nodes have at most ``width`` children, up to 5 levels deep, with duplicate
    siblings (tokens from a pool of 6), padding and ragged sizes; a target ``p`` and, per node, the draft ``q`` it
    was drawn from (its parent's: ``p`` perturbed, deep accepts) with a cut support (some nodes are no draw).
    ``own_q``: each node's q perturbed again and cut on a support of its own (siblings' q differ)."""
    if slots is None:
        slots = int(torch.randint(max(2, width), 2 * width + 10, (1,), generator=gen))
    deepest = 5
    pool = torch.randperm(vocab, generator=gen)[:6]
    tokens = pool[torch.randint(len(pool), (batch, slots), generator=gen)]
    parents = torch.full((batch, slots), -1)
    depth = torch.zeros(batch, slots, dtype=torch.long)
    sizes = torch.randint(1, slots + 1, (batch,), generator=gen)
    sizes[0] = slots
    for b in range(batch):
        kids = [0] * slots
        for j in range(1, int(sizes[b])):
            eligible = [i for i in range(j) if depth[b, i] < deepest and kids[i] < width]
            if not eligible:
                sizes[b] = j
                break
            deep = float(torch.rand((), generator=gen)) < 0.5
            pick = eligible[-1] if deep else eligible[int(torch.randint(len(eligible), (1,), generator=gen))]
            parents[b, j], depth[b, j] = pick, depth[b, pick] + 1
            kids[pick] += 1
    valid = torch.arange(slots) < sizes[:, None]
    tokens = torch.where(valid, tokens, tokens[:, :1])
    parents = torch.where(valid, parents, -1)
    depth = torch.where(valid, depth, 0)
    logits = torch.randn(batch, slots, vocab, generator=gen, dtype=torch.float64)
    p = torch.softmax(logits, -1)
    spread = 0.2 + 1.0 * float(torch.rand((), generator=gen))
    q_logits = logits + spread * torch.randn(batch, slots, vocab, generator=gen, dtype=torch.float64)
    q_logits[..., : max(vocab // 5, 1)] = -torch.inf
    q_logits = q_logits.gather(1, parents.clamp(min=0)[..., None].expand(-1, -1, vocab))
    if own_q:
        q_logits = q_logits + 0.5 * torch.randn(q_logits.shape, generator=gen, dtype=torch.float64)
        q_logits[torch.rand(q_logits.shape, generator=gen) < 0.3] = -torch.inf
        q_logits[..., 1] = 0.0  # never an empty support
    q = torch.softmax(q_logits, -1)
    p, q = p.to(dtype), q.to(dtype)
    if strided:  # views into wider storage, as a round's slices are
        p = torch.cat([p, p[..., :3]], -1)[..., :vocab]
        q = torch.cat([q[:, :1], q], 1)[:, 1:]
    return dict(tokens=tokens, parents=parents, depth=depth, valid=valid, p=p, q=q,
                test=torch.rand(batch, slots, generator=gen, dtype=torch.float64),
                final=torch.rand(batch, slots, generator=gen, dtype=torch.float64),
                max_depth=int(depth.max()), replacement=replacement)  # fmt: skip


def rounds(seed: int = 0) -> list[dict]:
    gen = torch.Generator().manual_seed(seed)
    cases = []
    for i, (width, vocab) in enumerate([(1, 8), (3, 8), (8, 8), (1, 1500), (3, 1500), (8, 1500)]):
        for replacement in (True, False):
            dtype = torch.float32 if (i + replacement) % 2 else torch.float64
            cases.append(random_round(gen, 1 + 2 * (i % 2), width, vocab, replacement, dtype, strided=i % 3 == 1))
    for replacement in (True, False):  # many small rows: each outcome's rarer branches (a repeated sibling
        cases.append(random_round(gen, 200, 4, 8, replacement, slots=14))  # accepted, a corrected P drawn from)
    cases.append(random_round(gen, 200, 4, 8, False, slots=14, own_q=True))  # siblings drawn from different q
    cases.append(random_round(gen, 2, 1, 40, False, slots=1))  # the root alone (max_depth 0): the bonus from p
    return cases


def boundary_case() -> dict:
    """The root alone with ``p = [1/4, 0, 1/4, 1/2]`` and bonus uniforms 1/4 and 1/2, each exactly at a boundary of
    the cumulative sum: HF's ``searchsorted(..., right=True)`` draws tokens 2 and 3; counting the entries strictly
    below ``u * total`` would draw 0 and 2."""
    case = random_round(torch.Generator().manual_seed(7), 2, 1, 4, False, slots=1)
    case["p"] = torch.tensor([0.25, 0.0, 0.25, 0.5]).expand(2, 1, 4).contiguous()
    case["q"] = torch.zeros(2, 1, 4)
    case["final"] = torch.tensor([[0.25], [0.5]], dtype=torch.float64)
    return case


def chain_round(gen: torch.Generator, batch: int, slots: int, vocab: int) -> dict:
    """Sampled chains as ``SampledChain`` builds them (slot i at depth i, ragged lengths), float32 ``p`` and each
    node's ``q`` (its parent's ``p`` perturbed), each token drawn from its ``q``, and the round's noise layout."""
    sizes = torch.randint(1, slots + 1, (batch,), generator=gen)
    sizes[0] = slots
    index = torch.arange(slots)
    valid = index < sizes[:, None]
    parents = torch.where(valid & (index > 0), index - 1, -1).expand(batch, -1).contiguous()
    depth = torch.where(valid, index, 0).expand(batch, -1).contiguous()
    logits = torch.randn(batch, slots, vocab, generator=gen)
    p = torch.softmax(logits, -1)
    q = torch.softmax(logits + 0.7 * torch.randn(logits.shape, generator=gen), -1).roll(1, 1)  # the parent's
    tokens = torch.multinomial(q.view(-1, vocab), 1, generator=gen).view(batch, slots)
    tokens = torch.where(valid, tokens, tokens[:, :1])
    return dict(tokens=tokens, parents=parents, depth=depth, valid=valid, num_nodes=sizes, p=p, q=q,
                noise=torch.rand(batch, slots, 4, generator=gen), max_depth=slots - 1)  # fmt: skip


def chain_tree(case: dict):
    from specdec.types import DeviceTree

    return DeviceTree(case["tokens"], case["parents"], case["depth"], case["valid"], case["num_nodes"], max_children=1)


def no_pass_case() -> dict:
    """Every node's uniform at 1 (no test passes) and each node's q its parent's p: every residual is 0, so the
    root keeps p and the bonus is drawn from it."""
    gen = torch.Generator().manual_seed(3)
    case = random_round(gen, 2, 3, 40, False, slots=9)
    case["q"] = case["p"].gather(1, case["parents"].clamp(min=0)[..., None].expand(-1, -1, 40))
    case["test"] = torch.ones_like(case["test"])
    return case


def args_of(case: dict, device: str = "cpu") -> list:
    return [case[k].to(device) if isinstance(case[k], torch.Tensor) else case[k] for k in ARG_NAMES]


def pair_case(case: dict, seed: int) -> dict:
    """``case`` with ``test`` and ``final`` as the float32 halves the rule passes (``noise[..., 0:2]`` and
    ``noise[..., 2:4]`` of fresh ``[B, S, 4]`` uniforms: strided views)."""
    noise = torch.rand(*case["test"].shape, 4, generator=torch.Generator().manual_seed(seed))
    return {**case, "test": noise[..., 0:2], "final": noise[..., 2:4]}


DEPTH_ROWS = 3  # the per-depth q of the by-depth rounds: depths 4 (and deeper) read the last row


def by_depth_cases(case: dict, seed: int) -> tuple[dict, dict]:
    """``case`` with ``q`` a random per-depth ``[B, DEPTH_ROWS, V]`` (a cut support), for ``q_by_depth=True``; and
    the same case with the ``[B, S, V]`` q each node reads, built node by node (row ``min(max(depth - 1, 0),
    DEPTH_ROWS - 1)``)."""
    gen = torch.Generator().manual_seed(seed)
    batch, slots, vocab = case["p"].shape
    logits = torch.randn(batch, DEPTH_ROWS, vocab, generator=gen, dtype=torch.float64)
    logits[..., : max(vocab // 4, 1)] = -torch.inf
    rows = torch.softmax(logits, -1).to(case["p"].dtype)
    slot_q = torch.empty(batch, slots, vocab, dtype=rows.dtype)
    for b in range(batch):
        for s in range(slots):
            slot_q[b, s] = rows[b, min(max(int(case["depth"][b, s]) - 1, 0), DEPTH_ROWS - 1)]
    return {**case, "q": rows}, {**case, "q": slot_q}


def halves_to_float64(u: torch.Tensor) -> torch.Tensor:
    """The float64 uniform of each float32 pair ``(a, b)``: ``a + b 2^-24`` (exact), below ``1 - 2^-52``."""
    return (u[..., 0].double() + u[..., 1].double() * 2.0**-24).clamp(max=1.0 - 2.0**-52)


def check(case: dict, got, target: torch.Tensor | None = None) -> None:
    """``got`` (path, num_path, tokens) equals the reference's; ``target`` (the end node's distribution), where
    given, to 1e-5 relative (float32; 1e-12 in float64): its sums run in another order."""
    want, want_target = traversal_round_reference(*args_of(case), return_target=True)
    for name, a, b in zip(("path", "num_path", "tokens"), want, got, strict=True):
        assert torch.equal(a, b.cpu()), (name, a, b)
    if target is not None:
        tol = 1e-5 if target.dtype == torch.float32 else 1e-12
        assert target.dtype == want_target.dtype
        assert torch.allclose(target.cpu(), want_target, rtol=tol, atol=tol * 1e-3), (target - want_target).abs().max()


def assert_rounds_exercise_the_walk(cases: list[dict]) -> None:
    """The rounds reach every outcome: nothing accepted, a depth-1 node, a deeper node, a full-depth path."""
    lengths = torch.cat([traversal_round_reference(*args_of(c)).num_path for c in cases])
    assert (lengths == 1).any() and (lengths == 2).any() and (lengths >= 4).any(), lengths


# --- the dispatch (default tier) ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (dict(p=torch.zeros(2, 7, 40, dtype=torch.float16)), "p must be"),
        (dict(p=torch.zeros(7, 40, dtype=torch.float64)), "p must be"),
        (dict(q=torch.zeros(2, 7, 41, dtype=torch.float64)), "q must be"),
        (dict(q=torch.zeros(2, 7, 40)), "q must be"),
        (dict(tokens=torch.zeros(2, 7, dtype=torch.int32)), "tokens must be"),
        (dict(parents=torch.zeros(2, 6, dtype=torch.long)), "parents must be"),
        (dict(depth=torch.zeros(2, 7)), "depth must be"),
        (dict(valid=torch.zeros(2, 7, dtype=torch.long)), "valid must be"),
        (dict(test=torch.zeros(2, 7)), "test must be"),
        (dict(final=torch.zeros(2, 8, dtype=torch.float64)), "final must be"),
        (dict(final=torch.zeros(2, 7, 2)), "final must be"),  # halves beside a float64 test
        (dict(test=torch.zeros(2, 7, 2), final=torch.zeros(2, 7, 2, dtype=torch.float64)), "final must be"),
        (dict(test=torch.zeros(2, 7, 3), final=torch.zeros(2, 7, 3)), "test must be"),
        (dict(max_depth=-1), "max_depth"),
        (dict(max_depth=True), "max_depth"),
        (dict(replacement=0), "replacement"),
        (dict(final=torch.zeros(2, 7, dtype=torch.float64, device="meta")), "final is on meta"),
    ],
)
def test_bad_round_arguments_are_refused(change, match):
    case = {**random_round(torch.Generator().manual_seed(0), 2, 3, 40, False, slots=7), **change}
    with pytest.raises(ValueError, match=match):
        traversal_round(*(case[k] for k in ARG_NAMES))


def test_triton_round_refuses_a_block_not_a_power_of_two():
    pytest.importorskip("triton")
    from specdec.kernels.tree_traversal.triton import traversal_round_triton

    case = random_round(torch.Generator().manual_seed(0), 2, 3, 40, False, slots=7)
    with pytest.raises(ValueError, match="block=3"):  # refused before any launch: no device needed
        traversal_round_triton(*args_of(case), block=3)


def test_round_auto_is_the_reference_on_cpu_and_triton_is_refused():
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("checks the CPU dispatch without the interpreter")
    case = random_round(torch.Generator().manual_seed(1), 3, 3, 40, False)
    check(case, traversal_round(*args_of(case)))
    with pytest.raises(ValueError, match="GPU"):
        traversal_round(*args_of(case), impl="triton")
    with pytest.raises(ValueError, match="impl"):
        traversal_round(*args_of(case), impl="reference")
    assert not traversal.kernel_runs(case["p"])  # so BlockVerification runs block_verify here


def test_reference_takes_the_uniforms_halves():
    # test / final as float32 halves: the round of their float64 uniforms
    for i, case in enumerate(rounds()[:6]):
        halves = pair_case(case, i)
        floats = {**case, "test": halves_to_float64(halves["test"]), "final": halves_to_float64(halves["final"])}
        want, want_target = traversal_round_reference(*args_of(floats), return_target=True)
        got, target = traversal_round(*args_of(halves)), traversal_round_reference(*args_of(halves),
                                                                                   return_target=True)[1]  # fmt: skip
        for a, b in zip(want, got, strict=True):
            assert torch.equal(a, b)
        assert torch.equal(want_target, target)


def test_round_by_depth_equals_the_round_over_each_nodes_row():
    # q_by_depth=True reads each node's row of a per-depth q: the round over the [B, S, V] q built node by node
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("checks the CPU dispatch without the interpreter")
    cases = rounds()
    assert max(int(c["depth"].max()) for c in cases) > DEPTH_ROWS  # some nodes read the clamped last row
    for i, case in enumerate(cases):
        by_depth, per_node = by_depth_cases(case, i)
        want = traversal_round_reference(*args_of(per_node))
        got = traversal_round(*args_of(by_depth), q_by_depth=True)
        for a, b in zip(want, got, strict=True):
            assert torch.equal(a, b)
    with pytest.raises(ValueError, match="q_by_depth=True: q must be"):
        traversal_round(*args_of({**cases[0], "q": cases[0]["q"][:, :, :-1]}), q_by_depth=True)


def test_more_slots_than_the_walk_holds_run_the_reference():
    case = random_round(torch.Generator().manual_seed(2), 1, 2, 8, True, slots=MAX_SLOTS + 1)
    with mock.patch("specdec.kernels.tree_traversal.pick_impl", return_value="torch") as pick:
        check(case, traversal_round(*args_of(case)))
    assert pick.call_args.kwargs["fits"] is False
    with pytest.raises(ValueError, match=f"at most {MAX_SLOTS} slots"):
        traversal_round(*args_of(case), impl="triton")


def test_backends_field_reaches_the_dispatch():
    from specdec.backends import Backends, use

    with use(Backends(tree_traversal="torch")):
        assert traversal._TRAVERSAL_IMPL == "torch"
    with pytest.raises(ValueError, match="tree_traversal"):
        Backends(tree_traversal="cuda")


# --- Triton through the interpreter ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory) -> dict:
    pytest.importorskip("triton")
    gen = torch.Generator().manual_seed(4)
    chains = [chain_round(gen, batch, slots, vocab) for batch, slots, vocab in [(64, 16, 8), (3, 9, 1500)]]
    data = {"cases": rounds(), "no_pass": no_pass_case(), "chains": chains, "boundary": boundary_case()}
    return interpreted_outputs(__file__, tmp_path_factory.mktemp("tree_traversal"), data)


@pytest.mark.interpreter
def test_interpreted_round_equals_reference(interpreted):
    assert_rounds_exercise_the_walk(interpreted["cases"])
    small_blocks = 0
    for case, got, small in zip(interpreted["cases"], interpreted["round"], interpreted["round_small_block"],
                                strict=True):  # fmt: skip
        check(case, got[:3], got[3])
        if small is not None:
            check(case, small[:3], small[3])
            small_blocks += 1
    assert small_blocks == 6


@pytest.mark.interpreter
def test_interpreted_round_over_the_uniforms_halves_equals_reference(interpreted):
    # test / final as the strided float32 halves the rule passes, made into float64 uniforms inside the kernel
    for i, (case, got) in enumerate(zip(interpreted["cases"], interpreted["round_pairs"], strict=True)):
        check(pair_case(case, i), got[:3], got[3])


@pytest.mark.interpreter
def test_interpreted_round_reads_each_nodes_depth_row(interpreted):
    # q_by_depth=True against the reference over the [B, S, V] q built node by node
    for i, (case, got) in enumerate(zip(interpreted["cases"], interpreted["round_by_depth"], strict=True)):
        check(by_depth_cases(case, i)[1], got[:3], got[3])


@pytest.mark.interpreter
def test_interpreted_round_without_a_passed_test_draws_from_the_roots_p(interpreted):
    case, got = interpreted["no_pass"], interpreted["no_pass_out"]
    check(case, got[:3], got[3])
    assert torch.equal(got[1], torch.ones(2, dtype=torch.long))  # num_path
    assert torch.equal(got[3], case["p"][:, 0])  # the root's p, never corrected


@pytest.mark.interpreter
def test_interpreted_bonus_at_a_boundary_is_hfs_draw(interpreted):
    case, got = interpreted["boundary"], interpreted["boundary_out"]
    check(case, got[:3], got[3])
    assert got[2][:, 0].tolist() == [2, 3]  # the bonus (tokens[:, 0]: no draft accepted at the root alone)


@pytest.mark.interpreter
def test_interpreted_rule_equals_the_reference_rule(interpreted):
    # TraversalVerification through the round's dispatch: the same paths, lengths and tokens as with the reference
    from specdec.backends import Backends, use

    for case, got in zip(interpreted["cases"], interpreted["rule"], strict=True):
        with use(Backends(tree_traversal="torch")):
            want = _rule_round(case)
        for name, a, b in zip(("path", "num_path", "tokens"), want, got, strict=True):
            assert torch.equal(a, b), name


@pytest.mark.interpreter
def test_interpreted_block_verification_is_block_verify(interpreted):
    # BlockVerification where the kernel runs: traversal's round over the chain, token for token block_verify's
    from specdec.verify.block import block_verify

    lengths = []
    for case, got in zip(interpreted["chains"], interpreted["block"], strict=True):
        want = block_verify(chain_tree(case), case["p"], case["q"], case["noise"], case["max_depth"])
        for name, a, b in zip(("path", "num_path", "tokens"), want, got, strict=True):
            assert torch.equal(a, b), name
        lengths.append(want.num_path)
    lengths = torch.cat(lengths)
    assert (lengths == 1).any() and (lengths >= 3).any(), lengths


@pytest.mark.interpreter
def test_interpreted_auto_dispatch(interpreted):
    assert interpreted["auto_impl"] == "triton"  # under TRITON_INTERPRET=1 "auto" runs Triton
    check(interpreted["cases"][0], interpreted["auto_out"])


def _rule_round(case: dict):
    """``traversal_verify`` on the case, its uniforms put into the round's noise layout."""
    from specdec.types import DeviceTree

    noise = torch.zeros(*case["test"].shape, 4, dtype=torch.float32)
    noise[..., 0], noise[..., 2] = case["test"].float(), case["final"].float()  # draws.uniforms' pairs
    tree = DeviceTree(case["tokens"], case["parents"], case["depth"], case["valid"], case["valid"].sum(1))
    return traversal.traversal_verify(tree, case["p"], case["q"], noise, case["max_depth"], case["replacement"])


def _plain(out) -> tuple:
    """``(path, num_path, tokens, target)`` as a plain tuple (the test process loads it with weights_only)."""
    accept, target = out
    return (*accept, target)


def _run_interpreted(folder: Path) -> None:
    """Subprocess entry: the Triton outputs of the saved rounds through the interpreter, saved beside them."""
    from specdec.kernels.tree_traversal import triton as kernels

    data = torch.load(folder / "cases.pt")
    poison_empty(POISON)
    cases = data["cases"]
    out = {
        "round": [_plain(kernels.traversal_round_triton(*args_of(case), return_target=True)) for case in cases],
        "round_small_block": [
            _plain(kernels.traversal_round_triton(*args_of(case), block=SMALL_BLOCK, return_target=True))
            if case["p"].shape[-1] > SMALL_BLOCK
            else None
            for case in cases
        ],  # fmt: skip
        "round_pairs": [
            _plain(kernels.traversal_round_triton(*args_of(pair_case(case, i)), return_target=True))
            for i, case in enumerate(cases)
        ],
        "round_by_depth": [
            _plain(kernels.traversal_round_triton(*args_of(by_depth_cases(case, i)[0]), q_by_depth=True,
                                                  return_target=True))
            for i, case in enumerate(cases)
        ],  # fmt: skip
        "no_pass_out": _plain(kernels.traversal_round_triton(*args_of(data["no_pass"]), return_target=True)),
        "boundary_out": _plain(kernels.traversal_round_triton(*args_of(data["boundary"]), return_target=True)),
        "rule": [tuple(_rule_round(case)) for case in cases],
        "block": [
            tuple(specdec.BlockVerification().verify(chain_tree(c), c["p"], c["q"], c["noise"], c["max_depth"]))
            for c in data["chains"]
        ],
    }  # plain tuples: the test process loads them with weights_only
    triton_round = kernels.traversal_round_triton
    with mock.patch.object(kernels, "traversal_round_triton", side_effect=triton_round) as spy:
        out["auto_out"] = tuple(traversal_round(*args_of(cases[0])))
    out["auto_impl"] = "triton" if spy.call_count else "torch"
    torch.save(out, folder / "outputs.pt")


# --- compiled on CUDA ---------------------------------------------------------------------------------------------


def _needs_cuda() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")


@pytest.mark.gpu
@pytest.mark.parametrize("group", ["rounds", "full-vocab"])
def test_compiled_equals_reference_on_cuda(group):
    _needs_cuda()
    if group == "rounds":
        cases = rounds(seed=1) + rounds(seed=2) + [no_pass_case()]
    else:
        gen = torch.Generator().manual_seed(2)
        cases = [
            random_round(gen, batch, 8, 151936, replacement, dtype, slots=33)
            for batch in (1, 3)
            for replacement in (True, False)
            for dtype in (torch.float32, torch.float64)
        ]
    assert_rounds_exercise_the_walk(cases)
    for case in cases:
        from specdec.kernels.tree_traversal.triton import traversal_round_triton

        check(case, *traversal_round_triton(*args_of(case, "cuda"), return_target=True))
        check(case, traversal_round(*args_of(case, "cuda"), impl="triton"))
        check(case, traversal_round(*args_of(case, "cuda")))  # auto: Triton on CUDA
        check(case, traversal_round(*args_of(case, "cuda"), impl="torch"))
    for i, case in enumerate(cases[:8]):  # the uniforms as the strided float32 halves the rule passes
        halves = pair_case(case, i)
        check(halves, traversal_round(*args_of(halves, "cuda"), impl="triton"))
        by_depth, per_node = by_depth_cases(case, i)  # one q row per depth, read in place
        check(per_node, traversal_round(*args_of(by_depth, "cuda"), q_by_depth=True, impl="triton"))


@pytest.mark.gpu
def test_compiled_block_verification_is_block_verify_on_cuda():
    _needs_cuda()
    from specdec.verify.block import block_verify

    gen = torch.Generator().manual_seed(6)
    for batch, slots, vocab in [(64, 16, 8), (8, 16, 8192), (2, 9, 151936)]:
        case = chain_round(gen, batch, slots, vocab)
        want = block_verify(chain_tree(case), case["p"], case["q"], case["noise"], case["max_depth"])
        cuda = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in case.items()}
        assert traversal.kernel_runs(cuda["p"])
        got = specdec.BlockVerification().verify(chain_tree(cuda), cuda["p"], cuda["q"], cuda["noise"],
                                                 case["max_depth"])  # fmt: skip
        for name, a, b in zip(("path", "num_path", "tokens"), want, got, strict=True):
            assert torch.equal(a, b.cpu()), name


@pytest.mark.gpu
@pytest.mark.parametrize("replacement", [True, False], ids=["with", "without"])
def test_compiled_round_replays_in_a_cuda_graph(replacement):
    # one capture, new rounds' arguments copied in, replays
    _needs_cuda()
    gen = torch.Generator().manual_seed(5)
    cases = [random_round(gen, 3, 4, 1500, replacement, torch.float32, slots=20) for _ in range(8)]
    static = args_of({**cases[0], "max_depth": 5}, "cuda")
    graph, out = capture_without_host_reads(lambda: traversal_round(*static, impl="triton"))
    for case in cases:
        for buffer, value in zip(static, args_of(case), strict=True):
            if isinstance(buffer, torch.Tensor):
                buffer.copy_(value)
        graph.replay()
        check({**case, "max_depth": 5}, [t.clone() for t in out])


if __name__ == "__main__":
    _run_interpreted(Path(sys.argv[1]))
