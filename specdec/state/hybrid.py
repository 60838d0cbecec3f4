"""Tree verification of hybrid (recurrent + attention) HF targets: the recurrent adapters and the verify round.

During the round's tree forward every supported recurrent mixer runs through a per-family adapter (``gdn.py``,
``mamba2.py``) instead of its HF forward (``adapter_forwards``): the short conv reads each node's ancestor path
(falling back to the committed conv window above the root), the recurrence runs per path,
``state(node) = f(state(parent), x_node)``, in fp32 (``specdec.kernels.tree_gdn`` / ``tree_mamba2``: one fused
Triton launch per layer on CUDA), and nothing is written to the cache. The adapter stashes the small per-node
inputs of the recurrence; the commit (``specdec.state.recurrent.commit_recurrent``) replays only the accepted path
from the committed state and rebuilds the conv window from the path's pre-conv inputs. The maths and costs are in
``docs/hybrid.md``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from specdec.backends import env_default
from specdec.kernels.tree_conv import tree_conv
from specdec.state.forwards import swapped_forwards
from specdec.types import DraftTree

__all__ = [
    "AUTO_SCAN_MAX_TOKENS",
    "HYBRID_MODES",
    "HYBRID_PREFILLS",
    "HybridState",
    "RecurrentAdapter",
    "VerifyRound",
    "adapter_forwards",
    "cache_kwarg",
    "check_hybrid_mode",
    "hybrid_prefill",
    "is_recurrent_cache_layer",
    "path_rows",
    "topology_rows",
    "tree_conv",
]

HYBRID_MODES = ("exact", "snapshot")
"""Names ``hybrid_mode`` accepts. The round runs ``"exact"`` (the adapters, any tree) only; ``"snapshot"`` (restore a
whole-cache snapshot and re-run the accepted tokens through the model) is refused by it with a reason
(``specdec.engine.round_reason``)."""


def check_hybrid_mode(mode) -> None:
    """Refuse a ``hybrid_mode`` that is not one of ``HYBRID_MODES`` (the one message every entry point gives)."""
    if not isinstance(mode, str) or mode not in HYBRID_MODES:
        raise ValueError(f"hybrid_mode={mode!r}: choose one of {HYBRID_MODES} (the round runs 'exact').")
HYBRID_PREFILLS = ("auto", "model", "scan")
"""How hybrid targets run the prompt (``SPECDEC_HYBRID_PREFILL``): ``"model"``, the model's own forward (HF's
chunked or fused kernels); ``"scan"``, the prompt as a chain tree through specdec's adapters and tree scans, then
the commit's replay (captured with the round); ``"auto"`` (default), ``scan`` for prompts of up to
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


def _row_tables(index: torch.Tensor) -> torch.Tensor:
    """A topology's per-node table as ``[B, N, W]``: one row's ``[N, W]`` gains ``B = 1``."""
    return index[None] if index.dim() == 2 else index


def topology_rows(topo) -> int:
    """Rows (sequences, one tree each) of a round's topology: its ``rows``, 1 for a topology without one."""
    return int(getattr(topo, "rows", 1))


def path_rows(path: torch.Tensor, num_path: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(path [B, P], num_path [B])`` from the batched form or one row's ``(path [P], num_path 0-d)`` (``B = 1``)."""
    if path.dim() == 1:
        return path[None], num_path.reshape(1)
    if path.dim() != 2 or num_path.shape != path.shape[:1]:
        raise ValueError(
            f"path must be [B, P] with num_path [B] (or [P] with a 0-d num_path); got {list(path.shape)} and "
            f"{list(num_path.shape)}."
        )
    return path, num_path


@dataclass
class VerifyRound:
    """Everything one verify forward leaves for the commit.

    ``topo`` is the tree as the adapters read it: ``num_nodes`` (slots per row), ``is_chain``, ``device``,
    ``conv_index(width, stored)`` and optionally ``rows`` (the number of sequences, each with its own tree; 1 when
    absent) (``specdec.state.recurrent.DeviceTopology`` in the round). ``tree`` is the host tree it came from, if
    any (the round has none).

    With ``rows = B`` the verify forward holds ``[B, num_nodes]`` tokens, the cache ``B`` rows of conv windows and
    recurrent states, and each adapter's stash keeps the rows' nodes flattened row-major (row b's node i at
    ``b * num_nodes + i``).
    """

    model: object
    cache: object
    tree: DraftTree | None
    prefix_len: int
    topo: object
    stash: dict[int, object] = field(default_factory=dict)  # layer_idx -> adapter stash
    prompt: bool = False  # the prompt's chain tree (the scan prefill): tree scans walk the nodes in order
    _on_device: dict = field(default_factory=dict, repr=False)

    def topology(self, device: torch.device):
        """The tree's topology with index tensors on ``device`` (layers may sit on different devices: a topology
        with a ``to(device)`` method is copied there)."""
        if self.topo is None:
            raise ValueError("VerifyRound has no topology: build it with topo= (a DeviceTopology in the round).")
        if device not in self._on_device:
            if self.topo.device == device:
                self._on_device[device] = self.topo
            elif hasattr(self.topo, "to"):
                self._on_device[device] = self.topo.to(device)
            else:
                raise ValueError(
                    f"The round's {type(self.topo).__name__} is on {self.topo.device}, a recurrent layer on {device}: "
                    "put the recurrent layers on the topology's device."
                )
        return self._on_device[device]


class RecurrentAdapter:
    """Owns one HF recurrent mixer's forward during tree verification (subclasses per layer family).

    Subclasses implement ``tree_forward(hidden_states [B, N, H], rnd) -> output [B, N, H]`` (row b's nodes read
    row b's committed state through ``self.states(rnd)`` and row b's tree; the stash of all rows goes to
    ``rnd.stash[self.layer_idx]``, nodes flattened row-major) and ``advance(state, stash, nodes) -> state`` (one
    recurrence step: state row j advanced by stash node ``nodes[j]``, used for the replay).
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
        """The fp32 states after each row's nodes ``path[b, :num_path[b]]`` (``P`` masked ``advance`` steps, no host
        read); may update ``state`` in place. Subclasses with a fused kernel override it.

        Args:
            state (torch.Tensor): ``[B, ...]`` fp32 committed states, one per row.
            stash: the layer's stash of the verify forward.
            path (torch.Tensor): ``[B, P]`` int64 indices into the stash's (flattened) nodes, or ``[P]`` for one row.
            num_path (torch.Tensor): ``[B]`` int64 real entries per row of ``path`` (0-d for one row).
        """
        path, num_path = path_rows(path, num_path)
        for step in range(path.shape[1]):
            real = (num_path > step).view(-1, *(1,) * (state.dim() - 1))
            state = torch.where(real, self.advance(state, stash, path[:, step]), state)
        return state

    def states(self, rnd: VerifyRound) -> tuple[torch.Tensor, torch.Tensor]:
        """Committed ``(conv windows [B, C, S], recurrent states [B, ...])`` of this layer, one row per sequence of
        the round (``B`` = the topology's ``rows``)."""
        layer = rnd.cache.layers[self.layer_idx]
        conv, rec = _state_tensor(layer, "conv_states"), _state_tensor(layer, "recurrent_states")
        if conv is None or rec is None:
            raise ValueError(
                f"Layer {self.layer_idx} ({type(self.module).__name__}) has no recurrent state in the cache: "
                "prefill at least one token through the model before verifying a tree."
            )
        rows = topology_rows(rnd.topo)
        if conv.shape[0] != rows or rec.shape[0] != rows:
            raise ValueError(
                f"Layer {self.layer_idx} ({type(self.module).__name__}): the cache holds {conv.shape[0]} rows of conv "
                f"windows and {rec.shape[0]} of recurrent states, the round's topology {rows} trees: one per row."
            )
        if getattr(layer, "record_past", False):
            raise ValueError(
                f"Cache layer {self.layer_idx} records past conv states (activate_past_recording); "
                "specdec commits the accepted path itself, turn recording off."
            )
        return conv, rec

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
                    f"{type(self.module).__name__} (layer {self.layer_idx}) did not receive the cache of the "
                    f"verify round: pass it to the model under the name its forward takes "
                    f"({cache_kwarg(rnd.model)!r} for {type(rnd.model).__name__})."
                )
            mask = kwargs.get("attention_mask", rest[1] if len(rest) > 1 else None)
            if isinstance(mask, torch.Tensor) and mask.dim() == 2 and not bool(mask.bool().all()):
                raise ValueError("Padded batches are not supported in tree verification (2D mask with zeros).")
            rows = topology_rows(rnd.topo)
            if hidden_states.dim() != 3 or tuple(hidden_states.shape[:2]) != (rows, rnd.topo.num_nodes):
                raise ValueError(
                    f"{type(self.module).__name__} got hidden states {tuple(hidden_states.shape)}; a tree verify "
                    f"forward must hold exactly [rows, slots] = [{rows}, {rnd.topo.num_nodes}] tree nodes (one tree "
                    "of the round's topology per sequence)."
                )
            if self.layer_idx in rnd.stash:
                raise RuntimeError(f"Layer {self.layer_idx} ran twice in one verify forward.")
            return self.tree_forward(hidden_states, rnd)

        return forward


def adapter_forwards(adapters: Sequence[RecurrentAdapter], rnd: VerifyRound):
    """Route each adapted mixer's ``forward`` to its adapter; always restored on exit (hook-safe:
    ``specdec.state.forwards.swapped_forwards``). ``rnd`` must carry its topology (``rnd.topo``)."""
    if rnd.topo is None:
        raise ValueError("VerifyRound has no topology: build it with topo= (a DeviceTopology in the round).")
    return swapped_forwards((adapter.module, adapter.bound_forward(rnd)) for adapter in adapters)


class HybridState:
    """State manager of hybrid targets: the recurrent adapters of a model's mixers, run by the round.

    The round (``specdec.engine``) routes the mixers through ``adapters`` during its tree forward
    (``adapter_forwards``) and commits their state with ``specdec.state.recurrent.commit_recurrent``.

    Args:
        adapters (Sequence[RecurrentAdapter]): one per recurrent mixer of the model.
        mode (str): one of ``HYBRID_MODES``; the round runs ``"exact"`` only.
    """

    name = "hybrid"

    def __init__(self, adapters: Sequence[RecurrentAdapter], *, mode: str = "exact") -> None:
        check_hybrid_mode(mode)
        if not adapters:
            raise ValueError("HybridState needs at least one recurrent adapter (use KVState for attention-only).")
        self.adapters = tuple(adapters)
        self.mode = mode

    def __repr__(self) -> str:
        families = sorted({type(a.module).__name__ for a in self.adapters})
        return f"HybridState(mode={self.mode!r}, {len(self.adapters)} recurrent layers: {', '.join(families)})"
