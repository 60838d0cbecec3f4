"""Batched recurrent verify and commit: ``B`` sequences, each with its own draft tree over its own committed state.

Every row of a batched ``tree_forward`` + ``commit_recurrent`` must equal the same row run alone through the one-row
path (``TreeRow``, ``[P]`` path, 0-d count; itself checked against HF in ``test_hybrid_tree`` / ``test_hybrid_commit``)
to fp32 rounding, and the committed state must equal the state HF's own forward reaches decoding the prompt and the
accepted path one token at a time. The prompt's chain (``prompt=True``) takes rows of different lengths.
"""

from __future__ import annotations

import copy

import pytest
import torch
from device_trees import padded_tree
from hybrid_harness import VOCAB, next_logits, path_logits, prefill, random_tree, state_tensors, tiny_hybrid
from oracles.eager_state import eager_manager_for

from specdec.state.hybrid import VerifyRound, adapter_forwards, cache_kwarg
from specdec.state.recurrent import DeviceTopology, commit_recurrent
from specdec.types import DeviceTree, DraftTree, TreeRow

# Gated DeltaNet (Qwen3.5, Qwen3-Next's fused projections), Mamba2 + attention (Nemotron-H), attention and Mamba2 in
# one layer with muP multipliers (Falcon-H1)
FAMILIES = ("qwen3_5", "qwen3_next", "nemotron_h", "falcon_h1")
PREFIX = 7
SLOTS = 10
# per row: (tree kind, real nodes); each setup mixes shapes, so a row reading another row's tree or state shows
SETUPS = {
    "mixed": [("random", 9), ("chain", 6), ("bush", 4)],
    "root_and_deep": [("deep", 10), ("root", 1), ("random", 7)],
}


@pytest.fixture(scope="module", params=FAMILIES)
def family_model(request):
    return request.param, tiny_hybrid(request.param)


def _mask(tree: TreeRow | DeviceTree, prefix_len: int) -> torch.Tensor:
    """Additive mask ``[B, 1, S, prefix_len + S]``: real nodes see the prefix and their ancestors, padding only
    itself (as the round's ``tree_mask``)."""
    parents = tree.parents if tree.parents.dim() == 2 else tree.parents[None]
    valid = tree.valid if tree.valid.dim() == 2 else tree.valid[None]
    rows, slots = parents.shape
    masks = []
    for b in range(rows):
        seen = torch.eye(slots, dtype=torch.bool)
        for i, p in enumerate(parents[b].tolist()):
            if p >= 0:
                seen[i] |= seen[p]
        prefix = valid[b][:, None].expand(slots, prefix_len)
        masks.append(torch.cat([prefix, seen], dim=1))
    allowed = torch.stack(masks)[:, None]
    return torch.zeros(allowed.shape).masked_fill_(~allowed, torch.finfo(torch.float32).min)


@torch.no_grad()
def _verify(model, adapters, cache, tree: TreeRow | DeviceTree, prefix_len: int, *, prompt: bool = False):
    """One tree forward of ``tree`` (one row or ``[B, S]``) through the adapters over a ``DeviceTopology``.
    Returns (logits ``[B, S, V]``, the ``VerifyRound``)."""
    rnd = VerifyRound(model=model, cache=cache, tree=None, prefix_len=prefix_len, topo=DeviceTopology(tree),
                      prompt=prompt)  # fmt: skip
    tokens = tree.tokens if tree.tokens.dim() == 2 else tree.tokens[None]
    depth = tree.depth if tree.depth.dim() == 2 else tree.depth[None]
    with adapter_forwards(adapters, rnd):
        out = model(
            input_ids=tokens,
            position_ids=depth + prefix_len,
            attention_mask=_mask(tree, prefix_len),
            **{cache_kwarg(model): cache},
            use_cache=True,
        )
    return out.logits, rnd


def _recurrent(cache, adapters) -> dict:
    """``{(layer, name): tensor}`` of the recurrent layers' conv windows and states (the adapters' layers)."""
    layers = {a.layer_idx for a in adapters}
    return {k: v for k, v in state_tensors(cache).items() if k[0] in layers and k[1] != "keys" and k[1] != "values"}


def _batched_cache(model, prompts: torch.Tensor, singles: list):
    """A cache of ``B`` rows whose row b holds exactly ``singles[b]`` (each prefilled alone)."""
    cache = prefill(model, prompts)
    for key, tensor in state_tensors(cache).items():
        for b, single in enumerate(singles):
            tensor[b].copy_(state_tensors(single)[key][0])
    return cache


def _path(tree: DraftTree, gen: torch.Generator) -> list[int]:
    node = int(torch.randint(0, tree.num_nodes, (1,), generator=gen))
    parents, path = tree.parents.tolist(), [node]
    while parents[path[-1]] >= 0:
        path.append(parents[path[-1]])
    return path[::-1]


def _close(got: torch.Tensor, want: torch.Tensor, rel: float, where: str) -> None:
    tol = rel * max(1.0, want.abs().max().item())
    diff = (got - want).abs().max().item()
    assert diff <= tol, f"{where}: differs by {diff:.2e} (tolerance {tol:.1e})"


@pytest.mark.parametrize("setup", SETUPS)
def test_batched_rows_equal_each_row_alone_and_hf(family_model, setup):
    family, model = family_model
    adapters = eager_manager_for(model).adapters
    gen = torch.Generator().manual_seed(len(setup))
    rows = len(SETUPS[setup])
    prompts = torch.randint(0, VOCAB, (rows, PREFIX), generator=gen)
    singles = [prefill(model, prompts[b : b + 1]) for b in range(rows)]
    batched = _batched_cache(model, prompts, singles)
    committed = [_recurrent(single, adapters) for single in singles]
    key = next(iter(committed[0]))
    assert not torch.equal(committed[0][key], committed[1][key])  # the rows start from different states

    trees, row_trees, paths = [], [], []
    for kind, n in SETUPS[setup]:
        tree = random_tree(gen, n, "chain" if kind == "root" else kind)
        trees.append(tree)
        row_trees.append(padded_tree(tree.tokens.tolist(), tree.parents.tolist(), SLOTS))
        paths.append(_path(tree, gen))
    width = max(len(p) for p in paths) + 1  # one padding entry at least
    path = torch.tensor([p + [p[-1]] * (width - len(p)) for p in paths])
    num_path = torch.tensor([len(p) for p in paths])

    logits, rnd = _verify(model, adapters, copy.deepcopy(batched), DeviceTree.stack(row_trees), PREFIX)
    assert rnd.topo.rows == rows and logits.shape[:2] == (rows, SLOTS)
    for adapter in adapters:
        commit_recurrent(adapter, rnd, path, num_path)
    got = _recurrent(rnd.cache, adapters)

    for b, tree in enumerate(trees):
        n = tree.num_nodes
        alone, one = _verify(model, adapters, copy.deepcopy(singles[b]), row_trees[b], PREFIX)
        for adapter in adapters:
            commit_recurrent(adapter, one, path[b], num_path[b])  # the one-row form: [P], 0-d
        _close(logits[b, :n], alone[0, :n], 1e-5, f"{family} row {b}: logits vs the row alone")
        _close(logits[b, :n], path_logits(model, prompts[b : b + 1], tree), 1e-5, f"{family} row {b}: vs HF paths")
        want = _recurrent(one.cache, adapters)
        for name, ref in want.items():
            _close(got[name][b], ref[0], 5e-6, f"{family} row {b}: {name} vs the row committed alone")

        # brute force: HF's own forward decodes the prompt and the accepted path one token at a time
        step_cache = copy.deepcopy(singles[b])
        for j, node in enumerate(paths[b]):
            step = next_logits(model, step_cache, int(tree.tokens[node]), PREFIX + j)
            _close(logits[b, node], step, 1e-5, f"{family} row {b}: node {node} vs HF's decode")
        for name, ref in _recurrent(step_cache, adapters).items():
            _close(got[name][b], ref[0], 5e-6, f"{family} row {b}: {name} vs HF's decode of the accepted path")


@torch.no_grad()
def test_prompt_chains_of_different_lengths(family_model):
    """The prompt's chain tree with a length per row (padding slots: single-node roots), from the empty state,
    committed by replaying each row's chain: logits and states equal the model's own forward over each prompt and
    the one-row chain."""
    family, model = family_model
    manager = eager_manager_for(model)
    adapters = manager.adapters
    gen = torch.Generator().manual_seed(1)
    lengths = torch.tensor([5, SLOTS, 2])
    rows = lengths.numel()
    ids = torch.randint(0, VOCAB, (rows, SLOTS), generator=gen)
    slots = torch.arange(SLOTS)
    real = slots < lengths[:, None]
    ids = torch.where(real, ids, 0)
    tree = DeviceTree(
        tokens=ids,
        parents=torch.where(real, slots - 1, -1),
        depth=torch.where(real, slots, 0),
        valid=real,
        num_nodes=lengths,
    )
    cache = prefill(model, ids[:, :1])
    manager.clear(cache)  # the empty state, attention rows cropped
    logits, rnd = _verify(model, adapters, cache, tree, 0, prompt=True)
    for adapter in adapters:
        commit_recurrent(adapter, rnd, slots.expand(rows, -1), lengths)
    got = _recurrent(cache, adapters)

    for b in range(rows):
        n = int(lengths[b])
        row = tree.row(b)
        single = prefill(model, ids[b : b + 1, :1])
        manager.clear(single)
        alone, one = _verify(model, adapters, single, row, 0, prompt=True)
        for adapter in adapters:
            commit_recurrent(adapter, one, slots, row.num_nodes)
        _close(logits[b, :n], alone[0, :n], 1e-5, f"{family} prompt row {b}: logits vs the row alone")
        for name, ref in _recurrent(single, adapters).items():
            _close(got[name][b], ref[0], 5e-6, f"{family} prompt row {b}: {name} vs the row alone")
        hf = prefill(model, ids[b : b + 1, :n])  # the model's own (chunked) prefill
        _close(logits[b, :n], model(input_ids=ids[b : b + 1, :n]).logits[0], 1e-4, f"{family} prompt row {b}: logits")
        for name, ref in _recurrent(hf, adapters).items():
            _close(got[name][b], ref[0], 1e-4, f"{family} prompt row {b}: {name} vs the model's prefill")


def test_device_topology_rows():
    """A ``[B, S]`` tree gives ``B`` rows and per-row conv tables equal to each row's own; a ``TreeRow`` keeps the
    one-row shapes."""
    gen = torch.Generator().manual_seed(0)
    rows = [padded_tree(t.tokens.tolist(), t.parents.tolist(), 12) for t in
            (random_tree(gen, 12, "random"), random_tree(gen, 5, "chain"), random_tree(gen, 1, "chain"))]  # fmt: skip
    topo = DeviceTopology(DeviceTree.stack(rows))
    assert (topo.rows, topo.num_nodes, topo.batched) == (3, 12, True)
    index = topo.conv_index(4, 3)
    assert index.shape == (3, 12, 4)
    for b, row in enumerate(rows):
        alone = DeviceTopology(row)
        assert (alone.rows, alone.num_nodes, alone.batched) == (1, 12, False)
        assert torch.equal(index[b], alone.conv_index(4, 3))
    with pytest.raises(ValueError, match="too short"):
        topo.conv_index(4, 2)


@torch.no_grad()
def test_row_mismatches_are_refused():
    model = tiny_hybrid("qwen3_5")
    adapters = eager_manager_for(model).adapters
    gen = torch.Generator().manual_seed(2)
    tree = DeviceTree.stack([padded_tree([1, 2, 3], [-1, 0, 0], 4)] * 2)
    one_row = prefill(model, torch.randint(0, VOCAB, (1, PREFIX), generator=gen))
    with pytest.raises(ValueError, match="1 rows of conv windows .* 2 trees"):
        _verify(model, adapters, copy.deepcopy(one_row), tree, PREFIX)  # a cache of one row, trees for two
    two_rows = prefill(model, torch.randint(0, VOCAB, (2, PREFIX), generator=gen))
    rnd = VerifyRound(model=model, cache=two_rows, tree=None, prefix_len=PREFIX, topo=DeviceTopology(tree))
    with adapter_forwards(adapters, rnd), pytest.raises(ValueError, match=r"\[rows, slots\] = \[2, 4\]"):
        model(input_ids=tree.tokens[:1], **{cache_kwarg(model): two_rows})  # hidden states of one row
    _, rnd = _verify(model, adapters, copy.deepcopy(two_rows), tree, PREFIX)
    with pytest.raises(ValueError, match="path has 3 rows"):
        commit_recurrent(adapters[0], rnd, torch.zeros(3, 2, dtype=torch.long), torch.ones(3, dtype=torch.long))
    with pytest.raises(ValueError, match="num_path"):
        commit_recurrent(adapters[0], rnd, torch.zeros(2, 2, dtype=torch.long), torch.ones((), dtype=torch.long))
