"""Tiny randomly initialised HF causal LMs of many architectures (fp32, CPU, no downloads)."""

from __future__ import annotations

import torch
import transformers as tf

VOCAB = 128
_COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    bos_token_id=1,
    eos_token_id=None,
    pad_token_id=0,
)

ARCHS = {
    "llama": (tf.LlamaConfig, tf.LlamaForCausalLM, {}),
    "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM, {}),
    "qwen3": (tf.Qwen3Config, tf.Qwen3ForCausalLM, {"head_dim": 16}),
    "mistral": (tf.MistralConfig, tf.MistralForCausalLM, {"sliding_window": None}),
    "gemma2": (tf.Gemma2Config, tf.Gemma2ForCausalLM, {"head_dim": 16, "sliding_window": 256}),  # eager only
    "gemma3": (tf.Gemma3TextConfig, tf.Gemma3ForCausalLM, {"head_dim": 16, "sliding_window": 256}),
    "phi3": (tf.Phi3Config, tf.Phi3ForCausalLM, {}),
}


def tiny_model(arch: str, *, seed: int = 0, scale: float = 1.0, attn: str = "sdpa", **overrides):
    """Build a tiny ``arch`` model; ``scale`` multiplies weights to make logits sharper (fewer near-ties)."""
    torch.manual_seed(seed)
    if arch == "gpt2":
        defaults = dict(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=512, bos_token_id=1,
                        eos_token_id=None)  # fmt: skip
        cfg = tf.GPT2Config(**{**defaults, **overrides}, attn_implementation=attn)
        model = tf.GPT2LMHeadModel(cfg)
    else:
        config_cls, model_cls, extra = ARCHS[arch]
        attn = "eager" if arch == "gemma2" else attn
        cfg = config_cls(**{**_COMMON, **extra, **overrides}, attn_implementation=attn)
        model = model_cls(cfg)
    if scale != 1.0:
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() >= 2:
                    p.mul_(scale)
    return model.eval()


def perturbed_copy(model, *, noise: float, seed: int = 1):
    """A drafter that mostly agrees with ``model``: the same weights plus Gaussian noise."""
    import copy

    torch.manual_seed(seed)
    draft = copy.deepcopy(model)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(noise * p.std() * torch.randn_like(p))
    return draft.eval()
