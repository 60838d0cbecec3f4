"""Exact tree verification and commit for hybrid (recurrent + attention) HF targets.

During ``verify_scope`` every supported recurrent mixer runs through a per-family adapter (``gdn.py``,
``mamba2.py``) instead of its HF forward: the short conv reads each node's ancestor path (falling back to the
committed conv window above the root), the recurrence runs per path, ``state(node) = f(state(parent), x_node)``,
in fp32 (``specdec.kernels.tree_gdn`` / ``tree_mamba2``: one tree depth at a time in their torch references, one
fused Triton launch per layer on CUDA), and nothing is written to the cache. The adapter stashes the small per-node
inputs of the recurrence; ``commit`` replays only the accepted path from the committed state and rebuilds the
conv window from the path's pre-conv inputs. Attention layers use the KV commit of ``kv.py``. The maths and
costs are in ``docs/hybrid.md``.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from specdec.backends import env_default
from specdec.state.forwards import swapped_forwards
from specdec.state.kv import KVState
from specdec.state.snapshot import Snapshot, restore, snapshot
from specdec.types import DraftTree

__all__ = [
    "AUTO_SCAN_MAX_TOKENS",
    "HYBRID_MODES",
    "HYBRID_PREFILLS",
    "HybridState",
    "RecurrentAdapter",
    "TreeTopology",
    "VerifyRound",
    "cache_kwarg",
    "hybrid_prefill",
    "is_recurrent_cache_layer",
    "tree_conv",
    "tree_scan",
]

logger = logging.getLogger(__name__)

HYBRID_MODES = ("exact", "snapshot")
HYBRID_PREFILLS = ("auto", "model", "scan")
"""How hybrid targets run the prompt (``SPECDEC_HYBRID_PREFILL``): ``"model"``, the model's own forward (HF's
chunked or fused kernels); ``"scan"``, the prompt as a chain tree through specdec's adapters and tree scans, then
the commit's replay (captured on the fast path); ``"auto"`` (default), ``scan`` for prompts of up to
``AUTO_SCAN_MAX_TOKENS`` tokens on CUDA (faster there, docs/hybrid.md) and ``model`` otherwise. Both are exact; in
bf16 they round differently."""

AUTO_SCAN_MAX_TOKENS = 4096
"""The longest prompt ``"auto"`` prefills by the scan. The scan walks a prompt's chain one node after another in
every recurrent layer and attends under an N x N mask (32 MiB in bf16 at this length), where the model's chunked
forward is parallel over the prompt; past this length ``auto`` leaves long prompts to the model. A guard on
memory and sequential steps, not a measured crossover (the zoo's prompts, up to 649 tokens, are measured)."""


PREFILL = env_default("hybrid_prefill")  # "auto", "scan" or "model" (specdec.backends)


def hybrid_prefill(device: torch.device | str | None = None, num_tokens: int | None = None) -> str:
    """The hybrid prefill chosen by ``SPECDEC_HYBRID_PREFILL`` for a prompt of ``num_tokens`` tokens and a target
    on ``device`` (read at each call; ``"graph"`` is an older name of ``"scan"``): ``"model"`` or ``"scan"``,
    ``"auto"`` resolved by the device and the length (``None`` counts as CPU / as a short prompt)."""
    value = PREFILL
    if value == "auto":
        on_cuda = device is not None and torch.device(device).type == "cuda"
        short = num_tokens is None or num_tokens <= AUTO_SCAN_MAX_TOKENS
        return "scan" if on_cuda and short else "model"
    return value


_CACHE_KWARGS = ("cache", "past_key_values", "cache_params")  # newest name first (5.24: cache; 5.17: the others)


@dataclass(frozen=True)
class _Level:
    nodes: torch.Tensor  # [n] node ids at this depth
    parent_slots: torch.Tensor | None  # [n] scratch slot of each node's parent (None at depth 0)
    store_rows: torch.Tensor | None  # [m] rows of this level that have children (their state is kept)
    store_slots: torch.Tensor | None  # [m] scratch slots for those rows


@dataclass(frozen=True)
class TreeTopology:
    """Per-depth node groups and conv gather tables of one tree (built once per verify, shared by all layers).

    Args:
        parents (list[int]): the parent array (``parents[0] = -1``).
        levels (tuple[_Level, ...]): nodes per depth with the scratch slots of the level-synchronous scan.
        num_internal (int): nodes with at least one child (only their states are kept during the scan).
        device (torch.device): where the index tensors live.
    """

    parents: list[int]
    levels: tuple[_Level, ...]
    num_internal: int
    device: torch.device
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
        return cls(parents=parents, levels=tuple(levels), num_internal=num_internal, device=torch.device(device))

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


def tree_conv(
    inputs: torch.Tensor,
    window: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    index: torch.Tensor,
    activation: Callable[[torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """Depthwise causal conv of every tree node over its own ancestor path.

    Args:
        inputs (torch.Tensor): ``[N, C]`` pre-conv inputs of the nodes.
        window (torch.Tensor): ``[C, S]`` committed conv window (newest column last).
        weight (torch.Tensor): ``[C, W]`` depthwise kernel; bias ``[C]`` or None.
        index (torch.Tensor): ``[N, W]`` from ``TreeTopology.conv_index(W, S)``.
        activation: applied to the conv output (fp32).

    Returns:
        ``[N, C]`` in the dtype of ``inputs``.
    """
    src = torch.cat([window, inputs.transpose(0, 1)], dim=1).float()  # [C, S + N]
    taps = src[:, index]  # [C, N, W]
    out = (taps * weight.float()[:, None, :]).sum(-1)  # [C, N]
    if bias is not None:
        out = out + bias.float()[:, None]
    return activation(out).transpose(0, 1).to(inputs.dtype)


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


def _state_tensor(layer, name: str) -> torch.Tensor | None:
    value = getattr(layer, name, None)
    if isinstance(value, dict):
        value = value.get(0)
    return value if isinstance(value, torch.Tensor) else None


def is_recurrent_cache_layer(layer) -> bool:
    """Whether an HF cache layer carries conv / recurrent state (``LinearAttentionLayer`` and friends)."""
    return hasattr(layer, "conv_states") or hasattr(layer, "recurrent_states")


def cache_kwarg(model) -> str:
    """Name under which ``model.forward`` takes the cache (``cache`` on 5.24, else ``past_key_values`` or
    ``cache_params``; an unknown name is silently swallowed by ``**kwargs``, so it must be looked up)."""
    params = inspect.signature(type(model).forward).parameters
    for name in _CACHE_KWARGS:
        if name in params:
            return name
    raise ValueError(f"{type(model).__name__}.forward takes no cache argument (looked for {_CACHE_KWARGS}).")


@dataclass
class VerifyRound:
    """Everything one verify forward leaves for ``commit`` / ``rollback``."""

    model: object
    cache: object
    tree: DraftTree
    prefix_len: int
    topo: TreeTopology
    stash: dict[int, object] = field(default_factory=dict)  # layer_idx -> adapter stash
    snap: Snapshot | None = None
    native: bool = False
    prompt: bool = False  # the prompt's chain tree (the scan prefill): tree scans walk the nodes in order
    _on_device: dict = field(default_factory=dict, repr=False)

    def topology(self, device: torch.device) -> TreeTopology:
        """The tree's topology with index tensors on ``device`` (layers may sit on different devices)."""
        if device not in self._on_device:
            self._on_device[device] = (
                self.topo if self.topo.device == device else TreeTopology.from_tree(self.tree, device)
            )
        return self._on_device[device]


class RecurrentAdapter:
    """Owns one HF recurrent mixer's forward during tree verification (subclasses per layer family).

    Subclasses implement ``tree_forward(hidden_states, rnd) -> output`` (reading the committed state through
    ``self.states(rnd)`` and storing a stash in ``rnd.stash[self.layer_idx]``) and
    ``advance(state, stash, nodes) -> state`` (one recurrence step for a batch of nodes, used for the replay).
    """

    family = "recurrent"

    def __init__(self, module) -> None:
        self.module = module
        self.layer_idx = int(module.layer_idx)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({type(self.module).__name__}, layer {self.layer_idx})"

    def tree_forward(self, hidden_states: torch.Tensor, rnd: VerifyRound) -> torch.Tensor:
        raise NotImplementedError

    def advance(self, state: torch.Tensor, stash, nodes: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def replay(self, state: torch.Tensor, stash, path: torch.Tensor, num_path: torch.Tensor) -> torch.Tensor:
        """The fp32 state after the nodes ``path[:num_path]`` (``P`` masked ``advance`` steps, no host read);
        may update ``state`` in place. Subclasses with a fused kernel override it."""
        for step in range(path.shape[0]):
            state = torch.where(num_path > step, self.advance(state, stash, path[step : step + 1]), state)
        return state

    def states(self, rnd: VerifyRound) -> tuple[torch.Tensor, torch.Tensor]:
        """Committed ``(conv window [1, C, S], recurrent state [1, ...])`` of this layer."""
        layer = rnd.cache.layers[self.layer_idx]
        conv, rec = _state_tensor(layer, "conv_states"), _state_tensor(layer, "recurrent_states")
        if conv is None or rec is None:
            raise ValueError(
                f"Layer {self.layer_idx} ({type(self.module).__name__}) has no recurrent state in the cache: "
                "prefill at least one token through the model before verifying a tree."
            )
        if conv.shape[0] != 1:
            raise ValueError(f"specdec verifies one sequence at a time; the cache has batch size {conv.shape[0]}.")
        if getattr(layer, "record_past", False):
            raise ValueError(
                f"Cache layer {self.layer_idx} records past conv states (activate_past_recording); "
                "specdec commits the accepted path itself, turn recording off."
            )
        return conv, rec

    def commit(self, rnd: VerifyRound, path: Sequence[int]) -> None:
        """Write the state after the accepted path (replayed from the committed state) and its conv window."""
        conv, rec = self.states(rnd)
        stash = rnd.stash[self.layer_idx]
        path = torch.tensor(path, dtype=torch.long, device=conv.device)
        state = rec.float()
        for j in range(path.numel()):
            state = self.advance(state, stash, path[j : j + 1])
        window = torch.cat([conv, stash.preconv.index_select(0, path).transpose(0, 1)[None].to(conv.dtype)], dim=-1)
        conv.copy_(window[..., -conv.shape[-1] :])
        rec.copy_(state.to(rec.dtype))

    def bound_forward(self, rnd: VerifyRound) -> Callable:
        """The replacement for the mixer's ``forward`` during one verify forward."""

        def forward(*args, **kwargs):
            if "hidden_states" in kwargs:
                hidden_states, rest = kwargs.pop("hidden_states"), list(args)
            else:
                hidden_states, rest = args[0], list(args[1:])
            cache = next((kwargs[k] for k in _CACHE_KWARGS if k in kwargs), rest[0] if rest else None)
            if cache is not rnd.cache:
                raise ValueError(
                    f"{type(self.module).__name__} (layer {self.layer_idx}) did not receive the cache given to "
                    f"verify_scope: pass it to the model under the name its forward takes "
                    f"({cache_kwarg(rnd.model)!r} for {type(rnd.model).__name__})."
                )
            mask = kwargs.get("attention_mask", rest[1] if len(rest) > 1 else None)
            if isinstance(mask, torch.Tensor) and mask.dim() == 2 and not bool(mask.bool().all()):
                raise ValueError("Padded batches are not supported in tree verification (2D mask with zeros).")
            if hidden_states.shape[0] != 1 or hidden_states.shape[1] != rnd.topo.num_nodes:
                raise ValueError(
                    f"{type(self.module).__name__} got hidden states {tuple(hidden_states.shape)}; a tree verify "
                    f"forward must hold exactly the {rnd.topo.num_nodes} tree nodes of one sequence."
                )
            if self.layer_idx in rnd.stash:
                raise RuntimeError(f"Layer {self.layer_idx} ran twice in one verify forward.")
            return self.tree_forward(hidden_states, rnd)

        return forward


def adapter_forwards(adapters: Sequence[RecurrentAdapter], rnd: VerifyRound):
    """Route each adapted mixer's ``forward`` to its adapter; always restored on exit (hook-safe:
    ``specdec.state.forwards.swapped_forwards``)."""
    return swapped_forwards((adapter.module, adapter.bound_forward(rnd)) for adapter in adapters)


class HybridState:
    """State manager of hybrid targets: exact tree verification through recurrent adapters.

    Same protocol as ``KVState`` (``verify_scope`` / ``commit`` / ``rollback``). One round at a time: a
    ``verify_scope`` must be followed by ``commit`` or ``rollback`` before the next one.

    Args:
        adapters (Sequence[RecurrentAdapter]): one per recurrent mixer of the model.
        mode (str): ``"exact"`` (default): adapters verify and commit replays the stashed path inputs.
            ``"snapshot"``: the cache is snapshotted before verify; chains verify through the model's own
            forward, other trees through the adapters; commit restores the snapshot and re-runs the accepted
            tokens through the model's own forward (one extra forward of ``len(path)`` tokens per round).
    """

    name = "hybrid"

    def __init__(self, adapters: Sequence[RecurrentAdapter], *, mode: str = "exact") -> None:
        if mode not in HYBRID_MODES:
            raise ValueError(f"hybrid_mode={mode!r}: choose one of {HYBRID_MODES}.")
        if not adapters:
            raise ValueError("HybridState needs at least one recurrent adapter (use KVState for attention-only).")
        self.adapters = tuple(adapters)
        self.mode = mode
        self._kv = KVState()
        self._round: VerifyRound | None = None

    def __repr__(self) -> str:
        families = sorted({type(a.module).__name__ for a in self.adapters})
        return f"HybridState(mode={self.mode!r}, {len(self.adapters)} recurrent layers: {', '.join(families)})"

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
        rnd = VerifyRound(
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

    def _check_native_ran(self, rnd: VerifyRound) -> None:
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

    def take_round(self, cache, prefix_len: int) -> VerifyRound:
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
            adapter.commit(rnd, path)

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
            lengths = [
                layer.keys.shape[-2]
                for layer in cache.layers
                if isinstance(getattr(layer, "keys", None), torch.Tensor) and layer.keys.dim() == 4
            ]
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
