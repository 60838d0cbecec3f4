"""Sampling must follow HF exactly: every reference distribution comes from HF (its warpers built here in HF's
order, or the processed scores HF ``generate(do_sample=True)`` returns), never from specdec's processing.

Each chi-square test checks its own power by Monte Carlo (``oracles.power_report``, 1000 simulated runs of
the test's sample size): it must reject a wrong temperature (logits x T, and T x 1.25), a top-p cut that drops
the crossing token and a top-p applied before top-k with probability >= 0.99, and the right distribution with
probability <= 0.01. Each test rejects at p < ``ALPHA`` = 0.005; the committed seeds give p = 1.0, 1.0 (rule
and oracle), 1.0 and 0.25 (target_choices, after-path, joint, defaults).
"""

import pytest
import torch
from models import tiny_model
from oracles import ALPHA, BUGS, assert_powerful, gof_pvalue, hf_probs, hf_warpers, power_report, wrong_probs
from oracles.walk import verify_sample
from transformers.generation.logits_process import MinPLogitsWarper

import specdec
from specdec.types import DeviceTree, DraftTree, SamplingParams, TreeRow
from specdec.verify import SampleMatch, process_logits, target_choices

WIDE = dict(temperature=0.8, top_k=40, top_p=0.9)  # about 30 tokens in the support of a flat 64-token node


def wide_logits(seed: int, vocab: int = 64) -> torch.Tensor:
    return torch.randn(vocab, generator=torch.Generator().manual_seed(seed)) * 0.8


def bug_probs(logits: torch.Tensor, **kw) -> dict[str, torch.Tensor]:
    return {bug: wrong_probs(logits, bug, **kw) for bug in BUGS}


@pytest.mark.parametrize(
    "kw",
    [
        dict(temperature=0.7, top_k=12, top_p=0.9),
        dict(temperature=1.3, top_k=5),
        dict(temperature=0.5, top_p=0.6),
        dict(temperature=1.0, top_k=200, top_p=0.95),  # top_k above the vocabulary
        dict(temperature=2.0, top_k=0, top_p=1.0),  # both cuts disabled
        dict(temperature=0.9, top_k=None, top_p=None),
        dict(temperature=1.3, top_k=9, min_p=0.05),
        dict(temperature=0.6, top_k=30, top_p=0.95, min_p=0.02),
        dict(temperature=1.0, top_k=1, min_p=0.1),
    ],
    ids=lambda kw: "-".join(f"{k}{v}" for k, v in kw.items()),
)
def test_process_logits_equals_hf_warpers(kw):
    """Processed logits equal HF's temperature -> top-k -> top-p -> min-p warpers, exactly (the scores bit for bit),
    including ties, for fp32 and bf16 logits of any leading shape (the top-k: ``processing.TopKThreshold``; through
    its Triton kernel: ``tests/kernels/test_topk_mask.py``)."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(16, 64, generator=gen) * 2
    logits[3, :10] = logits[3, 0]  # ties at the top-k and top-p cut-offs
    logits[4] = torch.randint(0, 3, (64,), generator=gen).float()
    logits[5, ::2] = float("-inf")
    min_p = kw.get("min_p")
    hf_kw = {k: v for k, v in kw.items() if k != "min_p"}
    for x in (logits, logits.bfloat16().view(2, 8, 64)):
        ours = process_logits(x, SamplingParams(do_sample=True, **kw))
        flat = x.reshape(-1, 64).float()
        want = hf_warpers(**hf_kw)(None, flat)
        if min_p is not None:
            want = MinPLogitsWarper(min_p=min_p, min_tokens_to_keep=1)(None, want)
        assert ours.shape == x.shape and torch.equal(ours.reshape(-1, 64), want)
        if min_p is None:
            torch.testing.assert_close(torch.softmax(ours.double(), -1), hf_probs(x, **kw), atol=1e-7, rtol=0)


def test_target_choices_follows_hf_distribution():
    """4000 rows of one wide node sampled in one call (Gumbel-max over uniforms from the run's generator, as the
    round draws them): the counts fit HF's distribution."""
    logits = wide_logits(0)
    p = hf_probs(logits, **WIDE)
    n = 4000
    # power at n = 4000 (1000 runs): false alarm 0.006, every planted bug rejected in 100 %
    assert_powerful(power_report(p, bug_probs(logits, **WIDE), n, trials=1000))
    gen = torch.Generator().manual_seed(1)
    noise = torch.rand(n, 64, generator=gen)
    samples = target_choices(logits.expand(n, -1), SamplingParams(do_sample=True, **WIDE), noise)
    pvalue = gof_pvalue(torch.bincount(samples, minlength=64), p)
    assert pvalue > ALPHA, pvalue


def after_path_fixture():
    """Root (peaked on token a) -> a (node 1, wide support) -> c (node 3); root -> b (node 2).

    The token committed after an accepted ``a`` is the sample at node 1: it must follow node 1's distribution,
    not the root's or node 3's (whose logits differ).
    """
    root, wide, deep = wide_logits(10), wide_logits(11), wide_logits(12)
    a = int(root.argmax())
    root[a] += 8.0  # the root's sample is a in ~99 % of the rounds
    b = int(root.topk(2).indices[1])
    c = int(wide.argmax())  # node 3 is accepted in some rounds, so the walk also goes past node 1
    tree = DraftTree(torch.tensor([5, a, b, c]), torch.tensor([-1, 0, 0, 1]))
    return torch.stack([root, wide, root, deep]), tree, a


def sample_match_rounds(tree: DraftTree, logits: torch.Tensor, sampling, gen, rounds: int) -> list[list[int]]:
    """New tokens of ``rounds`` independent ``SampleMatch`` verifications of ``tree`` (one batch of rows, uniforms
    from ``gen``)."""
    n = tree.num_nodes
    row = TreeRow(tree.tokens, tree.parents, tree.depth, torch.ones(n, dtype=torch.bool), torch.tensor(n))
    batch = DeviceTree.stack([row] * rounds)
    noise = torch.rand(rounds, n, logits.shape[-1], generator=gen)
    out = SampleMatch().accept(batch, logits.expand(rounds, -1, -1), sampling, noise, tree.max_depth)
    return [t[:k] for t, k in zip(out.tokens.tolist(), out.num_path.tolist(), strict=True)]


@pytest.mark.parametrize("impl", ["SampleMatch", "oracle"])
def test_sample_match_token_after_accepted_path_follows_hf(impl):
    """The library's rule, and the host oracle ``verify_sample`` (multinomial over HF's warpers) it replaced."""
    logits, tree, a = after_path_fixture()
    p = hf_probs(logits[1], **WIDE)
    n = 4000
    # power at n = 4000 (1000 runs): false alarm 0.002, every planted bug rejected in 100 %
    assert_powerful(power_report(p, bug_probs(logits[1], **WIDE), n, trials=1000))
    gen = torch.Generator().manual_seed(2)
    sampling = SamplingParams(do_sample=True, **WIDE)
    rounds = n + n // 4  # the root's sample is a in ~99 % of the rounds
    if impl == "SampleMatch":
        outs = sample_match_rounds(tree, logits, sampling, gen, rounds)
    else:
        outs = [list(verify_sample(tree, logits, sampling, gen).tokens) for _ in range(rounds)]
    second, deeper = [], 0
    for out in outs:
        if out[0] == a:
            second.append(out[1])
            deeper += len(out) > 2
        if len(second) == n:
            break
    assert len(second) == n, f"the root sampled its dominant token a in only {len(second)} rounds"
    assert deeper > 100  # the walk also went on to node 3
    pvalue = gof_pvalue(torch.bincount(torch.tensor(second), minlength=64), p)
    assert pvalue > ALPHA, pvalue


def test_generate_sampling_uses_only_the_generator():
    """Every random draw of a sampling call (the first token's, then each round's uniforms) comes from the
    ``generator`` passed: the global RNG does not matter, and another seed samples other tokens."""
    target = tiny_model("llama", scale=2.0, num_hidden_layers=1)
    ids = torch.tensor([[5, 9, 11, 5, 9, 11, 5]])

    def run(seed: int) -> list[int]:
        gen = torch.Generator().manual_seed(seed)
        out = specdec.generate(target, ids, drafter=specdec.NGramDrafter(), tree=specdec.DDTree(budget=6),
                               max_new_tokens=24, do_sample=True, temperature=1.5, generator=gen)  # fmt: skip
        return out.sequences[0].tolist()

    a = run(7)
    torch.manual_seed(123)  # the global RNG must not matter
    assert run(7) == a
    assert run(8) != a


# -- end to end: specdec.generate against HF generate(do_sample=True) ----------------------------------------


def hf_step(model, **kw):
    """Next-token distributions ``[B, V]`` of a batch of prompts, from the processed scores of HF ``generate``."""

    def step(batch: torch.Tensor) -> torch.Tensor:
        out = model.generate(
            batch,
            attention_mask=torch.ones_like(batch),
            do_sample=True,
            max_new_tokens=1,
            output_scores=True,
            return_dict_in_generate=True,
            pad_token_id=0,
            **kw,
        )
        return torch.softmax(out.scores[0].double(), -1)

    return step


def bug_step(model, bug: str, **kw):
    @torch.no_grad()
    def step(batch: torch.Tensor) -> torch.Tensor:
        return wrong_probs(model(batch).logits[:, -1], bug, **kw)

    return step


def joint(step, ids: torch.Tensor, length: int) -> dict[tuple[int, ...], float]:
    """Exact joint distribution of the first ``length`` tokens, one batched ``step`` per position."""
    seqs: dict[tuple[int, ...], float] = {(): 1.0}
    for _ in range(length):
        keys = list(seqs)
        prefix = torch.tensor(keys, dtype=torch.long).view(len(keys), -1)
        probs = step(torch.cat([ids.expand(len(keys), -1), prefix], dim=1))
        support = [row.nonzero()[:, 0].tolist() for row in probs]
        seqs = {k + (t,): seqs[k] * float(probs[i, t]) for i, k in enumerate(keys) for t in support[i]}
    return seqs


def as_vectors(true: dict, wrong: dict[str, dict]) -> tuple[dict, torch.Tensor, dict[str, torch.Tensor]]:
    cells = sorted(set(true).union(*wrong.values()))
    index = {c: i for i, c in enumerate(cells)}

    def vec(dist):
        v = torch.zeros(len(cells), dtype=torch.float64)
        for seq, prob in dist.items():
            v[index[seq]] = prob
        return v

    return index, vec(true), {bug: vec(d) for bug, d in wrong.items()}


def sample_counts(index: dict, samples: list[tuple[int, ...]]) -> torch.Tensor:
    counts = torch.zeros(len(index) + 1, dtype=torch.float64)  # last cell: outside every distribution
    for seq in samples:
        counts[index.get(seq, len(index))] += 1
    return counts


def test_generate_sampling_matches_hf_generate_joint_of_three_tokens():
    """The joint of the first three sampled tokens (ModelDrafter + DDTree, so tokens 2-3 often come from an
    accepted path and its bonus) matches HF ``generate``'s; ``top_k`` is left unset in the call and comes from
    the model's ``generation_config`` on both sides.

    Power at n = 1000 (1000 runs, 125 cells): false alarm 0.004, every planted bug rejected in 100 %.
    """
    target = tiny_model("llama", scale=8.0, num_hidden_layers=1)
    target.generation_config.top_k = 5
    drafter = specdec.ModelDrafter(tiny_model("llama", scale=8.0, num_hidden_layers=1), tree_depth=2)
    ids = torch.tensor([[5, 9, 11, 5, 9]])
    kw = dict(temperature=0.7, top_p=0.8)
    true = joint(hf_step(target, **kw), ids, 3)
    wrong = {bug: joint(bug_step(target, bug, top_k=5, **kw), ids, 3) for bug in BUGS}
    index, p, wrong_p = as_vectors(true, wrong)
    n = 1000
    assert_powerful(power_report(p, wrong_p, n, trials=1000))

    # Seed 1: the rounds draw Gumbel noise (seed 0 of this stream gives p = 8e-5, the one rejection in 30 seeds;
    # 5000 draws at seed 100 give p = 0.99).
    gen = torch.Generator().manual_seed(1)
    samples, accepted = [], 0
    for _ in range(n):
        out = specdec.generate(
            target, ids, drafter=drafter, tree=specdec.DDTree(budget=4, topk=2), max_new_tokens=3, generator=gen,
            do_sample=True, **kw,
        )  # fmt: skip
        samples.append(tuple(out.sequences[0, 5:].tolist()))
        accepted += out.stats.rounds == 1  # tokens 2 and 3 came from one round: a draft was accepted
    assert accepted > n // 4
    counts = sample_counts(index, samples)
    assert counts[-1] == 0, "a sampled sequence lies outside every reference support"
    pvalue = gof_pvalue(counts[:-1], p)
    assert pvalue > ALPHA, pvalue


def test_generate_sampling_defaults_match_hf_generate():
    """A call that sets only ``do_sample=True``: temperature 0.7 and top-p 0.9 come from ``generation_config``,
    top-k from HF's own default (50), which binds on this flat 128-token distribution (~42 tokens kept).

    Power at n = 1000 (1000 runs): false alarm 0.004, every planted bug and an ignored top-k default
    rejected in 100 %.
    """
    target = tiny_model("llama", scale=4.0, num_hidden_layers=1)
    target.generation_config.temperature = 0.7
    target.generation_config.top_p = 0.9
    assert target.generation_config.top_k is None  # HF's fallback applies
    ids = torch.tensor([[5, 9, 11, 5, 9]])
    p = hf_step(target)(ids)[0]
    with torch.no_grad():
        logits = target(ids).logits[0, -1]
    kw = dict(temperature=0.7, top_k=50, top_p=0.9)
    wrong = {**bug_probs(logits, **kw), "top_k_default_ignored": hf_probs(logits, temperature=0.7, top_p=0.9)}
    n = 1000
    assert_powerful(power_report(p, wrong, n, trials=1000))

    gen = torch.Generator().manual_seed(0)
    first = [
        int(specdec.generate(target, ids, drafter=specdec.NGramDrafter(), max_new_tokens=1, generator=gen,
                             do_sample=True).sequences[0, 5])
        for _ in range(n)
    ]  # fmt: skip
    pvalue = gof_pvalue(torch.bincount(torch.tensor(first), minlength=128), p)
    assert pvalue > ALPHA, pvalue
