"""``tree_rejection``: the Triton sibling-rank loop of recursive rejection sampling (interpreter on CPU, compiled on
GPU) equals the torch reference, directly and through ``recursive_rejection``.

The reference itself is held to the one-slot-at-a-time definition by
``tests/verify/test_multidraft.py::test_rank_by_rank_equals_the_one_slot_at_a_time_definition`` (through
``recursive_rejection``, which calls the dispatch); the default tier here checks the dispatcher's refusals.

The interpreted comparisons (the ``interpreter`` tier) run in one subprocess with ``TRITON_INTERPRET=1``, as in
``test_tree_accept.py``: this file, run as a script, reads the rounds the tests wrote (and the kernel's arguments,
captured from ``recursive_rejection``'s call), runs the Triton version with ``torch.empty`` poisoned, and saves the
outputs for the tests here to compare: ``nxt`` exactly, ``r`` to 1e-12 (the residual mass is summed in another
order), and the accepted path, its length and tokens exactly. Rounds: random trees of at most ``K`` children per
node (duplicate siblings, padding, ragged sizes), a draft with a cut support, a target close to it (deep accepts),
both replacement modes, ``B`` in {1, 3}, ``K`` in {1, 3, 8}, ``V`` in {8, 1500} (1500: several vocabulary blocks,
with the default block and with 256).
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
from specdec.kernels.tree_rejection import tree_rejection, tree_rejection_reference
from specdec.types import DeviceTree

POISON = -987654321  # what torch.empty's integer outputs hold in the interpreter process until written
ARG_NAMES = ("p", "q", "table", "tokens", "weighed", "drawable", "kept", "replacement")
SMALL_BLOCK = 256  # the interpreted direct calls at V = 1500 also run with this block (six blocks)


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
                p=p, q=q, noise=noise, max_depth=depth, replacement=replacement)  # fmt: skip


def _tree(case: dict, device: str = "cpu") -> DeviceTree:
    fields = [case[k].to(device) for k in ("tokens", "parents", "depth", "valid", "num_nodes")]
    return DeviceTree(*fields, max_children=case["max_children"])


def run_round(case: dict, impl: str, device: str = "cpu"):
    """``recursive_rejection`` on the round with ``tree_rejection`` forced to ``impl``; returns the
    ``(path, num_path, tokens)`` and the kernel's arguments (``ARG_NAMES``) as the call passed them."""
    calls = []

    def spy(*args, **kwargs):
        calls.append(dict(zip(ARG_NAMES, args, strict=True)))
        return tree_rejection(*args, **kwargs)

    p, q, noise = (case[k].to(device) for k in ("p", "q", "noise"))
    with mock.patch.object(multidraft, "tree_rejection", spy), mock.patch.object(multidraft, "_REJECTION_IMPL", impl):
        out = multidraft.recursive_rejection(_tree(case, device), p, q, noise, case["max_depth"], case["replacement"])
    assert len(calls) == 1
    return tuple(t.cpu() for t in (out.path, out.num_path, out.tokens)), calls[0]


def rounds(seed: int = 0, per_setting: int = 2) -> list[dict]:
    """``per_setting`` random rounds for each replacement mode, B in {1, 3}, K in {1, 3, 8}, V in {8, 1500}."""
    gen = torch.Generator().manual_seed(seed)
    return [random_round(gen, batch, width, vocab, replacement)
            for replacement in (True, False) for batch in (1, 3) for width in (1, 3, 8) for vocab in (8, 1500)
            for _ in range(per_setting)]  # fmt: skip


def mass_zero_case() -> dict:
    """Direct arguments (with replacement) where every drawable child is rejected and leaves no residual mass
    (``q`` twice ``p``): ``r`` must stay ``p``."""
    gen = torch.Generator().manual_seed(9)
    batch, slots, width, vocab = 2, 5, 3, 40
    p = torch.softmax(torch.randn(batch, slots, vocab, generator=gen, dtype=torch.float64), -1)
    table = torch.tensor([[1, 2, 3], [4, 5, 5], [5, 5, 5], [5, 5, 5], [5, 5, 5]]).expand(batch, -1, -1).contiguous()
    tokens = torch.randint(vocab, (batch, slots, width), generator=gen)
    weighed = torch.full((batch, slots, width), 2.0, dtype=torch.float64)  # above any r(c): rejected
    drawable = table < slots
    kept = torch.ones(batch, slots, width, dtype=torch.float64)
    q = 2.0 * p[:, [0, 0, 0, 0, 1]]
    return dict(p=p, q=q, table=table, tokens=tokens, weighed=weighed, drawable=drawable, kept=kept,
                replacement=True)  # fmt: skip


def _args(call: dict, device: str = "cpu") -> list:
    return [v.to(device) if isinstance(v, torch.Tensor) else v for v in (call[k] for k in ARG_NAMES)]


def check_direct(call: dict, got: tuple[torch.Tensor, torch.Tensor]) -> None:
    """``got = (r, nxt)`` equals the reference on the arguments ``call``: ``nxt`` exactly, ``r`` to 1e-12."""
    want_r, want_nxt = tree_rejection_reference(*_args(call))
    r, nxt = (t.cpu() for t in got)
    assert nxt.dtype == torch.long and r.dtype == torch.float64 and r.shape == want_r.shape
    assert torch.equal(nxt, want_nxt)
    assert not r.isnan().any()
    assert torch.allclose(r, want_r, rtol=1e-12, atol=1e-15), (r - want_r).abs().max()


def reference_rounds(cases: list[dict]) -> list[tuple]:
    return [run_round(case, "torch") for case in cases]


def assert_rounds_exercise_the_loop(expected: list[tuple]) -> None:
    """The rounds accept deep paths and reject first children; rejections reduce ``r``; with ``K > 1``, later
    ranks are accepted after earlier ones were rejected."""
    lengths = torch.cat([out[1].reshape(-1) for out, _ in expected])
    assert (lengths >= 3).any() and (lengths == 1).any()
    later = reduced = 0
    for _, call in expected:
        r, nxt = tree_rejection_reference(*_args(call))
        reduced += int((r != call["p"]).any(-1).sum())
        later += int((nxt[..., None] == call["table"][..., 1:]).any(-1).sum())
    assert reduced > 0 and later > 0


# --- the dispatcher (default tier) --------------------------------------------------------------------------------


def _valid_args() -> dict:
    return dict(zip(ARG_NAMES, _args(mass_zero_case()), strict=True))


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (dict(p=torch.zeros(2, 5, 40)), "p must be"),
        (dict(p=torch.zeros(5, 40, dtype=torch.float64)), "p must be"),
        (dict(q=torch.zeros(2, 5, 41, dtype=torch.float64)), "q must be"),
        (dict(q=torch.zeros(2, 5, 40)), "q must be"),
        (dict(table=torch.zeros(2, 5, 3, dtype=torch.int32)), "table must be"),
        (dict(table=torch.zeros(2, 4, 3, dtype=torch.long)), "table must be"),
        (dict(table=torch.zeros(2, 5, 0, dtype=torch.long)), "K >= 1"),
        (dict(tokens=torch.zeros(2, 5, 2, dtype=torch.long)), "tokens must be"),
        (dict(weighed=torch.zeros(2, 5, 3)), "weighed must be"),
        (dict(drawable=torch.zeros(2, 5, 3)), "drawable must be"),
        (dict(kept=torch.zeros(2, 5, 3)), "kept must be"),
        (dict(kept=None, replacement=False), "kept is None"),
        (dict(replacement=1), "replacement"),
        (dict(tokens=torch.zeros(2, 5, 3, dtype=torch.long, device="meta")), "tokens is on meta"),
    ],
)
def test_bad_arguments_are_refused(change, match):
    args = {**_valid_args(), **change}
    with pytest.raises(ValueError, match=match):
        tree_rejection(*(args[k] for k in ARG_NAMES))


def test_kept_may_be_none_with_replacement():
    args = {**_valid_args(), "kept": None, "replacement": True}
    r, nxt = tree_rejection(*(args[k] for k in ARG_NAMES))
    assert r.shape == args["p"].shape and nxt.shape == args["p"].shape[:2]


def test_auto_is_the_reference_on_cpu_and_triton_is_refused():
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("checks the CPU dispatch without the interpreter")
    args = _valid_args()
    r, nxt = tree_rejection(*args.values())
    want = tree_rejection_reference(*args.values())
    assert torch.equal(r, want[0]) and torch.equal(nxt, want[1])
    assert torch.equal(r, args["p"])  # no residual mass: r stays p
    with pytest.raises(ValueError, match="GPU"):
        tree_rejection(*args.values(), impl="triton")
    with pytest.raises(ValueError, match="impl"):
        tree_rejection(*args.values(), impl="reference")


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
    data = {"cases": cases, "calls": [call for _, call in expected], "mass_zero": mass_zero_case()}
    out = interpreted_outputs(__file__, tmp_path_factory.mktemp("tree_rejection"), data)
    return {**out, "expected": expected}


@pytest.mark.interpreter
def test_interpreted_kernel_equals_reference(interpreted):
    assert_rounds_exercise_the_loop(interpreted["expected"])
    for call, got, small in zip(interpreted["calls"], interpreted["direct"], interpreted["direct_small_block"],
                                strict=True):  # fmt: skip
        check_direct(call, got)
        if small is not None:
            check_direct(call, small)
    check_direct(interpreted["mass_zero"], interpreted["mass_zero_out"])
    assert torch.equal(interpreted["mass_zero_out"][0], interpreted["mass_zero"]["p"])


@pytest.mark.interpreter
def test_interpreted_rounds_equal_reference_rounds(interpreted):
    # recursive_rejection with the kernel: the same accepted paths, lengths, tokens (and bonus) as with the reference
    for i, ((want, _), got) in enumerate(zip(interpreted["expected"], interpreted["rounds"], strict=True)):
        for name, a, b in zip(("path", "num_path", "tokens"), want, got, strict=True):
            assert torch.equal(a, b), (i, name)


@pytest.mark.interpreter
def test_interpreted_auto_dispatch(interpreted):
    assert interpreted["auto_impl"] == "triton"  # under TRITON_INTERPRET=1 "auto" runs Triton


def _run_interpreted(folder: Path) -> None:
    """Subprocess entry: the Triton outputs of the saved rounds through the interpreter, saved beside them."""
    from specdec.kernels.tree_rejection import triton as kernels

    data = torch.load(folder / "cases.pt")
    poison_empty(POISON)
    out = {
        "direct": [kernels.tree_rejection_triton(*_args(call)) for call in data["calls"]],
        "direct_small_block": [
            kernels.tree_rejection_triton(*_args(call), block=SMALL_BLOCK)
            if call["p"].shape[-1] > SMALL_BLOCK
            else None
            for call in data["calls"]
        ],  # fmt: skip
        "rounds": [run_round(case, "triton")[0] for case in data["cases"]],
        "mass_zero_out": kernels.tree_rejection_triton(*_args(data["mass_zero"])),
    }
    with mock.patch.object(kernels, "tree_rejection_triton", side_effect=kernels.tree_rejection_triton) as spy:
        tree_rejection(*_args(data["calls"][0]))
    out["auto_impl"] = "triton" if spy.call_count else "torch"
    torch.save(out, folder / "outputs.pt")


# --- compiled on CUDA ---------------------------------------------------------------------------------------------


def _needs_cuda() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")


@pytest.mark.gpu
def test_compiled_equals_reference_on_cuda():
    _needs_cuda()
    cases = rounds(seed=1, per_setting=4)
    gen = torch.Generator().manual_seed(2)
    cases += [random_round(gen, batch, 8, 151936, replacement) for batch in (1, 3) for replacement in (True, False)]
    for case in cases:
        want, call = run_round(case, "torch")
        got, cuda_call = run_round(case, "triton", "cuda")
        for a, b in zip(want, got, strict=True):
            assert torch.equal(a, b)
        check_direct(call, tree_rejection(*_args(call, "cuda"), impl="triton"))
        check_direct(call, tree_rejection(*_args(call, "cuda")))  # auto picks Triton on CUDA
        check_direct(call, tree_rejection(*_args(call, "cuda"), impl="torch"))  # the CUDA reference agrees too
        assert cuda_call["p"].is_cuda
    check_direct(mass_zero_case(), tree_rejection(*_args(mass_zero_case(), "cuda"), impl="triton"))


@pytest.mark.gpu
@pytest.mark.parametrize("replacement", [True, False], ids=["with", "without"])
def test_compiled_kernel_replays_in_a_cuda_graph(replacement):
    # One capture, then new rounds' arguments (same shapes) copied into the static inputs before each replay.
    _needs_cuda()
    gen = torch.Generator().manual_seed(3)
    calls = [run_round(random_round(gen, 3, 8, 1500, replacement, slots=20), "torch")[1] for _ in range(8)]
    static = _args(calls[0], "cuda")
    graph, (r, nxt) = capture_without_host_reads(lambda: tree_rejection(*static, impl="triton"))
    for call in calls:
        for buffer, value in zip(static, _args(call), strict=True):
            if isinstance(buffer, torch.Tensor):
                buffer.copy_(value)
        graph.replay()
        check_direct(call, (r.clone(), nxt.clone()))


if __name__ == "__main__":
    _run_interpreted(Path(sys.argv[1]))
