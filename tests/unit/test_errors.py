"""Bad input gets a clear error naming the problem and the fix, before any cache is touched."""

import logging

import pytest
import torch
from models import tiny_model

import specdec
from specdec.engine import Engine
from specdec.target import TargetModel
from specdec.types import SamplingParams
from specdec.validate import ProtocolError


@pytest.fixture(scope="module")
def target():
    return TargetModel(tiny_model("llama", scale=2.0))


IDS = torch.tensor([[5, 6, 7, 8]])


def gen(target, ids=IDS, **kw):
    kw.setdefault("max_new_tokens", 5)
    return specdec.generate(target, ids, **kw)


def test_error_drafter_vocab_mismatch(target):
    draft = specdec.ModelDrafter(tiny_model("llama", vocab_size=200))
    with pytest.raises(ValueError, match=r"vocabulary \(200\) differs from the target's \(128\)"):
        gen(target, drafter=draft)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: specdec.DDTree(budget=0), "budget must be an int >= 1"),
        (lambda: specdec.DDTree(budget=4, topk=0), "topk must be an int >= 1"),
        (lambda: specdec.Chain(k=0), "k must be an int >= 1"),
    ],
)
def test_error_bad_tree_spec(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_error_empty_prompt(target):
    with pytest.raises(ValueError, match="prompt is empty"):
        gen(target, ids=torch.zeros(1, 0, dtype=torch.long))


def test_error_too_long(target):
    with pytest.raises(ValueError, match="needs 516 positions but the target handles 512"):
        gen(target, max_new_tokens=512)


def test_error_right_padding(target):
    with pytest.raises(ValueError, match="not left-padded .*padding_side='left'"):
        gen(target, ids=IDS.repeat(2, 1), attention_mask=torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]]))


def test_error_all_padding_row(target):
    with pytest.raises(ValueError, match="Row 1 of attention_mask is all padding"):
        gen(target, ids=IDS.repeat(2, 1), attention_mask=torch.tensor([[1, 1, 1, 1], [0, 0, 0, 0]]))


def test_error_batch_streamer(target):
    with pytest.raises(ValueError, match="A streamer takes one sequence"):
        gen(target, ids=IDS.repeat(2, 1), streamer=object())


def test_error_bad_max_new_tokens(target):
    with pytest.raises(ValueError, match="max_new_tokens=0 must be an int >= 1"):
        gen(target, max_new_tokens=0)


def test_error_device_mismatch(target):
    with pytest.raises(ValueError, match="input_ids are on meta but the target is on cpu"):
        gen(target, ids=IDS.to("meta"))


def test_error_draft_device_mismatch(target):
    draft = specdec.ModelDrafter(tiny_model("llama").to("meta"))
    with pytest.raises(ValueError, match="Draft model is on meta but the target is on cpu"):
        gen(target, drafter=draft)


def test_error_attention_implementation():
    model = tiny_model("llama")
    model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match='attn_implementation="sdpa"'):
        TargetModel(model)


def test_error_sampling_params(target):
    with pytest.raises(ValueError, match="temperature=0.0 must be > 0"):
        gen(target, do_sample=True, temperature=0.0)
    with pytest.raises(ValueError, match=r"top_p=1.5 must be in \[0, 1\]"):
        gen(target, do_sample=True, top_p=1.5)
    with pytest.raises(ValueError, match=r"top_p=-0.1 must be in \[0, 1\]"):
        gen(target, do_sample=True, top_p=-0.1)


def test_top_p_zero_keeps_the_top_token_as_hf():
    """HF takes ``top_p=0.0`` (its warper keeps ``min_tokens_to_keep=1`` token): sampling then always draws the most
    likely token, so the output is HF's own ``top_p=0.0`` output and its greedy one, under a tree too."""
    model = tiny_model("llama", scale=2.0)
    ids = torch.randint(4, 128, (1, 9), generator=torch.Generator().manual_seed(1))
    want = model.generate(ids, max_new_tokens=10, do_sample=True, top_p=0.0)
    assert torch.equal(want, model.generate(ids, max_new_tokens=10, do_sample=False))
    drafter = specdec.ModelDrafter(tiny_model("llama", seed=3, scale=2.0))
    for tree in (specdec.Chain(3), specdec.DDTree(8)):
        out = specdec.generate(model, ids, max_new_tokens=10, do_sample=True, top_p=0.0, drafter=drafter, tree=tree)
        assert torch.equal(out.sequences, want), tree


def _committed_state(target):
    """The engine's committed state: the prefix length, the root, and the K/V rows of the committed tokens."""
    engine = Engine.for_target(target, capacity=1)
    n = int(engine.prefix)
    return engine, [engine.prefix.clone(), engine.root.clone(), engine.target.storage.kv[..., :n, :].clone()]


def test_errors_leave_the_cache_untouched(target):
    out = gen(target, drafter=specdec.NGramDrafter(), max_new_tokens=8)
    engine, before = _committed_state(target)
    storage = engine.target.storage.kv
    right_padded = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    bad_calls = (dict(ids=IDS.repeat(2, 1), attention_mask=right_padded), dict(max_new_tokens=10_000),
                 dict(attention_mask=torch.zeros(1, 4)))  # fmt: skip
    for bad in bad_calls:
        with pytest.raises(ValueError):
            gen(target, **bad)
    again, after = _committed_state(target)
    assert again is engine and engine.target.storage.kv is storage
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    assert out.stats.new_tokens == 8


class _OutOfVocabDrafter(specdec.NGramDrafter):
    """Proposes a path whose token is outside the vocabulary: a drafter of a user's, so the round checks the tree
    made of its proposal and its read raises ``ProtocolError``."""

    def attach(self, target, capacity: int, batch: int = 1):
        state = super().attach(target, capacity, batch)
        propose = state.propose

        def bad(root, prefix, depth, span):
            proposal = propose(root, prefix, depth, span)
            return proposal._replace(paths=torch.full_like(proposal.paths, 10_000),
                                     path_lengths=torch.ones_like(proposal.path_lengths))  # fmt: skip

        state.propose = bad
        return state


def test_failed_round_leaves_the_committed_state_untouched(target):
    """A round that raises (an out-of-vocabulary draft) leaves the committed prefix, root and K/V rows as they were;
    the next call decodes the target's greedy tokens."""
    gen(target, max_new_tokens=3)
    engine, before = _committed_state(target)
    with pytest.raises(ProtocolError, match="_OutOfVocabDrafter .*outside the vocabulary"), torch.no_grad():
        engine.round_for(_OutOfVocabDrafter(), specdec.Chain(k=2), specdec.Greedy(), SamplingParams(),
                         graph=False)(None)  # fmt: skip
    _, after = _committed_state(target)
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    ref = target.model.generate(IDS, do_sample=False, max_new_tokens=6)
    assert torch.equal(gen(target, drafter=specdec.NGramDrafter(), max_new_tokens=6).sequences, ref)


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda t: gen(t, do_sample=True, generator=123), TypeError, r"generator=123 \(int\): pass a torch.Generator"),
        (lambda t: specdec.NGramDrafter(max_ngram=2.5), TypeError, r"max_ngram=2.5 must be a Python int"),
        (lambda t: specdec.NGramDrafter(min_ngram="1"), TypeError, r"min_ngram='1' must be a Python int"),
        (lambda t: specdec.NGramDrafter(max_matches=True), TypeError, r"max_matches=True must be a Python int"),
        (lambda t: specdec.ModelDrafter("a/path"), TypeError, r"not the path 'a/path': pass AutoModelForCausalLM"),
        (lambda t: specdec.ModelDrafter(object()), TypeError, r"takes an HF causal LM \(an nn.Module\)"),
        (lambda t: specdec.SpeculativeModel(specdec.SpeculativeModel(t.model)), TypeError,
         r"SpeculativeModel already: pass the HF model it wraps"),
        (lambda t: specdec.MultiDraftRejection(replacement="yes"), TypeError, r"replacement='yes' must be True"),
        (lambda t: gen(t, verifier="greedy"), TypeError, r"verifier='greedy' is a rule's name; .*specdec\.Greedy\(\)"),
        (lambda t: gen(t, verifier="nope"), TypeError, r"verifier='nope': pass a rule object.*registered names"),
    ],
)  # fmt: skip
def test_raw_errors_are_clear(target, call, error, match):
    with pytest.raises(error, match=match):
        call(target)
    assert torch.equal(gen(target).sequences, gen(target).sequences)  # a valid call after it still runs


@pytest.mark.parametrize(
    "tree, key, match",
    [("ddtree", "budget", r"tree.budget='abc': pass a whole number >= 1 or auto"),
     ("ddtree", "topk", r"tree.topk='x': pass a whole number"), ("chain", "k", r"tree.k='four': pass a whole")],
)  # fmt: skip
def test_cli_tree_settings_of_text_are_clear(tree, key, match):
    from specdec.loading import build_tree

    value = {"budget": "abc", "topk": "x", "k": "four"}[key]
    with pytest.raises(ValueError, match=match):
        build_tree(tree, **{key: value})
    assert build_tree("ddtree", budget="16").budget == 16  # digits from the command line still count


def test_a_round_that_cannot_fit_is_refused_before_allocating(target, monkeypatch):
    import importlib

    generate_module = importlib.import_module("specdec.generate")  # the module (specdec.generate: its function)
    draft = specdec.ModelDrafter(tiny_model("llama", seed=3))
    with pytest.raises(ValueError, match=r"a round of 1000001 tree slots .* needs about \d+\.\d GiB .* free: lower"):
        gen(target, drafter=draft, tree=specdec.DDTree(budget=10**6))
    # what is free decides: a round that fits in the machine is refused when the memory is not there
    monkeypatch.setattr(generate_module, "available_bytes", lambda device: 1024)
    with pytest.raises(ValueError, match=r"tree slots over .* but cpu has 0\.0 GiB free"):
        gen(target, drafter=draft, tree=specdec.DDTree(budget=8))
    monkeypatch.undo()
    want = target.model.generate(IDS, max_new_tokens=5, do_sample=False)
    assert torch.equal(gen(target, drafter=draft, tree=specdec.DDTree(budget=8)).sequences, want)


def test_a_tree_that_fits_but_is_huge_is_warned_about(target, monkeypatch, caplog):
    """A budget past ``LARGE_TREE_SLOTS`` fits (so it runs) but gets a warning naming its size and the usual range;
    the usual budgets get none. The memory check and the warning come before anything is allocated: here the call
    is then refused for memory, so the test runs no huge round."""
    import importlib

    generate_module = importlib.import_module("specdec.generate")
    draft = specdec.ModelDrafter(tiny_model("llama", seed=3))
    with caplog.at_level(logging.WARNING, logger="specdec.generate"):
        gen(target, drafter=draft, tree=specdec.DDTree(budget=63))
    assert not [r for r in caplog.records if "tree slots per round" in r.getMessage()]
    monkeypatch.setattr(generate_module, "available_bytes", lambda device: 1024)
    with caplog.at_level(logging.WARNING, logger="specdec.generate"), pytest.raises(ValueError, match="GiB free"):
        gen(target, drafter=draft, tree=specdec.DDTree(budget=5000))
    (warning,) = [r for r in caplog.records if "tree slots per round" in r.getMessage()]
    assert "5001 tree slots" in warning.getMessage() and "15-63" in warning.getMessage()


def test_a_target_in_training_mode_with_dropout_is_warned_about(caplog):
    """Dropout active (training mode): a warning saying why the output is random and to call model.eval(); eval
    mode, or training mode without dropout, gets none."""
    model = tiny_model("llama", attention_dropout=0.5)
    ids = torch.randint(4, 128, (1, 6), generator=torch.Generator().manual_seed(0))
    cases = ((True, model, True), (False, model, False), (True, tiny_model("llama"), False))
    for train, dropout_model, warned in cases:
        dropout_model.train(train)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="specdec.generate"):
            specdec.generate(dropout_model, ids, max_new_tokens=2)
        got = [r for r in caplog.records if "training mode" in r.getMessage()]
        assert bool(got) == warned, (train, [r.getMessage() for r in caplog.records])
        if warned:
            assert "model.eval()" in got[0].getMessage()
    model.eval()


def test_failed_round_leaves_a_hybrid_state_untouched():
    """The same on a hybrid target: a round whose check fails commits no recurrent state (conv windows and states
    of every linear-attention layer stay as they were), and the next call equals HF."""
    from state.hybrid_harness import tiny_hybrid

    target = TargetModel(tiny_hybrid("qwen3_5", scale=2.0))
    gen(target, max_new_tokens=3)
    engine = Engine.for_target(target, capacity=1)
    layers = list(engine.target.recurrent.values())  # the engine's recurrent layers (conv windows and states)
    assert layers

    def state():
        return [engine.prefix.clone(), engine.root.clone()] + [
            t.clone() for layer in layers for t in (layer.conv_states, layer.recurrent_states)
        ]

    before = state()
    with pytest.raises(ProtocolError, match="outside the vocabulary"), torch.no_grad():
        engine.round_for(_OutOfVocabDrafter(), specdec.Chain(k=2), specdec.Greedy(), SamplingParams(),
                         graph=False)(None)  # fmt: skip
    changed = [i for i, (a, b) in enumerate(zip(before, state(), strict=True)) if not torch.equal(a, b)]
    assert not changed, changed
    ref = target.model.generate(IDS, do_sample=False, max_new_tokens=6)
    assert torch.equal(gen(target, drafter=specdec.NGramDrafter(), max_new_tokens=6).sequences, ref)
