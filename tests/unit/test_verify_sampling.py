"""Sample-and-match must emit genuine target samples: chi-square tests that can fail."""

import torch
from models import tiny_model

import specdec
from specdec.types import DraftTree, SamplingParams
from specdec.verify import process_logits, verify_sample

SAMPLING = SamplingParams(do_sample=True, temperature=0.7, top_k=12, top_p=0.9)


def chi2_pvalue(counts: torch.Tensor, probs: torch.Tensor, min_expected: float = 5.0) -> float:
    """Pearson chi-square goodness of fit; cells with small expectation are pooled."""
    n = counts.sum()
    expected = probs * n
    big = expected >= min_expected
    obs = torch.cat([counts[big], counts[~big].sum(0, keepdim=True)])
    exp = torch.cat([expected[big], expected[~big].sum(0, keepdim=True)])
    keep = exp > 0
    if (obs[~keep] > 0).any():
        return 0.0  # a token outside the support was emitted
    obs, exp = obs[keep], exp[keep]
    if obs.numel() == 1:
        return 1.0  # a one-point distribution, and every sample hit it
    stat = ((obs - exp) ** 2 / exp).sum()
    dof = obs.numel() - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), stat.double() / 2))


def run_tree(logits: torch.Tensor, tree: DraftTree, sampling: SamplingParams, n: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    return [verify_sample(tree, logits, sampling, gen).tokens for _ in range(n)]


def fixture_tree():
    torch.manual_seed(0)
    logits = torch.randn(4, 32) * 1.5  # [N, V]
    p_root = torch.softmax(process_logits(logits[:1], SAMPLING), -1)[0]
    a, b = p_root.topk(2).indices.tolist()
    # root -> a -> (child), root -> b : the walk accepts a or b with high probability
    tree = DraftTree(torch.tensor([5, a, b, 7]), torch.tensor([-1, 0, 0, 1]))
    return logits, tree, a


def test_verify_sample_first_token_matches_target():
    logits, tree, _ = fixture_tree()
    outs = run_tree(logits, tree, SAMPLING, 6000, seed=1)
    counts = torch.bincount(torch.tensor([o[0] for o in outs]), minlength=32).double()
    p = torch.softmax(process_logits(logits[:1], SAMPLING), -1)[0].double()
    assert chi2_pvalue(counts, p) > 0.01


def test_verify_sample_token_after_accepted_path_matches_target():
    logits, tree, a = fixture_tree()
    outs = run_tree(logits, tree, SAMPLING, 6000, seed=2)
    second = torch.tensor([o[1] for o in outs if o[0] == a])
    assert second.numel() > 1000
    counts = torch.bincount(second, minlength=32).double()
    p = torch.softmax(process_logits(logits[1:2], SAMPLING), -1)[0].double()  # node 1 carries token a
    assert chi2_pvalue(counts, p) > 0.01


def test_chi2_detects_a_wrong_distribution():
    """The test above has power: samples at temperature 1.0 fail against the 0.7 distribution."""
    logits, tree, _ = fixture_tree()
    wrong = SamplingParams(do_sample=True, temperature=1.0, top_k=12, top_p=0.9)
    outs = run_tree(logits, tree, wrong, 6000, seed=3)
    counts = torch.bincount(torch.tensor([o[0] for o in outs]), minlength=32).double()
    p = torch.softmax(process_logits(logits[:1], SAMPLING), -1)[0].double()
    assert chi2_pvalue(counts, p) < 1e-4


def test_process_logits_matches_hf_top_k_top_p_order():
    torch.manual_seed(0)
    logits = torch.randn(3, 50)
    out = process_logits(logits, SAMPLING)
    scaled = logits / 0.7
    kth = scaled.topk(12, dim=-1).values[:, -1:]
    kept = scaled >= kth
    assert torch.equal(torch.isfinite(out) & (out > -1e30), torch.isfinite(out) & (out > -1e30) & kept)
    assert ((out > -1e30).sum(-1) <= 12).all()


def test_verify_sample_uses_only_the_generator():
    logits, tree, _ = fixture_tree()
    a = run_tree(logits, tree, SAMPLING, 50, seed=7)
    torch.manual_seed(123)  # the global RNG must not matter
    b = run_tree(logits, tree, SAMPLING, 50, seed=7)
    assert a == b


def test_generate_sampling_end_to_end_first_two_tokens():
    """Whole loop at temperature 0.7 / top-k / top-p: the first token and the token after it follow the target."""
    target = tiny_model("llama", scale=3.0, num_hidden_layers=1)
    draft = specdec.ModelDrafter(tiny_model("llama", scale=3.0, num_hidden_layers=1))  # same weights: accepts
    tree = specdec.DDTree(budget=6, topk=2)
    ids = torch.tensor([[5, 9, 11, 5, 9]])
    gen = torch.Generator().manual_seed(0)
    kw = dict(do_sample=True, temperature=0.7, top_k=12, top_p=0.9)
    outs = [
        specdec.generate(target, ids, drafter=draft, tree=tree, max_new_tokens=3, generator=gen, **kw)
        .sequences[0, 5:]
        .tolist()
        for _ in range(400)
    ]
    with torch.no_grad():
        p0 = torch.softmax(process_logits(target(ids).logits[:, -1], SAMPLING), -1)[0].double()
        # marginal of the second token: sum_x p0(x) p(. | prompt, x)
        support = p0.nonzero().squeeze(-1)
        ext = torch.cat([ids.expand(support.numel(), -1), support[:, None]], dim=1)
        p1 = torch.softmax(process_logits(target(ext).logits[:, -1], SAMPLING), -1).double()
        p_second = (p0[support, None] * p1).sum(0)
    counts = torch.bincount(torch.tensor([o[0] for o in outs]), minlength=128).double()
    assert chi2_pvalue(counts, p0) > 0.01
    second = torch.bincount(torch.tensor([o[1] for o in outs]), minlength=128).double()
    assert chi2_pvalue(second, p_second) > 0.01
