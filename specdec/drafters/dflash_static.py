"""Fixed-shape storage and forwards of a ``DFlashDrafter`` for the fast path (static context K/V).

The context keys/values of the committed tokens live in one preallocated tensor ``[L, 2, 1, H_kv, capacity, D]``
at slot = position. The block forward sees every slot through a mask that shows only slots below the committed
length, so its shapes never change and it can be captured in a CUDA graph. Same maths as
``DFlashDrafter.draft_logq`` (``docs/dflash.md``).
"""

from __future__ import annotations

import torch

__all__ = ["DFlashStatic"]


class DFlashStatic:
    """Static context of one ``DFlashDrafter`` for sequences of up to ``capacity`` tokens.

    Args:
        drafter (DFlashDrafter): bound to its target (``validate`` was called).
        capacity (int): context slots (>= prompt + new tokens + block size).
    """

    def __init__(self, drafter, capacity: int) -> None:
        cfg, model = drafter.config, drafter.model
        device, dtype = model.fc.weight.device, model.fc.weight.dtype
        self.drafter, self.capacity = drafter, capacity
        self.kv = torch.zeros(
            cfg.num_hidden_layers, 2, 1, cfg.num_key_value_heads, capacity, cfg.head_dim, dtype=dtype, device=device
        )
        self.slots = torch.arange(capacity, device=device)
        self.offsets = torch.arange(cfg.block_size, device=device)
        self.masks = torch.full((cfg.block_size - 1,), cfg.mask_token_id, dtype=torch.long, device=device)
        self.block_keys = torch.ones(cfg.block_size, cfg.block_size, dtype=torch.bool, device=device)

    def ingest(self, hidden: torch.Tensor, first: torch.Tensor | int) -> None:
        """Project target features ``[1, R, K*H]`` of the tokens at positions ``first .. first + R - 1`` into slots."""
        positions = torch.arange(hidden.shape[1], device=self.slots.device) + first
        model = self.drafter.model
        for layer, (k, v) in enumerate(model.project_context(hidden.to(self.slots.device), positions[None])):
            self.kv[layer, 0].index_copy_(2, positions, k.to(self.kv.dtype))
            self.kv[layer, 1].index_copy_(2, positions, v.to(self.kv.dtype))

    def logq(self, root: torch.Tensor, prefix: torch.Tensor, depth: int) -> torch.Tensor:
        """Per-depth log-probabilities ``[depth, V]`` (fp32) of the block ``[root, MASK x (B-1)]`` at ``prefix``.

        Args:
            root (torch.Tensor): ``[1]`` int64, the last committed token (not yet in the context).
            prefix (torch.Tensor): 0-d int64, its position (= number of context rows held).
            depth (int): rows wanted (block slots 1..depth).
        """
        drafter, model = self.drafter, self.drafter.model
        block = torch.cat([root.view(1), self.masks])[None]
        positions = (prefix + self.offsets)[None]
        size = block.shape[1]
        seen = (self.slots < prefix)[None].expand(size, -1)
        allowed = torch.cat([seen, self.block_keys], dim=1)[None]
        context = [(self.kv[i, 0], self.kv[i, 1]) for i in range(self.kv.shape[0])]
        hidden = model(drafter._embed(block), positions, context, self.slots[None], allowed)
        return drafter.block_logq(hidden, depth)
