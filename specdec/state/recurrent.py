"""Hybrid (Gated DeltaNet or Mamba2 + attention) targets in the round: device tree topology, recurrent commit.

The recurrent mixers run through their adapters (``specdec.state.gdn``, ``specdec.state.mamba2``), fed a
``DeviceTopology`` built from the device tree (conv gather table and parent array as tensors, no host reads);
the recurrences go through ``specdec.kernels.tree_gdn`` / ``tree_mamba2`` (Triton on CUDA). A batch of ``B``
sequences verifies ``B`` trees at once (a ``DeviceTree`` of ``[B, S]`` slots), each row over its own committed
state. The conv windows and recurrent states live in static tensors with one row per sequence
(``specdec.state.storage``); the commit replays each row's accepted path from its committed state in a fixed
number of masked steps (one fused Triton launch per Gated DeltaNet layer on CUDA,
``specdec.kernels.gdn_path_replay``) and rebuilds each conv window by one gather.
"""

from __future__ import annotations

import torch

from specdec.kernels.tree_gdn import auto_impl as gdn_impl
from specdec.kernels.tree_mamba2 import auto_impl as mamba2_impl
from specdec.state.gdn import GatedDeltaNetAdapter
from specdec.state.hybrid import HybridState, RecurrentAdapter, VerifyRound, path_rows
from specdec.state.mamba2 import Mamba2Adapter
from specdec.types import DeviceTree, TreeRow

__all__ = ["CommitPlan", "DeviceTopology", "commit_recurrent", "hybrid_reason"]

# Adapters whose tree forward reads only ``conv_index`` and the parent array (both built on the device here).
_DEVICE_ADAPTERS = (GatedDeltaNetAdapter, Mamba2Adapter)


def hybrid_reason(state, device: torch.device, *, needs_kernels: bool = True) -> str | None:
    """None when the hybrid state manager's layers all have a device path on ``device``, else why not.

    ``needs_kernels``: also require the Triton tree scans on CUDA (a reference scan reads the parent array on the
    host, so its round cannot be captured in a CUDA graph; it still runs when called).
    """
    if not isinstance(state, HybridState):
        return None
    if state.mode != "exact":
        return f"hybrid_mode={state.mode!r} replays through the model's own forward"
    other = sorted({type(a.module).__name__ for a in state.adapters if not isinstance(a, _DEVICE_ADAPTERS)})
    if other:
        return f"recurrent layers {', '.join(other)} have no device tree scan yet"
    if needs_kernels and device.type == "cuda":  # a reference scan reads the parents on the host: no capture
        kernels = {"tree_gdn": gdn_impl, "tree_mamba2": mamba2_impl}
        used = {"tree_gdn" if isinstance(a, GatedDeltaNetAdapter) else "tree_mamba2" for a in state.adapters}
        slow = sorted(name for name in used if kernels[name](device) != "triton")
        if slow:
            return f"the tree scan {', '.join(slow)} would run its PyTorch reference on CUDA (Triton off or missing)"
    return None


class DeviceTopology:
    """The round's trees as the recurrent adapters read them (``VerifyRound.topo``), with tensors only.

    Args:
        tree (TreeRow | DeviceTree): one row's tree (fields ``[S]``) or one tree per row of the batch (fields
            ``[B, S]``). ``S`` slots per row; padding slots have parent -1 and depth 0 (they read their row's
            committed state and window, and their outputs are ignored).
        chain (bool): the real nodes of every row form a chain by construction (a ``Chain`` round); the trees are
            on the device, so this is not read off them.

    Attributes: ``rows`` (``B``; 1 for a ``TreeRow``), ``num_nodes`` (``S``, slots per row), ``batched`` (the
    tree came with a row dimension), ``parents`` and ``depth`` ``[B, S]``, ``is_chain``, ``device``.
    """

    def __init__(self, tree: TreeRow | DeviceTree, *, chain: bool = False) -> None:
        if tree.parents.dim() not in (1, 2) or tree.depth.shape != tree.parents.shape:
            raise ValueError(
                f"DeviceTopology needs parents and depth of one shape, [S] (one row) or [B, S]; got "
                f"{list(tree.parents.shape)} and {list(tree.depth.shape)}."
            )
        self.tree = tree
        self.is_chain = chain
        self.batched = tree.parents.dim() == 2
        self.parents = tree.parents if self.batched else tree.parents[None]  # [B, S]
        self.depth = tree.depth if self.batched else tree.depth[None]
        self.device = tree.parents.device
        self.rows, self.num_nodes = self.parents.shape
        self._conv_index: dict = {}

    def to(self, device: torch.device | str) -> DeviceTopology:
        """The same trees with their tensors on ``device`` (layers may sit on different devices)."""
        if torch.device(device) == self.device:
            return self
        return DeviceTopology(type(self.tree)(*(t.to(device) for t in self.tree)), chain=self.is_chain)

    def conv_index(self, width: int, stored: int) -> torch.Tensor:
        """Gather table ``[B, S, width]`` (``[S, width]`` for a ``TreeRow``), per row into that row's
        ``cat(window (stored columns), node inputs)``: each slot's taps, oldest first, newest = the slot itself;
        above the root the walk continues into the row's committed window."""
        if stored < width - 1:
            raise ValueError(f"conv window of {stored} columns is too short for kernel width {width}")
        key = (width, stored)
        if key not in self._conv_index:
            columns = []
            node = torch.arange(self.num_nodes, device=self.device).expand(self.rows, -1)  # [B, S]
            for distance in range(width):  # newest tap first
                if distance:
                    node = torch.where(node >= 0, self.parents.gather(1, node.clamp(min=0)), -1)
                above = stored - (distance - self.depth)  # the committed window, newest column last
                columns.append(torch.where(node >= 0, stored + node, above))
            index = torch.stack(columns[::-1], dim=-1)  # [B, S, width]
            self._conv_index[key] = index if self.batched else index[0]
        return self._conv_index[key]


class CommitPlan:
    """What the commits of one round's recurrent layers share, computed once per round instead of once per layer:
    each row's accepted path and its length, with the rows that ``keep`` leaves out given length 0 (their masked
    replay steps nowhere and their conv window keeps its columns: state and window stay as they were, without a
    copy to restore them), the path's offsets into the flattened stash, and the window columns that remain.

    Args:
        path (torch.Tensor): ``[B, P]`` int64 accepted nodes per row (``[P]`` for one row), as
            :func:`commit_recurrent`'s.
        num_path (torch.Tensor): ``[B]`` int64 real entries per row (0-d for one row).
        keep (torch.Tensor | None): ``[B]`` bool, rows whose state is committed; None: every row.
    """

    def __init__(self, path: torch.Tensor, num_path: torch.Tensor, keep: torch.Tensor | None = None) -> None:
        path, num_path = path_rows(path, num_path)
        if keep is not None:
            num_path = torch.where(keep, num_path, 0)
        self.path, self.num_path = path, num_path
        self._flat: dict[int, torch.Tensor] = {}
        self._columns: dict[int, torch.Tensor] = {}

    def flat(self, nodes: int) -> torch.Tensor:
        """``[B, P]`` indices into a stash of ``nodes`` slots per row, flattened row-major."""
        if nodes not in self._flat:
            rows = self.path.shape[0]
            self._flat[nodes] = self.path + torch.arange(rows, device=self.path.device)[:, None] * nodes
        return self._flat[nodes]

    def columns(self, stored: int) -> torch.Tensor:
        """``[B, stored]``: the columns of ``cat(window, path inputs)`` that form each row's new window."""
        if stored not in self._columns:
            self._columns[stored] = self.num_path[:, None] + torch.arange(stored, device=self.path.device)
        return self._columns[stored]


def commit_recurrent(adapter: RecurrentAdapter, rnd: VerifyRound, path: torch.Tensor, num_path: torch.Tensor,
                     keep: torch.Tensor | None = None, *, plan: CommitPlan | None = None) -> None:  # fmt: skip
    """Write each row's state after its accepted path and its conv window into the layer's cache, on the device
    (tensor ops only: no host read, capturable).

    Row b replays ``path[b, :num_path[b]]`` from row b's committed state and rebuilds row b's conv window from
    those nodes' pre-conv inputs.

    Args:
        adapter (RecurrentAdapter): the layer's adapter (its stash is in ``rnd``).
        rnd (VerifyRound): the round verified with a ``DeviceTopology`` of ``B`` rows.
        path (torch.Tensor): ``[B, P]`` int64 accepted nodes per row (indices into the row's tree), root first,
            padded by repeating the last one; ``[P]`` for one row.
        num_path (torch.Tensor): ``[B]`` int64 number of real entries per row of ``path`` (0-d for one row).
        keep (torch.Tensor | None): ``[B]`` bool, rows whose state is committed; the others keep theirs (a round
            whose protocol check failed). None: every row.
        plan (CommitPlan | None): the round's shared part, made once for all its layers (``CommitPlan(path,
            num_path, keep)``); None: made here.
    """
    plan = CommitPlan(path, num_path, keep) if plan is None else plan
    conv, rec = adapter.states(rnd)  # [B, C, W], [B, ...]
    rows, stored = conv.shape[0], conv.shape[-1]
    if plan.path.shape[0] != rows:
        raise ValueError(f"commit_recurrent: path has {plan.path.shape[0]} rows, the layer's cache {rows}.")
    stash = rnd.stash[adapter.layer_idx]
    flat = plan.flat(stash.preconv.shape[0] // rows)  # the stash holds every row's nodes, flattened row-major
    state = adapter.replay(rec.float(), stash, flat, plan.num_path)  # fixed step count: no host read
    inputs = stash.preconv[flat].transpose(1, 2).to(conv.dtype)  # [B, C, P]
    window = torch.cat([conv, inputs], dim=2)  # [B, C, W + P]: the last W columns up to the path's end
    conv.copy_(window.gather(2, plan.columns(stored)[:, None, :].expand(-1, conv.shape[1], -1)))
    if state is not rec:  # the replay stepped a copy (a state kept in another dtype, or a closed form)
        rec.copy_(state.to(rec.dtype))
