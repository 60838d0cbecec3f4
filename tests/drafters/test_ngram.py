"""The n-gram drafter's device lookup (``NGramState.propose``, tensor ops over a static history) and the trees the
policies build from it, against a brute-force host lookup and the host tree oracles (``paths_to_tree``,
``chain_tree``), after a prefill and after commits of accepted paths."""

from __future__ import annotations

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from oracles.host_trees import chain_tree, paths_to_tree, root_tree, to_draft_tree

import specdec
from specdec.drafters.ngram import NGramDrafterConfig, NGramState
from specdec.types import Accept


def host_continuations(ids: list[int], cfg: NGramDrafterConfig, length: int, max_matches: int) -> list[list[int]]:
    """Brute force: for the longest suffix of ``ids`` (``max_ngram`` .. ``min_ngram`` tokens) that occurred earlier
    (an occurrence ending before the last token), what followed each occurrence (up to ``length`` tokens, cut at
    the end of ``ids``), most recent occurrence first, without repeats, at most ``max_matches``.

    Like the device lookup (whose shapes are fixed), only the ``4 * cfg.max_matches`` most recent occurrences are
    looked at: in a long run of one repeated continuation an older, different one is not found."""
    total = len(ids)
    for n in range(min(cfg.max_ngram, total - 1), cfg.min_ngram - 1, -1):
        suffix = ids[total - n :]
        starts = [s for s in range(total - 1 - n, -1, -1) if ids[s : s + n] == suffix][: 4 * cfg.max_matches]
        found: list[list[int]] = []
        for start in starts:
            cont = ids[start + n : start + n + length]
            if cont not in found:
                found.append(cont)
        if found:
            return found[:max_matches]
    return []


def proposed_paths(proposal) -> list[list[int]]:
    paths, lengths = proposal.paths[0].tolist(), proposal.path_lengths[0].tolist()
    return [p[:n] for p, n in zip(paths, lengths, strict=True) if n > 0]


_CONFIGS = st.builds(
    lambda hi, lo, m: NGramDrafterConfig(max_ngram=hi, min_ngram=min(lo, hi), max_matches=m),
    st.integers(1, 4),
    st.integers(1, 3),
    st.integers(1, 8),
)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(0, 3), min_size=1, max_size=40),
    _CONFIGS,
    st.integers(1, 6),
    st.integers(1, 16),
)
@example(ids=[0, 9] + [0] * 20, cfg=NGramDrafterConfig(max_ngram=1, max_matches=3), depth=2, budget=8)  # the cap
def test_propose_after_prefill_matches_host_lookup(ids, cfg, depth, budget):
    """After the prompt: the device continuations are the brute-force ones (same order, same lengths), and the
    chain / DDTree built from them are ``chain_tree`` / ``paths_to_tree`` of those continuations."""
    capacity = len(ids) + 32
    state = NGramState(cfg, capacity, torch.device("cpu"))
    prompt = torch.tensor([ids])
    state.prefill(prompt, None)
    root, prefix = prompt[0, -1:], torch.tensor([len(ids) - 1])
    proposal = state.propose(root, prefix, depth, capacity)
    assert proposal.paths.shape == (1, cfg.max_matches, depth)
    assert proposed_paths(proposal) == host_continuations(ids, cfg, depth, cfg.max_matches)
    assert_trees(state, ids, cfg, depth, budget, capacity)


def assert_trees(state, ids: list[int], cfg, chain_depth: int, budget: int, capacity: int) -> None:
    """``Chain(chain_depth)`` and ``DDTree(budget)`` built from the device proposals (each drafted as deep as the
    policy's ``max_depth``) equal the host oracles over the brute-force continuations of ``ids``."""
    root, prefix = torch.tensor([ids[-1]]), torch.tensor([len(ids) - 1])
    chain_prop = state.propose(root, prefix, chain_depth, capacity)
    tree_prop = state.propose(root, prefix, budget, capacity)
    rt = torch.tensor([ids[-1]])
    chain = to_draft_tree(specdec.Chain(k=chain_depth).build(chain_prop, rt, chain_depth).row(0))
    first = host_continuations(ids, cfg, chain_depth, 1)
    want = chain_tree(ids[-1], first[0]) if first else root_tree(ids[-1])
    assert chain.tokens.tolist() == want.tokens.tolist() and chain.parents.tolist() == want.parents.tolist()
    tree = to_draft_tree(specdec.DDTree(budget=budget).build(tree_prop, rt, budget).row(0))
    want = paths_to_tree(ids[-1], host_continuations(ids, cfg, budget, cfg.max_matches), budget=budget)
    assert tree.tokens.tolist() == want.tokens.tolist() and tree.parents.tolist() == want.parents.tolist()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 2), min_size=24, max_size=60), st.integers(0, 2**31 - 1), _CONFIGS)
def test_propose_after_commits_matches_host_lookup(seq, seed, cfg):
    """Rounds of accepted paths (1 to 5 tokens, the rows past the path left as the round writes them): before each
    round the device lookup over the committed history equals the brute force over the committed tokens."""
    gen = torch.Generator().manual_seed(seed)
    depth, budget, slots = 4, 10, 5
    capacity = len(seq) + slots + 2
    state = NGramState(cfg, capacity, torch.device("cpu"))
    committed = 6
    state.prefill(torch.tensor([seq[:committed]]), None)
    while committed < len(seq):
        ids = seq[:committed]
        root, prefix = torch.tensor([ids[-1]]), torch.tensor([committed - 1])
        proposal = state.propose(root, prefix, depth, capacity)
        assert proposed_paths(proposal) == host_continuations(ids, cfg, depth, cfg.max_matches)
        assert_trees(state, ids, cfg, depth, budget, capacity)
        num = min(int(torch.randint(1, slots + 1, (1,), generator=gen)), len(seq) - committed)
        # accepted drafts + bonus, then junk in the rows past the path (as a round leaves them)
        tokens = torch.tensor(seq[committed : committed + num] + [7] * (slots - num))
        path = torch.arange(slots).clamp(max=num)
        state.commit(Accept(path[None], torch.tensor([num + 1]), tokens[None]), None, prefix)
        committed += num


@pytest.mark.parametrize("tree", [specdec.Chain(k=4), specdec.DDTree(budget=8)], ids=str)
def test_ngram_generate_equals_hf_greedy_and_accepts_drafts(tree):
    """End to end on a repetitive prompt: HF's greedy tokens, with drafts accepted."""
    from models import tiny_model

    target = tiny_model("qwen3", scale=2.0)
    motif = torch.randint(3, 128, (6,), generator=torch.Generator().manual_seed(1))
    ids = torch.cat([motif, motif, motif]).unsqueeze(0)
    ref = target.generate(ids, do_sample=False, max_new_tokens=40)
    out = specdec.generate(target, ids, drafter=specdec.NGramDrafter(), tree=tree, max_new_tokens=40)
    assert torch.equal(out.sequences, ref)
    assert out.stats.new_tokens > out.stats.rounds + 1  # some rounds accepted drafts
