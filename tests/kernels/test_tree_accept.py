"""``tree_accept``: the Triton tree mask and acceptance walk (interpreter on CPU, compiled on GPU) equal the torch
references bit for bit, and both equal brute-force oracles (a parent walk per row; ``walk_tree``).

The interpreted comparisons (the ``interpreter`` tier) run in one subprocess with ``TRITON_INTERPRET=1`` (it must
be set before Triton is imported and must not leak into the rest of the suite): this file, run as a script, reads
the cases the tests wrote, runs the Triton versions with ``torch.empty`` poisoned (NaN, or a sentinel integer) so
that an output element never written shows up, and saves the outputs for the tests here to compare. They run the
cheap subset of the random cases that covers what the whole set does (``kernel_harness.cover``), plus walks that
run the full ``max_depth`` steps (a kernel that stops the walk early fails those); the GPU tests run every case.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
from device_trees import padded_tree
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_harness import capture_without_host_reads, cover, interpreted_outputs, poison_empty
from oracles.walk import walk_tree

from specdec.kernels.tree_accept import (
    MAX_ACCEPT_SLOTS,
    accept_path,
    accept_path_reference,
    accept_paths,
    tree_mask,
    tree_mask_reference,
    tree_masks,
    verify_inputs,
)
from specdec.trees import ddtree_device
from specdec.types import DraftTree

SLOTS = [1, 2, 16, 48, 80, 256]
DTYPES = [torch.bfloat16, torch.float16, torch.float32]
SHAPES = ["chain", "bush", "random", "deep"]
POISON = -987654321  # what torch.empty's integer outputs hold in the interpreter process until written


# --- cases -------------------------------------------------------------------------------------------------------


def _randint(gen: torch.Generator, low: int, high: int) -> int:
    """Uniform in [low, high]."""
    return int(torch.randint(low, high + 1, (1,), generator=gen))


def random_tree(gen: torch.Generator, slots: int, vocab: int, shape: str) -> dict:
    """A padded tree in ``slots`` slots: a random number of real nodes of the given shape (``deep``: chains with
    random branch points), tokens from ``vocab`` values (duplicate siblings are common), random padding tokens."""
    n = _randint(gen, 1, slots) if _randint(gen, 0, 3) else slots
    parents = [-1]
    for i in range(1, n):
        if shape == "chain":
            parents.append(i - 1)
        elif shape == "bush":
            parents.append(0)
        elif shape == "random":
            parents.append(_randint(gen, 0, i - 1))
        else:
            parents.append(_randint(gen, 0, i - 1) if _randint(gen, 0, 9) < 3 else i - 1)
    depth = [0]
    for p in parents[1:]:
        depth.append(depth[p] + 1)
    pad = slots - n
    return dict(
        tokens=torch.randint(0, vocab, (slots,), generator=gen),
        parents=torch.tensor(parents + [-1] * pad),
        depth=torch.tensor(depth + [0] * pad),
        valid=torch.arange(slots) < n,
        num_nodes=n,
    )


def follow_choices(gen: torch.Generator, tree: dict, vocab: int, follow: float) -> torch.Tensor:
    """Per slot, with probability ``follow`` the token of one of its real children (long accepted paths), else a
    random token (possibly one no child carries)."""
    tokens, parents, n = tree["tokens"].tolist(), tree["parents"].tolist(), tree["num_nodes"]
    choices = []
    for i in range(len(tokens)):
        kids = [tokens[j] for j in range(1, n) if parents[j] == i]
        if kids and float(torch.rand((), generator=gen)) < follow:
            choices.append(kids[_randint(gen, 0, len(kids) - 1)])
        else:
            choices.append(_randint(gen, 0, vocab))
    return torch.tensor(choices)


def _ddtree(gen: torch.Generator, slots: int) -> tuple[dict, int]:
    """A DDTree of ``ddtree_device`` in ``slots`` slots from random log-probabilities; returns it and its D."""
    depth_limit = _randint(gen, 1, 15)
    vocab = _randint(gen, 2, 12)
    budget = _randint(gen, 1, slots - 1)
    logq = torch.log_softmax(2.0 * torch.randn(depth_limit, vocab, generator=gen), dim=-1)
    topk = [None, 1, 2, 4, 8][_randint(gen, 0, 4)]
    tree = ddtree_device(logq, torch.tensor(_randint(gen, 0, vocab - 1)), budget=budget, topk=topk, num_slots=slots)
    out = dict(tokens=tree.tokens, parents=tree.parents, depth=tree.depth, valid=tree.valid,
               num_nodes=int(tree.num_nodes), argmax=logq.argmax(-1), vocab=vocab)  # fmt: skip
    return out, depth_limit


def _prefix_and_capacity(gen: torch.Generator, slots: int, i: int) -> tuple[int, int]:
    capacity = slots + _randint(gen, 0, 80) + (1200 if i % 23 == 0 else 0)  # some need two column blocks
    last = capacity - slots
    prefix = [0, last, max(last - 1, 0), last + 1, last + _randint(gen, 2, 9), _randint(gen, 0, last)][i % 6]
    return prefix, capacity  # prefix past capacity - S: the tree's last columns fall off the mask


def mask_cases(num: int = 150, seed: int = 0) -> list[dict]:
    """Random trees of every shape and of the sizes ``SLOTS`` (and random ones), then DDTrees; ``max_depth`` from
    the real depth to three above it, and in some cases below it (where only the reference's reach is checked)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(num):
        slots = SLOTS[i % len(SLOTS)] if i % 7 else _randint(gen, 1, 96)
        if slots == 256 and (i // 6) % 4:
            slots = _randint(gen, 3, 40)  # keep the 256-slot cases few: the interpreter runs a program per row
        if i % 5 == 4 and slots >= 2:
            tree, depth_limit = _ddtree(gen, slots)
        else:
            tree = random_tree(gen, slots, 4, SHAPES[i % len(SHAPES)])
            depth_limit = int(tree["depth"].max())
        max_depth = max(depth_limit + _randint(gen, -4, 3) if i % 7 == 0 else depth_limit + _randint(gen, 0, 3), 0)
        prefix, capacity = _prefix_and_capacity(gen, slots, i)
        dtype = [*DTYPES, torch.float64][i % 4] if i % 11 == 0 else DTYPES[i % 3]
        out.append(dict(parents=tree["parents"], valid=tree["valid"], prefix=torch.tensor(prefix),
                        capacity=capacity, max_depth=max_depth, dtype=dtype))  # fmt: skip
    return out


def accept_cases(num: int = 420, seed: int = 1) -> list[dict]:
    """Random trees (small vocabularies: duplicate siblings) with choices that mostly follow them, then DDTrees
    with choices that follow the drafter's argmax or are random; ``max_depth`` = the depth bound plus 0-3."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(num):
        slots = SLOTS[i % len(SLOTS)] if i % 7 else _randint(gen, 1, 96)
        if i % 4 == 3 and slots >= 2:
            tree, bound = _ddtree(gen, slots)
            if i % 8 == 3:  # the target agrees with the drafter's argmax: long paths
                choices = tree["argmax"][tree["depth"].clamp(max=bound - 1)]
            else:
                choices = follow_choices(gen, tree, tree["vocab"], 0.7)
        else:
            vocab = [2, 3, 4, 50][i % 4]
            tree = random_tree(gen, slots, vocab, SHAPES[i % len(SHAPES)])
            bound = int(tree["depth"].max())
            choices = follow_choices(gen, tree, vocab, [0.97, 0.85, 0.5][i % 3])
        out.append(dict(tokens=tree["tokens"], parents=tree["parents"], depth=tree["depth"], valid=tree["valid"],
                        choices=choices, max_depth=bound + _randint(gen, 0, 3)))  # fmt: skip
    return out


def long_accept_cases(seed: int = 3) -> list[dict]:
    """Walks that run all ``max_depth`` steps (``num_path == max_depth + 1``), 7 to 255 of them: chains followed to
    their end and the deepest path of deep trees, real nodes filling the slots or followed by padding."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for slots, nodes, shape in ((8, 8, "chain"), (48, 40, "deep"), (80, 80, "chain"), (256, 200, "deep"),
                                (256, 256, "chain")):  # fmt: skip
        parents = [-1] + [i - 1 if shape == "chain" or _randint(gen, 0, 9) >= 3 else _randint(gen, 0, i - 1)
                          for i in range(1, nodes)]  # fmt: skip
        depth = [0]
        for p in parents[1:]:
            depth.append(depth[p] + 1)
        tokens = torch.randperm(4 * slots, generator=gen)[:slots]  # distinct tokens: one child carries each choice
        choices = torch.randint(0, 4 * slots, (slots,), generator=gen)
        node = max(range(nodes), key=lambda i: (depth[i], -i))  # the deepest node, then its path from the root
        while node > 0:
            choices[parents[node]] = tokens[node]
            node = parents[node]
        pad = [0] * (slots - nodes)
        out.append(dict(tokens=tokens, parents=torch.tensor(parents + [-1] * len(pad)), depth=torch.tensor(depth + pad),
                        valid=torch.arange(slots) < nodes, choices=choices, max_depth=max(depth)))  # fmt: skip
    return out


def _bucket(value: int, edges: tuple[int, ...]) -> int:
    return sum(value >= edge for edge in edges)


def accept_features(case: dict) -> set:
    """What an accept case exercises: slot count, walk length, a walk that runs all its steps, depth slack, and
    two real children carrying the same choice (the first must win)."""
    slots, steps = case["parents"].numel(), case["max_depth"] + 1
    length = int(accept_oracle(case)[1])
    found = {("slots", slots if slots in SLOTS else "other"), ("length", _bucket(length, (2, 4, 8, 16))),
             ("slack", steps - 1 - int(case["depth"][case["valid"]].max()))}  # fmt: skip
    if length == steps:
        found.add(("full", _bucket(steps, (2, 4, 8))))
    if not torch.equal(accept_oracle(case)[0], accept_oracle(case, first=False)[0]):
        found.add(("first duplicate wins", length > 2))
    return found


def mask_features(case: dict) -> set:
    """What a mask case exercises: slot count, dtype, where the prefix puts the tree (at 0, overlapping the end),
    a depth bound below the real depth, several column blocks, padding rows."""
    slots, prefix, capacity = case["parents"].numel(), int(case["prefix"]), case["capacity"]
    return {("slots", slots if slots in SLOTS else "other"), ("dtype", case["dtype"]),
            ("prefix", "zero" if prefix == 0 else "past the end" if prefix + slots > capacity else "inside"),
            ("reach limited", case["max_depth"] < int(_depths(case["parents"]).max())),
            ("column blocks", capacity > 1024), ("padded", not bool(case["valid"].all()))}  # fmt: skip


def interpreted_cases() -> dict[str, list[dict]]:
    """The interpreter's cases: the cheapest random ones covering every feature twice, and the full-length walks."""
    masks = cover(mask_cases(), mask_features, lambda c: c["parents"].numel() * c["capacity"], times=2)
    accepts = cover(accept_cases(), accept_features, lambda c: c["parents"].numel() * (c["max_depth"] + 1), times=2)
    return {"mask": masks, "accept": accepts + long_accept_cases(), "big": [_big_accept_case()]}


def batched_mask_cases(num: int = 60, seed: int = 5) -> list[list[dict]]:
    """Batches of 2-3 random trees of one slot count (each with its own prefix), sharing the largest capacity and
    max_depth of the group (a larger max_depth reaches the same ancestors)."""
    groups: dict[int, list[dict]] = {}
    for case in mask_cases(num=num, seed=seed):
        groups.setdefault(case["parents"].numel(), []).append(case)
    out = []
    for cases in groups.values():
        if len(cases) >= 2:
            cases = cases[:3]
            capacity, depth = max(c["capacity"] for c in cases), max(c["max_depth"] for c in cases)
            out.append([dict(c, capacity=capacity, max_depth=depth, dtype=cases[0]["dtype"]) for c in cases])
    return out


def _batched_args(rows: list[dict], device: str = "cpu") -> list:
    first = rows[0]
    stacked = [torch.stack([r[k] for r in rows]).to(device) for k in ("parents", "valid", "prefix")]
    return [*stacked, first["capacity"], first["max_depth"], first["dtype"]]


def check_batched_masks(batches: list[list[dict]], outputs: list[torch.Tensor]) -> None:
    """Row b of each batched mask equals the reference and the oracle of tree b alone."""
    assert len(outputs) == len(batches) and batches
    for rows, got in zip(batches, outputs, strict=True):
        assert got.shape[0] == len(rows)
        for b, case in enumerate(rows):
            assert torch.equal(_bits(got[b : b + 1].cpu()), _bits(tree_mask_reference(*_mask_args(case))))
            assert torch.equal(_bits(got[b : b + 1].cpu()), _bits(mask_oracle(case)))


def _verify_args(rows: list[dict], device: str = "cpu") -> list:
    parents, valid, prefix, *rest = _batched_args(rows, device)
    depth = torch.stack([_depths(row) for row in parents.cpu()]).long()  # each node's depth, a Python walk
    return [parents, valid, depth.to(device), prefix, *rest]


def check_verify_inputs(batches: list[list[dict]], outputs: list[tuple]) -> None:
    """The masks as ``check_batched_masks``; positions, key slots and lengths as Python sums."""
    check_batched_masks(batches, [out[0] for out in outputs])
    for rows, (_, positions, write, lengths) in zip(batches, outputs, strict=True):
        parents = torch.stack([r["parents"] for r in rows])
        depth, slots = [_depths(row).tolist() for row in parents], parents.shape[1]
        starts = [int(r["prefix"]) for r in rows]
        assert positions.cpu().tolist() == [[x + d for d in ds] for x, ds in zip(starts, depth, strict=True)]
        assert write.cpu().tolist() == [[x + i for i in range(slots)] for x in starts]
        assert lengths.cpu().tolist() == [x + slots for x in starts]
        assert positions.dtype == write.dtype == lengths.dtype == torch.long


def test_verify_inputs_are_the_masks_and_the_slot_sums():
    batches = batched_mask_cases()
    check_verify_inputs(batches, [verify_inputs(*_verify_args(rows), impl="torch") for rows in batches])
    args = _verify_args(batches[0])
    with pytest.raises(ValueError, match="depth of the parents' shape"):
        verify_inputs(args[0], args[1], args[2][:, :-1], *args[3:])


def test_batched_masks_equal_each_tree_alone():
    batches = batched_mask_cases()
    check_batched_masks(batches, [tree_masks(*_batched_args(rows), impl="torch") for rows in batches])
    with pytest.raises(ValueError, match=r"parents and valid \[B, S\] and prefix \[B\]"):
        tree_masks(*_mask_args(mask_cases(num=1)[0]))


def batched_accept_cases(num: int = 120, seed: int = 7) -> list[list[dict]]:
    """Batches of 2-4 accept cases of one slot count (each with its own tree and choices), sharing the largest
    max_depth of the group (a larger bound walks the same path: the walk stops where no child carries the choice)."""
    groups: dict[int, list[dict]] = {}
    for case in accept_cases(num=num, seed=seed) + long_accept_cases():
        groups.setdefault(case["parents"].numel(), []).append(case)
    out = []
    for cases in groups.values():
        for start in range(0, len(cases) - 1, 4):
            rows = cases[start : start + 4]
            if len(rows) >= 2:
                depth = max(c["max_depth"] for c in rows)
                out.append([dict(c, max_depth=depth) for c in rows])
    return out


def _batched_accept_args(rows: list[dict], device: str = "cpu") -> list:
    stacked = [torch.stack([r[k] for r in rows]).to(device) for k in ACCEPT_KEYS[:-1]]
    return [*stacked, rows[0]["max_depth"]]


def check_batched_accepts(batches: list[list[dict]], outputs: list[tuple]) -> None:
    """Row b of each batched walk equals the reference and the oracle of tree b alone (all three tensors)."""
    assert len(outputs) == len(batches) and batches
    for rows, got in zip(batches, outputs, strict=True):
        path, num_path, tokens = (t.cpu() for t in got)
        assert path.shape[0] == num_path.shape[0] == tokens.shape[0] == len(rows)
        check_accepts(rows, [(path[b], num_path[b], tokens[b]) for b in range(len(rows))])


def test_batched_accepts_equal_each_tree_alone():
    batches = batched_accept_cases()
    assert len(batches) >= 10 and any(len(rows[0]["parents"]) > 64 for rows in batches)
    check_batched_accepts(batches, [accept_paths(*_batched_accept_args(rows), impl="torch") for rows in batches])
    args = _batched_accept_args(batches[0])
    with pytest.raises(ValueError, match=r"one shape \[B, S\]"):
        accept_paths(args[0], args[1][:, :-1], *args[2:])
    with pytest.raises(ValueError, match=r"one shape \[B, S\]"):
        accept_paths(*(t[0] for t in args[:5]), args[5])


MASK_KEYS = ("parents", "valid", "prefix", "capacity", "max_depth", "dtype")
ACCEPT_KEYS = ("tokens", "parents", "depth", "valid", "choices", "max_depth")


def _mask_args(case: dict, device: str = "cpu") -> list:
    return [case[k].to(device) if isinstance(case[k], torch.Tensor) else case[k] for k in MASK_KEYS]


def _accept_args(case: dict, device: str = "cpu") -> list:
    return [case[k].to(device) if isinstance(case[k], torch.Tensor) else case[k] for k in ACCEPT_KEYS]


# --- oracles -----------------------------------------------------------------------------------------------------


def mask_oracle(case: dict) -> torch.Tensor:
    """Row by row: walk the parent chain (up to ``2**bit_length(max_depth) - 1`` levels, ancestor_matrix's reach:
    every ancestor when ``max_depth`` bounds the depth), open those key columns, and the prefix if the row is real."""
    parents, valid = case["parents"].tolist(), case["valid"].tolist()
    prefix, capacity, dtype = int(case["prefix"]), case["capacity"], case["dtype"]
    hops = 2 ** case["max_depth"].bit_length() - 1
    visible = torch.zeros(len(parents), capacity, dtype=torch.bool)
    for i in range(len(parents)):
        visible[i, : min(prefix, capacity)] = valid[i]
        node, up = i, 0
        while node >= 0 and up <= hops:
            if prefix + node < capacity:
                visible[i, prefix + node] = True
            node, up = parents[node], up + 1
    zero, low = torch.tensor(0.0, dtype=dtype), torch.tensor(torch.finfo(dtype).min, dtype=dtype)
    return torch.where(visible, zero, low)[None, None]


def accept_oracle(case: dict, first: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``walk_tree`` on the real nodes, padded to ``P = max_depth + 1`` slots as ``accept_device`` pads; with
    ``first=False`` the same walk but the LAST duplicate sibling wins (to show that the cases tell them apart)."""
    n = int(case["valid"].sum())
    tokens, parents, choices = case["tokens"][:n], case["parents"][:n], case["choices"][:n].tolist()
    if first:
        result = walk_tree(DraftTree(tokens, parents), choices)
        path, new = list(result.path), list(result.tokens)
    else:
        kids = {(p, t): i for i, (p, t) in enumerate(zip(parents.tolist(), tokens.tolist(), strict=True)) if i}
        path = [0]
        while (nxt := kids.get((path[-1], choices[path[-1]]))) is not None:
            path.append(nxt)
        new = [int(tokens[i]) for i in path[1:]] + [choices[path[-1]]]
    steps = case["max_depth"] + 1
    return (torch.tensor(path + [path[-1]] * (steps - len(path))), torch.tensor(len(path)),
            torch.tensor(new + [0] * (steps - len(new))))  # fmt: skip


def _bits(mask: torch.Tensor) -> torch.Tensor:
    return mask.contiguous().view(torch.uint8)


def check_masks(cases: list[dict], outputs: list[torch.Tensor]) -> None:
    """Each output equals the reference bitwise, and the brute-force oracle."""
    assert len(outputs) == len(cases)
    for i, (case, got) in enumerate(zip(cases, outputs, strict=True)):
        info = (i, case["parents"].numel(), int(case["prefix"]), case["capacity"], case["max_depth"], case["dtype"])
        got = got.cpu()
        want = tree_mask_reference(*_mask_args(case))
        assert got.dtype == want.dtype and got.shape == want.shape, info
        assert torch.equal(_bits(got), _bits(want)), info
        assert torch.equal(_bits(got), _bits(mask_oracle(case))), info


def check_accepts(cases: list[dict], outputs: list[tuple]) -> None:
    """Each output equals ``accept_device`` (all three tensors, padding included) and ``walk_tree``."""
    assert len(outputs) == len(cases)
    for i, (case, got) in enumerate(zip(cases, outputs, strict=True)):
        info = (i, case["parents"].numel(), case["max_depth"])
        got = tuple(t.cpu() for t in got)
        want = accept_path_reference(*_accept_args(case))
        for g, w, o in zip(got, want, accept_oracle(case), strict=True):
            assert g.dtype == w.dtype == torch.long and g.shape == w.shape, info
            assert torch.equal(g, w), (info, got, want)
            assert torch.equal(g, o), (info, got, o)


# --- tests on CPU -------------------------------------------------------------------------------------------------


def test_cases_cover_what_matters():
    masks, accepts = mask_cases(), accept_cases()
    assert {c["parents"].numel() for c in masks} >= set(SLOTS) <= {c["parents"].numel() for c in accepts}
    assert {c["dtype"] for c in masks} >= set(DTYPES)
    assert sum(int(c["prefix"]) == 0 for c in masks) > 20
    assert sum(int(c["prefix"]) + c["parents"].numel() > c["capacity"] for c in masks) > 20
    assert sum(c["max_depth"] < int(_depths(c["parents"]).max()) for c in masks) > 10
    lengths = [int(accept_oracle(c)[1]) for c in accepts]
    assert sum(n >= 8 for n in lengths) > 20 and sum(n == 1 for n in lengths) > 20
    # cases where the walk reaches a node with two real children carrying its choice
    assert sum(not torch.equal(accept_oracle(c)[0], accept_oracle(c, first=False)[0]) for c in accepts) > 20


@pytest.mark.interpreter  # the interpreter's selection (seconds of oracle walks): checked where it is used
def test_interpreted_cases_cover_what_all_cases_do():
    picked = interpreted_cases()
    full = {f for c in mask_cases() for f in mask_features(c)}
    assert {f for c in picked["mask"] for f in mask_features(c)} == full and len(picked["mask"]) < 40
    full = {f for c in accept_cases() for f in accept_features(c)}
    assert {f for c in picked["accept"] for f in accept_features(c)} >= full and len(picked["accept"]) < 60
    # walks that run all their steps, up to the longest the kernel takes: a walk stopped early shows in these
    steps = [c["max_depth"] + 1 for c in long_accept_cases() if int(accept_oracle(c)[1]) == c["max_depth"] + 1]
    assert len(steps) == 5 and max(steps) == MAX_ACCEPT_SLOTS and min(steps) <= 8


def _depths(parents: torch.Tensor) -> torch.Tensor:
    depth = []
    for p in parents.tolist():
        depth.append(depth[p] + 1 if p >= 0 else 0)
    return torch.tensor(depth)


def test_references_equal_oracles():
    check_masks(mask_cases(num=60), [tree_mask(*_mask_args(c), impl="torch") for c in mask_cases(num=60)])
    check_accepts(accept_cases(num=100), [accept_path(*_accept_args(c), impl="torch") for c in accept_cases(num=100)])
    check_accepts(long_accept_cases(), [accept_path(*_accept_args(c), impl="torch") for c in long_accept_cases()])


@st.composite
def _trees(draw, max_nodes: int = 40):
    n = draw(st.integers(1, max_nodes))
    parents = [-1] + [draw(st.integers(max(0, i - 3), i - 1)) for i in range(1, n)]
    tokens = draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))
    return padded_tree(tokens, parents, n + draw(st.integers(0, 6)))


@settings(max_examples=150, deadline=None)
@given(_trees(), st.integers(0, 3), st.integers(0, 2**31 - 1))
def test_reference_paths_on_generated_trees(tree, slack, seed):
    # Hypothesis-shrunk checks of the CPU path (the dispatch's reference) against the oracles.
    gen = torch.Generator().manual_seed(seed)
    case = dict(tokens=tree.tokens, parents=tree.parents, depth=tree.depth, valid=tree.valid,
                num_nodes=int(tree.num_nodes))  # fmt: skip
    case["choices"] = follow_choices(gen, case, 3, 0.8)
    case["max_depth"] = int(tree.depth.max()) + slack
    check_accepts([case], [accept_path(*_accept_args(case))])
    slots = tree.parents.numel()
    mask_case = dict(
        parents=tree.parents,
        valid=tree.valid,
        prefix=torch.tensor(_randint(gen, 0, 5)),
        capacity=slots + _randint(gen, 0, 8),
        max_depth=case["max_depth"],
        dtype=torch.bfloat16,
    )
    check_masks([mask_case], [tree_mask(*_mask_args(mask_case))])


def test_auto_is_the_reference_on_cpu_and_triton_is_refused():
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("checks the CPU dispatch without the interpreter")
    case = accept_cases(num=1)[0]
    with pytest.raises(ValueError, match="GPU"):
        accept_path(*_accept_args(case), impl="triton")
    with pytest.raises(ValueError, match="GPU"):
        tree_mask(*_mask_args(mask_cases(num=1)[0]), impl="triton")
    with pytest.raises(ValueError, match="impl"):
        accept_path(*_accept_args(case), impl="reference")


def test_bad_arguments_are_refused():
    case = accept_cases(num=1)[0]
    args = _accept_args(case)
    with pytest.raises(ValueError, match="choices"):
        accept_path(*args[:4], args[4].int(), args[5])
    with pytest.raises(ValueError, match="max_depth"):
        accept_path(*args[:5], -1)
    margs = _mask_args(mask_cases(num=1)[0])
    with pytest.raises(ValueError, match="prefix"):
        tree_mask(margs[0], margs[1], torch.tensor([1, 2]), *margs[3:])
    with pytest.raises(ValueError, match="dtype"):
        tree_mask(*margs[:5], torch.int64)
    with pytest.raises(ValueError, match="valid"):
        tree_mask(margs[0], margs[1][:-1], *margs[2:])


# --- Triton through the interpreter ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory) -> dict:
    pytest.importorskip("triton")
    data = {"cases": interpreted_cases()}
    return interpreted_outputs(__file__, tmp_path_factory.mktemp("tree_accept"), data)


@pytest.mark.interpreter
def test_interpreted_mask_equals_reference(interpreted):
    check_masks(interpreted["cases"]["mask"], interpreted["mask"])


@pytest.mark.interpreter
def test_interpreted_batched_masks_equal_each_tree_alone(interpreted):
    check_batched_masks(batched_mask_cases(num=30), interpreted["batched"])


@pytest.mark.interpreter
def test_interpreted_verify_inputs(interpreted):
    check_verify_inputs(batched_mask_cases(num=30), interpreted["verify"])


@pytest.mark.interpreter
def test_interpreted_accept_equals_reference(interpreted):
    check_accepts(interpreted["cases"]["accept"], interpreted["accept"])


@pytest.mark.interpreter
def test_interpreted_batched_accepts_equal_each_tree_alone(interpreted):
    check_batched_accepts(batched_accept_cases(num=60), interpreted["batched_accept"])


@pytest.mark.interpreter
def test_interpreted_auto_dispatch(interpreted):
    # under TRITON_INTERPRET=1 "auto" runs Triton up to MAX_ACCEPT_SLOTS slots and the reference above
    assert interpreted["auto_impl"] == ["triton", "torch"]
    assert interpreted["big_refused"]
    check_accepts(interpreted["cases"]["big"], interpreted["big"])


def _big_accept_case() -> dict:
    gen = torch.Generator().manual_seed(7)
    tree = random_tree(gen, MAX_ACCEPT_SLOTS + 1, 3, "deep")
    return dict(tokens=tree["tokens"], parents=tree["parents"], depth=tree["depth"], valid=tree["valid"],
                choices=follow_choices(gen, tree, 3, 0.9), max_depth=int(tree["depth"].max()))  # fmt: skip


def _run_interpreted(folder: Path) -> None:
    """Subprocess entry: the Triton outputs of the saved cases through the interpreter, saved beside them."""
    from unittest import mock

    import specdec.kernels.tree_accept as tree_accept
    from specdec.kernels.tree_accept import triton as kernels

    cases = torch.load(folder / "cases.pt")["cases"]
    poison_empty(POISON)
    out = {
        "mask": [kernels.tree_mask_triton(*_mask_args(c)) for c in cases["mask"]],
        "batched": [kernels.tree_masks_triton(*_batched_args(rows)) for rows in batched_mask_cases(num=30)],
        "verify": [kernels.verify_inputs_triton(*_verify_args(rows)) for rows in batched_mask_cases(num=30)],
        "accept": [tuple(kernels.accept_path_triton(*_accept_args(c)[:2], *_accept_args(c)[3:]))
                   for c in cases["accept"]],
        "batched_accept": [tuple(accept_paths(*_batched_accept_args(rows), impl="triton"))
                           for rows in batched_accept_cases(num=60)],
    }  # fmt: skip
    picked = []
    with mock.patch.object(kernels, "accept_path_triton", side_effect=kernels.accept_path_triton) as spy:
        for case in (cases["accept"][0], cases["big"][0]):
            calls = spy.call_count
            result = accept_path(*_accept_args(case))
            picked.append("triton" if spy.call_count > calls else "torch")
    out["auto_impl"], out["big"] = picked, [tuple(result)]
    try:
        accept_path(*_accept_args(cases["big"][0]), impl="triton")
        out["big_refused"] = False
    except ValueError:
        out["big_refused"] = True
    assert tree_accept._triton_available()
    torch.save(out, folder / "outputs.pt")


# --- compiled on CUDA ---------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("part", ["masks", "verify-inputs", "accepts", "long-walks", "batched-walks",
                                  "cuda-reference"])
def test_compiled_equals_reference_on_cuda(part):
    # one part per test: their compiles (one per launch specialisation) run on parallel workers
    if part == "masks":
        masks = mask_cases()
        check_masks(masks, [tree_mask(*_mask_args(c, "cuda"), impl="triton") for c in masks])
    elif part == "verify-inputs":
        batches = batched_mask_cases()
        check_verify_inputs(batches, [verify_inputs(*_verify_args(rows, "cuda"), impl="triton") for rows in batches])
    elif part == "accepts":
        accepts = accept_cases()
        check_accepts(accepts, [accept_path(*_accept_args(c, "cuda"), impl="triton") for c in accepts])
    elif part == "long-walks":
        longs = long_accept_cases()  # walks that run all max_depth steps
        check_accepts(longs, [accept_path(*_accept_args(c, "cuda"), impl="triton") for c in longs])
    elif part == "batched-walks":
        batches = batched_accept_cases()
        check_batched_accepts(batches, [accept_paths(*_batched_accept_args(rows, "cuda"), impl="triton")
                                        for rows in batches])  # fmt: skip
    else:  # the CUDA reference (the eager round's ops) agrees too
        masks, accepts = mask_cases()[:40], accept_cases()[:60]
        check_masks(masks, [tree_mask(*_mask_args(c, "cuda"), impl="torch") for c in masks])
        check_accepts(accepts, [accept_path(*_accept_args(c, "cuda"), impl="torch") for c in accepts])


@pytest.mark.gpu
@pytest.mark.parametrize("slots", [16, 80])
def test_compiled_kernels_replay_in_a_cuda_graph(slots):
    # One capture, then new trees, prefixes and choices copied into the static inputs before each replay.
    gen = torch.Generator().manual_seed(slots)
    capacity, max_depth = 1024, 15
    cases = []
    for i in range(12):
        tree = random_tree(gen, slots, 3, SHAPES[i % len(SHAPES)])
        while int(tree["depth"].max()) > max_depth:
            tree = random_tree(gen, slots, 3, "bush")
        cases.append(dict(tokens=tree["tokens"], parents=tree["parents"], depth=tree["depth"], valid=tree["valid"],
                          choices=follow_choices(gen, tree, 3, 0.9), max_depth=max_depth,
                          prefix=torch.tensor(_randint(gen, 0, capacity - slots)), capacity=capacity,
                          dtype=torch.bfloat16))  # fmt: skip
    static = {k: v.cuda().clone() for k, v in cases[0].items() if isinstance(v, torch.Tensor)}

    def step():
        mask = tree_mask(static["parents"], static["valid"], static["prefix"], capacity, max_depth, torch.bfloat16)
        accept = accept_path(static["tokens"], static["parents"], static["depth"], static["valid"],
                             static["choices"], max_depth)  # fmt: skip
        return mask, accept

    graph, (mask, accept) = capture_without_host_reads(step)
    masks, accepts = [], []
    for case in cases:
        for k, v in static.items():
            v.copy_(case[k])
        graph.replay()
        masks.append(mask.clone())
        accepts.append(tuple(t.clone() for t in accept))
    check_masks(cases, masks)
    check_accepts(cases, accepts)


if __name__ == "__main__":
    _run_interpreted(Path(sys.argv[1]))
