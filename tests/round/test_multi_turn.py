"""Multi-turn calls: a prompt that continues the previous call's sequence prefills only its new tokens.

References from outside the code under test: HF's own continuation (``generate(..., past_key_values=)``) and HF's
``generate`` of each whole prompt from scratch. ``stats.reused_tokens`` is checked against the length the previous
call committed, so a reuse that silently stopped happening fails too.
"""

from __future__ import annotations

import pytest
import torch
from models import perturbed_copy, tiny_model
from state.hybrid_harness import tiny_hybrid

import specdec
from specdec.types import Continuation

NEW = 12
_MODELS: dict = {}


def model(kind: str):
    if kind not in _MODELS:
        _MODELS[kind] = tiny_model("qwen3", scale=2.0) if kind == "dense" else tiny_hybrid("qwen3_5", scale=2.0)
    return _MODELS[kind]


def drafters(kind: str):
    target = model(kind)
    out = {"plain": (None, None), "ngram": (specdec.NGramDrafter(), specdec.DDTree(budget=8, topk=3))}
    if kind == "dense":
        out["small-lm"] = (specdec.ModelDrafter(perturbed_copy(target, noise=0.05)), specdec.DDTree(budget=8, topk=3))
    return out


def turn_tokens(seed: int, n: int = 7) -> torch.Tensor:
    return torch.randint(3, 128, (1, n), generator=torch.Generator().manual_seed(seed))


def hf(target, ids, **kw):
    return target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=NEW,
                           eos_token_id=[], pad_token_id=0, **kw)  # fmt: skip


PAIRS = [("dense", "plain"), ("dense", "ngram"), ("dense", "small-lm"), ("hybrid", "plain"), ("hybrid", "ngram")]


@pytest.mark.parametrize("kind, setup", PAIRS)
def test_four_turns_equal_decoding_each_prompt_from_scratch(kind, setup):
    target = model(kind)
    drafter, tree = drafters(kind)[setup]
    specdec.generate(target, turn_tokens(99, 30), drafter=drafter, tree=tree, max_new_tokens=4)  # another sequence
    ids = turn_tokens(1, 20)
    previous = None
    for turn in range(4):
        out = specdec.generate(target, ids, drafter=drafter, tree=tree, max_new_tokens=NEW, eos_token_id=[])
        assert torch.equal(out.sequences, hf(target, ids)), turn
        if previous is None:
            assert out.stats.reused_tokens == 0
        else:  # everything the previous call committed: its sequence, but the last token where no round committed it
            n = previous.sequences.shape[1]
            assert previous.past_key_values.length == n
            assert n - 1 <= out.stats.reused_tokens <= n
        previous = out
        ids = torch.cat([out.sequences, turn_tokens(10 + turn)], 1)


def test_hf_continuation_with_past_key_values_gives_the_same_tokens():
    target = model("dense")
    drafter, tree = drafters("dense")["small-lm"]
    ids = turn_tokens(2, 16)
    ours = specdec.generate(target, ids, drafter=drafter, tree=tree, max_new_tokens=NEW, eos_token_id=[])
    theirs = target.generate(ids, do_sample=False, max_new_tokens=NEW, eos_token_id=[], pad_token_id=0,
                             return_dict_in_generate=True)  # fmt: skip
    for turn in range(3):
        assert torch.equal(ours.sequences, theirs.sequences), turn
        extra = turn_tokens(20 + turn)
        ids_ours, ids_theirs = torch.cat([ours.sequences, extra], 1), torch.cat([theirs.sequences, extra], 1)
        ours = specdec.generate(target, ids_ours, drafter=drafter, tree=tree, max_new_tokens=NEW, eos_token_id=[],
                                past_key_values=ours.past_key_values)  # fmt: skip
        theirs = target.generate(ids_theirs, do_sample=False, max_new_tokens=NEW, eos_token_id=[], pad_token_id=0,
                                 return_dict_in_generate=True, past_key_values=theirs.past_key_values)  # fmt: skip
        assert ours.stats.reused_tokens > 0
    # an HF cache is accepted (not read: the prompt is prefilled again), with the same tokens
    again = specdec.generate(target, ids_theirs, max_new_tokens=NEW, eos_token_id=[],
                             past_key_values=theirs.past_key_values)  # fmt: skip
    assert torch.equal(again.sequences, hf(target, ids_theirs))


@pytest.mark.parametrize("kind", ["dense", "hybrid"])
def test_an_edited_history_reuses_only_what_still_matches(kind):
    """The second prompt changes a token inside the first call's sequence: attention targets reuse the common
    prefix; hybrid targets reuse nothing (their recurrent state cannot step back to the edit)."""
    target = model(kind)
    drafter, tree = drafters(kind)["ngram"]
    first = specdec.generate(target, turn_tokens(3, 20), drafter=drafter, tree=tree, max_new_tokens=NEW,
                             eos_token_id=[])  # fmt: skip
    edited = first.sequences.clone()
    edited[0, 25] = (edited[0, 25] + 1) % 128
    ids = torch.cat([edited, turn_tokens(4)], 1)
    out = specdec.generate(target, ids, drafter=drafter, tree=tree, max_new_tokens=NEW, eos_token_id=[])
    assert torch.equal(out.sequences, hf(target, ids))
    assert out.stats.reused_tokens == (25 if kind == "dense" else 0)


def test_no_reuse_after_weights_change_in_place_or_when_turned_off():
    target = tiny_model("qwen3", scale=2.0, seed=4)
    ids = turn_tokens(5, 20)
    first = specdec.generate(target, ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW, eos_token_id=[])
    with torch.no_grad():
        target.model.layers[0].mlp.up_proj.weight.mul_(1.5)  # a training step between turns
    ids = torch.cat([first.sequences, turn_tokens(6)], 1)
    out = specdec.generate(target, ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW, eos_token_id=[])
    assert out.stats.reused_tokens == 0 and torch.equal(out.sequences, hf(target, ids))
    ids = torch.cat([out.sequences, turn_tokens(7)], 1)
    off = specdec.generate(target, ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW, eos_token_id=[],
                           reuse_prefix=False)  # fmt: skip
    assert off.stats.reused_tokens == 0 and torch.equal(off.sequences, hf(target, ids))


def _layer_hook(module, args, out):
    return (out[0] * 1.1, *out[1:]) if isinstance(out, tuple) else out * 1.1


def _swap(weight: torch.Tensor, i: int, j: int, dim: int) -> None:
    """Swap two rows (``dim=0``) or columns of ``weight`` in place: its norm and most of its elements kept."""
    a, b = weight.select(dim, i).clone(), weight.select(dim, j).clone()
    weight.select(dim, i).copy_(b)
    weight.select(dim, j).copy_(a)


EDITS = {  # an edit between calls that no update counter sees
    "data": lambda t: t.model.embed_tokens.weight.data.mul_(1.7),
    "sign": lambda t: t.model.layers[0].mlp.down_proj.weight.data.neg_(),  # the weight's norm kept
    "permute": lambda t: t.model.layers[0].mlp.down_proj.weight.data.copy_(
        t.model.layers[0].mlp.down_proj.weight.data.roll(1, 0)
    ),  # its norm kept
    "swap-rows": lambda t: _swap(t.model.embed_tokens.weight.data, 3, 7, dim=0),  # two tokens' embeddings
    "swap-columns": lambda t: _swap(t.model.layers[1].self_attn.q_proj.weight.data, 2, 9, dim=1),
    "buffer": lambda t: t.model.rotary_emb.inv_freq.data.mul_(1.5),  # a RoPE-scaling experiment
    "column": lambda t: t.model.layers[0].mlp.down_proj.weight.data[:, 5].zero_(),  # one unit ablated
    "element": lambda t: t.model.layers[0].mlp.up_proj.weight.data[-2, -3].add_(0.5),  # one weight, off the samples
    "attribute": lambda t: setattr(t.model.layers[0].input_layernorm, "variance_epsilon", 0.5),
    "hook": lambda t: t.model.layers[1].register_forward_hook(_layer_hook),
    "unset-attribute": lambda t: setattr(t.model.layers[0].self_attn, "sliding_window", 4),  # was None
    "swap": lambda t: setattr(t.model.layers[0].mlp, "act_fn", torch.nn.GELU()),  # a module without weights
}


@pytest.mark.parametrize("edit", sorted(EDITS))
@pytest.mark.parametrize("how", ["data", "data-same-prompt"])
def test_no_reuse_after_weights_edited_through_data(how, edit):
    """An edit that bumps no update counter (through ``.data``, as adapter merges write; one that keeps a weight's
    norm; a buffer, a module attribute, a hook): the fingerprint of the weights and buffers and the signature of the
    modules tell the kept K/V stale, and the rotary tables follow new frequencies: the next turn, or the same prompt
    again, equals HF on the edited model."""
    target = tiny_model("qwen3", scale=2.0, seed=5)
    ids = turn_tokens(10, 20)
    first = specdec.generate(target, ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW, eos_token_id=[])
    again = specdec.generate(target, ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW, eos_token_id=[])
    assert again.stats.reused_tokens > 0  # unedited: the kept rows serve the same prompt
    EDITS[edit](target)
    ids = ids if how == "data-same-prompt" else torch.cat([first.sequences, turn_tokens(11)], 1)
    out = specdec.generate(target, ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW, eos_token_id=[])
    assert out.stats.reused_tokens == 0 and torch.equal(out.sequences, hf(target, ids))


def test_a_swapped_in_module_is_watched_on_later_turns():
    """A submodule swapped in between turns (a weightless one: no weight signature changes) is itself watched from
    then on: a hook added to it two turns later still makes the kept K/V stale (the module listing follows the
    swap), and every turn equals HF."""
    target = tiny_model("qwen3", scale=2.0, seed=7)
    ids = turn_tokens(13, 20)
    mask = torch.ones_like

    first = specdec.generate(target, ids, attention_mask=mask(ids), max_new_tokens=NEW, eos_token_id=[])
    act = torch.nn.GELU()
    target.model.layers[0].mlp.act_fn = act  # seen: its parent's submodules changed
    ids = torch.cat([first.sequences, turn_tokens(14)], 1)
    second = specdec.generate(target, ids, attention_mask=mask(ids), max_new_tokens=NEW, eos_token_id=[])
    assert second.stats.reused_tokens == 0 and torch.equal(second.sequences, hf(target, ids))
    ids = torch.cat([second.sequences, turn_tokens(15)], 1)
    third = specdec.generate(target, ids, attention_mask=mask(ids), max_new_tokens=NEW, eos_token_id=[])
    assert third.stats.reused_tokens > 0 and torch.equal(third.sequences, hf(target, ids))
    act.register_forward_hook(lambda module, args, out: out * 1.5)  # on the module swapped in two turns ago
    ids = torch.cat([third.sequences, turn_tokens(16)], 1)
    fourth = specdec.generate(target, ids, attention_mask=mask(ids), max_new_tokens=NEW, eos_token_id=[])
    assert fourth.stats.reused_tokens == 0 and torch.equal(fourth.sequences, hf(target, ids))


def test_a_reused_turn_reads_the_weights_once(monkeypatch):
    """The fingerprint that the reuse check takes at a call's start is the one kept at its end (a call updates no
    weight): a continued turn reads every weight once, a first turn (no check) once, and an edit between two turns
    is still seen (the kept fingerprint is the one taken before it)."""
    from specdec.engine import Engine

    passes = []
    fingerprint = Engine._fingerprint
    monkeypatch.setattr(Engine, "_fingerprint", lambda self: (passes.append(1), fingerprint(self))[1])
    target = tiny_model("qwen3", scale=2.0, seed=6)
    ids = turn_tokens(12, 20)
    first = specdec.generate(target, ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW, eos_token_id=[])
    assert len(passes) == 1
    ids = torch.cat([first.sequences, turn_tokens(13)], 1)
    second = specdec.generate(target, ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW, eos_token_id=[])
    assert second.stats.reused_tokens > 0 and len(passes) == 2
    with torch.no_grad():
        target.model.layers[0].mlp.up_proj.weight.data.mul_(1.5)
    ids = torch.cat([second.sequences, turn_tokens(14)], 1)
    out = specdec.generate(target, ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW, eos_token_id=[])
    assert out.stats.reused_tokens == 0 and torch.equal(out.sequences, hf(target, ids))


def test_another_drafter_or_a_batch_in_between_prefills_from_scratch():
    target = model("dense")
    ngram, tree = drafters("dense")["ngram"]
    first = specdec.generate(target, turn_tokens(8, 20), drafter=ngram, tree=tree, max_new_tokens=NEW, eos_token_id=[])
    ids = torch.cat([first.sequences, turn_tokens(9)], 1)
    other, _ = drafters("dense")["small-lm"]
    out = specdec.generate(target, ids, drafter=other, tree=tree, max_new_tokens=NEW, eos_token_id=[])
    assert out.stats.reused_tokens == 0 and torch.equal(out.sequences, hf(target, ids))


def test_a_continuation_that_the_prompt_does_not_extend_is_refused():
    target = model("dense")
    first = specdec.generate(target, turn_tokens(11, 20), max_new_tokens=NEW, eos_token_id=[])
    assert isinstance(first.past_key_values, Continuation)
    with pytest.raises(ValueError, match="does not start with"):
        specdec.generate(target, turn_tokens(12, 40), max_new_tokens=4, past_key_values=first.past_key_values)
    batch = torch.cat([first.sequences, first.sequences])
    with pytest.raises(ValueError, match="one sequence"):
        specdec.generate(target, batch, max_new_tokens=4, past_key_values=first.past_key_values)
