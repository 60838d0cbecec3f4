"""HF's logits processors under trees: every node processed with its own ancestry as history.

The reference is HF's own ``model.generate`` with the same options (greedy: token identity). The drafters make
rounds accept deep paths so that the processors act at nodes whose history includes draft tokens: an oracle that
proposes HF's processed continuation with planted mistakes (chain and DDTree), a small-LM drafter that follows the
unprocessed target (so processors keep overturning its drafts), and n-gram lookup. Sampling: the exact marginal of
the second and third new tokens under HF's processors and warpers (a brute force over the first tokens with the
target's full forwards) against counts of specdec's samples, χ² with stated power against the wrong marginal a
processor without the node's ancestry would give.
"""

from __future__ import annotations

import pytest
import torch
from models import perturbed_copy, tiny_model
from oracle_drafter import SOFT, OracleDrafter, full_schedule
from oracles import gof_pvalue, multinomial_counts
from state.hybrid_harness import tiny_hybrid
from transformers import LogitsProcessor, LogitsProcessorList

import specdec
from specdec.processors import NodeHistory

NEW = 24
# Each option as a function of the target's plain greedy continuation ``g`` (its new tokens), so that it bites.
OPTIONS = {
    "repetition_penalty": lambda g: dict(repetition_penalty=1.8),
    "penalty_below_one": lambda g: dict(repetition_penalty=0.6),
    "no_repeat_ngram": lambda g: dict(no_repeat_ngram_size=2),
    "no_repeat_trigram": lambda g: dict(no_repeat_ngram_size=3, repetition_penalty=0.5),  # repeats, then banned
    "bad_words": lambda g: dict(bad_words_ids=[[g[3]], [g[5], g[6]], [g[8], g[9], g[10]]]),
    "sequence_bias": lambda g: dict(sequence_bias={(g[2],): -3.0, (g[4], 77): 6.0, (g[9], g[10], 78): 9.0}),
    "suppress": lambda g: dict(suppress_tokens=[g[1], g[7]], begin_suppress_tokens=[g[0]]),
    "forced_eos": lambda g: dict(forced_eos_token_id=9),
    "prompt_penalty": lambda g: dict(encoder_repetition_penalty=2.5),  # the prompt's tokens rewarded
    # penalised, and banned: against a repetition penalty below one, which makes the prompt's tokens recur
    "prompt_penalty_below_one": lambda g: dict(encoder_repetition_penalty=0.4, repetition_penalty=0.3),
    "prompt_unigram": lambda g: dict(encoder_no_repeat_ngram_size=1, repetition_penalty=0.3),
    # the prompt's tokens rewarded, so that its bigrams recur, and banned
    "prompt_bigram": lambda g: dict(encoder_no_repeat_ngram_size=2, encoder_repetition_penalty=6.0),
    "prompt_ngram_and_repeats": lambda g: dict(encoder_no_repeat_ngram_size=3, no_repeat_ngram_size=2,
                                               encoder_repetition_penalty=1.5),  # fmt: skip
    "length_penalty": lambda g: dict(exponential_decay_length_penalty=(3, 2.5), eos_token_id=[77]),
    # the penalty reaches EOS scores that min_new_tokens set to -inf (NaN in releases that add inf to them)
    "length_penalty_after_min_new": lambda g: dict(exponential_decay_length_penalty=(3, 2.5), min_new_tokens=9,
                                                   eos_token_id=[77]),  # fmt: skip
    "combined": lambda g: dict(repetition_penalty=1.4, no_repeat_ngram_size=3, bad_words_ids=[[g[5], g[6]]],
                               sequence_bias={(g[3],): -1.5}, min_new_tokens=6, eos_token_id=[9]),  # fmt: skip
}
_MODELS: dict = {}


def model(kind: str):
    if kind not in _MODELS:
        target = tiny_model("qwen3", scale=2.0) if kind == "dense" else tiny_hybrid("qwen3_5", scale=2.0)
        # the hybrid's small LM is an unrelated attention model (a perturbed copy would keep recurrent layers)
        draft = perturbed_copy(target, noise=0.05) if kind == "dense" else tiny_model("qwen3", seed=5, scale=2.0)
        _MODELS[kind] = (target, specdec.ModelDrafter(draft))
    return _MODELS[kind]


def prompt(seed: int = 3, n: int = 10) -> torch.Tensor:
    # a prompt that repeats itself, so penalties and n-gram bans act from the first token
    half = torch.randint(3, 128, (1, n // 2), generator=torch.Generator().manual_seed(seed))
    return torch.cat([half, half], 1)


def plain(kind: str) -> list[int]:
    """The target's greedy new tokens without options."""
    target, _ = model(kind)
    return hf(target, prompt())[0, prompt().shape[1] :].tolist()


def hf(target, ids, **options):
    options = {"max_new_tokens": NEW, "do_sample": False, "eos_token_id": [], "pad_token_id": 0, **options}
    return target.generate(ids, **options)


def drafter_for(setup: str, target, small, ref):
    if setup == "plain":
        return None, None
    if setup.startswith("oracle"):
        tree = specdec.Chain(k=4) if setup == "oracle-chain" else specdec.DDTree(budget=10, topk=3)
        schedule = [(0, 5), (SOFT, 2), (0, 5), *full_schedule(4)]
        return OracleDrafter(ref[0], depth=4, schedule=schedule), tree
    if setup == "small-lm":
        return small, specdec.DDTree(budget=8, topk=3)
    return specdec.NGramDrafter(), specdec.DDTree(budget=8, topk=3)


def _cases():
    """Every option x setup on the dense target; on the hybrid one, plain decoding and the oracle DDTree in the
    default tier, the other setups in the slow tier."""
    for option in sorted(OPTIONS):
        for kind in ("dense", "hybrid"):
            for setup in ("plain", "oracle-chain", "oracle-ddtree", "small-lm", "ngram"):
                slow = kind == "hybrid" and setup not in ("plain", "oracle-ddtree")
                yield pytest.param(kind, setup, option, marks=[pytest.mark.slow] if slow else [])


@pytest.mark.parametrize("kind, setup, option", list(_cases()))
def test_greedy_equals_hf_with_the_same_options(kind, setup, option):
    target, small = model(kind)
    ids = prompt()
    options = {"max_new_tokens": NEW, "eos_token_id": [], "pad_token_id": 0, **OPTIONS[option](plain(kind))}
    ref = hf(target, ids, **options)
    base = hf(target, ids, max_new_tokens=NEW, eos_token_id=options["eos_token_id"])
    assert not torch.equal(ref, base), "the option changed nothing: the test would prove nothing"
    drafter, tree = drafter_for(setup, target, small, ref)
    out = specdec.generate(target, ids, drafter=drafter, tree=tree, **options)
    assert torch.equal(out.sequences, ref), (out.sequences[0, ids.shape[1]:], ref[0, ids.shape[1]:])
    if setup.startswith("oracle"):
        assert max(out.stats.accept_lengths) >= 4, out.stats.accept_lengths  # deep nodes were processed and kept


def test_batch_rows_equal_each_row_alone():
    target, small = model("dense")
    options = dict(OPTIONS["combined"](plain("dense")), max_new_tokens=NEW, pad_token_id=0)
    a, b = prompt(3, 10), prompt(5, 6)
    batch = torch.cat([a, torch.cat([torch.zeros(1, 4, dtype=torch.long), b], 1)])
    mask = (torch.arange(10) >= torch.tensor([[0], [4]])).long()
    out = specdec.generate(target, batch, attention_mask=mask, drafter=small, tree=specdec.DDTree(budget=8, topk=3),
                           **options)  # fmt: skip
    for row, ids in enumerate((a, b)):
        ref = hf(target, ids, **options)[0, ids.shape[1] :]
        got = out.sequences[row, 10 :][: ref.shape[0]]
        assert torch.equal(got, ref), (row, got, ref)


class BanNextOfLast(LogitsProcessor):
    """A history-dependent user processor: the token after the last one (mod V) and the token seen two steps back
    are banned."""

    def __call__(self, input_ids, scores):
        scores = scores.clone()
        rows = torch.arange(scores.shape[0])
        scores[rows, (input_ids[:, -1] + 1) % scores.shape[-1]] = -float("inf")
        if input_ids.shape[1] >= 3:
            scores[rows, input_ids[:, -3]] = -float("inf")
        return scores


class TreeBanNextOfLast:
    """The same processor, tree-aware: it runs inside the captured round."""

    tree_aware = True

    def process_tree(self, scores: torch.Tensor, nodes: NodeHistory) -> torch.Tensor:
        tail = nodes.tail(3)  # [B, S, 3]
        vocab = scores.shape[-1]
        out = scores.scatter(2, ((tail[..., 2:] + 1) % vocab), -float("inf"))
        back = tail[..., :1]
        return torch.where(back >= 0, out.scatter(2, back.clamp(min=0), -float("inf")), out)


@pytest.mark.parametrize("kind", ["dense", "hybrid"])
def test_user_logits_processor_per_node(kind):
    target, small = model(kind)
    ids = prompt()
    ref = hf(target, ids, logits_processor=LogitsProcessorList([BanNextOfLast()]), repetition_penalty=1.3)
    for drafter, tree in ((None, None), (small, specdec.DDTree(budget=8, topk=3)),
                          (OracleDrafter(ref[0], depth=4), specdec.DDTree(budget=10, topk=3))):  # fmt: skip
        out = specdec.generate(target, ids, drafter=drafter, tree=tree, max_new_tokens=NEW, eos_token_id=[],
                               logits_processor=[BanNextOfLast()], repetition_penalty=1.3)  # fmt: skip
        assert torch.equal(out.sequences, ref)
        assert out.stats.uncaptured  # the stats say the round ran uncaptured, and why
        tree_aware = specdec.generate(target, ids, drafter=drafter, tree=tree, max_new_tokens=NEW, eos_token_id=[],
                                      logits_processor=[TreeBanNextOfLast()], repetition_penalty=1.3)  # fmt: skip
        assert torch.equal(tree_aware.sequences, ref)
        assert not tree_aware.stats.uncaptured


def test_output_scores_are_processed_with_each_steps_history():
    target, small = model("dense")
    ids = prompt()
    options = dict(OPTIONS["combined"](plain("dense")), max_new_tokens=NEW, pad_token_id=0, output_scores=True,
                   output_logits=True)  # fmt: skip
    ref = target.generate(ids, return_dict_in_generate=True, do_sample=False, **options)
    out = specdec.generate(target, ids, drafter=small, tree=specdec.DDTree(budget=8, topk=3), **options)
    assert torch.equal(out.sequences, ref.sequences)
    for j, (a, b) in enumerate(zip(out.scores, ref.scores, strict=True)):
        assert torch.equal(torch.isinf(a), torch.isinf(b)), j
        assert torch.allclose(a[~torch.isinf(a)], b[~torch.isinf(b)], atol=1e-4, rtol=1e-4), j


def test_bad_values_raise_hf_errors_or_name_the_fix():
    target, _ = model("dense")
    ids = prompt()
    with pytest.raises(ValueError, match="penalty"):
        specdec.generate(target, ids, max_new_tokens=4, repetition_penalty=-1.0)
    with pytest.raises(ValueError, match="outside the target's vocabulary"):
        specdec.generate(target, ids, max_new_tokens=4, bad_words_ids=[[10_000]])
    with pytest.raises(ValueError, match="eos_token_id"):
        specdec.generate(target, ids, max_new_tokens=4, exponential_decay_length_penalty=(2, 1.5), eos_token_id=[])
    with pytest.raises(TypeError, match="not callable"):
        specdec.generate(target, ids, max_new_tokens=4, logits_processor=[3])


# -- sampling ------------------------------------------------------------------------------------------------------
SAMPLES = 1500
WARP = dict(temperature=0.9, top_k=40)
PENALTY = 0.1  # below 1: seen tokens are favoured, so the first token's own penalty moves the later marginals


def _processed_probs(target, seqs: torch.Tensor, prompt_len: int, *, ancestry: bool = True) -> torch.Tensor:
    """HF's sampling distribution after each of ``seqs [N, L]`` (repetition penalty, then the warpers); with
    ``ancestry=False`` the penalty sees only the prompt (the wrong marginal a node without its ancestry gets)."""
    from transformers import RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper, TopKLogitsWarper

    logits = target(seqs).logits[:, -1].float()
    history = seqs if ancestry else seqs[:, :prompt_len]
    scores = RepetitionPenaltyLogitsProcessor(PENALTY)(history, logits)
    scores = TemperatureLogitsWarper(WARP["temperature"])(seqs, scores)
    scores = TopKLogitsWarper(WARP["top_k"])(seqs, scores)
    return torch.softmax(scores, -1)


def _marginals(target, ids: torch.Tensor, *, ancestry: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact marginals of new tokens 2 and 3 under HF's sampling (a brute force over tokens 1 and 2)."""
    n = ids.shape[1]
    p1 = _processed_probs(target, ids, n, ancestry=ancestry)[0]  # [V]
    firsts = torch.nonzero(p1 > 0).flatten()
    seqs = torch.cat([ids.expand(len(firsts), -1), firsts[:, None]], 1)
    p2 = _processed_probs(target, seqs, n, ancestry=ancestry)  # [F, V]
    m2 = (p1[firsts, None] * p2).sum(0)
    m3 = torch.zeros_like(m2)
    for i, first in enumerate(firsts.tolist()):
        seconds = torch.nonzero(p2[i] > 1e-6).flatten()
        seqs = torch.cat([ids.expand(len(seconds), -1), torch.full((len(seconds), 1), first), seconds[:, None]], 1)
        p3 = _processed_probs(target, seqs, n, ancestry=ancestry)
        m3 += p1[first] * (p2[i, seconds, None] * p3).sum(0)
    return m2.double(), m3.double()


@pytest.mark.slow
@pytest.mark.parametrize("rule", ["sample-match", "speculative-sampling"])
def test_sampling_marginals_match_hf_with_the_penalty(rule):
    """χ² of the 2nd and 3rd new tokens against HF's exact marginals; power: the wrong marginals (the penalty
    without the node's ancestry) are rejected in nearly every trial at this sample size."""
    target = tiny_model("qwen3", scale=2.0, seed=1)  # peaked enough that a penalty of 0.1 makes repeats likely
    small = specdec.ModelDrafter(perturbed_copy(target, noise=0.02))
    ids = prompt(7, 6)
    with torch.no_grad():
        m2, m3 = _marginals(target, ids)
        w2, w3 = _marginals(target, ids, ancestry=False)
    for right, wrong in ((m2, w2), (m3, w3)):  # stated power: the wrong marginal fails at p < 1e-3 in most trials
        counts = multinomial_counts(wrong, SAMPLES, 200, torch.Generator().manual_seed(1))
        rejected = sum(gof_pvalue(c, right) < 1e-3 for c in counts)
        assert rejected >= 0.9 * 200, rejected
    if rule == "sample-match":
        verifier, tree = specdec.SampleMatch(), specdec.DDTree(budget=6, topk=3)
    else:
        verifier, tree = specdec.SpeculativeSampling(), specdec.SampledChain(k=3)
    out = specdec.generate(target, ids, drafter=small, tree=tree, verifier=verifier, do_sample=True,
                           num_return_sequences=SAMPLES, max_new_tokens=3, eos_token_id=[], pad_token_id=0,
                           repetition_penalty=PENALTY, generator=torch.Generator().manual_seed(0), **WARP)  # fmt: skip
    assert sum(out.stats.accept_hist[1:]) >= 300  # many rounds accepted drafts: tokens 2 and 3 came from tree nodes
    n = ids.shape[1]
    for j, right in ((1, m2), (2, m3)):
        counts = torch.bincount(out.sequences[:, n + j], minlength=right.shape[0]).double()
        assert gof_pvalue(counts, right) > 1e-3, j


def test_tree_paths_equal_a_walk_up_each_tree():
    """``tree_paths`` (ancestors by squaring the parent relation) against walking parent pointers on the host."""
    from specdec.processors import tree_paths
    from specdec.types import DeviceTree

    gen = torch.Generator().manual_seed(0)
    for _ in range(60):
        batch, slots = 3, int(torch.randint(1, 40, (), generator=gen))
        parents = torch.full((batch, slots), -1)
        depth = torch.zeros(batch, slots, dtype=torch.long)
        counts = []
        for b in range(batch):
            n = int(torch.randint(1, slots + 1, (), generator=gen))
            counts.append(n)
            for i in range(1, n):
                parents[b, i] = int(torch.randint(0, i, (), generator=gen))
                depth[b, i] = depth[b, parents[b, i]] + 1
        tokens = torch.randint(0, 150_000, (batch, slots), generator=gen)
        valid = torch.arange(slots)[None] < torch.tensor(counts)[:, None]
        tree = DeviceTree(tokens, parents, depth, valid, torch.tensor(counts))
        width = int(depth.max()) + 1 + int(torch.randint(0, 3, (), generator=gen))
        got = tree_paths(tree, width)
        for b in range(batch):
            for i in range(slots):
                path, j = [], i
                while j >= 0:
                    path.append(int(tokens[b, j]))
                    j = int(parents[b, j])
                assert got[b, i].tolist() == path[::-1] + [-1] * (width - len(path)), (b, i)


def test_steering_drafts_nothing_where_the_processors_give_nan():
    """A draft steered by processors that give NaN (HF's length penalty on an EOS at -inf, in releases that add inf
    to it) drafts nothing there, and a depth the processors forbid entirely keeps its unsteered q: the tree is
    never built over NaN or over a row of -inf."""
    from specdec.processors import Processors

    class NanAndForbid:
        tree_aware, needs_history = True, False

        def process_tree(self, scores, nodes):
            scores = scores.clone()
            scores[..., 3] = float("nan")
            scores[:, 1] = -float("inf")  # depth 2: everything forbidden
            return scores

    logq = torch.log_softmax(torch.randn(2, 3, 10, generator=torch.Generator().manual_seed(0)), -1)
    history = torch.randint(0, 10, (2, 6))
    length, root, generated = torch.tensor([4, 5]), torch.tensor([1, 2]), torch.tensor([0, 1])
    steered = Processors([NanAndForbid()]).steer(logq, history, length, root, generated)
    assert not steered.isnan().any()
    assert (steered[:, [0, 2], 3] == -float("inf")).all()
    torch.testing.assert_close(steered[:, [0, 2]].exp().sum(-1), torch.ones(2, 2))
    torch.testing.assert_close(steered[:, 1], logq[:, 1])


def _random_round(gen: torch.Generator, vocab: int):
    """A random batch at a round: left-padded prompts (pad id 1, which real tokens use too), generated tokens, and
    a random tree per row over a small vocabulary (so that n-grams recur); returns (``NodeHistory``, per row HF's
    padded prompt, per row and node HF's ``input_ids`` at that node's choice)."""
    from specdec.processors import node_history
    from specdec.types import DeviceTree

    batch, width, pad_id = 3, 7, 1
    counts = torch.randint(0, width, (batch,), generator=gen)  # pad tokens per row (at least one real token)
    prompt_len = width - counts
    # tokens generated before the root, which is one more; -1: the root is the prompt's last token (the prefill's
    # choice), so that a short row's last n - 1 tokens reach into its padding
    made = int(torch.randint(-1, 4, (), generator=gen))
    slots = int(torch.randint(1, 9, (), generator=gen))
    history = torch.randint(0, vocab, (batch, width + made + 2), generator=gen)
    history = torch.where(torch.rand(history.shape, generator=gen) < 0.4, pad_id, history)  # the pad id, often
    padded = [torch.cat([torch.full((int(counts[b]),), pad_id), history[b, : prompt_len[b]]]) for b in range(batch)]
    length = prompt_len + made  # the root is history[b, length]: committed tokens before it
    parents = torch.full((batch, slots), -1)
    depth = torch.zeros(batch, slots, dtype=torch.long)
    for b in range(batch):
        for i in range(1, slots):
            parents[b, i] = int(torch.randint(0, i, (), generator=gen))
            depth[b, i] = depth[b, parents[b, i]] + 1
    tokens = torch.randint(0, vocab, (batch, slots), generator=gen)
    tokens[:, 0] = history[torch.arange(batch), length]
    tree = DeviceTree(tokens, parents, depth, torch.ones(batch, slots, dtype=torch.bool), torch.full((batch,), slots))
    pad = (torch.full((batch, int(counts.max())), pad_id), counts)
    nodes = node_history(history, length, tree, length + 1 - prompt_len, int(depth.max()) + 1, pad)
    inputs = []
    for b in range(batch):
        row = []
        for i in range(slots):
            path, j = [], i
            while j >= 0:
                path.append(int(tokens[b, j]))
                j = int(parents[b, j])
            row.append(torch.cat([padded[b][: counts[b]], history[b, : length[b]], torch.tensor(path[::-1])]))
        inputs.append(row)
    return nodes, padded, inputs


@pytest.mark.parametrize("name", ["penalty", "ngram-1", "ngram-2", "ngram-3", "ngram-4"])
def test_prompt_processors_equal_hfs_classes_at_every_node(name):
    """``encoder_repetition_penalty`` / ``encoder_no_repeat_ngram_size`` at every node of random padded rounds
    against HF's own processors, built with each row's padded prompt as HF's ``encoder_input_ids`` and called with
    each node's whole ``input_ids`` (padding included: pad tokens that complete or start a prompt n-gram count)."""
    from transformers.generation import logits_process as hf_classes

    from specdec.processors import EncoderNGramBan, EncoderRepetitionPenalty

    gen = torch.Generator().manual_seed(11)
    vocab, banned = 6, 0
    for _ in range(40):
        nodes, padded, inputs = _random_round(gen, vocab)
        scores = torch.randn(*nodes.depth.shape, vocab, generator=gen) * 3
        if name == "penalty":
            ours = EncoderRepetitionPenalty(1 / 2.5, uncaptured=True)
            theirs = [hf_classes.EncoderRepetitionPenaltyLogitsProcessor(2.5, p[None]) for p in padded]
        else:
            n = int(name.split("-")[1])
            ours = EncoderNGramBan(n, uncaptured=True)
            theirs = [hf_classes.EncoderNoRepeatNGramLogitsProcessor(n, p[None]) for p in padded]
        got = ours.process_tree(scores, nodes)
        for b, row in enumerate(inputs):
            for i, ids in enumerate(row):
                want = theirs[b](ids[None], scores[b, i][None].clone())[0]
                torch.testing.assert_close(got[b, i], want, msg=lambda m, b=b, i=i: f"row {b} node {i}: {m}")
                banned += int(torch.isinf(want).sum())
    assert name == "penalty" or banned >= 5  # bans happened


class BanGenerated(LogitsProcessor):
    """A user processor that reads the generated part as ``input_ids[:, width:]`` (``width``: the padded prompt's),
    as HF's batch makes it: it bans every token generated so far; and one that records the shapes it sees."""

    def __init__(self, width: int) -> None:
        self.width, self.seen = width, []

    def __call__(self, input_ids, scores):
        self.seen.append((input_ids[:, : self.width] == 0).sum(-1).tolist())  # pad tokens (id 0) it sees per row
        if input_ids.shape[1] <= self.width:
            return scores
        return scores.scatter(1, input_ids[:, self.width :], -float("inf"))


@pytest.mark.parametrize("kind", ["dense", "hybrid"])
def test_a_users_processor_sees_each_row_with_its_left_padding(kind):
    """A left-padded batch: the user's processor sees each row as HF's ``input_ids`` holds it (its pad tokens
    first), so one that indexes by the padded width equals HF, with and without a drafter; ``output_scores`` too."""
    target, small = model(kind)
    a, b = prompt(3, 10), prompt(5, 6)
    batch = torch.cat([a, torch.cat([torch.zeros(1, 4, dtype=torch.long), b], 1)])
    mask = (torch.arange(10) >= torch.tensor([[0], [4]])).long()
    options = dict(max_new_tokens=12, pad_token_id=0, eos_token_id=[], attention_mask=mask)
    ref = target.generate(batch, do_sample=False, logits_processor=LogitsProcessorList([BanGenerated(10)]),
                          return_dict_in_generate=True, output_scores=True, **options)  # fmt: skip
    for drafter, tree in ((None, None), (small, specdec.DDTree(budget=8, topk=3))):
        processor = BanGenerated(10)
        out = specdec.generate(target, batch, drafter=drafter, tree=tree, logits_processor=[processor],
                               output_scores=True, **options)  # fmt: skip
        assert torch.equal(out.sequences, ref.sequences)
        assert {row for seen in processor.seen for row in seen} >= {4}  # row 1's four pad tokens were seen
        for j, (x, y) in enumerate(zip(out.scores, ref.scores, strict=True)):
            assert torch.equal(torch.isinf(x), torch.isinf(y)), j


PADDED_OPTIONS = [{"repetition_penalty": 3.0}, {"no_repeat_ngram_size": 1}, {"bad_words_ids": "pad-then-next"},
                  {"encoder_repetition_penalty": 0.3}, {"encoder_no_repeat_ngram_size": 1},
                  {"encoder_no_repeat_ngram_size": 2}]  # fmt: skip


@pytest.mark.parametrize("option", PADDED_OPTIONS)
def test_padding_counts_as_hf_counts_it_for_the_processors_that_read_input_ids(option):
    """A padded row whose pad token is the token it would generate next: HF's n-gram ban and bad words count the
    pad tokens as the row's tokens (and its repetition penalty too in releases whose generate does not pass the
    padding as ``prompt_ignore_length``; its "encoder" penalty and n-gram ban read the prompt as passed, padding
    included), so the row's output depends on them; specdec equals HF, with and without a
    drafter, on whichever transformers runs."""
    target, small = model("dense")
    a, b = prompt(3, 10), prompt(5, 6)
    alone = target.generate(b, max_new_tokens=2, do_sample=False)[0, 6:].tolist()
    pad = alone[0]
    batch = torch.cat([a, torch.cat([torch.full((1, 4), pad), b], 1)])
    mask = (torch.arange(10) >= torch.tensor([[0], [4]])).long()
    if option.get("bad_words_ids") == "pad-then-next":  # a two-token bad word that starts in the padding
        option = {"bad_words_ids": [[pad, int(b[0, 0])]]}
    options = dict(max_new_tokens=10, pad_token_id=pad, eos_token_id=[], attention_mask=mask, **option)
    ref = target.generate(batch, do_sample=False, **options)
    for drafter, tree in ((None, None), (small, specdec.DDTree(budget=8, topk=3))):
        out = specdec.generate(target, batch, drafter=drafter, tree=tree, **options)
        assert torch.equal(out.sequences, ref), (option, out.sequences[:, 10:], ref[:, 10:])
