"""The ``scan`` hybrid prefill (``SPECDEC_HYBRID_PREFILL=scan``) on the eager path: the prompt as a chain tree
through specdec's adapters and tree scans from the empty state, then each layer's path replay.

Oracles: the model's own forward over the prompt (its cache and last logits), the target's own greedy
``generate``, and the fast path's ``scan`` prefill (the two paths must then accept the same tokens)."""

from __future__ import annotations

from unittest import mock

import pytest
import torch
from hybrid_harness import VOCAB
from test_hybrid_generate import _bigram_drafter, _target

import specdec
from specdec.state.hybrid import HybridState, _state_tensor, hybrid_prefill
from specdec.target import TargetModel

FAMILIES = ["qwen3_5", "qwen3_next", "nemotron_h", "mamba2"]


@pytest.fixture
def scan(monkeypatch):
    monkeypatch.setenv("SPECDEC_HYBRID_PREFILL", "scan")


def _cache_tensors(tgt: TargetModel) -> dict[str, torch.Tensor]:
    """Every recurrent state, conv window and attention K/V row of the target's cache, by name."""
    out = {}
    for i, layer in enumerate(tgt.cache.layers):
        for name in ("conv_states", "recurrent_states", "keys", "values"):
            t = _state_tensor(layer, name)
            if t is not None and t.numel():
                out[f"{i}.{name}"] = t.clone()
    return out


@pytest.mark.parametrize("family", FAMILIES)
@torch.no_grad()
def test_scan_prefill_equals_the_models_own_forward(family, monkeypatch):
    """Same logits, conv windows, recurrent states and K/V rows as the model's own forward (fp32, 1e-4), for
    prompts of 1, 9 and 70 tokens; the cache then holds exactly the prompt."""
    tgt = TargetModel(_target(family))
    gen = torch.Generator().manual_seed(1)
    for n in (1, 9, 70):
        ids = torch.randint(0, VOCAB, (1, n), generator=gen)
        monkeypatch.setenv("SPECDEC_HYBRID_PREFILL", "model")
        want_logits, _ = tgt.prefill(ids)
        want = _cache_tensors(tgt)
        monkeypatch.setenv("SPECDEC_HYBRID_PREFILL", "scan")
        with mock.patch.object(HybridState, "take_round", autospec=True, side_effect=HybridState.take_round) as spy:
            logits, _ = tgt.prefill(ids)
        assert spy.call_count == 1  # the prompt went through a verified chain tree, not the model's forward
        got = _cache_tensors(tgt)
        assert tgt.length == n and got.keys() == want.keys()
        assert any(k.endswith("recurrent_states") for k in got)
        assert any(k.endswith("keys") for k in got) == (family != "mamba2")  # pure Mamba2 has no attention
        torch.testing.assert_close(logits, want_logits, rtol=1e-4, atol=1e-4)
        for name, t in want.items():
            torch.testing.assert_close(got[name], t, rtol=1e-4, atol=1e-4, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.parametrize("family", FAMILIES)
def test_scan_prefill_decodes_the_target_greedy_on_both_paths(family, scan):
    """Eager and fast path with the scan prefill: the target's greedy tokens, and the same accepted lengths."""
    target = _target(family)
    drafter = _bigram_drafter(target)
    input_ids = torch.randint(0, VOCAB, (1, 70), generator=torch.Generator().manual_seed(5))
    # 20 tokens: qwen3_next's 28th greedy token is a near-tie that the scan and HF's chunked prefill round apart
    want = target.generate(input_ids, max_new_tokens=20, do_sample=False)
    for tree in (None, specdec.Chain(k=4), specdec.DDTree(budget=8)):
        d = drafter if tree is not None else None
        eager = specdec.generate(target, input_ids, drafter=d, tree=tree, max_new_tokens=20, cuda_graphs=False)
        fast = specdec.generate(target, input_ids, drafter=d, tree=tree, max_new_tokens=20, cuda_graphs=True)
        assert eager.stats.path == "eager" and fast.stats.path == "fast"
        assert torch.equal(eager.sequences, want) and torch.equal(fast.sequences, want), tree
        assert eager.stats.accept_hist == fast.stats.accept_hist, tree


def test_scan_prefill_of_the_zoo_hybrid(zoo, scan):
    """The trained zoo pair on the eager path with the scan prefill: HF greedy, with long accepted paths."""
    import json

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specdec.drafters.dflash import DFlashDrafter

    target = AutoModelForCausalLM.from_pretrained(zoo / "target-hybrid", dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(zoo / "tokenizer")
    drafter = DFlashDrafter.from_pretrained("assets/drafters/zoo-hybrid", target=target)
    row = json.loads((zoo / "prompts_dev.jsonl").read_text().splitlines()[0])
    ids = tok(row["prompt"], return_tensors="pt").input_ids
    want = target.generate(ids, max_new_tokens=32, do_sample=False)
    out = specdec.generate(target, ids, drafter=drafter, tree=specdec.DDTree(budget=32, topk=8), max_new_tokens=32,
                           cuda_graphs=False)  # fmt: skip
    assert out.stats.path == "eager" and torch.equal(out.sequences, want)
    assert out.stats.tau > 2.5


def test_snapshot_mode_keeps_the_models_prefill(scan):
    """``hybrid_mode="snapshot"`` verifies chains through the model's own forward, so it prefills through it too."""
    target = _target("qwen3_5")
    ids = torch.randint(0, VOCAB, (1, 12), generator=torch.Generator().manual_seed(2))
    snap = TargetModel(target, hybrid_mode="snapshot")
    logits, _ = snap.prefill(ids)
    want, _ = TargetModel(target).prefill_into(type(snap.cache)(config=target.config), ids)
    assert torch.equal(logits, want)


def test_a_bad_setting_is_refused_before_the_cache_changes(monkeypatch):
    tgt = TargetModel(_target("qwen3_5"))
    tgt.prefill(torch.randint(0, VOCAB, (1, 5), generator=torch.Generator().manual_seed(0)))
    cache, before = tgt.cache, _cache_tensors(tgt)
    monkeypatch.setenv("SPECDEC_HYBRID_PREFILL", "chunked")
    with pytest.raises(ValueError, match="SPECDEC_HYBRID_PREFILL='chunked'"):
        tgt.prefill(torch.ones(1, 3, dtype=torch.long))
    assert tgt.cache is cache and tgt.length == 5
    assert all(torch.equal(t, before[name]) for name, t in _cache_tensors(tgt).items())
    monkeypatch.setenv("SPECDEC_HYBRID_PREFILL", "graph")  # the older name
    assert hybrid_prefill() == "scan"


def test_auto_picks_the_scan_for_short_prompts_on_cuda_and_the_models_forward_otherwise(monkeypatch):
    monkeypatch.delenv("SPECDEC_HYBRID_PREFILL", raising=False)
    assert hybrid_prefill(torch.device("cuda")) == "scan" and hybrid_prefill("cuda:1", 4096) == "scan"
    assert hybrid_prefill("cuda", 4097) == "model"
    assert hybrid_prefill(torch.device("cpu"), 10) == "model" and hybrid_prefill() == "model"
    monkeypatch.setenv("SPECDEC_HYBRID_PREFILL", "model")
    assert hybrid_prefill(torch.device("cuda"), 10) == "model"
    monkeypatch.setenv("SPECDEC_HYBRID_PREFILL", "scan")
    assert hybrid_prefill(torch.device("cpu"), 5000) == "scan"


@pytest.mark.parametrize("graphs", [False, True])
def test_both_paths_resolve_the_prefill_for_the_targets_device(graphs, monkeypatch):
    """The eager and the fast path ask ``hybrid_prefill`` with the target's device and the prompt's length
    (``auto`` depends on both)."""
    import specdec.engine
    import specdec.target

    seen = []

    def spy(device=None, num_tokens=None):
        seen.append((device, num_tokens))
        return hybrid_prefill(device, num_tokens)

    module = specdec.engine if graphs else specdec.target
    monkeypatch.setattr(module, "hybrid_prefill", spy)
    target = _target("qwen3_5")
    ids = torch.randint(0, VOCAB, (1, 6), generator=torch.Generator().manual_seed(3))
    specdec.generate(target, ids, drafter=_bigram_drafter(target), tree=specdec.DDTree(budget=4, topk=2),
                     max_new_tokens=3, cuda_graphs=graphs)  # fmt: skip
    assert seen and all(torch.device(d) == torch.device("cpu") and n == 6 for d, n in seen)


def test_the_prompt_chain_walks_the_nodes_and_rounds_pick_by_size(scan):
    """The prompt's chain goes to ``tree_gdn`` with ``walk="nodes"`` (paths would replay N (N + 1) / 2 steps) on
    both paths; verify rounds leave the choice to the kernel (``"auto"``)."""
    import specdec.state.gdn as gdn

    target = _target("qwen3_5")
    drafter = _bigram_drafter(target)
    ids = torch.randint(0, VOCAB, (1, 20), generator=torch.Generator().manual_seed(4))
    walks: list[tuple[int, str, bool]] = []

    def spy(*args, walk="auto", **kwargs):
        parents = args[6]
        chain = torch.equal(parents.cpu(), torch.arange(-1, parents.numel() - 1))
        walks.append((args[1].shape[0], walk, chain))
        return gdn_tree(*args, walk=walk, **kwargs)

    gdn_tree = gdn.tree_gdn
    with mock.patch.object(gdn, "tree_gdn", side_effect=spy):
        for graphs in (False, True):
            walks.clear()
            specdec.generate(target, ids, drafter=drafter, tree=specdec.DDTree(budget=8), max_new_tokens=6,
                             cuda_graphs=graphs)  # fmt: skip
            prompt = [w for n, w, _ in walks if n >= 20]
            trees = [w for n, w, chain in walks if n < 20 and (graphs or not chain)]
            assert prompt and set(prompt) == {"nodes"}, graphs  # one per GDN layer (the fast path pads to 64)
            # DDTree rounds: "auto"; on the eager path a round whose tree came out as a chain takes the chain rule
            assert trees and set(trees) == {"auto"}, graphs
    with pytest.raises(ValueError, match="walk="):
        gdn_tree(*(torch.zeros(1),) * 7, walk="levels")


@pytest.mark.parametrize("graphs", [False, True])
def test_drafted_chains_pick_their_schedule_by_size_and_heads(graphs, monkeypatch):
    """Chain rounds ask ``tree_gdn`` for ``chain_walk``'s schedule (paths while value heads x nodes is small, the
    node walk past it) on both paths; DDTree rounds keep ``"auto"``; the tokens stay HF's greedy ones."""
    import sys

    import specdec.state.gdn as gdn

    tree_gdn_module = sys.modules["specdec.kernels.tree_gdn"]  # the package (specdec.kernels.tree_gdn is the function)

    target = _target("qwen3_5")
    drafter = _bigram_drafter(target)
    ids = torch.randint(0, VOCAB, (1, 6), generator=torch.Generator().manual_seed(5))
    ref = target.generate(ids, max_new_tokens=8, min_new_tokens=8, do_sample=False)
    walks: list[str] = []
    gdn_tree = gdn.tree_gdn

    def spy(*args, walk="auto", **kwargs):
        walks.append(walk)
        return gdn_tree(*args, walk=walk, **kwargs)

    def rounds(tree) -> set[str]:
        walks.clear()
        out = specdec.generate(target, ids, drafter=drafter, tree=tree, max_new_tokens=8, cuda_graphs=graphs)
        assert torch.equal(out.sequences, ref)
        return set(walks)

    monkeypatch.setattr(gdn, "tree_gdn", spy)
    assert rounds(specdec.Chain(k=4)) == {"paths"}  # 5 nodes x a few value heads
    assert rounds(specdec.DDTree(budget=4, topk=2)) == {"auto"}
    monkeypatch.setattr(tree_gdn_module, "CHAIN_PATHS_MAX_WORK", 0)
    assert rounds(specdec.Chain(k=4)) == {"nodes"}
