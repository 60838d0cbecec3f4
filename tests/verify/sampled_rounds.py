"""Rounds of the sampled policies and the rules that weigh q, many at once, against a synthetic target whose
next-token logits after every prefix are a fixed table (so each node's logits are known exactly), and the HF
distributions every test compares with (``oracles.hf_probs``: HF's own warpers on the table's logits).

A round is one row of a batch: its own tree (the policy's draws from its own uniforms) and its own uniforms for
the rule. The tests count the tokens the rounds emit (``Emitted``) and compare with HF.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from models import perturbed_copy, tiny_model
from oracles import ALPHA, assert_powerful, gof_pvalue, hf_probs, power_report

import specdec
from specdec.types import Proposal, SamplingParams

V = 16
DEPTH = 3
ROOT = 5  # the last committed token (the table's logits do not depend on it)
SAMPLING = SamplingParams(do_sample=True, temperature=0.9, top_k=12, top_p=0.95)
SAMPLING_WIDE = SamplingParams(do_sample=True, temperature=1.3)  # no cut: every token in both supports
ROUNDS = 16000  # rounds per rule-level test: the power check of ``assert_fits`` passes at this size
E2E_CALLS = 1200  # generate calls per end-to-end test: the power check of ``assert_fits`` passes at this size


class Table:
    """The synthetic target: logits ``[V]`` after every prefix of at most ``DEPTH`` drafted tokens.

    ``peaked``: along the argmax path, the most likely token of the first ``peaked`` depths gets +6, so nearly
    every round accepts those tokens and goes on (the rounds then test the token after an accepted path);
    otherwise every depth is spread (p_max ~ 0.15).
    """

    def __init__(self, seed: int = 0, scale: float = 0.6, peaked: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.levels = [torch.randn((V,) * (d + 1), generator=gen) * scale for d in range(DEPTH + 1)]
        prefix: tuple[int, ...] = ()
        for d in range(peaked):
            row = self.levels[d][prefix]
            top = int(row.argmax())
            row[top] += 6.0
            prefix = (*prefix, top)

    def after(self, *prefix: int) -> torch.Tensor:
        return self.levels[len(prefix)][prefix]

    def node_logits(self, tree) -> torch.Tensor:
        """``[B, S, V]``: the logits after each node's root-to-node path."""
        batch, slots = tree.tokens.shape
        path = torch.zeros(batch, slots, DEPTH, dtype=torch.long)  # path[.., d] = token at depth d + 1
        node = torch.arange(slots).expand(batch, -1)
        for _ in range(DEPTH):  # climb to the root: each ancestor's token sits at its depth
            d = tree.depth.gather(1, node)
            token = torch.where(d > 0, tree.tokens.gather(1, node), 0)
            path += torch.nn.functional.one_hot((d - 1).clamp(min=0), DEPTH) * token[..., None]
            node = torch.where(d > 0, tree.parents.gather(1, node).clamp(min=0), node)
        out = torch.empty(batch, slots, V)
        for d in range(DEPTH + 1):
            index = torch.zeros(batch, slots, dtype=torch.long)
            for e in range(d):
                index = index * V + path[..., e]
            rows = self.levels[d].reshape(-1, V)[index]
            out = torch.where((tree.depth == d)[..., None], rows, out)
        return out


def draft_logq(table: Table, noise: float = 0.6, seed: int = 1) -> torch.Tensor:
    """A drafter's per-depth ``logq [DEPTH, V]``: the table's logits along its own argmax path, perturbed."""
    gen = torch.Generator().manual_seed(seed)
    rows, prefix = [], ()
    for _ in range(DEPTH):
        logits = table.after(*prefix)
        rows.append(torch.log_softmax(logits + noise * torch.randn(V, generator=gen), -1))
        prefix = (*prefix, int(logits.argmax()))
    return torch.stack(rows)


@dataclass
class Emitted:
    """What ``n`` rounds emitted: ``tokens [n, P]`` (accepted drafts then the bonus) and ``num_path [n]``."""

    tokens: torch.Tensor
    num_path: torch.Tensor

    def first(self) -> torch.Tensor:
        return self.tokens[:, 0]

    def after_accepted(self, token: int) -> torch.Tensor:
        """The round's second token, in rounds whose first token ``token`` was an accepted draft."""
        keep = (self.num_path >= 2) & (self.tokens[:, 0] == token)
        return self.tokens[keep, 1]

    def most_accepted(self) -> int:
        """The draft token most often accepted first."""
        firsts = self.tokens[self.num_path >= 2, 0]
        return int(torch.bincount(firsts, minlength=V).argmax())


def run_rounds(policy, rule, n: int, *, seed: int, table: Table | None = None, logq: torch.Tensor | None = None,
               sampling: SamplingParams = SAMPLING) -> Emitted:  # fmt: skip
    """``n`` independent rounds of ``policy`` + ``rule`` (each row its own draws), as the engine runs one."""
    table = table or Table()
    logq = draft_logq(table) if logq is None else logq
    policy = policy.with_sampling(sampling)
    rule.check(sampling, policy)
    gen = torch.Generator().manual_seed(seed)
    depth = min(policy.max_depth, logq.shape[0])
    proposal = Proposal(logq=logq[:depth].expand(n, -1, -1))
    root = torch.full((n,), ROOT, dtype=torch.long)
    tree_noise = torch.rand(n, depth, V, generator=gen) if policy.stochastic else None
    tree = policy.build(proposal, root, depth, tree_noise)
    noise = torch.rand(n, tree.num_slots, V, generator=gen) if rule.uses_noise(sampling) else None
    out = rule.accept(tree, table.node_logits(tree), sampling, noise, depth, proposal)
    return Emitted(out.tokens, out.num_path)


def probs(logits: torch.Tensor, sampling: SamplingParams = SAMPLING) -> torch.Tensor:
    """HF's sampling distribution of ``logits`` (its warpers, in its order)."""
    return hf_probs(logits, temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p)


def planted(p: torch.Tensor, shift: float = 0.02) -> torch.Tensor:
    """``p`` with its most likely cell's probability raised by ``shift`` (absolute), the others scaled down."""
    top = int(p.argmax())
    out = p * (1 - (p[top] + shift)) / (1 - p[top])
    out[top] = p[top] + shift
    return out


def ratio_bugs(p: torch.Tensor, q: torch.Tensor) -> dict[str, torch.Tensor]:
    """Output distributions of one speculative-sampling step (draft ``x ~ q``, accept with ``min(1, p/q)``, else
    draw from ``norm(max(0, p - q))``) with a bug that acts only on the tokens where ``p / q > 1``:

    * ``accept_capped_above_1``: those tokens accepted with probability 0.9 instead of 1 (the rest of the step
      exact), total-variation distance 0.02 from ``p`` on the tables of these tests;
    * ``residual_squared``: the residual drawn from ``norm(max(0, p - q) ** 2)`` (it is non-zero only there).

    The exact step returns ``p``; these are the alternatives a chi-square test of the emitted token must reject
    besides the planted +2 % of the most likely cell."""
    p, q = p.double(), q.double()
    above = p >= q  # p / q >= 1 (q = 0 included)
    residual = (p - q).clamp(min=0.0)
    capped = torch.where(above, 0.9 * q, p)  # accepted mass per token
    out = {"accept_capped_above_1": capped + (1.0 - capped.sum()) * residual / residual.sum()}
    kept = torch.minimum(p, q)
    out["residual_squared"] = kept + (1.0 - kept.sum()) * residual**2 / (residual**2).sum()
    return out


def assert_fits(samples: torch.Tensor, p: torch.Tensor, *, power: bool = True, q: torch.Tensor | None = None) -> float:
    """The counts of ``samples`` fit ``p`` at ``ALPHA``; with ``power``, first check by Monte Carlo (1000 runs of
    this sample size) that the test rejects a planted +2 % bias of ``p``'s most likely cell with probability
    >= 0.99 and ``p`` itself with probability <= 0.01; given the draft distribution ``q``, also the bugs that act
    only where ``p / q > 1`` (:func:`ratio_bugs`)."""
    n = samples.numel()
    if power:
        wrong = {"planted_2pct": planted(p), **(ratio_bugs(p, q) if q is not None else {})}
        assert_powerful(power_report(p, wrong, n, trials=1000))
    pvalue = gof_pvalue(torch.bincount(samples, minlength=p.numel()).double(), p)
    assert pvalue > ALPHA, pvalue
    return pvalue


# -- end to end -----------------------------------------------------------------------------------------------
E2E_PROMPT = torch.tensor([[5, 9, 11, 5, 9]])
E2E_SAMPLING = dict(temperature=1.0, top_k=8)


def e2e_models():
    """A tiny target (fast to run, spread next-token distributions) and a drafter it mostly accepts."""
    kw = dict(num_hidden_layers=1, hidden_size=32, intermediate_size=64, num_attention_heads=2, num_key_value_heads=1)
    target = tiny_model("qwen3", scale=3.0, **kw)
    return target, specdec.ModelDrafter(perturbed_copy(target, noise=0.3), tree_depth=2)


def hf_joint(target, length: int, **kw) -> dict[tuple[int, ...], float]:
    """HF's exact joint of the first ``length`` sampled tokens: the processed scores of HF ``generate``."""
    seqs: dict[tuple[int, ...], float] = {(): 1.0}
    for _ in range(length):
        keys = list(seqs)
        batch = torch.cat(
            [E2E_PROMPT.expand(len(keys), -1), torch.tensor(keys, dtype=torch.long).view(len(keys), -1)], 1
        )
        out = target.generate(batch, attention_mask=torch.ones_like(batch), do_sample=True, max_new_tokens=1,
                              output_scores=True, return_dict_in_generate=True, pad_token_id=0, **kw)  # fmt: skip
        step = torch.softmax(out.scores[0].double(), -1)
        seqs = {
            k + (t,): seqs[k] * float(step[i, t]) for i, k in enumerate(keys) for t in step[i].nonzero()[:, 0].tolist()
        }
    return seqs


def assert_generate_fits(tree, rule, n: int, length: int, *, seed: int = 0) -> None:
    """``n`` calls of ``specdec.generate`` (``length`` new tokens each): the joint of the tokens fits HF's, after a
    Monte-Carlo power check against a planted +2 % bias of the most likely sequence (see ``assert_fits``)."""
    target, drafter = e2e_models()
    true = hf_joint(target, length, **E2E_SAMPLING)
    cells = sorted(true)
    index = {c: i for i, c in enumerate(cells)}
    p = torch.tensor([true[c] for c in cells], dtype=torch.float64)
    gen = torch.Generator().manual_seed(seed)
    samples, multi = [], 0
    for _ in range(n):
        out = specdec.generate(target, E2E_PROMPT, drafter=drafter, tree=tree, verifier=rule, max_new_tokens=length,
                               do_sample=True, generator=gen, **E2E_SAMPLING)  # fmt: skip
        seq = tuple(out.sequences[0, E2E_PROMPT.shape[1] :].tolist())
        if seq not in index:
            pytest.fail(f"{seq} lies outside HF's support")
        samples.append(index[seq])
        multi += out.stats.tau > 1
    assert multi > n // 5, f"only {multi} of {n} calls accepted a draft"
    assert_fits(torch.tensor(samples), p)


# -- the checks each family runs ---------------------------------------------------------------------------------
def check_first_token(policy, rule, *, seed: int = 0) -> float:
    """The first token a round emits (an accepted depth-1 draft or the token drawn after rejecting them all)
    follows HF's distribution at the root."""
    table = Table()
    out = run_rounds(policy, rule, ROUNDS, seed=seed, table=table)
    assert (out.num_path >= 2).double().mean() > 0.2, "too few rounds accepted a draft"
    assert (out.num_path == 1).double().mean() > 0.05, "too few rounds rejected every depth-1 draft"
    # the drafter's q at depth 1, processed as the policy draws from it: the ratio bugs' alternatives
    return assert_fits(out.first(), probs(table.after()), q=probs(draft_logq(table)[0]))


def check_after_path(policy, rule, *, seed: int = 0, sampling: SamplingParams = SAMPLING_WIDE) -> float:
    """The token a round emits after accepting the root's dominant token ``a`` (an accepted draft, then the next
    accepted draft or the token drawn after it) follows HF's distribution after ``a`` (by default at another
    temperature than ``check_first_token`` and without cuts)."""
    table = Table(peaked=1)
    a = int(table.after().argmax())
    out = run_rounds(policy, rule, ROUNDS + ROUNDS // 8, seed=seed, table=table, sampling=sampling)
    second = out.after_accepted(a)
    assert second.numel() >= ROUNDS, f"only {second.numel()} rounds accepted {a} first"
    assert (out.num_path[out.num_path >= 2] >= 3).double().mean() > 0.2, "too few rounds went past depth 2"
    return assert_fits(second, probs(table.after(a), sampling))


def check_after_two(policy, rule, *, seed: int = 0, sampling: SamplingParams = SAMPLING_WIDE) -> float:
    """Rounds that accepted the dominant ``a`` then the dominant ``b``: the third token follows HF's distribution
    after ``(a, b)`` (depth 3: siblings' draws and corrections below an accepted node)."""
    table = Table(peaked=2)
    a = int(table.after().argmax())
    b = int(table.after(a).argmax())
    out = run_rounds(policy, rule, ROUNDS + ROUNDS // 4, seed=seed, table=table, sampling=sampling)
    third = out.tokens[(out.num_path >= 3) & (out.tokens[:, 0] == a) & (out.tokens[:, 1] == b), 2]
    assert third.numel() >= ROUNDS, third.numel()
    return assert_fits(third, probs(table.after(a, b), sampling))


_GREEDY: dict = {}
GREEDY_PROMPT = torch.tensor([[5, 9, 11, 5, 9, 11, 5, 9]])
GREEDY_NEW = 24


def check_greedy_limit(policy, rule) -> None:
    """At ``do_sample=False`` the call is token-identical to the target's own greedy ``generate``, and the drafter
    (a slightly perturbed copy of the target) gets drafts accepted."""
    if not _GREEDY:
        target = tiny_model("qwen3", scale=2.0)
        drafter = specdec.ModelDrafter(perturbed_copy(target, noise=0.05), tree_depth=3)
        ref = target.generate(GREEDY_PROMPT, do_sample=False, max_new_tokens=GREEDY_NEW, pad_token_id=0)
        _GREEDY.update(target=target, drafter=drafter, ref=ref)
    target, drafter = _GREEDY["target"], _GREEDY["drafter"]
    out = specdec.generate(target, GREEDY_PROMPT, drafter=drafter, tree=policy, verifier=rule,
                           max_new_tokens=GREEDY_NEW, do_sample=False)  # fmt: skip
    assert torch.equal(out.sequences, _GREEDY["ref"])
    assert out.stats.tau > 1.5, out.stats.tau
