"""``path_trie``: sampled paths merged into a trie. The reference against a brute force on the host (a dictionary of
prefixes), the Triton launch (interpreter on CPU, compiled on GPU) against both, and ``SampledTrees`` through it.

The brute force numbers each distinct prefix the first time a path (in order, depth by depth) reaches it, which is
the numbering the round's rules rely on (``docs/trees.md``: siblings in the order of the first path that drew
them, parents before children). Cases: vocabularies of 2-3 tokens (most prefixes shared) and of 1000 (none), one
path, one depth, up to 16 x 16 and 32 x 32 entries (the kernel's bound), batches of 1, 3 and 64 rows, extra padding
slots, strided paths and roots as ``[B, 1]``.

The interpreted comparisons (the ``interpreter`` tier) run in one subprocess with ``TRITON_INTERPRET=1``
(``kernel_harness.interpreted_outputs``), with ``torch.empty`` poisoned so that an output slot the kernel never
writes shows up.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from unittest import mock

import pytest
import torch
from kernel_harness import capture_without_host_reads, interpreted_outputs

import specdec
import specdec.trees.sampled as sampled
from specdec.kernels.path_trie import MAX_ENTRIES, path_trie, path_trie_reference

SHAPES = [(1, 1, 1), (3, 4, 3), (1, 3, 5), (64, 4, 8), (3, 16, 16), (1, 32, 32)]  # (B, M, L)


def brute_trie(paths: torch.Tensor, root: torch.Tensor, num_slots: int, lengths: torch.Tensor | None = None,
               budget: int | None = None) -> tuple:  # fmt: skip
    """One row at a time on the host: a dictionary from each prefix to its node number (the real tokens of each
    path, ``lengths``; the first ``budget`` nodes)."""
    batch, num, length = paths.shape
    tokens = torch.zeros(batch, num_slots, dtype=torch.long)
    parents = torch.full((batch, num_slots), -1, dtype=torch.long)
    depth = torch.zeros(batch, num_slots, dtype=torch.long)
    valid = torch.zeros(batch, num_slots, dtype=torch.bool)
    count = torch.zeros(batch, dtype=torch.long)
    for b in range(batch):
        nodes: dict[tuple, int] = {(): 0}
        rows = paths[b].tolist()
        for m in range(num):
            for lvl in range(length if lengths is None else int(lengths[b, m])):
                prefix = tuple(rows[m][: lvl + 1])
                if prefix not in nodes and (budget is None or len(nodes) <= budget):
                    slot = nodes[prefix] = len(nodes)
                    tokens[b, slot], parents[b, slot], depth[b, slot] = prefix[-1], nodes[prefix[:-1]], lvl + 1
        tokens[b, len(nodes) :] = tokens[b, 0] = int(root.reshape(-1)[b])
        valid[b, : len(nodes)] = True
        count[b] = len(nodes)
    return tokens, parents, depth, valid, count


def random_case(gen: torch.Generator, batch: int, num: int, length: int, vocab: int, extra: int = 0,
                strided: bool = False) -> dict:  # fmt: skip
    paths = torch.randint(vocab, (batch, num, length * (2 if strided else 1)), generator=gen)
    if strided:
        paths = paths[:, :, ::2]
    root = torch.randint(2000, 3000, (batch, 1), generator=gen)
    return {"paths": paths, "root": root, "num_slots": num * length + 1 + extra}


def cases(seed: int = 0) -> list[dict]:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for batch, num, length in SHAPES:
        for vocab in (2, 3, 1000):
            out.append(random_case(gen, batch, num, length, vocab, extra=vocab % 3, strided=vocab == 3))
    return out


def check(case: dict, got) -> None:
    want = brute_trie(case["paths"], case["root"], case["num_slots"])
    for name, a, b in zip(("tokens", "parents", "depth", "valid", "num_nodes"), want, got, strict=True):
        assert b.dtype == a.dtype, name
        assert torch.equal(a, b.cpu()), (name, case["paths"].shape)


def args_of(case: dict, device: str = "cpu") -> tuple:
    return case["paths"].to(device), case["root"].to(device), case["num_slots"]


def test_cases_share_prefixes_and_fill_the_bound():
    # the vocabularies of 2-3 tokens merge prefixes in every row, of 1000 none in some case; one case holds
    # MAX_ENTRIES entries
    all_cases = cases()
    merged = [brute_trie(c["paths"], c["root"], c["num_slots"])[4] for c in all_cases]
    entries = [c["paths"].shape[1] * c["paths"].shape[2] for c in all_cases]
    assert any((n < e + 1).all() and n.numel() > 1 for n, e in zip(merged, entries, strict=True))
    assert any((n == e + 1).all() and e > 1 for n, e in zip(merged, entries, strict=True))
    assert max(entries) == MAX_ENTRIES


def test_reference_equals_the_brute_force():
    for case in cases():
        check(case, path_trie_reference(*args_of(case)))


def test_reference_with_lengths_and_a_budget_equals_the_brute_force():
    # trie_device's form: paths with fewer real tokens (0: an empty path; the entries past a path's length are junk)
    # and only the first ``budget`` nodes kept
    gen = torch.Generator().manual_seed(3)
    cut = bigger = False
    for batch, num, length, vocab, budget in [(5, 4, 3, 3, 12), (3, 6, 5, 2, 7), (2, 3, 4, 1000, 1), (4, 5, 6, 3, 40)]:
        case = random_case(gen, batch, num, length, vocab)
        lengths = torch.randint(0, length + 1, (batch, num), generator=gen)
        slots = min(budget, num * length) + 1 + 2
        got = path_trie_reference(case["paths"], case["root"], slots, lengths=lengths, budget=budget)
        want = brute_trie(case["paths"], case["root"], slots, lengths, budget)
        for name, a, g in zip(("tokens", "parents", "depth", "valid", "num_nodes"), want, got, strict=True):
            assert torch.equal(a, g), (name, batch, num, length, budget)
        cut |= bool((want[4] < min(budget, num * length) + 1).any())  # short paths or shared prefixes
        bigger |= bool((want[4] == budget + 1).any()) and budget < num * length  # the budget cut the tree
    assert cut and bigger


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(paths=torch.zeros(2, 3, dtype=torch.long)), "paths must be"),
        (dict(paths=torch.zeros(2, 3, 4, dtype=torch.int32)), "paths must be"),
        (dict(paths=torch.zeros(0, 3, 4, dtype=torch.long)), "paths must be"),
        (dict(root=torch.zeros(3, dtype=torch.long)), "root must be"),
        (dict(root=torch.zeros(2, dtype=torch.int32)), "root must be"),
        (dict(num_slots=12), "num_slots=12"),
        (dict(num_slots=13.0), "num_slots"),
        (dict(num_slots=True), "num_slots"),
    ],
)
def test_bad_arguments_are_refused(change, match):
    case = {"paths": torch.zeros(2, 3, 4, dtype=torch.long), "root": torch.zeros(2, dtype=torch.long),
            "num_slots": 13, **change}  # fmt: skip
    with pytest.raises(ValueError, match=match):
        path_trie(case["paths"], case["root"], case["num_slots"])


def test_auto_is_the_reference_on_cpu_and_triton_is_refused():
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("checks the CPU dispatch without the interpreter")
    case = cases()[1]
    check(case, path_trie(*args_of(case)))
    with pytest.raises(ValueError, match="GPU"):
        path_trie(*args_of(case), impl="triton")
    with pytest.raises(ValueError, match="impl"):
        path_trie(*args_of(case), impl="reference")


def test_more_entries_than_the_kernel_holds_run_the_reference():
    case = random_case(torch.Generator().manual_seed(2), 1, 33, 32, 2)
    with mock.patch("specdec.kernels.path_trie.pick_impl", return_value="torch") as pick:
        check(case, path_trie(*args_of(case)))
    assert pick.call_args.kwargs["fits"] is False
    with pytest.raises(ValueError, match=f"at most {MAX_ENTRIES} path entries"):
        path_trie(*args_of(case), impl="triton")


def test_backends_field_reaches_the_policy():
    from specdec.backends import Backends, use

    with use(Backends(path_trie="torch")):
        assert sampled._TRIE_IMPL == "torch"
        with mock.patch.object(sampled, "path_trie", side_effect=path_trie) as spy:
            sampled_tree(batch=2)
        assert spy.call_args.kwargs["impl"] == "torch"
    with pytest.raises(ValueError, match="path_trie"):
        Backends(path_trie="cuda")


def sampled_tree(batch: int, seed: int = 0, device: str = "cpu"):
    """``SampledTrees(4, 5)`` built over a random ``logq`` at T = 1 (its uniforms drawn here)."""
    gen = torch.Generator().manual_seed(seed)
    logq = torch.log_softmax(torch.randn(batch, 5, 12, generator=gen) * 2, -1).to(device)
    noise = torch.rand(batch, 5, 12, generator=gen).to(device)
    policy = specdec.SampledTrees(4, 5).with_sampling(specdec.types.SamplingParams(do_sample=True))
    root = torch.arange(batch, device=device) + 1000
    return policy.build(specdec.types.Proposal(logq=logq), root, 5, noise=noise)


# --- Triton through the interpreter ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory) -> dict:
    pytest.importorskip("triton")
    data = {"cases": cases(seed=1)}
    return interpreted_outputs(__file__, tmp_path_factory.mktemp("path_trie"), data)


@pytest.mark.interpreter
def test_interpreted_trie_equals_the_brute_force(interpreted):
    for case, got in zip(interpreted["cases"], interpreted["trie"], strict=True):
        check(case, got)


@pytest.mark.interpreter
def test_interpreted_policy_takes_the_kernel_and_builds_the_reference_tree(interpreted):
    assert interpreted["policy_impl"] == "triton"
    for batch, got in zip((1, 3), interpreted["policy"], strict=True):
        want = sampled_tree(batch)  # this process: the reference's tensor ops
        for name, a, b in zip(("tokens", "parents", "depth", "valid", "num_nodes"), want, got, strict=False):
            assert torch.equal(a, b), name


def _poison() -> None:
    """``torch.empty`` fills int64 / int32 outputs with -987654321 and uint8 ones with 200 from now on: a slot the
    kernel never writes shows up (no output holds those values)."""
    empty = torch.empty

    def poisoned(*args, **kwargs):
        t = empty(*args, **kwargs)
        return t.fill_(200) if t.dtype == torch.uint8 else t.fill_(-987654321) if not t.is_floating_point() else t

    torch.empty = poisoned


def _run_interpreted(folder: Path) -> None:
    """Subprocess entry: the Triton outputs of the saved cases through the interpreter, saved beside them."""
    from specdec.kernels.path_trie import triton as kernels

    data = torch.load(folder / "cases.pt")
    _poison()
    out = {"trie": [tuple(kernels.path_trie_triton(*args_of(c))) for c in data["cases"]]}
    with mock.patch.object(kernels, "path_trie_triton", side_effect=kernels.path_trie_triton) as spy:
        out["policy"] = [tuple(sampled_tree(batch))[:5] for batch in (1, 3)]
    out["policy_impl"] = "triton" if spy.call_count == 2 else "torch"
    torch.save(out, folder / "outputs.pt")


# --- compiled on CUDA ---------------------------------------------------------------------------------------------


def _needs_cuda() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")


@pytest.mark.gpu
def test_compiled_equals_the_brute_force_on_cuda():
    _needs_cuda()
    for case in cases(seed=2) + cases(seed=3):
        from specdec.kernels.path_trie.triton import path_trie_triton

        check(case, path_trie_triton(*args_of(case, "cuda")))
        check(case, path_trie(*args_of(case, "cuda")))  # auto: Triton on CUDA
        check(case, path_trie(*args_of(case, "cuda"), impl="torch"))


@pytest.mark.gpu
def test_compiled_trie_replays_in_a_cuda_graph():
    _needs_cuda()
    gen = torch.Generator().manual_seed(5)
    all_cases = [random_case(gen, 3, 4, 8, vocab) for vocab in (2, 3, 1000, 2, 5)]
    paths, root, slots = args_of(all_cases[0], "cuda")
    graph, out = capture_without_host_reads(lambda: path_trie(paths, root, slots, impl="triton"))
    for case in all_cases:
        paths.copy_(case["paths"])
        root.copy_(case["root"])
        graph.replay()
        check(case, [t.clone() for t in out])


if __name__ == "__main__":
    _run_interpreted(Path(sys.argv[1]))
