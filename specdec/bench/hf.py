"""The HF baselines of the bench: the target's own ``generate`` (eager dynamic cache, static cache, assisted).

``hf-generate`` is plain ``model.generate``; ``hf-static`` is ``generate(cache_implementation="static")`` (HF
compiles the forward on CUDA); ``hf-assisted`` is HF assisted generation with ``assistant_model=`` set to the
small model of a ``ModelDrafter``, so HF's own speculative baseline runs with the same draft model as specdec.
"""

from __future__ import annotations

import time

import torch

__all__ = ["HF_KINDS", "hf_row", "run_hf"]

HF_KINDS = ("generate", "static", "assisted")


def _sync(device: torch.device) -> None:
    if device.type != "cpu" and torch.accelerator.is_available():
        torch.accelerator.synchronize(device)


def _hf_kwargs(kind: str, assistant, temperature: float, gen_kwargs: dict) -> dict:
    kwargs = {k: v for k, v in gen_kwargs.items() if v is not None}  # a method's HF options too (``generation``)
    if "eos_token_id" in gen_kwargs:
        kwargs["eos_token_id"] = gen_kwargs["eos_token_id"]
    kwargs.update({"do_sample": False} if temperature == 0 else {"do_sample": True, "temperature": temperature})
    if kind == "static":
        kwargs["cache_implementation"] = "static"
    elif kind == "assisted":
        kwargs["assistant_model"] = assistant
    return kwargs


def run_hf(
    model,
    input_ids: torch.Tensor,
    kind: str,
    temperature: float,
    gen_kwargs: dict,
    *,
    assistant=None,
    attention_mask: torch.Tensor | None = None,
    pad_token_id: int | None = None,
):
    """One timed HF ``generate`` call; the prompt forward is timed apart so decode time excludes the prefill.

    Args:
        model: the HF causal LM.
        input_ids (torch.Tensor): ``[1, T]`` prompt on the model's device, or ``[B, T]`` left-padded prompts with
            ``attention_mask`` (not with ``kind="assisted"``: HF assisted generation takes one sequence).
        kind (str): ``"generate"``, ``"static"`` or ``"assisted"``.
        temperature (float): 0 = greedy.
        gen_kwargs (dict): ``max_new_tokens``, ``top_k``, ``top_p``, optionally ``eos_token_id`` and a method's HF
            options (``Method.generation``).
        assistant: the HF draft model (``kind="assisted"`` only).
        attention_mask (torch.Tensor | None): ``[B, T]``, 0 on the left padding; None = no padding.
        pad_token_id (int | None): HF's ``pad_token_id`` (fills a finished row while others go on); None = HF's.

    Returns:
        tuple: (sequences ``[B, T + n]``, total seconds, prefill seconds).
    """
    if kind not in HF_KINDS:
        raise ValueError(f"Unknown HF baseline {kind!r}; choose one of {HF_KINDS}.")
    if kind == "assisted" and assistant is None:
        raise ValueError("hf-assisted needs a drafter: {hf: assisted, drafter: {kind: model, ...}}.")
    if kind == "assisted" and input_ids.shape[0] > 1:
        raise ValueError("hf-assisted takes one sequence (HF assisted generation refuses batches).")
    device = input_ids.device
    kwargs = _hf_kwargs(kind, assistant, temperature, gen_kwargs)
    if pad_token_id is not None:
        kwargs["pad_token_id"] = pad_token_id
    mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
    with torch.no_grad():
        _sync(device)
        start = time.perf_counter()
        model(input_ids) if attention_mask is None else model(input_ids, attention_mask=mask)
        _sync(device)
        prefill_s = time.perf_counter() - start
        start = time.perf_counter()
        seqs = model.generate(input_ids, attention_mask=mask, **kwargs)
        _sync(device)
    return seqs, time.perf_counter() - start, prefill_s


def hf_row(
    name: str, kind: str, temperature: float, prompt_id, input_ids, seqs, total_s: float, prefill_s: float
) -> dict:
    """A bench row for an HF baseline run (same fields as specdec rows). τ is 1 for plain decoding; HF does not
    report acceptance for assisted generation, so its τ is None."""
    new = int(seqs.shape[1] - input_ids.shape[1])
    decode_s = max(total_s - prefill_s, 0.0)
    return {
        "method": name,
        "drafter": "none",
        "tree": "hf",
        "budget": 0,
        "topk": None,
        "temperature": float(temperature),
        "prompt_id": prompt_id,
        "prompt_tokens": int(input_ids.shape[1]),
        "new_tokens": new,
        "decode_tokens": max(new - 1, 0),
        "tau": None if kind == "assisted" else (1.0 if new > 1 else 0.0),
        "rounds": 0 if kind == "assisted" else max(new - 1, 0),
        "target_forwards": None if kind == "assisted" else new,
        "draft_forwards": 0,
        "tree_nodes": 0,
        "total_s": total_s,
        "prefill_s": prefill_s,
        "decode_s": decode_s,
        "decode_tok_s": max(new - 1, 0) / decode_s if decode_s > 0 else None,
        "phase_ms": {},
        "accept_hist": [],
        "depth_accept": [],
        "capture_ms": 0.0,
        "compile_ms": 0.0,
        "path": "hf",
        "tokens": seqs[0, input_ids.shape[1] :].tolist(),
        "identical_to_ar": None,
        "identical_to_hf": None,
    }
