"""Token identity with HF ``generate`` in rounds that accept every length ``0 .. D``.

The drafter (``oracle_drafter.OracleDrafter``) proposes the target's own greedy continuation (HF's
``generate(do_sample=False)``) with mistakes planted at chosen depths, so each round's accepted length is known
in advance: every test checks the tokens against HF and each round's accepted length against the schedule, so a
round that accepts too little (a drafted token wrongly rejected) or too much fails as surely as a wrong token.
Mistakes come in two kinds: out of reach of every tree, or second choice (a tree that keeps siblings accepts the
whole depth through the sibling). Sampling is checked by chi-square against the exact distribution of the 3rd
and 4th new tokens computed with HF's own warpers (``oracles``), at a sample size whose power is computed.

CPU, fp32, tiny random targets (``models.tiny_model``, ``state.hybrid_harness.tiny_hybrid``), one seed.
"""

from __future__ import annotations

import copy
import re

import pytest
import torch
from models import ARCHS, tiny_model
from oracle_drafter import HARD, NONE, SHORT, SOFT, OracleDrafter, expected_accept, full_schedule
from oracles import ALPHA, BUGS, gof_pvalues, hf_probs, multinomial_counts, wrong_probs
from oracles.ddtree_heap import build_ddtree, chain_from_logq
from oracles.host_trees import paths_to_tree
from state.hybrid_harness import next_logits, prefill, state_tensors, tiny_hybrid
from transformers import GenerationConfig

import specdec
from specdec.state import manager_for
from specdec.trees import TREES
from specdec.types import DeviceTree, Proposal, SamplingParams
from specdec.verify import RULES

PROMPT = torch.randint(3, 128, (1, 8), generator=torch.Generator().manual_seed(0))
DEPTH = 4
MAX_NEW = 40
ATTENTION = [*ARCHS, "gpt2"]
HYBRIDS = ["qwen3_5", "qwen3_next", "mamba2", "nemotron_h", "bamba", "granitemoehybrid", "falcon_h1", "zamba2"]
TREES_UNDER_TEST = {"chain4": specdec.Chain(4), "ddtree10-top2": specdec.DDTree(budget=10, topk=2)}

_MODELS: dict[str, torch.nn.Module] = {}
_CONTINUATIONS: dict[str, torch.Tensor] = {}


_THETA_100 = {"rope_parameters": {"rope_type": "default", "rope_theta": 100.0}}
# Settings whose greedy continuation does not fall into a loop of one or two tokens (the tiny targets' default
# does for several archs, and a loop would hide wrong positions or masks): faster rotary frequencies or another
# seed, untied LM heads for gemma and gpt2 (a tied head favours repeating the input token). The sliding-window
# archs get a window of 12 tokens, which acts on these 48-token sequences (their tokens differ from a wide window's).
ARCH_SETTINGS = {
    "llama": _THETA_100,
    "qwen2": {"seed": 8},
    "qwen3": {},
    "mistral": {**_THETA_100, "sliding_window": 12},
    "gemma2": {"seed": 1, "tie_word_embeddings": False, "sliding_window": 12},  # sliding + full layers
    "gemma3": {"seed": 1, "tie_word_embeddings": False, "sliding_window": 12},
    "phi3": _THETA_100,
    "gpt2": {"tie_word_embeddings": False},
}


def model_for(name: str):
    """The tiny target ``name`` (built once): an attention arch of ``models`` or gpt2 (``ARCH_SETTINGS``), or a
    hybrid family of ``state.hybrid_harness`` with long-memory recurrent mixers (``long_memory``)."""
    if name not in _MODELS:
        if name in ATTENTION:
            _MODELS[name] = tiny_model(name, scale=2.0, **ARCH_SETTINGS.get(name, {}))
        else:
            _MODELS[name] = long_memory(tiny_hybrid(name, scale=2.0))
    return _MODELS[name]


def long_memory(model):
    """Recurrent mixers that carry the output: decays 20x slower (``A_log - 3``) and outputs 8x larger.

    At the default settings a Gated DeltaNet state forgets within a few tokens and the Mamba mixers add little to
    the residual stream, so a state continued from the wrong tree node moves the logits by ~1e-3, below their
    top-2 margins (falcon_h1's tokens do not change even with its states wiped); here it moves them by ~0.3.
    """
    with torch.no_grad():
        for adapter in manager_for(model).adapters:
            adapter.module.A_log.sub_(3.0)
            adapter.module.out_proj.weight.mul_(8.0)
    return model


def continuation(name: str) -> torch.Tensor:
    """Prompt + HF greedy tokens, ``DEPTH + 2`` past the longest run of this file (the drafter reads ahead)."""
    if name not in _CONTINUATIONS:
        out = model_for(name).generate(PROMPT, do_sample=False, max_new_tokens=MAX_NEW + DEPTH + 2)
        _CONTINUATIONS[name] = out[0]
    return _CONTINUATIONS[name]


def hf_greedy(name: str, max_new: int) -> torch.Tensor:
    return continuation(name)[: PROMPT.shape[1] + max_new][None]


def keeps_siblings(tree, paths: bool) -> bool:
    """Whether ``tree`` keeps the true token next to a second-choice decoy (a branching policy over paths, or
    over log-probs with at least two candidates per depth)."""
    if not tree.branching:
        return False
    return paths or getattr(tree, "effective_topk", 2) >= 2


def check_rounds(out, drafter: OracleDrafter, *, siblings: bool | None, cover: bool = True) -> None:
    """Each round accepted what its planted mistake allows; with ``cover``, every length ``0 .. D`` occurred.

    ``siblings=None`` (a policy of unknown shape): a second-choice mistake at depth p accepts between p - 1 and D.
    """
    depth = drafter.depth
    log = drafter.state.rounds_log[: out.stats.rounds]
    assert len(log) == out.stats.rounds
    for r, (kind, plant, got) in enumerate(log):
        if siblings is None and kind == SOFT:
            assert plant - 1 <= got <= depth, (r, kind, plant, got, log)
            continue
        want = expected_accept(kind, plant, depth, siblings=bool(siblings))
        assert got == want, f"round {r} ({kind=}, {plant=}): accepted {got}, expected {want}; log {log}"
    if cover:
        hist = out.stats.accept_hist
        assert len(hist) == depth + 1 and all(hist), f"accept lengths 0..{depth} not all reached: {hist}"


def run(name: str, tree, *, paths=False, schedule=None, max_new: int = MAX_NEW, depth: int = DEPTH, **kwargs):
    """``specdec.generate`` of target ``name`` with the oracle drafter (``depth`` deep at most); returns (output,
    drafter)."""
    depth = min(depth, tree.max_depth)
    drafter = OracleDrafter(continuation(name), depth=depth, schedule=schedule or full_schedule(depth), paths=paths)
    kwargs.setdefault("generator", torch.Generator().manual_seed(0))  # stochastic tree policies draw from it
    out = specdec.generate(model_for(name), PROMPT, drafter=drafter, tree=tree, max_new_tokens=max_new, **kwargs)
    assert out.stats.path == "eager"
    return out, drafter


# -- greedy identity over every architecture ----------------------------------------------------------------
@pytest.mark.parametrize("proposal", ["logq", "paths"])
@pytest.mark.parametrize("tree", list(TREES_UNDER_TEST), ids=str)
@pytest.mark.parametrize("name", [*ATTENTION, *HYBRIDS])
def test_identity_deep_rounds(name, tree, proposal):
    tree, paths = TREES_UNDER_TEST[tree], proposal == "paths"
    out, drafter = run(name, tree, paths=paths)
    assert torch.equal(out.sequences, hf_greedy(name, MAX_NEW))
    check_rounds(out, drafter, siblings=keeps_siblings(tree, paths))


# -- EOS and max_new_tokens inside an accepted run -----------------------------------------------------------
class Chunks:
    """Streamer keeping what each step committed: the prompt, the first token, then one chunk per round."""

    def __init__(self) -> None:
        self.chunks: list[list[int]] = []

    def put(self, value: torch.Tensor) -> None:
        self.chunks.append(value.view(-1).tolist())

    def end(self) -> None:
        pass


def round_chunks(name: str, tree, paths: bool) -> list[list[int]]:
    """New tokens of a free run: ``[first token]``, then each round's accepted drafts + bonus."""
    streamer = Chunks()
    run(name, tree, paths=paths, streamer=streamer)
    return streamer.chunks[1:]


@pytest.mark.parametrize("proposal", ["logq", "paths"])
@pytest.mark.parametrize("tree", list(TREES_UNDER_TEST), ids=str)
@pytest.mark.parametrize("name", ["llama", "qwen3_5"])
def test_eos_inside_accepted_run(name, tree, proposal):
    """EOS = a token that a round accepts as a draft (depth >= 2 where possible) with more accepted after it: the
    output stops there as HF's does, and the rest of that round is dropped."""
    tree, paths = TREES_UNDER_TEST[tree], proposal == "paths"
    chunks = round_chunks(name, tree, paths)
    seen: list[int] = []
    picks = []
    for r, chunk in enumerate(chunks):
        for j, tok in enumerate(chunk[:-2]):  # an accepted draft with another draft and the bonus after it
            if r > 0 and tok not in seen and tok not in chunk[:j]:
                picks.append((j >= 1, r, j, tok))
        seen += chunk
    assert picks, f"no round accepted >= 2 drafts with a fresh token: {chunks}"
    _, r, j, eos = max(picks, key=lambda p: (p[0], -p[1]))  # the first deep one
    ref = model_for(name).generate(PROMPT, do_sample=False, max_new_tokens=MAX_NEW, eos_token_id=eos, pad_token_id=0)
    out, _ = run(name, tree, paths=paths, eos_token_id=eos)
    assert torch.equal(out.sequences, ref)
    new = out.sequences[0, PROMPT.shape[1] :].tolist()
    assert new[-1] == eos and len(new) == sum(map(len, chunks[:r])) + j + 1
    assert out.stats.rounds == r  # the EOS round is the last one


@pytest.mark.parametrize("proposal", ["logq", "paths"])
@pytest.mark.parametrize("tree", list(TREES_UNDER_TEST), ids=str)
@pytest.mark.parametrize("name", ["gpt2", "mamba2"])
def test_max_new_tokens_inside_accepted_run(name, tree, proposal):
    """``max_new_tokens`` ending before the last accepted draft of a deep round: cut exactly as HF cuts."""
    tree, paths = TREES_UNDER_TEST[tree], proposal == "paths"
    chunks = round_chunks(name, tree, paths)
    cuts = [
        (sum(map(len, chunks[:r])) + j, r)
        for r, chunk in enumerate(chunks)
        if r >= 2 and len(chunk) >= 4
        for j in (1, len(chunk) - 2)
    ]
    assert cuts, f"no round accepted >= 3 drafts: {chunks}"
    for cut, r in cuts[:2]:
        out, drafter = run(name, tree, paths=paths, max_new=cut)
        assert torch.equal(out.sequences, hf_greedy(name, cut)), (cut, r)
        assert out.stats.new_tokens == cut and out.stats.rounds == r
        assert sum((a + 1) * n for a, n in enumerate(out.stats.accept_hist)) == cut - 1  # drafts past the cut uncounted
        assert drafter.state.rounds_log[r - 1][2] == len(chunks[r]) - 1  # the cut round accepted as in the free run


# -- hybrid targets: the recurrent state carries the output --------------------------------------------------
def _greedy_after_prompt(model, steps: int, wipe: bool) -> list[int]:
    """Greedy tokens after the prompt by HF single-token decode steps, the recurrent states zeroed after the prompt
    when ``wipe`` (attention K/V kept)."""
    with torch.no_grad():
        cache = prefill(model, PROMPT)
        if wipe:
            for (_, kind), tensor in state_tensors(cache).items():
                if kind in ("conv_states", "recurrent_states"):
                    tensor.zero_()
        tokens = [int(model(PROMPT).logits[0, -1].argmax())]
        for i in range(steps - 1):
            tokens.append(int(next_logits(model, cache, tokens[-1], PROMPT.shape[1] + i).argmax()))
    return tokens


@pytest.mark.parametrize("proposal", ["logq", "paths"])
@pytest.mark.parametrize("family", HYBRIDS)
def test_hybrid_recurrent_state_through_sibling_rounds(family, proposal):
    """On targets whose tokens change when their recurrent state is wiped, every round accepting through a
    sibling (the recurrent state replayed along a branch that is not the first child at each depth) stays exact."""
    model = model_for(family)
    steps = 12
    kept = _greedy_after_prompt(model, steps, wipe=False)
    assert kept == continuation(family)[PROMPT.shape[1] : PROMPT.shape[1] + steps].tolist()
    assert _greedy_after_prompt(model, steps, wipe=True) != kept, "the recurrent state does not affect the tokens"
    schedule = [(SOFT, d) for d in range(1, DEPTH + 1)] + [(HARD, 3), (NONE, DEPTH + 1), (HARD, 1)]
    out, drafter = run(family, specdec.DDTree(budget=12, topk=3), paths=proposal == "paths", schedule=schedule)
    assert torch.equal(out.sequences, hf_greedy(family, MAX_NEW))
    check_rounds(out, drafter, siblings=True, cover=False)
    assert out.stats.accept_hist[DEPTH] >= 4  # the sibling rounds


# -- padding slots ---------------------------------------------------------------------------------------------
PADDED = {
    # topk = 1: the tree holds D nodes of its 12 (8 padding slots every round)
    "ddtree12-top1-logq": (specdec.DDTree(budget=12, topk=1), False, full_schedule(DEPTH)),
    # paths cut short and single paths: tries of 1..8 nodes in 14 slots
    "ddtree14-paths": (specdec.DDTree(budget=14), True, full_schedule(DEPTH, kinds=(SHORT, SOFT, HARD))),
    # a chain of 6 slots drafted 4 deep, paths cut short
    "chain6-paths": (specdec.Chain(6), True, full_schedule(DEPTH, kinds=(SHORT, HARD))),
}


@pytest.mark.parametrize("config", list(PADDED))
@pytest.mark.parametrize("name", ["llama", "gpt2", "qwen3_5", "nemotron_h"])
def test_padding_slots(name, config):
    """Trees with fewer real nodes than slots: padding slots never change a real node's output."""
    tree, paths, schedule = PADDED[config]
    out, drafter = run(name, tree, paths=paths, schedule=schedule)
    assert torch.equal(out.sequences, hf_greedy(name, MAX_NEW))
    check_rounds(out, drafter, siblings=keeps_siblings(tree, paths))
    assert out.stats.tree_nodes <= out.stats.rounds * (tree.budget - 1)  # at least 2 of the budget + 1 slots padding


# -- the trees the rounds verify are the host references' ------------------------------------------------------
class Recording:
    """A tree policy that delegates to ``policy`` and keeps every (proposal, root, tree) of the rounds."""

    def __init__(self, policy) -> None:
        self.policy = policy
        self.budget, self.max_depth = policy.budget, policy.max_depth
        self.reads, self.branching, self.stochastic = policy.reads, policy.branching, policy.stochastic
        self.built: list = []

    def build(self, proposal: Proposal, root: torch.Tensor, depth: int, noise=None) -> DeviceTree:
        tree = self.policy.build(proposal, root, depth, noise)
        self.built.append((Proposal(*(None if t is None else t.clone() for t in proposal)), root.clone(),
                           DeviceTree(*(t.clone() if torch.is_tensor(t) else t for t in tree))))  # fmt: skip
        return tree


def host_reference(policy, proposal: Proposal, root: int):
    if proposal.logq is not None:
        if isinstance(policy, specdec.Chain):
            return chain_from_logq(proposal.logq[0], root, k=policy.k)
        return build_ddtree(proposal.logq[0], root, budget=policy.budget, topk=policy.topk)
    paths = [p[:n].tolist() for p, n in zip(proposal.paths[0], proposal.path_lengths[0].tolist(), strict=True)]
    if isinstance(policy, specdec.Chain):
        paths = [paths[0][: policy.k]]
    return paths_to_tree(root, paths, budget=policy.budget)


REFERENCE_TREES = {  # policy, proposal, drafted depth
    "ddtree15-logq": (specdec.DDTree(), False, DEPTH),
    # one depth: 12 of the 15 nodes are tail tokens of equal log-prob, so the tie order picks them
    "ddtree15-depth1-logq": (specdec.DDTree(), False, 1),
    "ddtree9-top4-logq": (specdec.DDTree(budget=9, topk=4), False, DEPTH),
    "chain4-logq": (specdec.Chain(4), False, DEPTH),
    "ddtree6-paths": (specdec.DDTree(budget=6), True, DEPTH),  # the trie cut by the budget
    "chain3-paths": (specdec.Chain(3), True, DEPTH),
}


@pytest.mark.parametrize("config", list(REFERENCE_TREES))
def test_round_trees_match_host_references(config):
    """Each round's padded device tree is node for node the host reference (best-first heap, trie, chain)."""
    policy, paths, depth = REFERENCE_TREES[config]
    recording = Recording(policy)
    out, drafter = run("qwen3", recording, paths=paths, depth=depth)
    assert torch.equal(out.sequences, hf_greedy("qwen3", MAX_NEW))
    full = policy.budget >= 2 * depth  # room for both paths of a second-choice mistake (else the trie is cut)
    check_rounds(out, drafter, siblings=keeps_siblings(policy, paths) if full else None, cover=full)
    assert len(recording.built) >= out.stats.rounds
    for proposal, root, tree in recording.built:
        ref = host_reference(policy, proposal, int(root[0]))
        n, row = ref.num_nodes, tree.row(0)
        assert int(row.num_nodes) == n and row.valid.tolist() == [True] * n + [False] * (tree.num_slots - n)
        assert row.tokens[:n].tolist() == ref.tokens.tolist()
        assert row.parents[:n].tolist() == ref.parents.tolist() and row.depth[:n].tolist() == ref.depth.tolist()
        # padding: the root token, parent -1, depth 0
        assert (row.tokens[n:] == root[0]).all() and (row.parents[n:] == -1).all() and (row.depth[n:] == 0).all()


# -- every registered tree policy and verification rule --------------------------------------------------------
def instantiate(registry: str, name: str, cls):
    """``cls()``: a registered class must be usable with its defaults (the command line builds it by name)."""
    try:
        return cls()
    except TypeError as err:
        raise AssertionError(
            f"{registry}[{name!r}] = {cls.__name__} needs arguments ({err}); give them defaults"
        ) from err


def check_registered(policy_name: str, rule_name: str, proposal: str) -> None:
    """The pair decodes token-identically to HF greedy, or ``generate`` refuses it by name before any round."""
    policy = instantiate("TREES", policy_name, TREES[policy_name])
    rule = instantiate("RULES", rule_name, RULES[rule_name])
    refusal = None
    try:  # generate checks the rule first, then whether the policy reads what the drafter proposes
        rule.check(SamplingParams(), policy)
    except ValueError as err:
        refusal = str(err).split(":")[0]  # the rule's own message, naming itself
    if refusal is None and proposal not in policy.reads:
        refusal = "proposes"  # round_reason: the policy reads no field the drafter provides
    if refusal is not None:
        with pytest.raises(ValueError, match=re.escape(refusal)):
            run("qwen3", policy, paths=proposal == "paths", verifier=rule)
        return
    out, drafter = run("qwen3", policy, paths=proposal == "paths", verifier=rule)
    assert torch.equal(out.sequences, hf_greedy("qwen3", MAX_NEW))
    known = isinstance(policy, specdec.Chain | specdec.DDTree)
    check_rounds(out, drafter, siblings=keeps_siblings(policy, proposal == "paths") if known else None)


@pytest.mark.parametrize("proposal", ["logq", "paths"])
@pytest.mark.parametrize("rule_name", sorted(RULES))
@pytest.mark.parametrize("policy_name", sorted(TREES))
def test_registered_policies_and_rules(policy_name, rule_name, proposal):
    """Every entry of ``specdec.trees.TREES`` x ``specdec.verify.RULES`` (at collection time), with defaults."""
    check_registered(policy_name, rule_name, proposal)


class SiblingChain:
    """A custom policy: the argmax chain with each depth's second choice as a leaf next to the chain node."""

    reads = ("logq",)
    branching = True
    stochastic = False
    calls = 0

    def __init__(self, k: int = 4) -> None:
        self.k = k

    @property
    def budget(self) -> int:
        return 2 * self.k

    @property
    def max_depth(self) -> int:
        return self.k

    def build(self, proposal: Proposal, root: torch.Tensor, depth: int, noise=None) -> DeviceTree:
        type(self).calls += 1
        logq = proposal.logq  # [B, D, V]
        batch, d = logq.shape[0], min(depth, self.k)
        top = logq[:, :d].float().topk(2, dim=-1).indices  # [B, d, 2]: chain node, sibling
        step = torch.arange(d, device=logq.device)
        chain_parent = torch.where(step > 0, 2 * step - 1, 0)  # node 2i+1 is the chain node of depth i+1
        slots, pad = 2 * self.k + 1, 2 * (self.k - d)
        none = torch.full((pad + 1,), -1, device=logq.device)
        tokens = torch.cat([root[:, None], top.flatten(1), root[:, None].expand(batch, pad)], 1)
        parents = torch.cat([none[:1], chain_parent.repeat_interleave(2), none[1:]])
        depths = torch.cat([none[:1] + 1, (step + 1).repeat_interleave(2), none[1:] + 1])
        valid = torch.arange(slots, device=logq.device) <= 2 * d
        return DeviceTree(tokens, parents.expand(batch, -1), depths.expand(batch, -1), valid.expand(batch, -1),
                          torch.full((batch,), 2 * d + 1, device=logq.device))  # fmt: skip


class CountingGreedy(specdec.Greedy):
    """A custom rule: greedy acceptance that counts its calls."""

    calls = 0

    def accept(self, tree, logits, sampling, noise, max_depth, proposal=None):
        type(self).calls += 1
        return super().accept(tree, logits, sampling, noise, max_depth, proposal)


def test_custom_registered_policy_and_rule_are_used(monkeypatch):
    """A policy and a rule registered by name run through the same check, and the round really calls them."""
    monkeypatch.setitem(TREES, "test-sibling-chain", SiblingChain)
    monkeypatch.setitem(RULES, "test-counting-greedy", CountingGreedy)
    monkeypatch.setattr(SiblingChain, "calls", 0)
    monkeypatch.setattr(CountingGreedy, "calls", 0)
    check_registered("test-sibling-chain", "test-counting-greedy", "logq")
    assert SiblingChain.calls >= 9 and CountingGreedy.calls >= 9
    # the sibling leaf catches a second-choice mistake at depth p: p drafts accepted
    out, drafter = run("llama", SiblingChain(), schedule=[(SOFT, d) for d in range(1, DEPTH + 1)])
    assert torch.equal(out.sequences, hf_greedy("llama", MAX_NEW))
    assert all(got == plant for _, plant, got in drafter.state.rounds_log[: out.stats.rounds])


# -- sampling after several rounds -----------------------------------------------------------------------------
SAMPLING = dict(temperature=0.3, top_k=4, top_p=0.8)
SAMPLING_TARGET = "qwen3"
SAMPLES = 800  # generate calls; the power of the test at this size is checked in test_sampling_chi2_power
CHI2_TOKENS = (3, 4)  # the new tokens tested (1-based): after the prefill's token and at least one round
_MARGINALS: dict = {}


def sampling_marginals(model, steps: int, probs_of) -> list[torch.Tensor]:
    """Exact distribution ``[V]`` (float64) of each of the first ``steps`` new tokens when every token is drawn
    from ``probs_of(logits)`` (HF forwards over every reachable prefix)."""
    seqs, weights, out = PROMPT, torch.ones(1, dtype=torch.float64), []
    with torch.no_grad():
        for s in range(steps):
            probs = probs_of(model(seqs).logits[:, -1])  # [n, V]
            out.append((weights[:, None] * probs).sum(0))
            if s + 1 < steps:
                row, tok = (probs > 0).nonzero(as_tuple=True)
                weights, seqs = weights[row] * probs[row, tok], torch.cat([seqs[row], tok[:, None]], 1)
    return out


def marginals(kind: str) -> list[torch.Tensor]:
    """HF's exact marginals (``kind="hf"``) or those of a planted sampling bug."""
    if kind not in _MARGINALS:
        model = model_for(SAMPLING_TARGET)
        if kind == "hf":
            fn = lambda logits: hf_probs(logits, **SAMPLING)  # noqa: E731
        elif kind == "temperature_twice":
            fn = lambda logits: hf_probs(logits, **{**SAMPLING, "temperature": SAMPLING["temperature"] ** 2})  # noqa: E731
        else:
            fn = lambda logits: wrong_probs(logits, kind, **SAMPLING)  # noqa: E731
        _MARGINALS[kind] = sampling_marginals(model, max(CHI2_TOKENS), fn)
    return _MARGINALS[kind]


def chi2_rejects(counts: dict[int, torch.Tensor], truth: list[torch.Tensor]) -> torch.Tensor:
    """The test: reject when the counts of any tested token fail the fit at ALPHA / len(CHI2_TOKENS)."""
    level = ALPHA / len(CHI2_TOKENS)
    return torch.stack([gof_pvalues(counts[t], truth[t - 1]) < level for t in CHI2_TOKENS]).any(0)


def test_sampling_chi2_power():
    """At SAMPLES draws the test rejects each planted processing bug with probability >= 0.99 and the truth with
    probability <= 0.01 (1000 simulated runs per case, token counts drawn from the exact marginals)."""
    truth = marginals("hf")
    rates = {}
    for i, bug in enumerate(["hf", *BUGS, "temperature_twice"]):
        gen = torch.Generator().manual_seed(i)
        sim = {t: multinomial_counts(marginals(bug)[t - 1], SAMPLES, 1000, gen) for t in CHI2_TOKENS}
        rates[bug] = float(chi2_rejects(sim, truth).double().mean())
    assert rates.pop("hf") <= 0.01, rates
    assert min(rates.values()) >= 0.99, rates


@pytest.mark.slow  # about 12-30 s: in the slow tier, which CI runs
def test_sampling_multi_round_chi2():
    """The 3rd and 4th new tokens of ``SAMPLES`` calls (top-k, top-p, temperature; a drafter equal to the target
    over a DDTree, so rounds accept 1-3 drafts) follow HF's exact marginals."""
    model = model_for(SAMPLING_TARGET)
    drafter = specdec.ModelDrafter(copy.deepcopy(model), tree_depth=3)
    tree = specdec.DDTree(budget=8, topk=4)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.empty(SAMPLES, max(CHI2_TOKENS), dtype=torch.long)
    hist = torch.zeros(4)
    later_rounds = 0
    for i in range(SAMPLES):
        out = specdec.generate(model, PROMPT, drafter=drafter, tree=tree, do_sample=True, generator=gen,
                               max_new_tokens=max(CHI2_TOKENS), **SAMPLING)  # fmt: skip
        tokens[i] = out.sequences[0, PROMPT.shape[1] :]
        hist[: len(out.stats.accept_hist)] += torch.tensor(out.stats.accept_hist, dtype=torch.float)
        later_rounds += out.stats.accept_lengths[0] < max(CHI2_TOKENS) - 1  # the last token from round 2 or later
    counts = {t: torch.bincount(tokens[:, t - 1], minlength=model.config.vocab_size)[None] for t in CHI2_TOKENS}
    truth = marginals("hf")
    pvalues = {t: float(gof_pvalues(counts[t], truth[t - 1])[0]) for t in CHI2_TOKENS}
    assert not chi2_rejects(counts, truth), pvalues
    # the tested tokens came from deep rounds and from later rounds
    assert hist[1:].sum() > 0.5 * hist.sum() and hist[2:].sum() > 0.1 * hist.sum(), hist
    assert later_rounds > 0.2 * SAMPLES, later_rounds


def test_sampling_support_hf_defaults():
    """With HF's defaults (temperature 1, top-k 50 when unset) every sampled token lies in the support of HF's
    processed distribution at its prefix (with no top-k, about half of each node's mass lies outside it)."""
    model = model_for("llama")
    top_k = GenerationConfig._get_default_generation_params()["top_k"]
    gen = torch.Generator().manual_seed(1)
    for _ in range(12):
        drafter = OracleDrafter(continuation("llama"), depth=DEPTH, schedule=[(NONE, DEPTH + 1)])
        out = specdec.generate(model, PROMPT, drafter=drafter, tree=specdec.DDTree(budget=10, topk=2),
                               max_new_tokens=16, do_sample=True, generator=gen)  # fmt: skip
        seq = out.sequences
        with torch.no_grad():
            logits = model(seq).logits[0, PROMPT.shape[1] - 1 : -1]
        probs = hf_probs(logits, top_k=top_k)
        new = seq[0, PROMPT.shape[1] :]
        assert (probs.gather(1, new[:, None]) > 0).all(), (new.tolist(), probs.gather(1, new[:, None]).flatten())
