"""What a tree policy and a verification rule return is checked at the protocol boundary (``specdec.validate``).

Each violation is planted in a policy or rule defined here (wrapping a built-in one and breaking one field): the
call raises ``ProtocolError`` naming the class, the field and the fix, and the next valid call still equals HF's
greedy output. The built-in policies and rules, which are not checked on the device, are checked here against
the same invariants on random proposals (property test), and a sound wrapper of them passes the checks.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from models import perturbed_copy, tiny_model

import specdec
from specdec.types import Accept, DeviceTree, Proposal, SamplingParams
from specdec.validate import ProtocolError, accept_flags, tree_flags

IDS = torch.tensor([[5, 9, 2, 77, 31, 8, 40, 5, 9]])
VOCAB = 128


@pytest.fixture(scope="module")
def pair():
    model = tiny_model("qwen3", scale=4.0)
    drafter = specdec.ModelDrafter(perturbed_copy(model, noise=0.02))
    want = model.generate(IDS, max_new_tokens=12, do_sample=False)
    return model, drafter, want


@dataclass(frozen=True)
class Broken:
    """``DDTree(8, 3)`` with one field of its trees broken by ``how`` (a policy of a user's: checked)."""

    how: str
    inner: specdec.DDTree = specdec.DDTree(budget=8, topk=3)

    @property
    def budget(self):
        return self.inner.budget

    @property
    def max_depth(self):
        return self.inner.max_depth

    reads = ("logq",)
    branching = True
    stochastic = False

    def build(self, proposal, root, depth, noise=None):
        tree = self.inner.build(proposal, root, depth, noise)
        t = {k: v.clone() for k, v in tree._asdict().items() if isinstance(v, torch.Tensor)}
        if self.how == "depth":
            t["depth"][:, 1] += 1
        elif self.how == "parent-after-child":
            t["parents"][:, 1] = 3
        elif self.how == "num_nodes":
            t["num_nodes"] = t["num_nodes"] + 1
        elif self.how == "token-range":
            t["tokens"][:, 1] = VOCAB + 5
        elif self.how == "root-token":  # slot 0 holds another token than the round's root
            t["tokens"][:, 0] = (t["tokens"][:, 0] + 1) % VOCAB
        elif self.how == "padding":  # the last slot made padding, its parent and depth kept
            t["valid"][:, -1] = False
            t["num_nodes"] = t["valid"].sum(1)
            t["parents"][:, -1], t["depth"][:, -1] = 0, 1
        elif self.how == "list":
            return DeviceTree(t["tokens"].tolist(), t["parents"], t["depth"], t["valid"], t["num_nodes"])
        elif self.how == "columns":
            return DeviceTree(t["tokens"][:, :-1], t["parents"], t["depth"], t["valid"], t["num_nodes"])
        elif self.how == "dtype":
            return DeviceTree(t["tokens"].int(), t["parents"], t["depth"], t["valid"], t["num_nodes"])
        return DeviceTree(**t, max_children=tree.max_children)


@dataclass(frozen=True)
class BrokenRule:
    """``Greedy()`` with its result broken by ``how`` (a rule of a user's: checked)."""

    how: str
    name = "broken"

    def check(self, sampling, tree):
        return None

    def uses_noise(self, sampling):
        return False

    def accept(self, tree, logits, sampling, noise, max_depth, proposal=None):
        a = specdec.Greedy().accept(tree, logits, sampling, noise, max_depth, proposal)
        if self.how == "num_path-0":
            return a._replace(num_path=torch.zeros_like(a.num_path))
        if self.how == "num_path-long":
            return a._replace(num_path=a.num_path + a.path.shape[1])
        if self.how == "foreign-token":
            return a._replace(tokens=torch.where(a.num_path[:, None] > 1, (a.tokens + 1) % VOCAB, a.tokens))
        if self.how == "not-a-chain":
            return a._replace(path=torch.where(a.num_path[:, None] > 1, a.path.flip(1), a.path))
        if self.how == "list":
            return Accept(a.path.tolist(), a.num_path, a.tokens)
        if self.how == "columns":
            return Accept(a.path[:, :-1], a.num_path, a.tokens[:, :-1])
        return a


POLICY_CASES = {
    "depth": "depth: depth disagrees with parents",
    "parent-after-child": "parents: a node's parent is not an earlier slot",
    "num_nodes": "num_nodes: num_nodes is not the number of real slots",
    "token-range": "tokens: a real node's token is outside the vocabulary",
    "root-token": r"tokens: slot 0 does not hold the round's root token",
    "padding": "padding: a padding slot has a parent or a depth",
    "list": "returned tokens as list: return a torch.Tensor",
    "columns": r"returned tokens of shape \[1, 8\]; the round needs \[1, 9\]",
    "dtype": "returned tokens as torch.int32; the round needs torch.int64",
}
RULE_CASES = {
    "num_path-0": "num_path: num_path is outside",
    "num_path-long": "num_path: num_path is outside",
    "foreign-token": "tokens: an accepted draft token differs from the tree's token",
    "not-a-chain": "path: the accepted path is not a chain of real nodes from the root",
    "list": "returned path as list",
    "columns": r"returned path of shape \[1, \d+\]; the round needs",
}


@pytest.mark.parametrize("how", list(POLICY_CASES))
def test_a_broken_policy_is_named_and_the_next_call_is_exact(pair, how):
    model, drafter, want = pair
    with pytest.raises(ProtocolError, match=rf"tree policy .*Broken.*{POLICY_CASES[how]}"):
        specdec.generate(model, IDS, drafter=drafter, tree=Broken(how), max_new_tokens=12)
    out = specdec.generate(model, IDS, drafter=drafter, tree=Broken("none"), max_new_tokens=12)
    assert torch.equal(out.sequences, want)  # a sound policy of a user's passes the checks; nothing was left stale


@pytest.mark.parametrize("how", ["parent-after-child", "depth", "root-token"])
def test_a_broken_policy_on_a_hybrid_is_named_and_the_next_call_is_exact(how):
    """On a hybrid target the recurrent layers walk the tree too: a broken tree reaches them sanitised (every parent
    before its child), so the round runs to its read and the error names the policy, as on a dense target."""
    from state.hybrid_harness import tiny_hybrid

    model = tiny_hybrid("qwen3_next")
    drafter = specdec.ModelDrafter(tiny_model("qwen3", scale=4.0))  # an attention model of the same vocabulary
    want = model.generate(IDS, max_new_tokens=10, do_sample=False)
    with pytest.raises(ProtocolError, match=rf"tree policy .*Broken.*{POLICY_CASES[how]}"):
        specdec.generate(model, IDS, drafter=drafter, tree=Broken(how), max_new_tokens=10)
    out = specdec.generate(model, IDS, drafter=drafter, tree=Broken("none"), max_new_tokens=10)
    assert torch.equal(out.sequences, want)


def test_a_drafter_missing_protocol_members_is_refused_by_name():
    """A drafter of a user's written from the protocol table but without ``reset`` and ``num_forwards`` is refused
    before anything runs, naming both."""

    class Partial:
        provides, target_layer_ids = ("paths",), None

        def validate(self, target, tree):
            return None

        def draft_depth(self, tree):
            return tree.max_depth

        def window(self, tree):
            return 1

        def forwards_per_round(self, tree):
            return 0

        def attach(self, target, capacity, batch=1):
            raise AssertionError("never reached")

    model = tiny_model("qwen3", scale=2.0)
    with pytest.raises(TypeError, match=r"lacks \['reset', 'num_forwards'\]"):
        specdec.generate(model, IDS, drafter=Partial(), tree=specdec.Chain(3), max_new_tokens=4)


@pytest.mark.parametrize("how", list(RULE_CASES))
def test_a_broken_rule_is_named_and_the_next_call_is_exact(pair, how):
    model, drafter, want = pair
    with pytest.raises(ProtocolError, match=rf"verification rule .*BrokenRule.*{RULE_CASES[how]}"):
        specdec.generate(model, IDS, drafter=drafter, tree=specdec.DDTree(8, topk=3), verifier=BrokenRule(how),
                         max_new_tokens=12)  # fmt: skip
    out = specdec.generate(model, IDS, drafter=drafter, tree=specdec.DDTree(8, topk=3), verifier=BrokenRule("none"),
                           max_new_tokens=12)  # fmt: skip
    assert torch.equal(out.sequences, want)


def test_a_policy_of_budget_zero_is_refused(pair):
    model, drafter, _ = pair

    @dataclass(frozen=True)
    class Empty(Broken):
        @property
        def budget(self):
            return 0

    with pytest.raises(ValueError, match=r"tree policy Empty: budget=0 must be an int >= 1"):
        specdec.generate(model, IDS, drafter=drafter, tree=Empty("none"), max_new_tokens=4)


def test_a_users_policy_cannot_hand_the_rules_its_own_q(pair, monkeypatch):
    """``DeviceTree.draft_probs`` (the q a sampled policy drew from, read by the rules that weigh q) is kept only
    from specdec's own policies: a user's policy that carries a wrong one decodes as the built-in policy with the
    same seed. Kept (the trust check planted away), the wrong q changes the tokens: the comparison can fail."""
    model, drafter, _ = pair

    @dataclass(frozen=True)
    class StochasticDDTree(specdec.StochasticDDTree):  # a user's subclass: its trees are checked
        def build(self, proposal, root, depth, noise=None):
            tree = super().build(proposal, root, depth, noise)
            q = tree.draft_probs
            return tree if q is None else tree._replace(draft_probs=torch.full_like(q, 1.0 / q.shape[-1]))

    def run(policy):
        out = specdec.generate(model, IDS, drafter=drafter, tree=policy, do_sample=True, temperature=1.0, top_k=0,
                               verifier=specdec.MultiDraftRejection(replacement=False), max_new_tokens=24,
                               generator=torch.Generator().manual_seed(7))  # fmt: skip
        return out.sequences if hasattr(out, "sequences") else out

    want = run(specdec.StochasticDDTree(8, 3))
    assert torch.equal(run(StochasticDDTree(8, 3)), want)
    monkeypatch.setattr("specdec.engine.trusted", lambda obj: True)
    assert not torch.equal(run(StochasticDDTree(8, 3)), want)


@pytest.mark.parametrize("seed", range(6))
def test_built_in_policies_and_rules_keep_the_invariants(seed):
    """Property test: random proposals (peaked or flat), every built-in policy, greedy and sampled rules."""
    gen = torch.Generator().manual_seed(seed)
    batch, depth = 3, 5
    logq = torch.log_softmax(torch.randn(batch, depth, VOCAB, generator=gen) * (4.0 if seed % 2 else 0.5), -1)
    root = torch.randint(VOCAB, (batch,), generator=gen)
    proposal = Proposal(logq=logq)
    policies = [specdec.Chain(4), specdec.DDTree(budget=7, topk=3), specdec.DDTree(budget=15, topk=8),
                specdec.StochasticDDTree(budget=9, topk=4)]  # fmt: skip
    for policy in policies:
        noise = torch.rand(batch, depth, VOCAB, generator=gen) if getattr(policy, "stochastic", False) else None
        tree = policy.build(proposal, root, min(depth, policy.max_depth), noise)
        assert tree_flags(tree, VOCAB).eq(0).all(), (policy, tree_flags(tree, VOCAB))
        logits = torch.randn(batch, tree.num_slots, VOCAB, generator=gen) * 3
        for rule, sampling in ((specdec.Greedy(), SamplingParams()),
                               (specdec.SampleMatch(), SamplingParams(do_sample=True, temperature=1.0))):  # fmt: skip
            noise = torch.rand(batch, tree.num_slots, VOCAB, generator=gen)
            accept = rule.accept(tree, logits, sampling, noise, min(depth, policy.max_depth), proposal)
            assert accept_flags(accept, tree, VOCAB).eq(0).all(), (policy, rule)


def test_the_checks_catch_what_they_name():
    """The bitmask on hand-made trees: each broken field sets its own bit, a sound tree none."""
    tokens = torch.tensor([[3, 4, 5, 6]])
    parents = torch.tensor([[-1, 0, 1, -1]])
    depth = torch.tensor([[0, 1, 2, 0]])
    valid = torch.tensor([[True, True, True, False]])
    sound = DeviceTree(tokens, parents, depth, valid, torch.tensor([3]))
    assert tree_flags(sound, VOCAB).item() == 0
    assert tree_flags(sound._replace(parents=torch.tensor([[-1, 2, 1, -1]])), VOCAB).item() & 1
    assert tree_flags(sound._replace(depth=torch.tensor([[0, 1, 1, 0]])), VOCAB).item() & 2
    assert tree_flags(sound._replace(valid=torch.tensor([[True, False, True, False]])), VOCAB).item() & 4
    assert tree_flags(sound._replace(num_nodes=torch.tensor([4])), VOCAB).item() & 8
    assert tree_flags(sound._replace(tokens=torch.tensor([[3, -1, 5, 6]])), VOCAB).item() & 16
    assert tree_flags(sound._replace(parents=torch.tensor([[-1, 0, 1, 0]])), VOCAB).item() & 32
    assert tree_flags(sound, VOCAB, torch.tensor([3])).item() == 0
    assert tree_flags(sound, VOCAB, torch.tensor([7])).item() == 128
    good = Accept(path=torch.tensor([[0, 1, 2]]), num_path=torch.tensor([3]), tokens=torch.tensor([[4, 5, 9]]))
    assert accept_flags(good, sound, VOCAB).item() == 0
    assert accept_flags(good._replace(num_path=torch.tensor([4])), sound, VOCAB).item() & 256
    assert accept_flags(good._replace(path=torch.tensor([[0, 2, 1]])), sound, VOCAB).item() & 512
    assert accept_flags(good._replace(tokens=torch.tensor([[4, 6, 9]])), sound, VOCAB).item() & 1024
    assert accept_flags(good._replace(tokens=torch.tensor([[4, 5, VOCAB]])), sound, VOCAB).item() & 2048


class _BrokenDrafter(specdec.ModelDrafter):
    """A drafter of a user's (defined outside specdec: checked) whose proposals are broken by ``how``."""

    def __init__(self, model, how: str) -> None:
        super().__init__(model)
        self.how = how

    def attach(self, target, capacity, batch=1):
        state = super().attach(target, capacity, batch)
        propose, how = state.propose, self.how

        def broken(root, prefix, depth, span):
            p = propose(root, prefix, depth, span)
            if how == "wide":  # a draft vocabulary larger than the target's, not mapped
                return p._replace(logq=torch.cat([p.logq, p.logq], -1))
            if how == "list":
                return p._replace(logq=p.logq.tolist())
            if how == "int":
                return p._replace(logq=p.logq.long())
            if how == "positive":  # scores, not log-probabilities
                return p._replace(logq=p.logq + 5.0)
            if how == "nan":  # a few NaN entries (NaN > 0 is False: not caught as "above 0")
                logq = p.logq.clone()
                logq[..., :5] = float("nan")
                return p._replace(logq=logq)
            if how == "no-paths":  # no match this round, said as zero paths
                empty = torch.zeros(p.logq.shape[0], 0, 1, dtype=torch.long, device=p.logq.device)
                return Proposal(paths=empty, path_lengths=empty[..., 0])
            # paths whose first token lies outside the vocabulary
            top = p.logq.argmax(-1)  # [B, D]
            paths = top[:, None, :].clone()
            paths[:, 0, 0] = VOCAB + 5
            lengths = torch.full(paths.shape[:2], paths.shape[2], dtype=torch.long, device=paths.device)
            return Proposal(paths=paths, path_lengths=lengths)

        state.propose = broken
        return state


@pytest.mark.parametrize(
    ("how", "tree", "match"),
    [
        ("wide", specdec.DDTree(budget=8, topk=3), r"drafter .*_BrokenDrafter returned logq of shape \[1, \d+, 256\]; "
         r"the round needs \[1, D, 128\]"),
        ("list", specdec.Chain(4), r"drafter .*_BrokenDrafter returned logq as list"),
        ("int", specdec.DDTree(budget=8, topk=3), r"returned logq as torch.int64: return float log-probabilities"),
        ("no-paths", specdec.DDTree(budget=8), r"returned paths of shape \[1, 0, 1\]; the round needs \[1, M, L\] "
         r"int64 with M >= 1 \(a round without a draft: one path of length 0"),
        ("no-paths", specdec.Chain(4), r"returned paths of shape \[1, 0, 1\]"),
        ("positive", specdec.DDTree(budget=8, topk=3), r"drafter .*_BrokenDrafter: logq: a drafted log-probability is "
         r"above 0 .*fix: return log_softmax over the vocabulary"),
        ("positive", specdec.Chain(4), r"logq: a drafted log-probability is above 0"),
        ("nan", specdec.DDTree(budget=8, topk=3), r"drafter .*_BrokenDrafter: logq: a drafted log-probability is NaN"),
        ("nan", specdec.DDTree(budget="auto", topk=3), r"logq: a drafted log-probability is NaN .*fix: return "
         r"log-probabilities that are finite or -inf"),
        ("paths", specdec.DDTree(budget=8), r"drafter .*_BrokenDrafter \(its proposal, through tree policy "
         r"specdec.trees.policies.DDTree\): tokens: a real node's token is outside the vocabulary"),
    ],
)  # fmt: skip
def test_a_users_drafter_with_a_broken_proposal_fails_loudly(pair, how, tree, match):
    """A drafter of a user's is checked as a policy is: the proposal's type, shape (the target's vocabulary) and
    dtype on the host, the tokens of the tree a built-in policy makes of it on the device. The next call with a
    sound drafter equals HF."""
    model, drafter, want = pair
    bad = _BrokenDrafter(perturbed_copy(model, noise=0.02), how)
    with pytest.raises(ProtocolError, match=match):
        specdec.generate(model, IDS, max_new_tokens=12, drafter=bad, tree=tree)
    out = specdec.generate(model, IDS, max_new_tokens=12, drafter=drafter, tree=tree)
    assert torch.equal(out.sequences, want)


class _EqChain(specdec.Chain):
    """A user's policy that defines ``__eq__`` without ``__hash__`` (Python then makes it unhashable)."""

    def __eq__(self, other):
        return isinstance(other, _EqChain) and self.k == other.k


class _EqGreedy(specdec.Greedy):
    def __eq__(self, other):
        return isinstance(other, _EqGreedy)


@pytest.mark.parametrize("what", ["tree", "verifier"])
def test_an_unhashable_policy_or_rule_is_refused_before_the_prefill_with_the_fix(pair, what):
    """Rounds are cached by the policy's and rule's value: one that cannot be hashed is refused by name, with the
    fix, before anything is built; the next call equals HF."""
    model, drafter, want = pair
    kwargs = {"tree": _EqChain(4)} if what == "tree" else {"tree": specdec.Chain(4), "verifier": _EqGreedy()}
    kind = "tree policy" if what == "tree" else "verification rule"
    with pytest.raises(TypeError, match=rf"{kind} .*_Eq\w+ is not hashable .*frozen dataclass"):
        specdec.generate(model, IDS, max_new_tokens=12, drafter=drafter, **kwargs)
    out = specdec.generate(model, IDS, max_new_tokens=12, drafter=drafter, tree=specdec.Chain(4))
    assert torch.equal(out.sequences, want)
