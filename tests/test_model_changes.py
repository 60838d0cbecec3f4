"""The target cast between calls (fp32 -> bf16 -> fp32, fp32 -> fp64): every cached state follows the model.

Engines (static storage, rounds, prefills) are cached per target and the drafter's state per engine; a cast
reallocates the weights, so each call after one must rebuild what was built for the old weights, and the drafter's
own weights follow the target's dtype. After every change, specdec's tokens equal HF ``model.generate(do_sample=False)``
at that dtype: exactly at fp32 and fp64; at bf16 see ``check_bf16``. CPU, tiny random targets and the zoo's dense
target with its shipped DFlash drafter.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from models import tiny_model
from test_input_rules import sharp_drafter
from transformers import AutoModelForCausalLM

import specdec
from specdec.engine import Engine

ZOO_DRAFTER = Path(__file__).resolve().parents[1] / "assets" / "drafters" / "zoo-dense"
ROUND_TRIP = (torch.float32, torch.bfloat16, torch.float32, torch.float64, torch.float32)
MAX_NEW = 16


def prompt(n: int = 10, seed: int = 0, vocab: int = 128) -> torch.Tensor:
    return torch.randint(4, vocab, (1, n), generator=torch.Generator().manual_seed(seed))


def hf_greedy(model, ids, **kw) -> torch.Tensor:
    return model.generate(ids, max_new_tokens=MAX_NEW, do_sample=False, **kw)


@torch.no_grad()
def check_bf16(model, out: torch.Tensor, ref: torch.Tensor, prompt_len: int) -> None:
    """bf16: exact identity with HF's ``generate`` is not attainable in general. specdec verifies a tree of N tokens
    in one forward over its static storage (an additive mask over a padded span), HF decodes one token at a time
    over its dynamic cache: the same maths with other GEMM shapes and reduction orders, so logits differ in their
    last bf16 bits, and a near-tie (two logits within a few bf16 ulps) can flip the argmax, after which the two
    sequences part. HF's own decode and its full forward disagree the same way. So at bf16 every token specdec
    emits must be the target's argmax under teacher forcing (one bf16 forward over the sequence) up to a few bf16
    ulps, and the tokens must mostly agree with HF's ``generate``."""
    logits = model(out).logits[0, prompt_len - 1 : -1].float()  # [n, V]: the choice of each new token
    chosen = logits.gather(-1, out[0, prompt_len:, None])[:, 0]
    gap = logits.max(-1).values - chosen
    assert float(gap.max()) <= 4 * torch.finfo(torch.bfloat16).eps * float(logits.abs().max()), gap
    agree = (out[0, prompt_len:] == ref[0, prompt_len:]).float().mean()
    assert agree >= 0.5, (out, ref)


def check_at(model, out: torch.Tensor, ref: torch.Tensor, prompt_len: int) -> None:
    if model.dtype == torch.bfloat16:
        check_bf16(model, out, ref, prompt_len)
    else:
        assert torch.equal(out, ref), (model.dtype, out, ref)


def model_drafter(target):
    return specdec.ModelDrafter.from_target_layers(target, 1)


METHODS = {
    "ar": lambda t: (None, None),
    "ngram": lambda t: (specdec.NGramDrafter(), specdec.Chain(4)),
    "dflash": lambda t: (sharp_drafter(t), specdec.DDTree(budget=8, topk=3)),
    "model": lambda t: (model_drafter(t), specdec.Chain(3)),
    "mtp": lambda t: (specdec.MTPDrafter.random(t, seed=1, std=0.3), specdec.DDTree(budget=6, topk=3)),
}


def own_dtype(drafter) -> torch.dtype | None:
    module = getattr(drafter, "model", None) or getattr(getattr(drafter, "lm", None), "model", None)
    return None if module is None else next(module.parameters()).dtype


@pytest.mark.parametrize("method", list(METHODS))
def test_dtype_round_trip_equals_hf(method):
    target = tiny_model("llama", scale=2.0)
    drafter, tree = METHODS[method](target)
    ids = prompt()
    batch = torch.cat([prompt(seed=1), prompt(seed=2)])
    for dtype in ROUND_TRIP:
        target.to(dtype)
        out = specdec.generate(target, ids, drafter=drafter, tree=tree, max_new_tokens=MAX_NEW)
        check_at(target, out.sequences, hf_greedy(target, ids), ids.shape[1])
        if own_dtype(drafter) is not None:
            assert own_dtype(drafter) == dtype  # the drafter followed the target
        if dtype == torch.float64:  # a batch at the new dtype too (its own engine)
            out = specdec.generate(target, batch, drafter=drafter, tree=tree, max_new_tokens=MAX_NEW)
            assert torch.equal(out.sequences, hf_greedy(target, batch))


def test_zoo_target_and_drafter_round_trip(zoo):
    """The zoo's dense target with the shipped DFlash drafter, loaded at fp32, then cast between calls."""
    model = AutoModelForCausalLM.from_pretrained(zoo / "target-dense", dtype=torch.float32).eval()
    drafter = specdec.DFlashDrafter.from_pretrained(ZOO_DRAFTER, target=model)
    ids = prompt(24, vocab=8000)
    tree = specdec.DDTree(budget=16, topk=4)
    for dtype in ROUND_TRIP:
        model.to(dtype)
        out = specdec.generate(model, ids, drafter=drafter, tree=tree, max_new_tokens=MAX_NEW)
        check_at(model, out.sequences, hf_greedy(model, ids), ids.shape[1])
        assert own_dtype(drafter) == dtype
        assert out.stats.tau > 1.0  # the drafter still drafts (its state rebuilt at the new dtype)


def test_speculative_model_follows_a_cast_of_the_wrapped_model():
    """The caller casts the HF model it holds, not the wrapper: the wrapper's next call follows."""
    target = tiny_model("llama", scale=2.0)
    spec = specdec.SpeculativeModel(target, drafter=sharp_drafter(target), tree=specdec.DDTree(budget=8, topk=3))
    ids = prompt()
    for dtype in (torch.float32, torch.float64, torch.float32):
        target.to(dtype)
        assert torch.equal(spec.generate(ids, max_new_tokens=MAX_NEW), hf_greedy(target, ids))
        assert spec.dtype == dtype and own_dtype(spec.drafter) == dtype


def test_engine_rebuilt_only_when_the_weights_change():
    target = tiny_model("llama", scale=2.0)
    ids = prompt()
    specdec.generate(target, ids, max_new_tokens=4)
    engine = Engine._engines[target][1]
    specdec.generate(target, ids, max_new_tokens=4)
    assert Engine._engines[target][1] is engine  # reused while nothing changes
    with torch.no_grad():  # values changed in place: the same storage, the same engine, the new weights' tokens
        target.lm_head.weight.mul_(-1.0)
    out = specdec.generate(target, ids, max_new_tokens=MAX_NEW)
    assert Engine._engines[target][1] is engine and torch.equal(out.sequences, hf_greedy(target, ids))
    target.double()
    specdec.generate(target, ids, max_new_tokens=4)
    rebuilt = Engine._engines[target][1]
    assert rebuilt is not engine and rebuilt.target.storage.kv.dtype == torch.float64
    target.float()
    specdec.generate(target, ids, max_new_tokens=4)
    assert Engine._engines[target][1].target.storage.kv.dtype == torch.float32


def test_drafter_cast_alone_rebuilds_its_state():
    """The caller casts the drafter (not the target): its state and rounds are rebuilt, the tokens stay exact."""
    target = tiny_model("llama", scale=2.0)
    drafter = sharp_drafter(target)
    tree = specdec.DDTree(budget=8, topk=3)
    ids = prompt()
    ref = hf_greedy(target, ids)
    for dtype in (torch.bfloat16, torch.float64, torch.float32):
        drafter.to(dtype=dtype)
        out = specdec.generate(target, ids, drafter=drafter, tree=tree, max_new_tokens=MAX_NEW)
        assert torch.equal(out.sequences, ref) and own_dtype(drafter) == dtype


def test_drafter_kept_at_another_dtype_stays():
    """A drafter the caller keeps at another dtype than the target's (bf16 under fp32) is not cast with it."""
    target = tiny_model("llama", scale=2.0)
    drafter = sharp_drafter(target).to(dtype=torch.bfloat16)
    tree = specdec.DDTree(budget=8, topk=3)
    ids = prompt()
    specdec.generate(target, ids, drafter=drafter, tree=tree, max_new_tokens=4)
    target.double()
    out = specdec.generate(target, ids, drafter=drafter, tree=tree, max_new_tokens=MAX_NEW)
    assert own_dtype(drafter) == torch.bfloat16 and torch.equal(out.sequences, hf_greedy(target, ids))


def test_drafter_that_cannot_follow_gets_an_error():
    class Pinned(specdec.DFlashDrafter):
        to = None  # a drafter with weights and no way to move them

    target = tiny_model("llama", scale=2.0)
    plain = sharp_drafter(target)
    drafter = Pinned(plain.model, target=target)
    ids = prompt()
    specdec.generate(target, ids, drafter=drafter, max_new_tokens=4)
    target.double()
    with pytest.raises(ValueError, match=r"must follow, but Pinned has no to\(\): move its weights to torch.float64"):
        specdec.generate(target, ids, drafter=drafter, max_new_tokens=4)


@pytest.mark.parametrize("first", ["inference_mode", "plain"])
def test_calls_under_inference_mode_and_outside_it_mix(first):
    """A call under ``torch.inference_mode()`` and one outside it, in either order, on the same target and drafter:
    both equal HF (state built under inference mode would be inference tensors, which a later call outside it
    cannot update in place)."""
    target = tiny_model("llama", scale=2.0)
    drafter, tree = METHODS["dflash"](target)
    ids = prompt()
    ref = hf_greedy(target, ids)
    order = [True, False] if first == "inference_mode" else [False, True]
    for inference in order:
        with torch.inference_mode(inference):
            out = specdec.generate(target, ids, drafter=drafter, tree=tree, max_new_tokens=MAX_NEW, do_sample=False)
        assert torch.equal(out.sequences, ref), inference
        assert not out.sequences.is_inference()


@pytest.mark.parametrize("method", ["plain", "dflash"])
def test_a_global_seed_gives_the_same_sample_on_the_first_call_and_later_ones(method):
    """``torch.manual_seed(s)`` before each sampling call (no ``generator``), as with HF: the first call, which builds
    the rounds, samples what the later ones do (building a round draws nothing from the global generator)."""
    target = tiny_model("llama", scale=2.0)
    drafter, tree = METHODS["dflash"](target) if method == "dflash" else (None, None)
    ids = prompt()
    outs = []
    for _ in range(3):
        torch.manual_seed(0)
        out = specdec.generate(target, ids, drafter=drafter, tree=tree, max_new_tokens=MAX_NEW, do_sample=True)
        outs.append(out.sequences)
    assert all(torch.equal(outs[0], o) for o in outs[1:])


def test_a_deep_copy_of_a_speculative_model_decodes_as_the_original():
    """``copy.deepcopy`` of a wrapper (a copy of the target and drafter with it) decodes as HF on the copied target."""
    import copy

    target = tiny_model("llama", scale=2.0)
    spec = specdec.SpeculativeModel(target, drafter=specdec.NGramDrafter())
    ids = prompt()
    spec.generate(ids, max_new_tokens=MAX_NEW)
    twin = copy.deepcopy(spec)
    assert twin.target.model is not target
    assert torch.equal(twin.generate(ids, max_new_tokens=MAX_NEW), hf_greedy(twin.target.model, ids))
    assert torch.equal(spec.generate(ids, max_new_tokens=MAX_NEW), hf_greedy(target, ids))
