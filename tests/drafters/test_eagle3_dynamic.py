"""EAGLE-3 drafting EAGLE-2's candidate tree (``Eagle3Static.draft_tree``): every drafted row's log-probabilities
against the plain row-at-a-time reference run over that row's own ancestor chain (``oracles.eagle3_reference``),
across commits (rows of earlier trees never seen again); greedy decoding with ``DynamicTree`` and
``DDTree(candidates=True)`` token-identical to HF ``generate`` on dense and hybrid targets, a batch equal to each row
alone; no host read in the round; a drafter without candidate trees refused by name."""

from __future__ import annotations

import pytest
import torch
from models import tiny_model
from oracles.eagle3_reference import Reference
from state.hybrid_harness import tiny_hybrid
from test_eagle3 import HEADS, KV, VD, D, H, copy_head, described_weights, left_padded, sharp_head, write_official

import specdec
from specdec.drafters.eagle3 import Eagle3Drafter
from specdec.trees import DDTree, DynamicTree
from specdec.types import Accept

V = 128


def reference_rows(weights, embed, tokens, feats, chains):
    """Per chain of draft tokens (after the root): the reference's log-probabilities after the chain, each run from
    scratch over the committed rows then the chain's own rows (``[len(chains), V]``)."""
    out = []
    t = feats.shape[0]
    for chain in chains:
        ref = Reference(weights, heads=HEADS, kv_heads=KV, head_dim=D)
        for i in range(t):
            want, fed = ref.step(embed[tokens[i + 1]], ref.fuse(feats[i]), i)
        for s, token in enumerate(chain):
            want, fed = ref.step(embed[token], fed, t + s)
        out.append(want)
    return torch.stack(out)


def frontier_chains(proposal, b: int, levels: int, k: int) -> list[list[int]]:
    """The token chains of the drafted rows of row ``b`` in draft order: the root's (empty), then each level's
    frontier (the parents of the next level's candidates, ``k`` children each)."""
    cand, par = proposal.candidates[b].tolist(), proposal.parents[b].tolist()

    def chain(j):
        out = []
        while j >= 0:
            out.append(cand[j])
            j = par[j]
        return out[::-1]

    chains = [[]]
    for level in range(1, levels):
        start = k + (level - 1) * k * k  # the candidates of level + 1, k children of each frontier row in turn
        chains += [chain(par[start + r * k]) for r in range(k)]
    return chains


def test_tree_rows_match_the_reference_over_commits(tmp_path):
    """Two sequences of different prompt lengths; each round drafts a candidate tree (every row against the
    reference over its ancestor chain, within 1e-5 in fp32), then commits a random accepted path."""
    target = tiny_model("llama", num_hidden_layers=8, scale=2.0)
    weights = described_weights(seed=6)
    drafter = Eagle3Drafter.from_pretrained(write_official(tmp_path / "o", weights), target=target)
    embed = target.get_input_embeddings().weight.detach()
    target_ids = drafter.model.target_ids()
    gen = torch.Generator().manual_seed(7)
    lengths, width, levels, k, depth, slots = [6, 9], 9, 3, 3, 3, 7
    tokens = [torch.randint(4, V, (n + 1,), generator=gen).tolist() for n in lengths]
    feats = [torch.randn(n, 3 * H, generator=gen) for n in lengths]
    ids = torch.zeros(2, width, dtype=torch.long)
    padded = torch.zeros(2, width, 3 * H)
    for b, n in enumerate(lengths):
        ids[b, :n] = torch.tensor(tokens[b][:n])
        padded[b, :n] = feats[b]
    state = drafter.attach(target, 48, batch=2)
    state.prefill(ids, padded)
    for _ in range(3):
        prefix = torch.tensor([len(f) for f in feats])
        root = torch.tensor([t[-1] for t in tokens])
        proposal, rows = state.draft_tree(root, prefix, levels, k, 48)
        assert rows.shape == (2, 1 + (levels - 1) * k, VD)
        for b in range(2):
            chains = frontier_chains(proposal, b, levels, k)
            want = reference_rows(weights, embed, tokens[b], feats[b], chains)
            got = torch.full_like(want, float("-inf"))
            got[:, target_ids] = rows[b]
            finite = torch.isfinite(want)
            assert torch.equal(finite, torch.isfinite(got))
            torch.testing.assert_close(got[finite], want[finite], atol=1e-5, rtol=1e-5)
            # each drafted row's k most likely tokens (the reference's) are its candidates, scoring the row's
            # score plus their log-probability
            cand, par, score = (t[b].tolist() for t in (proposal.candidates, proposal.parents, proposal.scores))
            for i in range(len(chains)):
                start = 0 if i == 0 else k + (i - 1) * k
                children = list(range(start, start + k))
                top = want[i].topk(k)
                assert [cand[j] for j in children] == top.indices.tolist()
                base = 0.0 if i == 0 else score[par[children[0]]]
                torch.testing.assert_close(torch.tensor([score[j] for j in children]), top.values + base, atol=1e-5,
                                           rtol=1e-5)  # fmt: skip
        hidden = torch.randn(2, slots, 3 * H, generator=gen)
        num_path = torch.randint(1, depth + 2, (2,), generator=gen)
        path = torch.zeros(2, depth + 1, dtype=torch.long)
        acc = torch.zeros(2, depth + 1, dtype=torch.long)
        for b in range(2):
            nodes = [0] + sorted(torch.randperm(slots - 1, generator=gen)[:depth].add(1).tolist())
            n = int(num_path[b])
            path[b] = torch.tensor(nodes[:n] + [nodes[n - 1]] * (depth + 1 - n))
            acc[b, :n] = torch.randint(4, V, (n,), generator=gen)
            feats[b] = torch.cat([feats[b], hidden[b, path[b, :n]]])
            tokens[b] += acc[b, :n].tolist()
        state.commit(Accept(path=path, num_path=num_path, tokens=acc), hidden, prefix)


TREES = (DynamicTree(depth=3, topk=3, total_tokens=10), DDTree(budget=9, topk=3, candidates=True))


def check_greedy(target, drafter, lengths, max_new: int = 12, trees=TREES):
    ids, mask = left_padded(lengths)
    want = target.generate(ids, attention_mask=mask, max_new_tokens=max_new, do_sample=False, pad_token_id=0)
    outs = []
    for tree in trees:
        out = specdec.generate(target, ids, attention_mask=mask, drafter=drafter, tree=tree, max_new_tokens=max_new,
                               do_sample=False, pad_token_id=0)  # fmt: skip
        assert torch.equal(out.sequences, want), tree
        if len(lengths) == 1:
            assert out.stats.draft_forwards == out.stats.rounds * drafter.forwards_per_round(tree)
        outs.append(out)
    return outs


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("lengths", [(9,), (6, 10)], ids=["b1", "b2"])
def test_generate_greedy_is_lossless_dense(arch, lengths):
    target = tiny_model(arch, num_hidden_layers=6, scale=2.0)
    check_greedy(target, sharp_head(target, draft_vocab_size=VD), lengths)


@pytest.mark.parametrize("lengths", [(9,), (6, 10)], ids=["b1", "b2"])
def test_generate_greedy_is_lossless_hybrid(lengths):
    target = tiny_hybrid("qwen3_5")  # three layers: gated delta net, attention, gated delta net
    check_greedy(target, sharp_head(target, layer_ids=(2, 1, 3), draft_vocab_size=VD), lengths)


@pytest.mark.parametrize("lengths", [(246,), (236, 246)], ids=["b1", "b2"])
def test_generate_greedy_crosses_a_span_bucket(lengths):
    """Prompts just short of the first span bucket (256 slots): the rounds move to the next bucket while decoding,
    and every level's keys/values still sit right after the committed ones of the round's own span."""
    target = tiny_model("qwen3", num_hidden_layers=6, scale=2.0)
    check_greedy(target, sharp_head(target, draft_vocab_size=VD), lengths, max_new=24)


def test_generate_greedy_is_lossless_with_the_kernels_in_the_interpreter():
    """The candidate tree's levels on the attention kernel's path (``tree_attention`` over the committed keys/values
    and the tree's, the committed slots read without their mask) and every other kernel of the round, run by
    Triton's interpreter: a batch of two equals HF greedy with both candidate-tree policies."""
    from kernel_harness import run_lines_interpreted

    run_lines_interpreted(
        "from models import tiny_model",
        "from test_eagle3 import sharp_head, VD",
        "from test_eagle3_dynamic import check_greedy",
        "target = tiny_model('qwen3', num_hidden_layers=6, scale=2.0)",
        "check_greedy(target, sharp_head(target, draft_vocab_size=VD), (6, 10), max_new=6)",
        folders=["drafters"],
    )


def test_batch_rows_equal_each_row_alone():
    """Three prompts of different lengths in one batch: each row's tokens are those of the row decoded alone, with
    the reference's default tree."""
    target = tiny_model("qwen3", num_hidden_layers=6, scale=2.0)
    drafter = sharp_head(target, draft_vocab_size=VD)
    lengths = (5, 9, 7)
    ids, mask = left_padded(lengths, seed=4)
    both = specdec.generate(target, ids, attention_mask=mask, drafter=drafter, tree=DynamicTree(), max_new_tokens=10,
                            do_sample=False, pad_token_id=0)  # fmt: skip
    for b, n in enumerate(lengths):
        alone = specdec.generate(target, ids[b : b + 1, -n:], drafter=drafter, tree=DynamicTree(), max_new_tokens=10,
                                 do_sample=False, pad_token_id=0)  # fmt: skip
        assert torch.equal(both.sequences[b, -10:], alone.sequences[0, -10:]), b


@pytest.mark.parametrize("lengths", [(8,), (5, 8)], ids=["b1", "b2"])
def test_repeating_target_accepts_deep_paths(lengths):
    """The copy head on a repeating target: paths of three drafts of the candidate tree are accepted (trees deep
    enough for the head's spread draft), the tokens are HF's."""
    target = tiny_model("llama", num_hidden_layers=6, num_key_value_heads=4, scale=2.0)
    drafter = copy_head(target)
    trees = (DynamicTree(depth=3, topk=2, total_tokens=12), DDTree(budget=11, topk=2, candidates=True))
    outs = check_greedy(target, drafter, lengths, max_new=24, trees=trees)
    for out in outs:
        assert max(out.stats.accept_lengths) >= 4, out.stats.accept_lengths


def test_round_reads_nothing_on_the_host(monkeypatch):
    from host_reads import spy_round_reads

    target = tiny_model("qwen3", num_hidden_layers=6, scale=2.0)
    drafter = sharp_head(target, draft_vocab_size=VD)
    reads = spy_round_reads(monkeypatch)
    rounds = 0
    for lengths in ((9,), (6, 10)):
        ids, mask = left_padded(lengths)
        for tree in TREES:
            out = specdec.generate(target, ids, attention_mask=mask, drafter=drafter, tree=tree, max_new_tokens=10,
                                   pad_token_id=0)  # fmt: skip
            rounds += out.stats.rounds
    assert rounds > 10 and reads == []


def test_sampling_runs_with_sample_match_and_refuses_the_rest():
    target = tiny_model("qwen3", num_hidden_layers=6, scale=2.0)
    drafter = sharp_head(target, draft_vocab_size=VD)
    ids, mask = left_padded((5, 9), seed=2)
    kw = dict(attention_mask=mask, drafter=drafter, tree=TREES[0], max_new_tokens=10, pad_token_id=0, do_sample=True,
              temperature=0.9, top_k=20)  # fmt: skip
    out = specdec.generate(target, ids, verifier=specdec.SampleMatch(), **kw)
    assert out.sequences.shape == (2, ids.shape[1] + 10)
    with pytest.raises(ValueError, match="DynamicTree"):
        specdec.generate(target, ids, verifier=specdec.SpeculativeSampling(), **kw)


def test_drafters_without_candidate_trees_are_refused():
    target = tiny_model("qwen3", num_hidden_layers=6, scale=2.0)
    ids, _ = left_padded((6,))
    with pytest.raises(ValueError, match="Drafters that draft candidate trees: Eagle3Drafter"):
        specdec.generate(target, ids, drafter=specdec.NGramDrafter(), tree=DynamicTree(), max_new_tokens=4)
    with pytest.raises(ValueError, match="pass topk <= 100"):
        drafter = sharp_head(target, draft_vocab_size=100)
        specdec.generate(target, ids, drafter=drafter, tree=DynamicTree(depth=1, topk=101), max_new_tokens=4)


@pytest.mark.parametrize("name", ["dense", "hybrid"])
def test_cli_tree_dynamic(zoo, tmp_path, name):
    """``drafter=eagle3 tree=dynamic`` in the CLI decodes the zoo target's greedy tokens with the head shipped for it
    (``assets/drafters/zoo-{name}-eagle3``)."""
    from test_cli import _compose
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specdec import cli

    model = AutoModelForCausalLM.from_pretrained(zoo / f"target-{name}", dtype=torch.float32).eval()
    overrides = [f"target={name}", "drafter=eagle3", f"drafter.path=assets/drafters/zoo-{name}-eagle3", "tree=dynamic",
                 "tree.depth=3", "tree.topk=4", "tree.total_tokens=16", "prompts.limit=1", "max_new_tokens=12",
                 "show_text=false", "threads=1", "device=cpu"]  # fmt: skip
    cfg, choices = _compose("generate", overrides)
    records = cli.run_command("generate", cfg, choices, tmp_path / "out")
    tok = AutoTokenizer.from_pretrained(zoo / "tokenizer")
    ids = tok(records[0]["prompt"], return_tensors="pt").input_ids
    assert records[0]["tokens"] == model.generate(ids, do_sample=False, max_new_tokens=12)[0, ids.shape[1] :].tolist()


@pytest.mark.slow
def test_compiled_round_equals_hf_greedy():
    """``compile=True`` (inductor, on CPU): the candidate round compiles (no fallback) and the tokens stay HF's."""
    target = tiny_model("qwen3", num_hidden_layers=6, scale=2.0)
    drafter = sharp_head(target, draft_vocab_size=VD)
    ids, mask = left_padded((9,))
    want = target.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=0)
    out = specdec.generate(target, ids, attention_mask=mask, drafter=drafter, tree=TREES[0], max_new_tokens=12,
                           do_sample=False, pad_token_id=0, compile=True)  # fmt: skip
    assert torch.equal(out.sequences, want) and out.stats.compile_fallbacks == 0
