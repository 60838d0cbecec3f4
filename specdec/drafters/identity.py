"""Which target a drafter was trained for: the identity record of a checkpoint and the check against a target.

A DFlash drafter reads the target's hidden states and borrows its embedding and LM head, so it only drafts well
for the target it was trained with. The record (``config.json`` key ``specdec_target``) names that target by
architecture, vocabulary, hidden size, layer count and an embedding fingerprint (rule in ``docs/dflash.md``).
"""

from __future__ import annotations

import logging

import torch

from specdec.distributed import full_tensor

__all__ = [
    "RECORD_KEY",
    "check_identity",
    "embedding_fingerprint",
    "fingerprint_distance",
    "identity_differences",
    "target_identity",
]

logger = logging.getLogger(__name__)

RECORD_KEY = "specdec_target"
_GRID = 16  # the fingerprint samples a 16 x 16 grid of the embedding: 256 sign bits
_MAX_DISTANCE = 0.1  # share of differing bits still read as "the same embedding" (casts, light quantization)


def embedding_fingerprint(weight: torch.Tensor) -> str:
    """Signs of a fixed 16 x 16 grid of an embedding matrix, as 64 hex digits.

    Row j of the grid is token ``floor((j + 1/2) V / 16)``, column k is feature ``floor((k + 1/2) H / 16)``; bit
    (j, k) (row-major, first bit most significant) is 1 when that entry is > 0. A cast between fp32, bf16 and
    fp16 never changes a sign, so a cast copy of the same weights has the same fingerprint.

    Args:
        weight (torch.Tensor): ``[V, H]`` embedding, any device and float dtype.

    Returns:
        str: 64 lowercase hex digits.
    """
    vocab, width = weight.shape
    rows = [(2 * j + 1) * vocab // (2 * _GRID) for j in range(_GRID)]
    cols = [(2 * k + 1) * width // (2 * _GRID) for k in range(_GRID)]
    grid = weight.detach()[rows][:, cols].float().cpu()
    bits = "".join("1" if b else "0" for b in (grid > 0).flatten().tolist())
    return f"{int(bits, 2):0{_GRID * _GRID // 4}x}"


def fingerprint_distance(a: str, b: str) -> float:
    """Share of differing bits between two fingerprints (0 = same signs; about 0.5 for unrelated embeddings)."""
    return bin(int(a, 16) ^ int(b, 16)).count("1") / (_GRID * _GRID)


def target_identity(hf_model) -> dict:
    """The identity record of an HF causal LM: what a drafter trained for it writes in its ``config.json``.

    Returns:
        dict: ``architecture``, ``model_type``, ``vocab_size`` (LM-head rows), ``hidden_size``,
        ``num_hidden_layers``, ``embedding_fingerprint``.
    """
    cfg = hf_model.config
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    return {
        "architecture": type(hf_model).__name__,
        "model_type": getattr(text, "model_type", None),
        "vocab_size": int(hf_model.get_output_embeddings().weight.shape[0]),
        "hidden_size": int(text.hidden_size),
        "num_hidden_layers": int(text.num_hidden_layers),
        "embedding_fingerprint": embedding_fingerprint(full_tensor(hf_model.get_input_embeddings().weight)),
    }


def identity_differences(record: dict | None, identity: dict, *, vocab_size=None, num_target_layers=None) -> list[str]:
    """What differs between the target a drafter was made for and the target it is used with.

    Args:
        record (dict | None): the checkpoint's identity record; None for checkpoints without one.
        identity (dict): :func:`target_identity` of the target in use.
        vocab_size, num_target_layers (int | None): the checkpoint config's values, compared when ``record`` is
            None (the checks possible for checkpoints without a record).

    Returns:
        list[str]: one phrase per difference; empty when nothing differs.
    """
    if record is None:
        record = {"vocab_size": vocab_size, "num_hidden_layers": num_target_layers}
    diffs = [
        f"{key} {record[key]!r} (trained for) vs {identity[key]!r} (this target)"
        for key in ("architecture", "vocab_size", "hidden_size", "num_hidden_layers")
        if record.get(key) is not None and record[key] != identity[key]
    ]
    fingerprint = record.get("embedding_fingerprint")
    if fingerprint:
        distance = fingerprint_distance(fingerprint, identity["embedding_fingerprint"])
        if distance > _MAX_DISTANCE:
            diffs.append(f"embedding fingerprint differs in {distance:.0%} of its bits (another embedding)")
    return diffs


def check_identity(diffs: list[str], *, name: str, strict: bool) -> None:
    """Warn (``logging.warning``) about ``diffs``, or raise ``ValueError`` with ``strict=True``."""
    if not diffs:
        return
    message = (
        f"{name} was trained for another target: {'; '.join(diffs)}. It will draft poorly (about one token per "
        "round) and decoding can be slower than without a drafter; the output stays exact. Use a drafter "
        "trained for this target (specdec.train)"
    )
    if strict:
        raise ValueError(message + ", or load with strict=False to use it anyway.")
    logger.warning("%s; strict=True refuses such a pairing.", message)
