"""EAGLE-2's dynamic tree (``specdec.trees.dynamic``): the candidate expansion and the rerank against the reference's
own selection (``fixtures/eagle2``: its ``topK_genrate`` run on a head whose logits come from a fixed table), the
best-first order of ``DDTree(candidates=True)``, parents before children under ties, which rules are exact over the
tree, and the first token a round emits against HF's distribution (sample-and-match)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import specdec
from specdec.trees import DDTree, DynamicTree
from specdec.trees.dynamic import candidate_levels, expand_candidates, rerank_candidates
from specdec.types import Proposal, SamplingParams

FIXTURE = Path(__file__).parent.parent / "fixtures" / "eagle2" / "topk_generate.json"
CASES = json.loads(FIXTURE.read_text())["cases"]


def table_candidates(case) -> tuple[Proposal, torch.Tensor]:
    """The candidate tree of the fixture's stand-in head (its logits after a row: ``tanh(hidden fed in) +
    table[token]``, the hidden fed on being those logits), drafted by ``expand_candidates``."""
    table, hidden = torch.tensor(case["table"]), torch.tensor(case["hidden"])
    root = torch.tensor([case["root"]])
    out = torch.tanh(hidden)[None, None] + table[root][:, None]  # [1, 1, V]: the root's row
    state = {"out": out}

    def step(level, tokens, parent_rows):
        fed = state["out"].gather(1, parent_rows[..., None].expand(-1, -1, out.shape[-1]))
        state["out"] = torch.tanh(fed) + table[tokens]
        return torch.log_softmax(state["out"], -1)

    first = torch.log_softmax(out[:, 0], -1)
    return expand_candidates(first, step, levels=case["depth"] + 1, topk=case["top_k"]), root


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"d{c['depth']}-k{c['top_k']}-t{c['total_token']}")
def test_candidates_and_rerank_are_the_references(case):
    proposal, root = table_candidates(case)
    assert proposal.candidates[0].tolist() == case["candidates"]
    assert proposal.parents[0].tolist() == case["parents"]
    # the scores are float32 sums of log-softmaxes: another CPU's vector width (AVX-512 against AVX2) moves them by
    # an ulp or so; the candidates, their parents and the reranked tree above and below stay exact
    torch.testing.assert_close(proposal.scores[0], torch.tensor(case["scores"]), atol=1e-5, rtol=1e-6)
    policy = DynamicTree(depth=case["depth"], topk=case["top_k"], total_tokens=case["total_token"])
    tree = policy.build(proposal, root, policy.max_depth)
    assert tree.tokens.shape == (1, case["total_token"]) and bool(tree.valid.all())
    assert tree.tokens[0].tolist() == [case["root"], *case["tree_tokens"][1:]]
    assert tree.parents[0].tolist() == case["tree_parents"]
    assert tree.depth[0].tolist() == case["tree_depth"]


def paths_of(tokens, parents) -> list[tuple[int, ...]]:
    out = []
    for i in range(len(tokens)):
        path, node = [], i
        while node > 0:
            path.append(tokens[node])
            node = parents[node]
        out.append(tuple(reversed(path)))
    return out


@pytest.mark.parametrize("case", CASES[:2], ids=["d3-k4", "d7-k10"])
def test_ddtree_over_candidates_keeps_the_same_nodes_best_first(case):
    """``DDTree(candidates=True)`` of the same budget: the reference's node set, in order of score (largest first),
    parents before children."""
    proposal, root = table_candidates(case)
    budget = case["total_token"] - 1
    tree = DDTree(budget=budget, topk=case["top_k"], candidates=True).build(proposal, root, case["depth"] + 1)
    tokens, parents = tree.tokens[0].tolist(), tree.parents[0].tolist()
    assert all(0 <= parents[i] < i for i in range(1, len(parents)))
    want = paths_of([case["root"], *case["tree_tokens"][1:]], case["tree_parents"])
    assert sorted(paths_of(tokens, parents)) == sorted(want)
    scores = {}  # each path's score: the sum of the candidates' own log-probabilities along it
    cand, par, sc = case["candidates"], case["parents"], case["scores"]
    for j in range(len(cand)):
        path, node = [], j
        while node >= 0:
            path.append(cand[node])
            node = par[node]
        scores.setdefault(tuple(reversed(path)), sc[j])
    got = [scores[p] for p in paths_of(tokens, parents)[1:]]
    assert got == sorted(got, reverse=True)


def test_ties_keep_parents_before_children():
    """Scores with ties everywhere (children of probability 1 score as their parent, -inf rows): the kept set is
    closed under parents and laid out parents first, for both layouts."""
    gen = torch.Generator().manual_seed(0)
    k, levels, batch = 3, 4, 64
    vocab = 6
    logq = torch.randint(0, 3, (batch, 1 + (levels - 1) * k, vocab), generator=gen).float().neg()
    logq[:, :, :2] = 0.0  # ties at 0 (a "probability 1" token repeated)
    logq[:, 5:7] = float("-inf")

    def step(level, tokens, parent_rows):
        return logq[:, 1 + (level - 1) * k : 1 + level * k]

    proposal = expand_candidates(logq[:, 0], step, levels=levels, topk=k)
    root = torch.zeros(batch, dtype=torch.long)
    for budget in (1, 5, 17, 30):
        for tree in (DynamicTree(depth=levels - 1, topk=k, total_tokens=budget + 1).build(proposal, root, levels),
                     DDTree(budget=budget, topk=k, candidates=True).build(proposal, root, levels)):  # fmt: skip
            parents, depth = tree.parents, tree.depth
            assert bool((parents[:, 1:] >= 0).all()) and bool((parents[:, 1:] < torch.arange(1, budget + 1)).all())
            assert torch.equal(depth[:, 1:], depth.gather(1, parents[:, 1:].clamp(min=0))[:, :] + 1)


def test_candidate_levels_and_padding():
    assert candidate_levels(2 + 2 * 4, 2).tolist() == [1, 1, 2, 2, 2, 2, 3, 3, 3, 3]
    proposal = Proposal(candidates=torch.tensor([[7, 8]]), parents=torch.tensor([[-1, -1]]),
                        scores=torch.tensor([[-1.0, -2.0]]))  # fmt: skip
    tree = rerank_candidates(proposal, torch.tensor([3]), budget=4, topk=2, num_slots=5)
    assert tree.tokens.tolist() == [[3, 7, 8, 3, 3]] and tree.num_nodes.tolist() == [3]
    assert tree.parents.tolist() == [[-1, 0, 0, -1, -1]]


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: DynamicTree(depth=0), "depth must be an int >= 1"),
        (lambda: DynamicTree(topk=True), "topk must be an int >= 1"),
        (lambda: DynamicTree(depth=1, topk=2, total_tokens=8), "holds 6 candidates"),
        (lambda: DDTree(budget="auto", candidates=True), "candidates=True"),
        (lambda: DDTree(candidates=1), "True or False"),
    ],
)
def test_arguments_are_checked(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_defaults_registry_and_config():
    """The reference's defaults (total_token=60, depth=7, top_k=10); ``tree=dynamic`` in the CLI's config group and
    ``{kind: dynamic}`` in bench methods."""
    from specdec.bench.config import _tree_specs
    from specdec.loading import build_tree

    tree = DynamicTree()
    assert (tree.depth, tree.topk, tree.total_tokens, tree.budget, tree.max_depth) == (7, 10, 60, 59, 8)
    assert specdec.TREES["dynamic"] is DynamicTree and specdec.DynamicTree is DynamicTree
    assert build_tree("dynamic", depth=3, topk=4, total_tokens=20) == DynamicTree(3, 4, 20)
    assert build_tree("ddtree", budget=8, candidates=True) == DDTree(8, candidates=True)
    specs = _tree_specs({"kind": "dynamic", "depth": [3, 5], "topk": 4, "total_tokens": 20})
    assert [t for _, t in specs] == [DynamicTree(3, 4, 20), DynamicTree(5, 4, 20)]
    assert [label for label, _ in specs] == ["dynamic-d3-k4-t20", "dynamic-d5-k4-t20"]
    import yaml

    conf = Path(specdec.__file__).parent / "conf" / "tree" / "dynamic.yaml"
    raw = yaml.safe_load(conf.read_text())
    assert build_tree(raw.pop("name"), **raw) == DynamicTree()


def test_exact_rules_over_the_tree():
    """A deterministic tree given the draft: greedy and sample-and-match are exact; the rules that weigh q refuse
    it by name."""
    sampled = SamplingParams(do_sample=True, temperature=0.8)
    exact = set()
    for name, rule in specdec.RULES.items():
        try:
            rule().check(sampled if name != "greedy" else SamplingParams(), DynamicTree())
            exact.add(name)
        except ValueError as err:
            assert "DynamicTree" in str(err)
    assert exact == {"greedy", "sample-match"}


def test_first_token_follows_hf_with_sample_match():
    """Rounds of ``DynamicTree`` + ``SampleMatch`` against the synthetic table target: the first emitted token (an
    accepted depth-1 draft, or the target's own draw at the root) follows HF's distribution at the root."""
    from verify.sampled_rounds import DEPTH, ROOT, ROUNDS, SAMPLING, Table, V, assert_fits, probs

    table = Table()
    gen = torch.Generator().manual_seed(1)
    perturb = [torch.randn((V,) * (d + 1), generator=gen) * 0.6 for d in range(DEPTH)]
    n, k = ROUNDS, 3
    paths = {"front": torch.zeros(n, k, 0, dtype=torch.long)}

    def logits_after(path):  # [n, k, d] -> the perturbed table's logits after each path
        d = path.shape[-1]
        index = torch.zeros(path.shape[:2], dtype=torch.long)
        for e in range(d):
            index = index * V + path[..., e]
        return (table.levels[d] + perturb[d]).reshape(-1, V)[index]

    def step(level, tokens, parent_rows):
        front = paths["front"].gather(1, parent_rows[..., None].expand(-1, -1, level - 1))
        paths["front"] = torch.cat([front, tokens[..., None]], -1)
        return torch.log_softmax(logits_after(paths["front"]), -1)

    first = torch.log_softmax(logits_after(torch.zeros(n, 1, 0, dtype=torch.long))[:, 0], -1)
    proposal = expand_candidates(first, step, levels=DEPTH, topk=k)
    policy = DynamicTree(depth=DEPTH - 1, topk=k, total_tokens=8)
    tree = policy.build(proposal, torch.full((n,), ROOT), DEPTH)
    rule = specdec.SampleMatch()
    noise = torch.rand(n, tree.num_slots, V, generator=gen)
    out = rule.accept(tree, table.node_logits(tree), SAMPLING, noise, DEPTH, proposal)
    assert (out.num_path >= 2).double().mean() > 0.2, "too few rounds accepted a draft"
    assert_fits(out.tokens[:, 0], probs(table.after()))
