"""Every exact (sampled policy, rule) pair runs inside the one round as tensor ops: no tensor value reaches the host
while a round runs (on CUDA each read would be a sync inside a captured graph), greedy and sampling."""

import pytest
import torch
from host_reads import spy_round_reads
from models import perturbed_copy, tiny_model

import specdec

PAIRS = {
    "speculative-sampling": (specdec.SampledChain(3), specdec.SpeculativeSampling()),
    "block": (specdec.SampledChain(3), specdec.BlockVerification()),
    "specinfer-paths": (specdec.SampledTrees(3, 2, merge=False), specdec.MultiDraftRejection()),
    "rsd-trie": (specdec.SampledTrees(3, 2), specdec.MultiDraftRejection(replacement=False)),
    "rsd-gumbel-topk": (specdec.GumbelTopKTree((2, 2)), specdec.MultiDraftRejection(replacement=False)),
    "rsd-stochastic-ddtree": (specdec.StochasticDDTree(5, 2), specdec.MultiDraftRejection(replacement=False)),
    "traversal-trie": (specdec.SampledTrees(3, 2), specdec.TraversalVerification()),
    "traversal-paths": (specdec.SampledTrees(3, 2, merge=False), specdec.TraversalVerification(replacement=True)),
}


@pytest.mark.parametrize("do_sample", [False, True])
def test_rounds_read_nothing_on_the_host(monkeypatch, do_sample):
    target = tiny_model("qwen3", scale=2.0)
    drafter = specdec.ModelDrafter(perturbed_copy(target, noise=0.3), tree_depth=2)
    ids = torch.tensor([[5, 9, 11, 5, 9]])
    reads = spy_round_reads(monkeypatch)
    rounds = 0
    for tree, rule in PAIRS.values():
        gen = torch.Generator().manual_seed(0)
        out = specdec.generate(target, ids, drafter=drafter, tree=tree, verifier=rule, max_new_tokens=12,
                               do_sample=do_sample, temperature=0.8, top_k=20, generator=gen)  # fmt: skip
        rounds += out.stats.rounds
    assert rounds > 20 and reads == []
