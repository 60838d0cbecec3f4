"""Greedy speculative output must equal the target's own greedy ``generate``, token for token."""

import pytest
import torch
from models import ARCHS, perturbed_copy, tiny_model

import specdec

ALL_ARCHS = [*ARCHS, "gpt2"]
DRAFTS = ["ngram-chain", "ngram-tree", "model-chain", "model-tree"]


def make_drafter(kind: str, target):
    if kind.startswith("ngram"):
        return specdec.NGramDrafter(), specdec.Chain(k=4) if kind.endswith("chain") else specdec.DDTree(budget=8)
    draft = specdec.ModelDrafter(perturbed_copy(target, noise=0.3))
    return draft, specdec.Chain(k=3) if kind.endswith("chain") else specdec.DDTree(budget=8, topk=3)


def prompt(n: int = 10, seed: int = 1) -> torch.Tensor:
    # a repeated motif so the n-gram drafter finds matches
    motif = torch.randint(3, 128, (n // 2,), generator=torch.Generator().manual_seed(seed))
    return torch.cat([motif, motif]).unsqueeze(0)


@pytest.mark.parametrize("arch", ALL_ARCHS)
@pytest.mark.parametrize("kind", DRAFTS)
def test_generate_greedy_matches_vanilla(arch, kind):
    target = tiny_model(arch, scale=2.0)
    ids = prompt()
    ref = target.generate(ids, do_sample=False, max_new_tokens=40)
    drafter, tree = make_drafter(kind, target)
    out = specdec.generate(target, ids, drafter=drafter, tree=tree, max_new_tokens=40, do_sample=False)
    assert torch.equal(out.sequences, ref)
    assert out.stats.new_tokens == 40
    assert sum(out.stats.accept_hist) == out.stats.rounds


@pytest.mark.parametrize("kind", DRAFTS)
def test_generate_greedy_accepts_long_paths(kind):
    """A near-perfect drafter: accept-all and mid-path rounds must both occur and stay exact."""
    target = tiny_model("qwen3", scale=2.0)
    ids = prompt(12, seed=3)
    ref = target.generate(ids, do_sample=False, max_new_tokens=60)
    drafter, tree = make_drafter(kind, target)
    if kind.startswith("model"):
        drafter = specdec.ModelDrafter(perturbed_copy(target, noise=0.05))
    out = specdec.generate(target, ids, drafter=drafter, tree=tree, max_new_tokens=60, do_sample=False)
    assert torch.equal(out.sequences, ref)
    if kind.startswith("model"):
        assert out.stats.tau > 2.0, out.stats.accept_hist


@pytest.mark.parametrize("tree", [specdec.Chain(4), specdec.DDTree(budget=12, topk=3)], ids=["chain", "ddtree"])
def test_learned_positions_up_to_the_last_one(tree):
    """GPT-2 looks positions up in a learned table (``wpe``); asked for exactly as many tokens as its positions
    hold, tree nodes past the last position (never committed) must not index past the table; the tokens are
    HF's."""
    limit = 64
    model = tiny_model("gpt2", scale=3.0, n_positions=limit)
    drafter = specdec.ModelDrafter(perturbed_copy(model, noise=0.01))
    ids = torch.randint(4, 100, (1, limit - 9), generator=torch.Generator().manual_seed(5))
    want = model.generate(ids, max_new_tokens=9, do_sample=False)
    out = specdec.generate(model, ids, drafter=drafter, tree=tree, max_new_tokens=9, do_sample=False)
    assert torch.equal(out.sequences, want)
    assert out.stats.rounds < 9  # drafts were accepted: rounds reached past the last position


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_generate_greedy_attention_implementations(attn):
    target = tiny_model("llama", scale=2.0, attn=attn)
    ids = prompt()
    ref = target.generate(ids, do_sample=False, max_new_tokens=30)
    drafter, tree = make_drafter("model-tree", target)
    out = specdec.generate(target, ids, drafter=drafter, tree=tree, max_new_tokens=30, do_sample=False)
    assert torch.equal(out.sequences, ref)


@pytest.mark.parametrize("max_new", [1, 2, 3, 7])
def test_generate_max_new_tokens_edges(max_new):
    """max_new_tokens of 1 (prefill only) and values that a round overshoots are cut exactly as HF cuts."""
    target = tiny_model("qwen3", scale=2.0)
    ids = prompt()
    ref = target.generate(ids, do_sample=False, max_new_tokens=max_new)
    drafter = specdec.ModelDrafter(perturbed_copy(target, noise=0.01))
    out = specdec.generate(target, ids, drafter=drafter, tree=specdec.Chain(k=5), max_new_tokens=max_new)
    assert torch.equal(out.sequences, ref)
    assert out.sequences.shape[1] == ids.shape[1] + max_new


@pytest.mark.parametrize("where", ["first", "mid"])
def test_generate_stops_at_eos(where):
    target = tiny_model("qwen3", scale=2.0)
    ids = prompt()
    free = target.generate(ids, do_sample=False, max_new_tokens=40)[0, ids.shape[1] :]
    eos = int(free[0]) if where == "first" else int(free[17])
    ref = target.generate(ids, do_sample=False, max_new_tokens=40, eos_token_id=eos, pad_token_id=0)
    drafter = specdec.ModelDrafter(perturbed_copy(target, noise=0.01))
    out = specdec.generate(target, ids, drafter=drafter, tree=specdec.Chain(k=6), max_new_tokens=40, eos_token_id=eos)
    assert torch.equal(out.sequences, ref)
    assert int(out.sequences[0, -1]) == eos


def test_speculative_model_is_drop_in():
    target = tiny_model("llama", scale=2.0)
    ids = prompt()
    model = specdec.SpeculativeModel(target, drafter=specdec.NGramDrafter(), tree=specdec.Chain(k=4))
    out = model.generate(input_ids=ids, max_new_tokens=20, do_sample=False)
    assert torch.equal(out, target.generate(ids, do_sample=False, max_new_tokens=20))
    assert model.last_stats.new_tokens == 20


def test_the_prompt_as_inputs_as_hf_names_it():
    """``inputs=`` is HF's other name for the prompt, in ``specdec.generate`` as in ``SpeculativeModel.generate``;
    both names, or neither, is a clear error."""
    target = tiny_model("llama", scale=2.0)
    ids = prompt()
    want = target.generate(inputs=ids, do_sample=False, max_new_tokens=8)
    out = specdec.generate(target, inputs=ids, drafter=specdec.NGramDrafter(), max_new_tokens=8, do_sample=False)
    assert torch.equal(out.sequences, want)
    assert torch.equal(specdec.SpeculativeModel(target).generate(inputs=ids, max_new_tokens=8, do_sample=False), want)
    with pytest.raises(ValueError, match="Pass the prompt once"):
        specdec.generate(target, ids, inputs=ids, max_new_tokens=8)
    with pytest.raises(ValueError, match="needs the prompt"):
        specdec.generate(target, max_new_tokens=8)


def test_generate_streamer_receives_committed_tokens():
    class Collect:
        def __init__(self):
            self.chunks, self.ended = [], False

        def put(self, value):
            self.chunks.append(value.view(-1).tolist())

        def end(self):
            self.ended = True

    target = tiny_model("llama", scale=2.0)
    ids = prompt()
    streamer = Collect()
    out = specdec.generate(target, ids, drafter=specdec.NGramDrafter(), max_new_tokens=25, streamer=streamer)
    assert streamer.ended
    assert streamer.chunks[0] == ids[0].tolist()
    assert sum(streamer.chunks[1:], []) == out.sequences[0, ids.shape[1] :].tolist()


def test_generate_plain_ar_stats():
    target = tiny_model("llama", scale=2.0)
    out = specdec.generate(target, prompt(), max_new_tokens=10)
    assert out.stats.tau == 1.0
    assert out.stats.rounds == 9 and out.stats.target_forwards == 10
    assert {"prefill", "round"} <= set(out.stats.phase_ms)  # the round runs as one unit, timed as one phase


def test_generate_counts_draft_forwards_per_call():
    target = tiny_model("qwen3", scale=2.0)
    drafter = specdec.ModelDrafter(perturbed_copy(target, noise=0.05))
    first = specdec.generate(target, prompt(), drafter=drafter, tree=specdec.Chain(k=3), max_new_tokens=20)
    second = specdec.generate(target, prompt(), drafter=drafter, tree=specdec.Chain(k=3), max_new_tokens=20)
    assert first.stats.draft_forwards == second.stats.draft_forwards > 0
    assert first.stats.draft_forwards == 3 * first.stats.rounds  # k forwards per round
