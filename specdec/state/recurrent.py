"""Hybrid (Gated DeltaNet or Mamba2 + attention) targets in the round: device tree topology, recurrent commit.

The recurrent mixers run through their adapters (``specdec.state.gdn``, ``specdec.state.mamba2``), fed a
``DeviceTopology`` built from the device tree (conv gather table and parent array as tensors, no host reads);
the recurrences go through ``specdec.kernels.tree_gdn`` / ``tree_mamba2`` (Triton on CUDA). The conv windows and
recurrent states live in static tensors (``specdec.state.storage``); the commit replays the accepted path from the
committed state in a fixed number of masked steps (one fused Triton launch per Gated DeltaNet layer on CUDA,
``specdec.kernels.gdn_path_replay``) and rebuilds each conv window by one gather.
"""

from __future__ import annotations

import torch

from specdec.kernels.tree_gdn import auto_impl as gdn_impl
from specdec.kernels.tree_mamba2 import auto_impl as mamba2_impl
from specdec.state.gdn import GatedDeltaNetAdapter
from specdec.state.hybrid import HybridState, RecurrentAdapter, VerifyRound
from specdec.state.mamba2 import Mamba2Adapter
from specdec.types import TreeRow as DeviceTree

__all__ = ["DeviceTopology", "commit_recurrent", "hybrid_reason"]

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
    """The tree as the recurrent adapters read it (``VerifyRound.topo``), with tensors only.

    Args:
        tree (DeviceTree): ``S`` slots; padding slots have parent -1 and depth 0 (they read the committed state
            and window, and their outputs are ignored).
        chain (bool): the real nodes form a chain by construction (a ``Chain`` round); the tree is on the device,
            so this is not read off it.
    """

    def __init__(self, tree: DeviceTree, *, chain: bool = False) -> None:
        self.is_chain = chain
        self.parents, self.depth = tree.parents, tree.depth
        self.device = tree.parents.device
        self.num_nodes = tree.parents.numel()
        self._conv_index: dict = {}

    def conv_index(self, width: int, stored: int) -> torch.Tensor:
        """Gather table ``[S, width]`` into ``cat(window (stored columns), node inputs)``: each slot's taps, oldest
        first, newest = the slot itself; above the root the walk continues into the committed window."""
        if stored < width - 1:
            raise ValueError(f"conv window of {stored} columns is too short for kernel width {width}")
        key = (width, stored)
        if key not in self._conv_index:
            columns = []
            node = torch.arange(self.num_nodes, device=self.device)
            for distance in range(width):  # newest tap first
                if distance:
                    node = torch.where(node >= 0, self.parents[node.clamp(min=0)], -1)
                above = stored - (distance - self.depth)  # the committed window, newest column last
                columns.append(torch.where(node >= 0, stored + node, above))
            self._conv_index[key] = torch.stack(columns[::-1], dim=1)
        return self._conv_index[key]


def commit_recurrent(adapter: RecurrentAdapter, rnd: VerifyRound, path: torch.Tensor, num_path: torch.Tensor) -> None:
    """Write the state after the accepted path and its conv window into the layer's cache, on the device.

    Args:
        adapter (RecurrentAdapter): the layer's adapter (its stash is in ``rnd``).
        rnd (VerifyRound): the round verified with a ``DeviceTopology``.
        path (torch.Tensor): ``[P]`` int64 accepted nodes, root first, padded by repeating the last one.
        num_path (torch.Tensor): 0-d int64 number of real entries of ``path``.
    """
    conv, rec = adapter.states(rnd)
    stash = rnd.stash[adapter.layer_idx]
    state = adapter.replay(rec.float(), stash, path, num_path)  # fixed step count: no host read
    stored = conv.shape[-1]
    window = torch.cat([conv[0], stash.preconv.index_select(0, path).transpose(0, 1).to(conv.dtype)], dim=1)
    conv.copy_(window.index_select(1, num_path + torch.arange(stored, device=path.device))[None])
    rec.copy_(state.to(rec.dtype))
