"""Hybrid targets in the round (CPU: called, not replayed): token-identical to the target's own greedy
``generate`` (Gated DeltaNet and Mamba2 families), exact recurrent commits, the padded chain-tree prefill against
the model's own forward, no host reads inside a round; the snapshot mode is refused with a reason."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from hybrid_harness import VOCAB
from test_hybrid_generate import _bigram_drafter, _target

import specdec
from specdec.drafters.dflash import DFlashDrafter

TREES = [specdec.Chain(k=4), specdec.DDTree(budget=8), specdec.DDTree(budget=20, topk=3)]
# The CPU references of the tree-scan kernels build their level schedule on the host (CUDA rounds refuse them).
REFERENCE_SCANS = ("specdec/kernels/tree_gdn/reference.py", "specdec/kernels/tree_mamba2/reference.py")


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_next", "nemotron_h", "mamba2"])
def test_hybrid_round_matches_target_generate(family):
    target = _target(family)
    drafter = _bigram_drafter(target)
    gen = torch.Generator().manual_seed(0)
    accepted = 0
    for _ in range(2):
        input_ids = torch.randint(0, VOCAB, (1, 8), generator=gen)
        want = target.generate(input_ids, max_new_tokens=40, do_sample=False)
        plain = specdec.generate(target, input_ids, max_new_tokens=40)
        assert plain.stats.path == "eager" and torch.equal(plain.sequences, want)
        for tree in TREES:
            out = specdec.generate(target, input_ids, drafter=drafter, tree=tree, max_new_tokens=40)
            assert out.stats.path == "eager" and torch.equal(out.sequences, want), tree
            accepted += out.stats.new_tokens - out.stats.rounds
    assert accepted > 0  # multi-token commits of the recurrent state were exercised


def test_zoo_hybrid_round_matches_greedy(zoo):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = AutoModelForCausalLM.from_pretrained(zoo / "target-hybrid", dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(zoo / "tokenizer")
    drafter = DFlashDrafter.from_pretrained("assets/drafters/zoo-hybrid", target=target)
    rows = [json.loads(line) for line in (zoo / "prompts_dev.jsonl").read_text().splitlines()]
    taus = []
    for row in rows[:2]:
        ids = tok(row["prompt"], return_tensors="pt").input_ids
        want = target.generate(ids, max_new_tokens=32, do_sample=False)
        for tree in (specdec.Chain(k=15), specdec.DDTree(budget=32, topk=8)):
            out = specdec.generate(target, ids, drafter=drafter, tree=tree, max_new_tokens=32)
            assert out.stats.path == "eager" and torch.equal(out.sequences, want)
            taus.append(out.stats.tau)
    assert max(taus) > 2.5  # long accepted paths: deep recurrent commits


def test_snapshot_mode_is_refused_with_a_reason():
    """``hybrid_mode="snapshot"`` is no round of its own: ``generate`` refuses it, naming the mode and the fix, before
    anything runs; the default exact mode decodes the target's greedy tokens."""
    target = _target("qwen3_5")
    input_ids = torch.randint(0, VOCAB, (1, 8), generator=torch.Generator().manual_seed(0))
    want = target.generate(input_ids, max_new_tokens=12, do_sample=False)
    model = specdec.SpeculativeModel(target, hybrid_mode="snapshot")
    for kwargs in ({}, {"drafter": _bigram_drafter(target), "tree": specdec.DDTree(budget=8)}):
        with pytest.raises(ValueError, match="hybrid_mode='snapshot'.*use hybrid_mode='exact'"):
            model.generate(input_ids, max_new_tokens=12, **kwargs)
    exact = specdec.SpeculativeModel(target, hybrid_mode="exact")
    assert torch.equal(exact.generate(input_ids, max_new_tokens=12), want)


@torch.no_grad()
def test_warmup_runs_are_undone_before_capture():
    """Capture runs the round twice before recording it and must undo each run, recurrent states included;
    otherwise the first captured round of a call would decode from a state the warm-up already advanced."""
    from specdec.engine import Engine
    from specdec.target import TargetModel

    target = _target("qwen3_5")
    drafter = _bigram_drafter(target)
    ids = torch.randint(0, VOCAB, (1, 8), generator=torch.Generator().manual_seed(3))
    ones = torch.ones_like(ids)  # token 0 (the pad id) inside the prompt is text here, not padding
    specdec.generate(target, ids, attention_mask=ones, drafter=drafter, tree=specdec.DDTree(budget=8), max_new_tokens=8)
    engine = Engine.for_target(TargetModel.wrap(target), capacity=1)
    (rnd,) = [r for r in engine._rounds.values() if r.drafter is drafter]

    def start():
        logits = engine.prefill(ids, [ids.shape[1]], drafter)
        engine.start(logits.argmax(-1), [ids.shape[1]], [True])

    def state():
        rec = [
            t.clone() for layer in engine.target.recurrent.values() for t in (layer.conv_states, layer.recurrent_states)
        ]
        return [engine.prefix.clone(), engine.root.clone(), rnd.out.clone(), *rec]

    start()
    rnd.captured.fn()
    once = state()
    start()
    restore = rnd._snapshot()
    rnd.captured.fn()  # a warm-up run, undone
    restore()
    rnd.captured.fn()
    assert len(once) > 3 and all(torch.equal(a, b) for a, b in zip(once, state(), strict=True))


@pytest.mark.parametrize("groups", [1, 2])
def test_mamba2_closed_form_replay_equals_node_by_node_steps(groups):
    """The round's Mamba2 commit (all masked steps in closed form) against one ``mamba2_step`` per real node."""
    import torch.nn.functional as F

    from specdec.state.hybrid import RecurrentAdapter
    from specdec.state.mamba2 import Mamba2Adapter, Mamba2Stash, mamba2_step

    gen = torch.Generator().manual_seed(groups)
    n, heads, head_dim, state_dim, steps = 12, 4, 8, 6, 7
    stash = Mamba2Stash(
        preconv=torch.zeros(n, 1),
        x=torch.randn(n, heads, head_dim, generator=gen).to(torch.bfloat16),
        dt=F.softplus(torch.randn(n, heads, generator=gen)),
        B=torch.randn(n, groups, state_dim, generator=gen).to(torch.bfloat16),
        A=-torch.rand(heads, generator=gen) * 4 - 0.1,
        heads_per_group=heads // groups,
    )
    adapter = object.__new__(Mamba2Adapter)  # replay and advance read only the stash
    state = torch.randn(1, heads, head_dim, state_dim, generator=gen)
    B = stash.B.float().repeat_interleave(heads // groups, dim=1)
    for num in range(1, steps + 1):
        nodes = sorted(torch.randperm(n, generator=gen)[:num].tolist())
        path = torch.tensor(nodes + [nodes[-1]] * (steps - num))
        want = state
        for j in nodes:
            s = slice(j, j + 1)
            want = mamba2_step(want, stash.x[s].float(), stash.dt[s], B[s], stash.A)
        got = adapter.replay(state.clone(), stash, path, torch.tensor(num))
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        loop = RecurrentAdapter.replay(adapter, state.clone(), stash, path, torch.tensor(num))
        torch.testing.assert_close(loop, want, atol=1e-5, rtol=1e-5)


def test_cuda_rounds_refuse_a_reference_tree_scan():
    """On CUDA a reference tree scan would read the parent array on the host inside every round: capture names it
    and the round is called instead of replayed (checked with a CUDA device object; nothing runs on it)."""
    from specdec.backends import use
    from specdec.kernels.tree_gdn import auto_impl
    from specdec.state.recurrent import hybrid_reason
    from specdec.target import TargetModel

    cuda = torch.device("cuda")
    mamba = TargetModel.wrap(_target("mamba2")).state
    qwen = TargetModel.wrap(_target("qwen3_5")).state
    assert hybrid_reason(mamba, torch.device("cpu")) is None
    with use({"tree_mamba2": "torch"}):
        assert "tree_mamba2" in hybrid_reason(mamba, cuda)
    assert (hybrid_reason(qwen, cuda) is None) == (auto_impl(cuda) == "triton")


@pytest.fixture
def graph_prefill(monkeypatch):
    """Hybrid prefill through the chain-tree verify (``Backends(hybrid_prefill="scan")``)."""
    import specdec.state.hybrid as hybrid

    monkeypatch.setattr(hybrid, "PREFILL", "scan")


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_next", "nemotron_h", "mamba2"])
@torch.no_grad()
def test_padded_prefill_equals_the_models_own_forward(family, graph_prefill):
    """The padded chain-tree prefill leaves the static conv windows, recurrent states and K/V rows, and returns the
    last logits, that the model's own forward over the unpadded prompt gives (lengths around a bucket edge, one in
    the coarse buckets, and one past the captured maximum, which prefills uncaptured)."""
    from transformers import DynamicCache

    from specdec.engine import PREFILL_BUCKET, PREFILL_CAPTURE_MAX, PREFILL_WHOLE, Engine
    from specdec.state.hybrid import _state_tensor
    from specdec.state.storage import StaticModel
    from specdec.target import TargetModel

    target = _target(family)
    tgt = TargetModel(target)
    gen = torch.Generator().manual_seed(3)
    lengths = [1, PREFILL_BUCKET - 1, PREFILL_BUCKET + 1, PREFILL_WHOLE + 1, PREFILL_CAPTURE_MAX + 1]
    engine = Engine(tgt, capacity=PREFILL_CAPTURE_MAX + 64)
    for n in lengths:
        ids = torch.randint(0, VOCAB, (1, n), generator=gen)
        for t in (*engine.target.storage.kv.unsqueeze(0), *engine.target.recurrent.values()):  # stale state
            for x in (t,) if isinstance(t, torch.Tensor) else (t.conv_states, t.recurrent_states):
                x.normal_(generator=gen)
        logits = engine.prefill(ids, [n], None)[0]
        cache = DynamicCache(config=target.config)
        want_logits, _ = tgt.prefill_into(cache, ids)
        ref = StaticModel(tgt, engine.capacity)
        ref.load(cache, n)
        torch.testing.assert_close(logits, want_logits, rtol=1e-4, atol=1e-4)
        for i, layer in engine.target.recurrent.items():
            torch.testing.assert_close(layer.conv_states, ref.recurrent[i].conv_states, rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(layer.recurrent_states, ref.recurrent[i].recurrent_states, rtol=1e-4, atol=1e-4)
            assert _state_tensor(cache.layers[i], "recurrent_states") is not None
        kv, want_kv = engine.target.storage.kv[..., :n, :], ref.storage.kv[..., :n, :]
        torch.testing.assert_close(kv, want_kv, rtol=1e-4, atol=1e-4)
        assert int(engine.prefix) == n


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_next", "nemotron_h", "mamba2"])
def test_graph_prefill_decodes_the_target_greedy(family, graph_prefill):
    target = _target(family)
    drafter = _bigram_drafter(target)
    input_ids = torch.randint(0, VOCAB, (1, 70), generator=torch.Generator().manual_seed(5))  # past one bucket
    ones = torch.ones_like(input_ids)  # token 0 (the pad id) inside the prompt is text here, not padding
    # 20 tokens: qwen3_next's 28th greedy token is a near-tie (top-2 logits 6e-4 apart), which the sequential scan
    # and HF's chunked prefill round to different sides.
    want = target.generate(input_ids, attention_mask=ones, max_new_tokens=20, do_sample=False)
    for tree in (None, specdec.DDTree(budget=8)):
        d = drafter if tree is not None else None
        out = specdec.generate(target, input_ids, attention_mask=ones, drafter=d, tree=tree, max_new_tokens=20)
        assert out.stats.path == "eager" and torch.equal(out.sequences, want), tree


@pytest.mark.parametrize("family", ["qwen3_5", "mamba2"])
def test_hybrid_round_reads_nothing_on_the_host(family, monkeypatch):
    """A hybrid round (adapters over the device topology, tree scans, path replay commit) reads no tensor value on
    the host, except inside the CPU references of the tree-scan kernels (their level schedule is built on the
    host; on CUDA rounds are captured only with the Triton scans, ``hybrid_reason``)."""
    from host_reads import spy_round_reads

    reads = spy_round_reads(monkeypatch, exempt=REFERENCE_SCANS)
    target = _target(family)
    drafter = _bigram_drafter(target)
    ids = torch.randint(0, VOCAB, (1, 8), generator=torch.Generator().manual_seed(0))
    rounds = 0
    for d, tree in ((None, None), (drafter, specdec.Chain(k=4)), (drafter, specdec.DDTree(budget=8))):
        out = specdec.generate(target, ids, drafter=d, tree=tree, max_new_tokens=16)
        assert out.stats.path == "eager"
        rounds += out.stats.rounds
    assert rounds > 6 and reads == []


@pytest.mark.slow
def test_compiled_hybrid_rounds_equal_hf_greedy_and_compile_once():
    """``compile=True`` on a Gated DeltaNet hybrid: the compiled rounds (adapters, tree scans, path replays) decode
    the target's greedy tokens, and a second call reuses them without tracing anything again."""
    from torch._dynamo.utils import counters

    target = _target("qwen3_5")
    drafter = _bigram_drafter(target)
    input_ids = torch.randint(0, VOCAB, (1, 8), generator=torch.Generator().manual_seed(0))
    want = target.generate(input_ids, max_new_tokens=30, do_sample=False)
    kwargs = dict(drafter=drafter, tree=specdec.DDTree(budget=8), max_new_tokens=30, compile=True)
    first = specdec.generate(target, input_ids, **kwargs)
    graphs = counters["stats"]["unique_graphs"]
    again = specdec.generate(target, input_ids, **kwargs)
    assert first.stats.path == again.stats.path == "eager"
    assert torch.equal(first.sequences, want) and torch.equal(again.sequences, want)
    assert first.stats.compile_ms > 0 and again.stats.compile_ms == 0
    assert first.stats.new_tokens > first.stats.rounds  # multi-token commits ran compiled
    assert counters["stats"]["unique_graphs"] == graphs  # nothing recompiled on the second call


def test_hybrid_call_reads_the_host_once_per_round(monkeypatch):
    """Around the rounds too, a hybrid call reads the host once per round (the pinned copy of its result), once
    for the prefill's first token and once of the prompt (its pad tokens: tests/test_input_rules.py), outside the
    CPU references of the tree scans (as above)."""
    from host_reads import spy_round_reads

    reads = spy_round_reads(monkeypatch, everywhere=True, exempt=REFERENCE_SCANS)
    target = _target("qwen3_5")
    drafter = _bigram_drafter(target)
    ids = torch.randint(0, VOCAB, (1, 8), generator=torch.Generator().manual_seed(0))
    for d, tree in ((None, None), (drafter, specdec.DDTree(budget=8))):
        reads.clear()
        out = specdec.generate(target, ids, drafter=d, tree=tree, max_new_tokens=16)
        assert out.stats.path == "eager" and out.stats.rounds > 0
        assert len(reads) == out.stats.rounds + 2, reads


@torch.no_grad()
def test_round_verify_alone_repeats_and_leaves_the_committed_state_alone():
    """``Round._verify`` (the round's mask + target forward, the part a verify-only timing measures) commits
    nothing: a second call over the same tree gives the same logits, and the recurrent states, prefix and root are
    those the prefill left."""
    from specdec.engine import Engine
    from specdec.target import TargetModel
    from specdec.trees.build import ddtree_device
    from specdec.types import DeviceTree

    target = _target("qwen3_5")
    drafter = _bigram_drafter(target)
    ids = torch.randint(0, VOCAB, (1, 8), generator=torch.Generator().manual_seed(4))
    tree_spec = specdec.DDTree(budget=8)
    specdec.generate(target, ids, drafter=drafter, tree=tree_spec, max_new_tokens=8)
    engine = Engine.for_target(TargetModel.wrap(target), capacity=1)
    (rnd,) = [r for r in engine._rounds.values() if r.drafter is drafter]
    logits = engine.prefill(ids, [ids.shape[1]], drafter)
    engine.start(logits.argmax(-1), [ids.shape[1]], [True])
    layers = engine.target.recurrent.values()
    before = [t.clone() for layer in layers for t in (layer.conv_states, layer.recurrent_states)]
    before += [engine.prefix.clone(), engine.root.clone()]
    logq = torch.log_softmax(torch.randn(rnd.depth, VOCAB, generator=torch.Generator().manual_seed(5)) * 3, -1)
    tree = DeviceTree.stack([ddtree_device(logq, engine.root[0], budget=8, topk=4, num_slots=rnd.slots)])
    with rnd.captured.scope:
        first = rnd._verify(tree)[0].clone()
        second = rnd._verify(tree)[0]
    assert first.shape[:2] == (1, rnd.slots) and torch.equal(first, second)
    after = [t for layer in layers for t in (layer.conv_states, layer.recurrent_states)]
    after += [engine.prefix, engine.root]
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))


def test_hybrid_rounds_that_fail_to_compile_run_uncompiled_and_equal_hf_greedy(monkeypatch, caplog):
    """``compile=True`` on a Gated DeltaNet hybrid whose rounds fail to compile on their second graph (the first has
    run): the snapshot puts the recurrent states back, each round runs uncompiled, the tokens are HF's greedy ones
    and a warning names the error."""
    from compile_faults import failing_backend

    from specdec import engine as round_engine

    monkeypatch.setattr(
        round_engine, "compile_fn", lambda fn, mode: torch.compile(fn, backend=failing_backend(2), dynamic=False)
    )
    target = _target("qwen3_5")
    input_ids = torch.randint(0, VOCAB, (1, 8), generator=torch.Generator().manual_seed(0))
    want = target.generate(input_ids, max_new_tokens=30, do_sample=False)
    torch._dynamo.reset()
    with caplog.at_level(logging.WARNING, logger="specdec.runtime"):
        out = specdec.generate(
            target, input_ids, drafter=_bigram_drafter(target), tree=specdec.DDTree(budget=8), max_new_tokens=30,
            compile=True,
        )  # fmt: skip
    assert out.stats.path == "eager" and torch.equal(out.sequences, want)
    assert out.stats.new_tokens > out.stats.rounds  # multi-token commits of the recurrent states
    assert any("runs uncompiled" in r.getMessage() for r in caplog.records) and out.stats.compile_fallbacks >= 1
    torch._dynamo.reset()
