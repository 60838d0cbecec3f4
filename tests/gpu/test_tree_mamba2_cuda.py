"""Mamba2-family tree verification on CUDA (the adapter runs the Triton ``tree_mamba2`` kernel) against the same
verification on CPU (the PyTorch reference, which ``tests/state`` checks against each node's path run causally)."""

from __future__ import annotations

import copy

import pytest
import torch
from oracles.eager_state import eager_manager_for
from state.hybrid_harness import VOCAB, prefill, random_tree, tiny_hybrid, tree_mask

from specdec.kernels.tree_mamba2 import _triton_available
from specdec.state.hybrid import cache_kwarg
from specdec.types import DraftTree

pytestmark = pytest.mark.gpu

PREFIX = 9
TREES = [("root", 1), ("chain", 16), ("deep", 40), ("bush", 20), ("random", 64), ("random", 128)]


@torch.no_grad()
def verify_logits(model, prefix: torch.Tensor, tree: DraftTree, device: torch.device) -> torch.Tensor:
    """Logits ``[N, V]`` (on the CPU) of one tree forward inside ``verify_scope`` with the model on ``device``."""
    model = model.to(device)
    manager = eager_manager_for(model)
    cache = prefill(model, prefix.to(device))
    with manager.verify_scope(model, cache, tree, PREFIX):
        out = model(
            input_ids=tree.tokens[None].to(device),
            position_ids=(tree.depth + PREFIX)[None].to(device),
            attention_mask=tree_mask(tree, PREFIX, torch.float32).to(device),
            **{cache_kwarg(model): cache},
            use_cache=True,
        )
    return out.logits[0].cpu()


@pytest.mark.parametrize("family", ["mamba2", "nemotron_h", "falcon_h1"])
def test_mamba2_tree_verify_cuda_matches_cpu(cuda, family):
    assert _triton_available(), "the CUDA adapter path must run the Triton kernel"
    cpu_model = tiny_hybrid(family)
    cuda_model = copy.deepcopy(cpu_model).to(cuda)
    gen = torch.Generator().manual_seed(11)
    prefix = torch.randint(0, VOCAB, (1, PREFIX), generator=gen)
    for kind, n in TREES:
        tree = random_tree(gen, n, kind)
        want = verify_logits(cpu_model, prefix, tree, torch.device("cpu"))
        got = verify_logits(cuda_model, prefix, tree, cuda)
        diff = (got - want).abs().max().item()
        assert diff <= 1e-4 * max(1.0, want.abs().max().item()), f"{family} {kind} N={n}: CUDA vs CPU {diff:.2e}"
