"""Random-weight targets at real model shapes (``random_target``), their random prompts, and random DFlash drafters.

Timing does not depend on the weights' values: a Qwen3-8B-shaped target with random bf16 weights costs what the
trained one costs per forward, so the round cost at that size can be measured without the checkpoint. Tokens and
τ of such a target mean nothing (the drafter is random too: expect τ near 1); the rows to read are ms per round.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

__all__ = ["PRESETS", "describe_random_target", "random_dflash", "random_prompts", "random_target"]

# name -> (transformers config class, its kwargs); "layers" overrides num_hidden_layers.
PRESETS: dict[str, tuple[str, dict]] = {
    "qwen3-8b": (
        "Qwen3Config",
        dict(
            vocab_size=151936,
            hidden_size=4096,
            intermediate_size=12288,
            num_hidden_layers=36,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=128,
            max_position_embeddings=40960,
            rope_theta=1e6,
            tie_word_embeddings=False,
        ),
    ),
    # Qwen3.5 text architecture at its defaults (hidden 4096), 32 layers, 3 Gated-DeltaNet : 1 attention.
    "qwen3.5-hybrid-8b": ("Qwen3_5TextConfig", dict(num_hidden_layers=32, tie_word_embeddings=False)),
}

RANDOM_TARGET_KEYS = {"preset", "layers", "prompt_tokens", "config"}


def _config(spec: Mapping):
    import transformers

    unknown = set(spec) - RANDOM_TARGET_KEYS
    if unknown:
        raise ValueError(f"random_target has unknown keys {sorted(unknown)}; use {sorted(RANDOM_TARGET_KEYS)}.")
    preset = spec.get("preset")
    if preset not in PRESETS:
        raise ValueError(f"random_target.preset={preset!r}: choose one of {sorted(PRESETS)}.")
    config_name, kwargs = PRESETS[preset]
    kwargs = {**kwargs, **dict(spec.get("config") or {})}
    if spec.get("layers") is not None:
        kwargs["num_hidden_layers"] = int(spec["layers"])
    if config_name == "Qwen3_5TextConfig" and "layer_types" not in kwargs:
        layers = kwargs["num_hidden_layers"]
        kwargs["layer_types"] = ["full_attention" if i % 4 == 3 else "linear_attention" for i in range(layers)]
    return getattr(transformers, config_name)(**kwargs, attn_implementation="sdpa")


def check_random_target(spec: Mapping) -> None:
    """Refuse a ``random_target`` setting before anything is built (unknown keys, an unknown preset)."""
    _config(spec)


def random_target(spec: Mapping, *, device: torch.device, dtype: torch.dtype, seed: int = 0):
    """An HF causal LM of the ``spec["preset"]`` shape with random weights, built directly on ``device`` in
    ``dtype``, in eval mode.

    Args:
        spec (Mapping): ``preset`` (``qwen3-8b`` or ``qwen3.5-hybrid-8b``), optional ``layers`` (override the
            layer count) and ``config`` (a dict of config overrides, e.g. a small width for a CPU check).
        device, dtype: where and how the weights live.
        seed (int): initialisation seed. Default 0.
    """
    from transformers import AutoModelForCausalLM

    config = _config(spec)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()


def describe_random_target(spec: Mapping, model) -> str:
    """``random qwen3-8b shape (36 layers, 8.19 B params)``."""
    params = sum(p.numel() for p in model.parameters())
    return f"random {spec['preset']} shape ({model.config.num_hidden_layers} layers, {params / 1e9:.2f} B params)"


def random_prompts(model, *, num_prompts: int, prompt_tokens: int, seed: int = 0) -> list[dict]:
    """``num_prompts`` prompt records of ``prompt_tokens`` random token ids each (``input_ids``, no text)."""
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(seed)
    return [
        {"id": f"random-{i}", "input_ids": torch.randint(10, vocab - 10, (prompt_tokens,), generator=gen).tolist()}
        for i in range(num_prompts)
    ]


def random_dflash(
    target,
    *,
    num_layers: int = 5,
    block_size: int = 16,
    num_taps: int | None = None,
    scale: float = 4.0,
    seed: int = 0,
):
    """A freshly initialised ``specdec.DFlashDrafter`` of the target's width (``DFlashDrafter.for_target``), in
    the target's dtype, its matrices scaled by ``scale`` so drafts are not all near-ties.

    Args:
        target: the HF causal LM.
        num_layers (int): drafter layers. Default 5.
        block_size (int): the block (chain of block_size - 1). Default 16.
        num_taps (int | None): tapped target layers; None = ``num_layers``, at most the target's layer count.
        scale (float): factor on every 2-D weight. Default 4.0.
        seed (int): initialisation seed. Default 0.
    """
    import specdec

    param = next(target.parameters())
    depth = target.config.num_hidden_layers
    drafter = specdec.DFlashDrafter.for_target(
        target,
        mask_token_id=target.config.vocab_size - 1,
        num_layers=num_layers,
        block_size=block_size,
        num_taps=min(num_taps or num_layers, depth),
        seed=seed,
        dtype=param.dtype,
        device=param.device,
    )
    module = getattr(drafter, "model", None)
    if scale != 1.0 and isinstance(module, torch.nn.Module):
        with torch.no_grad():
            for p in module.parameters():
                if p.dim() == 2:
                    p.mul_(scale)
    return drafter
