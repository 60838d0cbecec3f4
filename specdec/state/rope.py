"""The target's rotary tables: each rotary embedding module's (cos, sin) at every slot, computed once per storage.

An HF model computes its rotary embedding at every forward from the positions (a float cast, a product with the
inverse frequencies, a concatenation, cos, sin, two scalings and two casts: ~9 kernels on CUDA for a handful of
rows). Each position's values depend on that position alone, so :class:`RopeTables` runs the module itself once
over positions ``0 .. capacity - 1`` and, while the round's forwards run (``specdec.attention.AttentionScope``),
answers each call with one gather of those rows: the same values bit for bit (a probe at build time checks the
module against its table). Modules whose values depend on the sequence length (``dynamic`` or ``longrope``
rope types) and calls with other position layouts (3D multimodal positions, another dtype) run the module's own
forward.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from specdec.kernels.row_gather import row_gather
from specdec.state.forwards import swappable

__all__ = ["RopeTables", "position_table"]

logger = logging.getLogger(__name__)

_STATIC_ROPE = ("default", "linear", "llama3", "yarn")  # inverse frequencies fixed at init


def _rotary_modules(model: nn.Module) -> list[nn.Module]:
    """The model's rotary embedding modules whose values depend on each position alone."""
    found = []
    for module in model.modules():
        name = type(module).__name__
        if not name.endswith("RotaryEmbedding") or not hasattr(module, "inv_freq") or not swappable(module):
            continue
        if getattr(module, "rope_type", "default") in _STATIC_ROPE:
            found.append(module)
    return found


class RopeTables:
    """Per rotary module of ``model``, its ``(cos, sin)`` at positions ``0 .. capacity - 1`` as one ``[capacity,
    2, D]`` tensor of ``dtype``; :meth:`forwards` gives the table-lookup forwards for ``swapped_forwards``.

    Args:
        model: the HF model (its rotary modules are called once here, outside any graph).
        capacity (int): positions covered (the static storage's slots: every position a forward of the round uses).
        dtype: the hidden states' dtype (HF casts cos / sin to it).
    """

    def __init__(self, model: nn.Module, capacity: int, dtype: torch.dtype) -> None:
        self.capacity, self.dtype = capacity, dtype
        self.tables: list[tuple[nn.Module, torch.Tensor]] = []
        self.made_from: list[tuple[torch.Tensor, object]] = []  # per table: the inv_freq and scaling it was made of
        for module in _rotary_modules(model):
            table = position_table(module, capacity, dtype)
            if table is not None:
                self.tables.append((module, table))
                self.made_from.append(_source(module))

    def refresh(self) -> int:
        """Recompute, in place (captured rounds keep reading the same tensors), each table whose module's
        ``inv_freq`` or ``attention_scaling`` changed since it was made (a RoPE-scaling experiment rewriting them
        between calls); returns how many. One comparison per rotary module."""
        changed = 0
        for k, (module, table) in enumerate(self.tables):
            freq, scaling = self.made_from[k]
            now = module.inv_freq
            if now.shape == freq.shape and torch.equal(now, freq) and _scaling(module) == scaling:
                continue
            fresh = position_table(module, self.capacity, self.dtype)
            if fresh is None or fresh.shape != table.shape:
                got = None if fresh is None else list(fresh.shape)
                raise ValueError(f"the rotary module {type(module).__name__} changed so that its table of "
                                 f"{list(table.shape)} cannot be remade ({got}): change only its frequencies' "
                                 "values, or load the model anew.")  # fmt: skip
            table.copy_(fresh)
            self.made_from[k] = _source(module)
            changed += 1
        return changed

    def forwards(self) -> list[tuple[nn.Module, object]]:
        """``(module, forward)`` pairs: each module's calls answered from its table (one gather)."""
        return [(module, _lookup(module, table)) for module, table in self.tables]


def _scaling(module: nn.Module):
    return getattr(module, "attention_scaling", None)


def _source(module: nn.Module) -> tuple[torch.Tensor, object]:
    """What a module's table is made of: a copy of its ``inv_freq`` and its ``attention_scaling``."""
    return module.inv_freq.detach().clone(), _scaling(module)


def position_table(module: nn.Module, capacity: int, dtype: torch.dtype, grids: int | None = None):
    """``module``'s ``(cos, sin)`` at positions ``0 .. capacity - 1`` as one ``[capacity, 2, D]`` tensor of ``dtype``,
    or None where the module does not take these calls or its values depend on more than each position (a probe
    of a few positions against the table, bit for bit). ``grids``: the module takes one position grid per
    multimodal RoPE section (``[grids, 1, L]``, Qwen3.5); the table is a text row's, the same position in all."""
    device = module.inv_freq.device
    x = torch.zeros(1, dtype=dtype, device=device)

    def positions(row: torch.Tensor) -> torch.Tensor:
        return row if grids is None else row[None].expand(grids, -1, -1)

    with torch.no_grad():
        try:
            cos, sin = module(x, positions(torch.arange(capacity, device=device)[None]))
            probe = torch.tensor([[capacity - 1, 0, 1, capacity // 2]], device=device)
            probe_cos, probe_sin = module(x, positions(probe))
        except Exception as err:  # a module of another signature: left to its own forward
            logger.info("specdec: %s keeps its own forward (%s)", type(module).__name__, err)
            return None
    if cos.dim() != 3 or cos.shape[:2] != (1, capacity) or sin.shape != cos.shape or cos.dtype != dtype:
        return None
    table = torch.stack((cos[0], sin[0]), dim=1)  # [capacity, 2, D]
    if not (torch.equal(table[probe[0], 0], probe_cos[0]) and torch.equal(table[probe[0], 1], probe_sin[0])):
        logger.info("specdec: %s depends on more than each position; it keeps its own forward",
                    type(module).__name__)  # fmt: skip
        return None
    return table


def _lookup(module: nn.Module, table: torch.Tensor):
    own = type(module).forward.__get__(module)

    def forward(x, position_ids):
        if position_ids.dim() != 2 or x.dtype != table.dtype or x.device != table.device:
            return own(x, position_ids)
        rows = row_gather(table, position_ids)  # one launch on CUDA (Backends.row_gather)
        return rows[..., 0, :], rows[..., 1, :]

    return forward
