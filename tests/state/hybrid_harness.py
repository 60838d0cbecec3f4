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
_COMMON = dict(vocab_size=VOCAB, hidden_size=64, bos_token_id=1, eos_token_id=None, pad_token_id=0)
_ATTN = dict(intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16)
_GDN = dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16)
_SSM = dict(mamba_n_heads=8, mamba_d_head=16, mamba_d_state=16, mamba_n_groups=2, mamba_chunk_size=16)
_GDN_LAYERS = ["linear_attention", "full_attention", "linear_attention"]

# family -> (model class name, config class name, config kwargs); 2-4 layers mixing recurrent and attention
_SPECS = {
    "qwen3_5": ("Qwen3_5ForCausalLM", "Qwen3_5TextConfig", {**_ATTN, **_GDN, "layer_types": _GDN_LAYERS}),
    "qwen3_next": (
        "Qwen3NextForCausalLM",
        "Qwen3NextConfig",
        {
            **_ATTN,
            **_GDN,
            "layer_types": _GDN_LAYERS,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 32,
        },
    ),
    "qwen3_5_moe": (
        "Qwen3_5MoeForCausalLM",
        "Qwen3_5MoeTextConfig",
        {
            **_ATTN,
            **_GDN,
            "layer_types": _GDN_LAYERS,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 32,
        },
    ),
    "mamba2": (
        "Mamba2ForCausalLM",
        "Mamba2Config",
        {
            "num_hidden_layers": 2,
            "num_heads": 8,
            "head_dim": 16,
            "expand": 2,
            "state_size": 16,
            "n_groups": 2,
            "chunk_size": 16,
        },
    ),
    "falcon_h1": (  # muP multipliers on, gated norm off (y * silu(z))
        "FalconH1ForCausalLM",
        "FalconH1Config",
        {
            **_ATTN,
            **_SSM,
            "num_hidden_layers": 2,
            "mamba_expand": 2,
            "mamba_d_ssm": None,
            "ssm_multipliers": [1.1, 1.5, 1.3, 1.2, 0.9],
            "ssm_in_multiplier": 1.3,
            "ssm_out_multiplier": 1.5,
        },
    ),
    "falcon_h1_rmsnorm": (  # gated RMSNorm on
        "FalconH1ForCausalLM",
        "FalconH1Config",
        {
            **_ATTN,
            **_SSM,
            "num_hidden_layers": 2,
            "mamba_expand": 2,
            "mamba_d_ssm": None,
            "mamba_rms_norm": True,
            "mamba_norm_before_gate": False,
        },
    ),
    "nemotron_h": (
        "NemotronHForCausalLM",
        "NemotronHConfig",
        {
            **_ATTN,
            "num_hidden_layers": 4,
            "mamba_num_heads": 8,
            "mamba_head_dim": 16,
            "ssm_state_size": 16,
            "n_groups": 2,
            "chunk_size": 16,
            "layers_block_type": ["mamba", "mlp", "attention", "mamba"],
        },
    ),
    "zamba2": (
        "Zamba2ForCausalLM",
        "Zamba2Config",
        {
            "intermediate_size": 128,
            "num_hidden_layers": 3,
            "num_attention_heads": 4,
            "num_key_value_heads": 4,
            "attention_head_dim": 16,
            "mamba_d_state": 16,
            "mamba_headdim": 16,
            "n_mamba_heads": 8,
            "mamba_ngroups": 2,
            "chunk_size": 16,
            "layers_block_type": ["mamba", "hybrid", "mamba"],
            "num_mem_blocks": 1,
            "use_mem_rope": True,
        },
    ),
    "bamba": (
        "BambaForCausalLM",
        "BambaConfig",
        {**_ATTN, **_SSM, "num_hidden_layers": 3, "attn_layer_indices": [1]},
    ),
    "granitemoehybrid": (
        "GraniteMoeHybridForCausalLM",
        "GraniteMoeHybridConfig",
        {
            **_ATTN,
            **_SSM,
            "num_hidden_layers": 3,
            "layer_types": ["mamba", "attention", "mamba"],
            "num_local_experts": 0,
            "shared_intermediate_size": 128,
        },
    ),
}
FAMILIES = tuple(_SPECS)


def tiny_hybrid(family: str, *, seed: int = 0, scale: float = 2.0):
    """A tiny random ``family`` model in fp32 eval mode; matrices scaled so logits are O(1..10)."""
    torch.manual_seed(seed)
    model_name, config_name, kwargs = _SPECS[family]
    config = getattr(tf, config_name)(**_COMMON, **{"num_hidden_layers": 3, **kwargs})
    model_cls = getattr(tf, model_name)
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
    ref = torch.empty(n, model.get_output_embeddings().weight.shape[0])
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


def state_tensors(cache) -> dict:
    """Every state tensor of a cache: ``{(layer, name): tensor}`` for conv/recurrent states and KV."""
    out = {}
    for i, layer in enumerate(cache.layers):
        for name in ("conv_states", "recurrent_states", "keys", "values"):
            value = getattr(layer, name, None)
            value = value.get(0) if isinstance(value, dict) else value
            if isinstance(value, torch.Tensor) and value.numel():
                out[(i, name)] = value
    return out
