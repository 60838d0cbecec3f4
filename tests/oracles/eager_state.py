"""The eager state path: tree verify and commit over HF dynamic caches, with host-side tree topologies.

The round (``specdec.engine``) commits attention K/V in its static storage (``specdec.state.storage.commit_rows``)
and recurrent state on the device (``specdec.state.recurrent.commit_recurrent`` over a ``DeviceTopology``). This
module is the independent reference of those stages, built over the library's own adapters:

- ``EagerKVState``: K/V commit / rollback of attention-only targets on a ``DynamicCache`` (gather of the accepted
  window entries, crop of the rest).
- ``TreeTopology`` / ``tree_scan``: the tree as host lists and per-depth index tensors, and the level-synchronous
  recurrence over it (the adapters' path before the fused tree kernels).
- ``EagerHybridState``: ``verify_scope`` (the adapters over a ``TreeTopology``), ``commit`` (per-layer replay of the
  accepted path in a host loop, conv window rebuilt from the path's pre-conv inputs), ``rollback``, ``clear``, and
  the ``"snapshot"`` mode (snapshot before verify, restore + replay of the accepted tokens through the model's own
  forward at commit).

``eager_manager(manager)`` / ``eager_manager_for(model)`` turn the library's manager of a model into its eager one.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from specdec.state import manager_for
from specdec.state.hybrid import (
    HybridState,
    RecurrentAdapter,
    VerifyRound,
    _state_tensor,
    adapter_forwards,
    cache_kwarg,
    is_recurrent_cache_layer,
)
from specdec.state.kv import KVState
from specdec.state.snapshot import Snapshot, restore, snapshot
from specdec.types import DraftTree

__all__ = [
    "EagerHybridState",
    "EagerKVState",
    "EagerRound",
    "TreeTopology",
    "commit_adapter",
    "eager_manager",
    "eager_manager_for",
    "gather_kv_window",
    "tree_scan",
    "truncate_kv",
]

logger = logging.getLogger(__name__)


# -- attention K/V on a DynamicCache ---------------------------------------------------------------------------


def _attention_layers(cache) -> Iterator:
    for layer in cache.layers:
        keys = getattr(layer, "keys", None)
        if isinstance(keys, torch.Tensor) and keys.dim() == 4:
            yield layer


def gather_kv_window(layer, prefix_len: int, path: Sequence[int]) -> None:
    """Keep ``prefix_len`` entries plus the window entries at ``path`` (node indices) in one attention layer."""
    n = len(path)
    if list(path) != list(range(n)):  # a chain prefix needs no copy, only the crop below
        idx = torch.as_tensor(path, device=layer.keys.device) + prefix_len
        layer.keys[:, :, prefix_len : prefix_len + n] = layer.keys.index_select(2, idx)
        layer.values[:, :, prefix_len : prefix_len + n] = layer.values.index_select(2, idx)
    layer.keys = layer.keys[:, :, : prefix_len + n]
    layer.values = layer.values[:, :, : prefix_len + n]


def truncate_kv(layer, length: int) -> None:
    layer.keys = layer.keys[:, :, :length]
    layer.values = layer.values[:, :, :length]


class EagerKVState(KVState):
    """Attention-only targets on a ``DynamicCache`` (every layer a ``DynamicLayer``).

    - ``verify_scope(model, cache, tree, prefix_len)``: wraps the target's tree forward (attention needs nothing).
    - ``commit(cache, prefix_len, path)``: keep the accepted nodes' K/V, as if the path had been run causally.
    - ``rollback(cache, prefix_len)``: drop the entries past ``prefix_len``.
    """

    @contextmanager
    def verify_scope(self, model, cache, tree: DraftTree, prefix_len: int) -> Iterator[None]:
        yield

    def commit(self, cache, prefix_len: int, path: Sequence[int]) -> None:
        for layer in _attention_layers(cache):
            gather_kv_window(layer, prefix_len, path)

    def rollback(self, cache, prefix_len: int) -> None:
        for layer in _attention_layers(cache):
            if layer.keys.shape[2] > prefix_len:
                truncate_kv(layer, prefix_len)


# -- host tree topology and the level-synchronous scan ---------------------------------------------------------


@dataclass(frozen=True)
class _Level:
    nodes: torch.Tensor  # [n] node ids at this depth
    parent_slots: torch.Tensor | None  # [n] scratch slot of each node's parent (None at depth 0)
    store_rows: torch.Tensor | None  # [m] rows of this level that have children (their state is kept)
    store_slots: torch.Tensor | None  # [m] scratch slots for those rows


@dataclass(frozen=True)
class TreeTopology:
    """Per-depth node groups and conv gather tables of one host tree (built once per verify, shared by all layers).

    Args:
        parents (list[int]): the parent array (``parents[0] = -1``).
        levels (tuple[_Level, ...]): nodes per depth with the scratch slots of the level-synchronous scan.
        num_internal (int): nodes with at least one child (only their states are kept during the scan).
        device (torch.device): where the index tensors live.
        tree (DraftTree): the tree it was built from (``to`` rebuilds it on another device).
    """

    parents: list[int]
    levels: tuple[_Level, ...]
    num_internal: int
    device: torch.device
    tree: DraftTree | None = field(default=None, repr=False, compare=False)
    _conv_index: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_tree(cls, tree: DraftTree, device: torch.device | str) -> TreeTopology:
        parents = [int(p) for p in tree.parents.tolist()]
        depth = [int(d) for d in tree.depth.tolist()]
        n = len(parents)
        has_child = [False] * n
        for p in parents[1:]:
            has_child[p] = True
        slot, num_internal = [-1] * n, 0
        for i in range(n):
            if has_child[i]:
                slot[i], num_internal = num_internal, num_internal + 1
        by_depth: list[list[int]] = [[] for _ in range(max(depth) + 1)]
        for i, d in enumerate(depth):
            by_depth[d].append(i)

        def t(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.long, device=device)

        levels = []
        for d, nodes in enumerate(by_depth):
            rows = [r for r, i in enumerate(nodes) if has_child[i]]
            levels.append(
                _Level(
                    nodes=t(nodes),
                    parent_slots=t([slot[parents[i]] for i in nodes]) if d else None,
                    store_rows=t(rows) if rows else None,
                    store_slots=t([slot[nodes[r]] for r in rows]) if rows else None,
                )
            )
        return cls(
            parents=parents, levels=tuple(levels), num_internal=num_internal, device=torch.device(device), tree=tree
        )

    def to(self, device: torch.device | str) -> TreeTopology:
        """The same tree with its index tensors on ``device`` (layers may sit on different devices)."""
        return self if torch.device(device) == self.device else TreeTopology.from_tree(self.tree, device)

    @property
    def num_nodes(self) -> int:
        return len(self.parents)

    @functools.cached_property
    def is_chain(self) -> bool:
        """Each node's parent is the node before (computed once per tree, read by every layer)."""
        return all(p == i - 1 for i, p in enumerate(self.parents))

    def conv_index(self, width: int, stored: int) -> torch.Tensor:
        """Gather table ``[N, width]`` of each node's conv taps, oldest first, newest = the node itself.

        Indices point into ``cat(committed window (stored columns), node inputs (N columns))``: node i is column
        ``stored + i``; above the root the walk continues into the committed window, newest column first.
        """
        key = (width, stored)
        if key not in self._conv_index:
            rows = []
            for i in range(self.num_nodes):
                taps, node, above = [0] * width, i, 0
                for t in range(width - 1, -1, -1):
                    if node >= 0:
                        taps[t], node = stored + node, self.parents[node]
                    else:
                        above += 1
                        if above > stored:
                            raise ValueError(f"conv window of {stored} columns is too short for kernel width {width}")
                        taps[t] = stored - above
                rows.append(taps)
            self._conv_index[key] = torch.tensor(rows, dtype=torch.long, device=self.device)
        return self._conv_index[key]


def tree_scan(
    init: torch.Tensor,
    topo: TreeTopology,
    step: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
) -> torch.Tensor:
    """Level-synchronous recurrence over a tree: ``state(i) = f(state(parent(i)), x_i)``, batched per depth.

    Args:
        init (torch.Tensor): ``[1, *S]`` committed state (the root's parent state).
        topo (TreeTopology): the tree.
        step: ``step(parent_states [n, *S], nodes [n]) -> (states [n, *S], outputs [n, *O])``.

    Returns:
        outputs ``[N, *O]`` in node order. Only states of nodes with children are kept (scratch of
        ``num_internal`` states); nothing is written back.
    """
    scratch = init.new_empty((topo.num_internal, *init.shape[1:])) if topo.num_internal else None
    outputs = None
    for depth, level in enumerate(topo.levels):
        prev = init if depth == 0 else scratch.index_select(0, level.parent_slots)
        states, out = step(prev, level.nodes)
        if outputs is None:
            outputs = out.new_empty((topo.num_nodes, *out.shape[1:]))
        outputs.index_copy_(0, level.nodes, out)
        if level.store_rows is not None:
            scratch.index_copy_(0, level.store_slots, states.index_select(0, level.store_rows))
    return outputs


# -- hybrid targets --------------------------------------------------------------------------------------------


@dataclass
class EagerRound(VerifyRound):
    """A ``VerifyRound`` over a host tree, plus what the snapshot mode keeps for its commit / rollback."""

    snap: Snapshot | None = None
    native: bool = False


def commit_adapter(adapter: RecurrentAdapter, rnd: VerifyRound, path: Sequence[int]) -> None:
    """Write the state after the accepted ``path`` (replayed node by node from the committed state, a host loop)
    and its conv window into one recurrent layer of the cache."""
    conv, rec = adapter.states(rnd)
    stash = rnd.stash[adapter.layer_idx]
    path = torch.tensor(path, dtype=torch.long, device=conv.device)
    state = rec.float()
    for j in range(path.numel()):
        state = adapter.advance(state, stash, path[j : j + 1])
    window = torch.cat([conv, stash.preconv.index_select(0, path).transpose(0, 1)[None].to(conv.dtype)], dim=-1)
    conv.copy_(window[..., -conv.shape[-1] :])
    rec.copy_(state.to(rec.dtype))


class EagerHybridState(HybridState):
    """Hybrid targets on a ``DynamicCache``: tree verify through the recurrent adapters over a ``TreeTopology``,
    then ``commit`` or ``rollback`` (one round at a time).

    ``mode="exact"``: commit replays the stashed inputs of the accepted path. ``mode="snapshot"``: the cache is
    snapshotted before verify; chains verify through the model's own forward, other trees through the adapters;
    commit restores the snapshot and re-runs the accepted tokens through the model's own forward.
    """

    def __init__(self, adapters: Sequence[RecurrentAdapter], *, mode: str = "exact") -> None:
        super().__init__(adapters, mode=mode)
        self._kv = EagerKVState()
        self._round: EagerRound | None = None

    def _check_cache(self, cache) -> None:
        covered = {a.layer_idx for a in self.adapters}
        for idx, layer in enumerate(cache.layers):
            if (
                is_recurrent_cache_layer(layer)
                and idx not in covered
                and _state_tensor(layer, "conv_states") is not None
            ):
                raise ValueError(
                    f"Cache layer {idx} ({type(layer).__name__}) holds recurrent state but no adapter covers it; "
                    "this model has a recurrent layer specdec cannot verify exactly."
                )

    @contextmanager
    def verify_scope(self, model, cache, tree: DraftTree, prefix_len: int, *, prompt: bool = False) -> Iterator[None]:
        """Wrap the target's one forward over ``tree`` (tokens in node order, positions ``prefix_len + depth``);
        ``prompt``: the tree is the prompt's chain (``VerifyRound.prompt``)."""
        if self._round is not None:
            logger.debug("verify_scope: discarding a round that was neither committed nor rolled back")
        self._check_cache(cache)
        device = self.adapters[0].module.conv1d.weight.device
        rnd = EagerRound(
            model=model,
            cache=cache,
            tree=tree,
            prefix_len=prefix_len,
            topo=TreeTopology.from_tree(tree, device),
            prompt=prompt,
        )
        if self.mode == "snapshot":
            rnd.snap = snapshot(cache, attention="length")
            rnd.native = rnd.topo.is_chain
        self._round = rnd
        if rnd.native:
            yield
            self._check_native_ran(rnd)
            return
        with adapter_forwards(self.adapters, rnd):
            yield
        missing = [a.layer_idx for a in self.adapters if a.layer_idx not in rnd.stash]
        if missing:
            raise RuntimeError(f"The verify forward did not run recurrent layers {missing} through verify_scope.")

    def _check_native_ran(self, rnd: EagerRound) -> None:
        adapter = self.adapters[0]
        _, rec = adapter.states(rnd)
        saved = rnd.snap.layers[adapter.layer_idx]
        before = saved.linear.get("recurrent_states", saved.tensors.get("recurrent_states"))
        before = before.get(0) if isinstance(before, dict) else before
        if before is not None and torch.equal(before, rec):
            raise ValueError(
                "The verify forward left the recurrent state unchanged: the model did not receive the cache given "
                f"to verify_scope (pass it as {cache_kwarg(rnd.model)!r})."
            )

    def take_round(self, cache, prefix_len: int) -> EagerRound:
        """The verified round of ``cache`` at ``prefix_len``, handed over (the state forgets it)."""
        rnd, self._round = self._round, None
        if rnd is None:
            raise RuntimeError("commit without a verify_scope: there is no verified tree to commit.")
        if rnd.cache is not cache or rnd.prefix_len != prefix_len:
            raise ValueError(
                f"commit(prefix_len={prefix_len}) does not match the verified round (prefix_len={rnd.prefix_len})."
            )
        return rnd

    def commit(self, cache, prefix_len: int, path: Sequence[int]) -> None:
        """Keep the accepted root-to-node ``path`` (node indices, root first) as if run causally."""
        rnd = self.take_round(cache, prefix_len)
        path = _check_path(rnd.tree, path)
        if self.mode == "snapshot":
            restore(cache, rnd.snap)
            _replay(rnd, path)
            return
        self._kv.commit(cache, prefix_len, path)
        for adapter in self.adapters:
            commit_adapter(adapter, rnd, path)

    def clear(self, cache) -> None:
        """Empty ``cache`` in place: every recurrent layer's conv window and state zeroed (the state before any
        token), every attention layer cropped to no tokens. The cache must have been run (its layers exist)."""
        self._round = None
        for adapter in self.adapters:
            layer = cache.layers[adapter.layer_idx]
            for name in ("conv_states", "recurrent_states"):
                state = _state_tensor(layer, name)
                if state is None:
                    raise ValueError(f"Layer {adapter.layer_idx} has no {name} yet: run a token through the model.")
                state.zero_()
        self._kv.rollback(cache, 0)

    def rollback(self, cache, prefix_len: int) -> None:
        """Undo a verify forward (exact mode never wrote recurrent state; snapshot mode restores its snapshot)."""
        rnd, self._round = self._round, None
        if rnd is not None and rnd.snap is not None and rnd.cache is cache:
            restore(cache, rnd.snap)
            return
        if rnd is None:
            lengths = [layer.keys.shape[-2] for layer in _attention_layers(cache)]
            if any(n > prefix_len for n in lengths):
                raise ValueError(
                    f"Cannot roll a hybrid cache back to {prefix_len} committed tokens: recurrent state of committed "
                    "tokens cannot be rewound (take a specdec.state.snapshot before and restore it instead)."
                )
        self._kv.rollback(cache, prefix_len)


def _check_path(tree: DraftTree, path: Sequence[int]) -> list[int]:
    path = [int(i) for i in path]
    parents = tree.parents.tolist()
    ok = bool(path) and path[0] == 0 and all(parents[b] == a for a, b in zip(path, path[1:], strict=False))
    if not ok:
        raise ValueError(f"path {path} is not a root-to-node path of the tree (parents {parents}).")
    return path


@torch.no_grad()
def _replay(rnd: VerifyRound, path: list[int]) -> None:
    """Run the accepted tokens through the model's own forward on top of the restored cache."""
    model = rnd.model
    params = inspect.signature(type(model).forward).parameters
    device = model.get_input_embeddings().weight.device
    tokens = rnd.tree.tokens.to(device).index_select(0, torch.tensor(path, device=device))[None]
    kwargs = {cache_kwarg(model): rnd.cache, "use_cache": True}
    if "position_ids" in params:
        kwargs["position_ids"] = torch.arange(len(path), device=device)[None] + rnd.prefix_len
    if "logits_to_keep" in params:
        kwargs["logits_to_keep"] = 1
    model(input_ids=tokens, **kwargs)


def eager_manager(manager) -> EagerKVState | EagerHybridState:
    """The eager counterpart of a library state manager (same adapters and mode)."""
    if isinstance(manager, (EagerKVState, EagerHybridState)):
        return manager
    if isinstance(manager, HybridState):
        return EagerHybridState(manager.adapters, mode=manager.mode)
    return EagerKVState()


def eager_manager_for(model, *, hybrid_mode: str = "exact") -> EagerKVState | EagerHybridState:
    """``eager_manager(specdec.state.manager_for(model, hybrid_mode=...))``."""
    return eager_manager(manager_for(model, hybrid_mode=hybrid_mode))
