"""Tiny hybrid HF models (fp32, CPU, random weights) and a minimal tree-verify harness for the state tests.

The harness runs a tree exactly as ``specdec.target`` does: tokens in node order, ``position_ids = prefix_len +
depth``, an additive float ancestor mask ``[1, 1, N, prefix_len + N]`` and the prefilled ``DynamicCache``.
"""

from __future__ import annotations

import torch
import transformers as tf
from transformers import DynamicCache

from specdec.state.hybrid import cache_kwarg
from specdec.types import DraftTree

VOCAB = 128
_ATTN = dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16)
_GDN = dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
            linear_conv_kernel_dim=4)
_SSM = dict(mamba_n_heads=8, mamba_d_head=16, mamba_d_state=16, mamba_n_groups=2, mamba_chunk_size=16)


def _configs() -> dict:
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, max_position_embeddings=512,
                  bos_token_id=1, eos_token_id=None, pad_token_id=0)
    return {
        "qwen3_5": lambda: (tf.Qwen3_5ForCausalLM, tf.Qwen3_5TextConfig(
            **common, **_ATTN, **_GDN, num_hidden_layers=3,
            layer_types=["linear_attention", "full_attention", "linear_attention"])),
        "qwen3_next": lambda: (tf.Qwen3NextForCausalLM, tf.Qwen3NextConfig(
            **common, **_ATTN, **_GDN, num_hidden_layers=3, num_experts=4, num_experts_per_tok=2,
            moe_intermediate_size=32, shared_expert_intermediate_size=32,
            layer_types=["linear_attention", "full_attention", "linear_attention"])),
        "mamba2": lambda: (tf.Mamba2ForCausalLM, tf.Mamba2Config(
            vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_heads=8, head_dim=16, expand=2,
            state_size=16, n_groups=2, chunk_size=16, bos_token_id=1, eos_token_id=None, pad_token_id=0)),
        "falcon_h1": lambda: (tf.FalconH1ForCausalLM, tf.FalconH1Config(
            **common, **_ATTN, **_SSM, num_hidden_layers=2, mamba_expand=2, mamba_d_ssm=None,
            ssm_multipliers=[1.1, 1.5, 1.3, 1.2, 0.9], ssm_in_multiplier=1.3, ssm_out_multiplier=1.5)),
        "falcon_h1_rmsnorm": lambda: (tf.FalconH1ForCausalLM, tf.FalconH1Config(
            **common, **_ATTN, **_SSM, num_hidden_layers=2, mamba_expand=2, mamba_d_ssm=None,
            mamba_rms_norm=True, mamba_norm_before_gate=False)),
        "nemotron_h": lambda: (tf.NemotronHForCausalLM, tf.NemotronHConfig(
            **common, **_ATTN, num_hidden_layers=4, mamba_num_heads=8, mamba_head_dim=16, ssm_state_size=16,
            n_groups=2, chunk_size=16, layers_block_type=["mamba", "mlp", "attention", "mamba"])),
        "zamba2": lambda: (tf.Zamba2ForCausalLM, tf.Zamba2Config(
            **common, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4, attention_head_dim=16,
            mamba_d_state=16, mamba_headdim=16, n_mamba_heads=8, mamba_ngroups=2, chunk_size=16,
            layers_block_type=["mamba", "hybrid", "mamba"], num_mem_blocks=1, use_mem_rope=True)),
        "bamba": lambda: (tf.BambaForCausalLM, tf.BambaConfig(
            **common, **_SSM, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=3,
            attn_layer_indices=[1])),
        "granitemoehybrid": lambda: (tf.GraniteMoeHybridForCausalLM, tf.GraniteMoeHybridConfig(
            **common, **_SSM, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=3,
            layer_types=["mamba", "attention", "mamba"], num_local_experts=0, shared_intermediate_size=128)),
    }


FAMILIES = tuple(_configs())


def tiny_hybrid(family: str, *, seed: int = 0, scale: float = 2.0):
    """A tiny random ``family`` model in fp32 eval mode; matrices scaled so logits are O(1..10)."""
    torch.manual_seed(seed)
    model_cls, config = _configs()[family]()
    if family != "mamba2":  # no attention layers: HF refuses an attention implementation
        config._attn_implementation = "sdpa"
    model = model_cls(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.mul_(scale)
    return model


def random_tree(gen: torch.Generator, n: int, kind: str = "random") -> DraftTree:
    """A tree of ``n`` nodes: ``chain``, ``bush`` (all children of the root), ``random`` (uniform parent) or
    ``deep`` (parent among the last three nodes)."""
    parents = [-1]
    for i in range(1, n):
        if kind == "chain":
            parents.append(i - 1)
        elif kind == "bush":
            parents.append(0)
        elif kind == "deep":
            parents.append(int(torch.randint(max(0, i - 3), i, (1,), generator=gen)))
        else:
            parents.append(int(torch.randint(0, i, (1,), generator=gen)))
    tokens = torch.randint(0, VOCAB, (n,), generator=gen)
    return DraftTree(tokens=tokens, parents=torch.tensor(parents))


def tree_mask(tree: DraftTree, prefix_len: int, dtype: torch.dtype) -> torch.Tensor:
    n = tree.num_nodes
    allowed = torch.eye(n, dtype=torch.bool)
    for i, p in enumerate(tree.parents.tolist()):
        if p >= 0:
            allowed[i] |= allowed[p]
    mask = torch.zeros(1, 1, n, prefix_len + n, dtype=dtype)
    mask[0, 0, :, prefix_len:].masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask


@torch.no_grad()
def prefill(model, input_ids: torch.Tensor) -> DynamicCache:
    cache = DynamicCache(config=model.config)
    model(input_ids=input_ids, **{cache_kwarg(model): cache}, use_cache=True)
    return cache


@torch.no_grad()
def tree_forward(model, cache, tree: DraftTree, prefix_len: int) -> torch.Tensor:
    """The model's own forward over the flattened tree (no state manager). Returns logits ``[N, V]``."""
    out = model(
        input_ids=tree.tokens[None],
        position_ids=(tree.depth + prefix_len)[None],
        attention_mask=tree_mask(tree, prefix_len, torch.float32),
        **{cache_kwarg(model): cache},
        use_cache=True,
    )
    return out.logits[0]


def verify(model, manager, cache, tree: DraftTree, prefix_len: int) -> torch.Tensor:
    """One tree forward inside the manager's ``verify_scope``. Returns logits ``[N, V]``."""
    with manager.verify_scope(model, cache, tree, prefix_len):
        return tree_forward(model, cache, tree, prefix_len)


@torch.no_grad()
def path_logits(model, prefix: torch.Tensor, tree: DraftTree) -> torch.Tensor:
    """Reference: every node's logits from a causal forward (no cache) of ``prefix + root->node path``."""
    parents = tree.parents.tolist()
    n = len(parents)
    is_leaf = [True] * n
    for p in parents[1:]:
        is_leaf[p] = False
    ref = torch.empty(n, VOCAB)
    for leaf in (i for i in range(n) if is_leaf[i]):
        path = [leaf]
        while parents[path[-1]] >= 0:
            path.append(parents[path[-1]])
        path.reverse()
        seq = torch.cat([prefix[0], tree.tokens[path]])[None]
        logits = model(input_ids=seq).logits[0, prefix.shape[1] :]
        ref[path] = logits
    return ref


@torch.no_grad()
def next_logits(model, cache, token: int, position: int) -> torch.Tensor:
    """Logits ``[V]`` of one native decode step on top of ``cache``."""
    out = model(
        input_ids=torch.tensor([[token]]),
        position_ids=torch.tensor([[position]]),
        **{cache_kwarg(model): cache},
        use_cache=True,
    )
    return out.logits[0, -1]
