"""The ``scan`` hybrid prefill (``Backends(hybrid_prefill="scan")``): the prompt as a chain tree through specdec's
adapters and tree scans from the empty state, then each layer's path replay (eagerly over an HF cache in the
oracle ``EagerTarget``, padded over the static storage in the round's prefill).

Oracles: the model's own forward over the prompt (its cache and last logits), the target's own greedy
``generate``, and the ``model`` prefill (the two prefills must then accept the same tokens)."""

from __future__ import annotations

from unittest import mock

import pytest
import torch
from hybrid_harness import VOCAB
from oracles.eager_state import EagerHybridState
from oracles.eager_target import EagerTarget
from test_hybrid_generate import _bigram_drafter, _target

import specdec
import specdec.state.hybrid as hybrid
from specdec.backends import env_default
from specdec.engine import Engine
from specdec.state.hybrid import _state_tensor, hybrid_prefill
from specdec.target import TargetModel

FAMILIES = ["qwen3_5", "qwen3_next", "nemotron_h", "mamba2"]


@pytest.fixture
def scan(monkeypatch):
    monkeypatch.setattr(hybrid, "PREFILL", "scan")


def _cache_tensors(tgt: EagerTarget) -> dict[str, torch.Tensor]:
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
    tgt = EagerTarget(_target(family))
    gen = torch.Generator().manual_seed(1)
    for n in (1, 9, 70):
        ids = torch.randint(0, VOCAB, (1, n), generator=gen)
        monkeypatch.setattr(hybrid, "PREFILL", "model")
        want_logits, _ = tgt.prefill(ids)
        want = _cache_tensors(tgt)
        monkeypatch.setattr(hybrid, "PREFILL", "scan")
        with mock.patch.object(
            EagerHybridState, "take_round", autospec=True, side_effect=EagerHybridState.take_round
        ) as spy:
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
def test_scan_prefill_decodes_the_target_greedy_like_the_model_prefill(family):
    """The round after the scan prefill and after the model's own prefill: the target's greedy tokens, and the same
    accepted lengths."""
    target = _target(family)
    drafter = _bigram_drafter(target)
    input_ids = torch.randint(0, VOCAB, (1, 70), generator=torch.Generator().manual_seed(5))
    ones = torch.ones_like(input_ids)  # token 0 (the pad id) inside the prompt is text here, not padding
    # 20 tokens: qwen3_next's 28th greedy token is a near-tie that the scan and HF's chunked prefill round apart
    want = target.generate(input_ids, attention_mask=ones, max_new_tokens=20, do_sample=False)
    for tree in (None, specdec.Chain(k=4), specdec.DDTree(budget=8)):
        d = drafter if tree is not None else None
        out = {}
        for prefill in ("scan", "model"):
            out[prefill] = specdec.generate(target, input_ids, attention_mask=ones, drafter=d, tree=tree,
                                            max_new_tokens=20, backends={"hybrid_prefill": prefill})  # fmt: skip
        assert torch.equal(out["scan"].sequences, want) and torch.equal(out["model"].sequences, want), tree
        assert out["scan"].stats.accept_hist == out["model"].stats.accept_hist, tree


def test_scan_prefill_of_the_zoo_hybrid(zoo, scan):
    """The trained zoo pair with the scan prefill: HF greedy, with long accepted paths."""
    import json

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specdec.drafters.dflash import DFlashDrafter

    target = AutoModelForCausalLM.from_pretrained(zoo / "target-hybrid", dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(zoo / "tokenizer")
    drafter = DFlashDrafter.from_pretrained("assets/drafters/zoo-hybrid", target=target)
    row = json.loads((zoo / "prompts_dev.jsonl").read_text().splitlines()[0])
    ids = tok(row["prompt"], return_tensors="pt").input_ids
    want = target.generate(ids, max_new_tokens=32, do_sample=False)
    out = specdec.generate(target, ids, drafter=drafter, tree=specdec.DDTree(budget=32, topk=8), max_new_tokens=32)
    assert out.stats.path == "eager" and torch.equal(out.sequences, want)
    assert out.stats.tau > 2.5


def _static_state(engine: Engine) -> list[torch.Tensor]:
    """The engine's committed state: prefix, root, the K/V rows, conv windows and recurrent states."""
    layers = engine.target.recurrent.values()
    return [engine.prefix.clone(), engine.root.clone(), engine.target.storage.kv.clone(),
            *(t.clone() for layer in layers for t in (layer.conv_states, layer.recurrent_states))]  # fmt: skip


def test_a_bad_setting_is_refused_before_the_storage_changes(monkeypatch):
    target = _target("qwen3_5")
    specdec.generate(target, torch.randint(0, VOCAB, (1, 5), generator=torch.Generator().manual_seed(0)),
                     max_new_tokens=3)  # fmt: skip
    engine = Engine.for_target(TargetModel.wrap(target), capacity=1)
    before = _static_state(engine)
    with pytest.raises(ValueError, match="hybrid_prefill='chunked'"):
        specdec.generate(target, torch.ones(1, 3, dtype=torch.long), max_new_tokens=3,
                         backends={"hybrid_prefill": "chunked"})  # fmt: skip
    assert Engine.for_target(TargetModel.wrap(target), capacity=1) is engine
    assert all(torch.equal(a, b) for a, b in zip(before, _static_state(engine), strict=True))
    assert hybrid.PREFILL == "auto"  # the process setting is left as it was
    monkeypatch.setenv("SPECDEC_HYBRID_PREFILL", "chunked")
    with pytest.raises(ValueError, match="SPECDEC_HYBRID_PREFILL='chunked'"):
        env_default("hybrid_prefill")
    monkeypatch.setenv("SPECDEC_HYBRID_PREFILL", "graph")  # the older name
    assert env_default("hybrid_prefill") == "scan"


def test_auto_picks_the_scan_for_short_prompts_on_cuda_and_the_models_forward_otherwise(monkeypatch):
    monkeypatch.setattr(hybrid, "PREFILL", "auto")
    assert hybrid_prefill(torch.device("cuda")) == "scan" and hybrid_prefill("cuda:1", 4096) == "scan"
    assert hybrid_prefill("cuda", 4097) == "model"
    assert hybrid_prefill(torch.device("cpu"), 10) == "model" and hybrid_prefill() == "model"
    monkeypatch.setattr(hybrid, "PREFILL", "model")
    assert hybrid_prefill(torch.device("cuda"), 10) == "model"
    monkeypatch.setattr(hybrid, "PREFILL", "scan")
    assert hybrid_prefill(torch.device("cpu"), 5000) == "scan"


def test_the_prefill_is_resolved_for_the_targets_device(monkeypatch):
    """The engine asks ``hybrid_prefill`` with the target's device and the prompt's length (``auto`` depends on
    both)."""
    import specdec.engine

    seen = []

    def spy(device=None, num_tokens=None):
        seen.append((device, num_tokens))
        return hybrid_prefill(device, num_tokens)

    monkeypatch.setattr(specdec.engine, "hybrid_prefill", spy)
    target = _target("qwen3_5")
    ids = torch.randint(0, VOCAB, (1, 6), generator=torch.Generator().manual_seed(3))
    specdec.generate(target, ids, drafter=_bigram_drafter(target), tree=specdec.DDTree(budget=4, topk=2),
                     max_new_tokens=3)  # fmt: skip
    assert seen and all(torch.device(d) == torch.device("cpu") and n == 6 for d, n in seen)


def test_the_prompt_chain_walks_the_nodes_and_rounds_pick_by_size(scan):
    """The prompt's chain goes to ``tree_gdn`` with ``walk="nodes"`` (paths would replay N (N + 1) / 2 steps);
    verify rounds leave the choice to the kernel (``"auto"``)."""
    import specdec.state.gdn as gdn

    target = _target("qwen3_5")
    drafter = _bigram_drafter(target)
    ids = torch.randint(0, VOCAB, (1, 20), generator=torch.Generator().manual_seed(4))
    walks: list[tuple[int, str, bool]] = []

    def spy(*args, walk="auto", **kwargs):
        parents = args[6][0]  # tree_gdn_rows: [B, N] (one row here)
        chain = torch.equal(parents.cpu(), torch.arange(-1, parents.numel() - 1))
        walks.append((args[1].shape[1], walk, chain))
        return gdn_tree(*args, walk=walk, **kwargs)

    gdn_tree = gdn.tree_gdn_rows
    with mock.patch.object(gdn, "tree_gdn_rows", side_effect=spy):
        specdec.generate(target, ids, drafter=drafter, tree=specdec.DDTree(budget=8), max_new_tokens=6)
    prompt = [w for n, w, _ in walks if n >= 20]
    trees = [w for n, w, _ in walks if n < 20]
    assert prompt and set(prompt) == {"nodes"}  # one per GDN layer (the prefill pads the prompt to 64 slots)
    assert trees and set(trees) == {"auto"}  # DDTree rounds, even one whose tree came out as a chain
    from specdec.kernels.tree_gdn import tree_gdn

    with pytest.raises(ValueError, match="walk="):
        tree_gdn(*(torch.zeros(1),) * 7, walk="levels")


def test_drafted_chains_pick_their_schedule_by_size_and_heads(monkeypatch):
    """Chain rounds ask ``tree_gdn`` for ``chain_walk``'s schedule (paths while value heads x nodes is small, the
    node walk past it); DDTree rounds keep ``"auto"``; the tokens stay HF's greedy ones."""
    import sys

    import specdec.state.gdn as gdn

    tree_gdn_module = sys.modules["specdec.kernels.tree_gdn"]  # the package (specdec.kernels.tree_gdn is the function)

    target = _target("qwen3_5")
    drafter = _bigram_drafter(target)
    ids = torch.randint(0, VOCAB, (1, 6), generator=torch.Generator().manual_seed(5))
    ref = target.generate(ids, max_new_tokens=8, min_new_tokens=8, do_sample=False)
    walks: list[str] = []
    gdn_tree = gdn.tree_gdn_rows

    def spy(*args, walk="auto", **kwargs):
        walks.append(walk)
        return gdn_tree(*args, walk=walk, **kwargs)

    def rounds(tree) -> set[str]:
        walks.clear()
        out = specdec.generate(target, ids, drafter=drafter, tree=tree, max_new_tokens=8)
        assert torch.equal(out.sequences, ref)
        return set(walks)

    monkeypatch.setattr(gdn, "tree_gdn_rows", spy)
    assert rounds(specdec.Chain(k=4)) == {"paths"}  # 5 nodes x a few value heads
    assert rounds(specdec.DDTree(budget=4, topk=2)) == {"auto"}
    monkeypatch.setattr(tree_gdn_module, "CHAIN_PATHS_MAX_WORK", 0)
    assert rounds(specdec.Chain(k=4)) == {"nodes"}
