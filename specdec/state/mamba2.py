"""Mamba2 (SSD) mixer adapters: ``Mamba2Mixer`` and its HF relatives with the same layout (``BambaMixer``,
``NemotronHMamba2Mixer``, ``Zamba2MambaMixer``, ``GraniteMoeHybridMambaLayer``) plus ``FalconH1Mixer`` (muP
multipliers, optional gated norm).

The HF module's ``in_proj``, conv weight, ``A_log``, ``dt_bias``, ``D``, gated norm and ``out_proj`` are used
as they are; only the short conv (over ancestor paths) and the SSM recurrence (per path, fp32) are computed
here. Per head (``docs/hybrid.md``): ``dt = clamp(softplus(dt + dt_bias))``; ``h <- exp(dt A) h + dt x B^T``;
``y = h C + D x``; then the module's gated RMSNorm with z and ``out_proj``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers.activations import ACT2FN

from specdec.kernels.tree_mamba2 import tree_mamba2_rows
from specdec.kernels.tree_mamba2.reference import mamba2_step
from specdec.state.hybrid import RecurrentAdapter, VerifyRound, _row_tables, path_rows, tree_conv

__all__ = ["MAMBA2_ADAPTERS", "FalconH1Adapter", "Mamba2Adapter", "Mamba2Stash", "mamba2_step"]


@dataclass(frozen=True)
class Mamba2Stash:
    """Per-node inputs of the SSM recurrence, kept from verify to commit (one verify forward, one layer).

    ``N`` counts the nodes of every row of the round, flattened row-major (row b's node i at ``b * slots + i``;
    one row: the tree's nodes).

    Args:
        preconv (torch.Tensor): ``[N, C]`` pre-conv x|B|C projections (model dtype), for the conv window.
        x (torch.Tensor): ``[N, H, P]`` post-conv inputs per head (model dtype; widened exactly to fp32 on use).
        dt (torch.Tensor): ``[N, H]`` fp32 step sizes (after softplus and the ``time_step_limit`` clamp).
        B (torch.Tensor): ``[N, G, S]`` post-conv input matrices per group (model dtype).
        A (torch.Tensor): ``[H]`` fp32 ``-exp(A_log)``.
        heads_per_group (int): ``H // G``; head h reads group ``h // heads_per_group``.
    """

    preconv: torch.Tensor
    x: torch.Tensor
    dt: torch.Tensor
    B: torch.Tensor
    A: torch.Tensor
    heads_per_group: int


class Mamba2Adapter(RecurrentAdapter):
    """Tree forward of a ``Mamba2Mixer``-layout SSD mixer (``in_proj`` -> gate | xBC | dt)."""

    family = "mamba2"

    def _project(self, hidden_states: torch.Tensor):
        """``(gate [B, N, I], xBC [B, N, C], dt [B, N, H])``."""
        m = self.module
        return m.in_proj(hidden_states).split([m.intermediate_size, m.conv_dim, m.num_heads], dim=-1)

    def _gated_norm(self, y: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return self.module.norm(y, gate)

    def tree_forward(self, hidden_states: torch.Tensor, rnd: VerifyRound) -> torch.Tensor:
        m = self.module
        rows, n = hidden_states.shape[:2]
        total = rows * n  # the stash keeps every row's nodes, flattened row-major
        gate, xbc, dt = self._project(hidden_states)  # batched over the rows
        conv, rec = self.states(rnd)
        topo = rnd.topology(conv.device)
        weight = m.conv1d.weight[:, 0, :]  # [C, W]
        index = _row_tables(topo.conv_index(weight.shape[-1], conv.shape[-1]))  # [B, N, W]
        post = tree_conv(xbc, conv, weight, m.conv1d.bias, index, ACT2FN[m.activation]).reshape(total, -1)
        group = m.n_groups * m.ssm_state_size
        x, B, C = post.split([m.intermediate_size, group, group], dim=-1)
        x = x.reshape(total, m.num_heads, m.head_dim)
        B = B.reshape(total, m.n_groups, m.ssm_state_size)
        low, high = m.time_step_limit
        dt = F.softplus(dt.reshape(total, -1).float() + m.dt_bias.float()).clamp(min=low, max=high)
        stash = Mamba2Stash(  # contiguous copies: the stash must not pin the whole projections until commit
            preconv=xbc.reshape(total, -1).contiguous(),
            x=x.contiguous(),
            dt=dt,
            B=B.contiguous(),
            A=-torch.exp(m.A_log.float()),
            heads_per_group=m.num_heads // m.n_groups,  # head h reads group h // heads_per_group
        )
        rnd.stash[self.layer_idx] = stash

        # [B, N], -1 above the root: the device topology's own (no launch), else from conv tap W-2 (the parent's
        # column, stored - 1 above the root)
        parents = topo.parents if isinstance(topo.parents, torch.Tensor) and topo.parents.shape == index.shape[:2] \
            else index[..., -2] - conv.shape[-1]
        C = C.reshape(total, m.n_groups, m.ssm_state_size)
        def per_row(t: torch.Tensor) -> torch.Tensor:
            return t.reshape(rows, n, *t.shape[1:])

        # one scan for the batch (one launch on CUDA): row r's nodes from row r's committed state and tree
        y = tree_mamba2_rows(rec.float(), per_row(stash.x), per_row(stash.B), per_row(C), per_row(dt), stash.A, m.D,
                             parents, impl="auto")  # fmt: skip
        y = y.reshape(total, *y.shape[2:])  # [B * N, H, P]
        y = self._gated_norm(y.reshape(rows, n, -1).to(hidden_states.dtype), gate)
        return m.out_proj(y.to(hidden_states.dtype))

    def replay(
        self, state: torch.Tensor, stash: Mamba2Stash, path: torch.Tensor, num_path: torch.Tensor
    ) -> torch.Tensor:
        """The ``P`` masked SSD steps of each row in closed form (the update is linear in the state): the state
        decays by the whole path, and step t adds ``dt_t B_t x_t`` decayed by the steps after it. Masked steps get
        ``dt = 0`` (no decay, no input). A few batched ops over all rows instead of ``P`` steps; equal to the steps
        up to fp32 rounding. Shapes as ``RecurrentAdapter.replay`` (``state [B, H, P, S]``)."""
        path, num_path = path_rows(path, num_path)
        real = torch.arange(path.shape[1], device=path.device) < num_path[:, None]  # [B, P]
        dt = stash.dt[path] * real[..., None]  # [B, P, H]
        x = stash.x[path].float()  # [B, P, H, Hd]
        B = stash.B[path].float().repeat_interleave(stash.heads_per_group, dim=2)  # [B, P, H, S]
        log_decay = dt * stash.A  # [B, P, H]
        after = log_decay.flip(1).cumsum(1).flip(1)  # sum over steps >= t
        after = torch.cat([after[:, 1:], torch.zeros_like(after[:, :1])], dim=1)  # sum over steps > t
        inputs = torch.einsum("bth,bthp,bths->bhps", torch.exp(after) * dt, x, B)
        return state * torch.exp(log_decay.sum(1))[:, :, None, None] + inputs

    def advance(self, state: torch.Tensor, stash: Mamba2Stash, nodes: torch.Tensor) -> torch.Tensor:
        x = stash.x.index_select(0, nodes).float()
        B = stash.B.index_select(0, nodes).float().repeat_interleave(stash.heads_per_group, dim=1)
        return mamba2_step(state, x, stash.dt.index_select(0, nodes), B, stash.A)


class FalconH1Adapter(Mamba2Adapter):
    """Falcon-H1: input multiplier and muP vector around ``in_proj``; the gated norm is optional."""

    def _project(self, hidden_states: torch.Tensor):
        m = self.module
        projected = m.in_proj(hidden_states * m.ssm_in_multiplier) * m.mup_vector
        return projected.split([m.intermediate_size, m.conv_dim, m.num_heads], dim=-1)

    def _gated_norm(self, y: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        if self.module.mamba_rms_norm:
            return self.module.norm(y, gate)
        return y * F.silu(gate)


MAMBA2_ADAPTERS: dict[str, type[RecurrentAdapter]] = {
    "Mamba2Mixer": Mamba2Adapter,
    "BambaMixer": Mamba2Adapter,
    "NemotronHMamba2Mixer": Mamba2Adapter,
    "Zamba2MambaMixer": Mamba2Adapter,
    "GraniteMoeHybridMambaLayer": Mamba2Adapter,
    "FalconH1Mixer": FalconH1Adapter,
}
