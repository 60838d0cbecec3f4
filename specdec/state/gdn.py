"""Gated DeltaNet adapters: Qwen3.5 / Qwen3.5-MoE (``Qwen3_5GatedDeltaNet``, ``Qwen3_5MoeGatedDeltaNet``) and
Qwen3-Next (``Qwen3NextGatedDeltaNet``) ``linear_attention`` layers.

The HF module's projections, conv weight, ``A_log``, ``dt_bias``, gated norm and ``out_proj`` are used as they
are; only the short conv (over ancestor paths) and the delta-rule recurrence (per path, fp32) are computed
here. Recurrence per value head (``docs/hybrid.md``): ``S <- exp(g) S``; ``S <- S + k (beta (v - S^T k))^T``;
``o = S^T q`` with q, k L2-normalised and q scaled by ``K^-1/2``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.activations import ACT2FN

from specdec.kernels import gdn_path_replay
from specdec.kernels.gated_rms_norm import gated_norm
from specdec.kernels.gdn_gates import gdn_gates
from specdec.kernels.tree_gdn import chain_walk, tree_gdn_rows
from specdec.kernels.tree_gdn.reference import gdn_step
from specdec.state.hybrid import RecurrentAdapter, VerifyRound, _row_tables, path_rows, tree_conv

__all__ = ["GDN_ADAPTERS", "GDNStash", "GatedDeltaNetAdapter", "Qwen3NextGatedDeltaNetAdapter", "gdn_step"]


@dataclass(frozen=True)
class GDNStash:
    """Per-node inputs of the recurrence, kept from verify to commit (one verify forward, one layer).

    ``N`` counts the nodes of every row of the round, flattened row-major (row b's node i at ``b * slots + i``;
    one row: the tree's nodes).

    Args:
        preconv (torch.Tensor): ``[N, C]`` pre-conv q|k|v projections (model dtype), for the conv window.
        key (torch.Tensor): ``[N, H, K]`` fp32, L2-normalised, one per key head.
        value (torch.Tensor): ``[N, HV, V]`` post-conv values (model dtype; widened exactly to fp32 on use).
        log_decay (torch.Tensor): ``[N, HV]`` fp32 ``g = -exp(A_log) softplus(a + dt_bias)`` (<= 0).
        beta (torch.Tensor): ``[N, HV]`` fp32 ``sigmoid(b)``.
        heads_per_key (int): ``HV // H``; value head h reads key head ``h // heads_per_key``.
    """

    preconv: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    log_decay: torch.Tensor
    beta: torch.Tensor
    heads_per_key: int


class GatedDeltaNetAdapter(RecurrentAdapter):
    """Tree forward of a Qwen3.5-layout Gated DeltaNet (``in_proj_qkv``, ``in_proj_z``, ``in_proj_b``,
    ``in_proj_a``)."""

    family = "gated_deltanet"

    def _project(self, hidden_states: torch.Tensor):
        """``(mixed_qkv [B, N, C], z [B, N, HV, V], b [B, N, HV], a [B, N, HV])``."""
        m = self.module
        z = m.in_proj_z(hidden_states)
        z = z.reshape(*z.shape[:2], -1, m.head_v_dim)
        return m.in_proj_qkv(hidden_states), z, m.in_proj_b(hidden_states), m.in_proj_a(hidden_states)

    def tree_forward(self, hidden_states: torch.Tensor, rnd: VerifyRound) -> torch.Tensor:
        m = self.module
        rows, n = hidden_states.shape[:2]
        total = rows * n  # the stash keeps every row's nodes, flattened row-major
        mixed, z, b, a = self._project(hidden_states)  # batched over the rows
        conv, rec = self.states(rnd)
        topo = rnd.topology(conv.device)
        weight = m.conv1d.weight[:, 0, :]  # [C, W]
        index = _row_tables(topo.conv_index(weight.shape[-1], conv.shape[-1]))  # [B, N, W]
        x = tree_conv(mixed, conv, weight, m.conv1d.bias, index, ACT2FN[m.activation]).reshape(total, -1)
        rep = m.num_v_heads // m.num_k_heads  # grouped value heads: value head h reads key head h // rep
        # L2-normalised q (repeated per value head, over sqrt(K)) and k, beta = sigmoid(b), g = -exp(A_log)
        # softplus(a + dt_bias): one launch on CUDA (gdn_gates), the former tensor ops elsewhere
        q, k, beta, g = gdn_gates(x, b.reshape(total, -1), a.reshape(total, -1), m.A_log, m.dt_bias,
                                  num_k_heads=m.num_k_heads, head_k_dim=m.head_k_dim, num_v_heads=m.num_v_heads)
        v = x[:, 2 * m.key_dim : 2 * m.key_dim + m.value_dim].reshape(total, m.num_v_heads, m.head_v_dim)
        # contiguous copies: the stash outlives this forward and must not pin the whole projections
        stash = GDNStash(
            preconv=mixed.reshape(total, -1).contiguous(),
            key=k,
            value=v.contiguous(),
            log_decay=g,
            beta=beta,
            heads_per_key=rep,
        )
        rnd.stash[self.layer_idx] = stash

        # [B, N], -1 above the root: the device topology's own (no launch), else from conv tap W-2 (the parent's
        # column, stored - 1 above the root)
        parents = topo.parents if isinstance(topo.parents, torch.Tensor) and topo.parents.shape == index.shape[:2] \
            else index[..., -2] - conv.shape[-1]
        # the prompt's chain: one walk over the nodes (replaying every node's path would cost N (N + 1) / 2 steps);
        # a drafted chain: by its size and the layer's heads; other trees: by their size (tree_gdn's "auto")
        walk = "nodes" if rnd.prompt else chain_walk(n, m.num_v_heads) if topo.is_chain else "auto"
        def per_row(x: torch.Tensor) -> torch.Tensor:
            return x.reshape(rows, n, *x.shape[1:])

        # one scan for the batch (one launch on CUDA): row r's nodes from row r's committed state and tree
        out = tree_gdn_rows(rec.float(), per_row(q), per_row(k), per_row(v), per_row(g), per_row(beta), parents,
                            impl="auto", walk=walk)  # fmt: skip
        # the gated norm on the fp32 output (rounded to the model dtype first, as the layer's cast does): one launch
        # on CUDA (gated_rms_norm), the layer's own norm elsewhere
        out = gated_norm(m.norm, out.reshape(-1, m.head_v_dim), z.reshape(-1, m.head_v_dim), hidden_states.dtype)
        out = out.reshape(rows, n, -1)
        return m.out_proj(out)

    def replay(self, state: torch.Tensor, stash: GDNStash, path: torch.Tensor, num_path: torch.Tensor) -> torch.Tensor:
        path, num_path = path_rows(path, num_path)
        state = state.contiguous()  # [B, HV, K, V] fp32, each row advanced in place (one Triton launch on CUDA)
        gdn_path_replay(state, stash.key, stash.value, stash.log_decay, stash.beta, path, num_path)
        return state

    def advance(self, state: torch.Tensor, stash: GDNStash, nodes: torch.Tensor) -> torch.Tensor:
        key = stash.key.index_select(0, nodes).repeat_interleave(stash.heads_per_key, dim=1)
        value = stash.value.index_select(0, nodes).float()
        return gdn_step(state, key, value, stash.log_decay.index_select(0, nodes), stash.beta.index_select(0, nodes))


class Qwen3NextGatedDeltaNetAdapter(GatedDeltaNetAdapter):
    """Qwen3-Next layout: fused ``in_proj_qkvz`` / ``in_proj_ba``, split by the module's own
    ``fix_query_key_value_ordering``."""

    def _project(self, hidden_states: torch.Tensor):
        m = self.module
        q, k, v, z, b, a = m.fix_query_key_value_ordering(m.in_proj_qkvz(hidden_states), m.in_proj_ba(hidden_states))
        rows, n = hidden_states.shape[:2]
        mixed = torch.cat([t.reshape(rows, n, -1) for t in (q, k, v)], dim=-1)
        return mixed, z, b, a


GDN_ADAPTERS: dict[str, type[RecurrentAdapter]] = {
    "Qwen3_5GatedDeltaNet": GatedDeltaNetAdapter,
    "Qwen3_5MoeGatedDeltaNet": GatedDeltaNetAdapter,
    "Qwen3NextGatedDeltaNet": Qwen3NextGatedDeltaNetAdapter,
}
