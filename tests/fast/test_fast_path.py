"""The fast path's device-side round on CPU (no capture): token-identical to HF greedy, exact storage commit,
engine reuse, fallbacks with a reason, and the sampled distribution against HF's own processing."""

from __future__ import annotations

import logging

import pytest
import torch
from host_reads import spy_round_reads
from models import perturbed_copy, tiny_model
from oracles import gof_pvalue
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper

import specdec
from specdec.drafters.dflash import DFlashDrafter
from specdec.engine import FastEngine, bucket_size
from specdec.state.storage import commit_rows, commit_rows_reference
from specdec.target import TargetModel

ARCHS = ["llama", "qwen2", "qwen3", "mistral", "phi3", "gpt2"]
TREES = [specdec.Chain(k=5), specdec.DDTree(budget=12, topk=3), specdec.DDTree(budget=40)]


def sharp_drafter(target, *, seed: int = 1, scale: float = 6.0) -> DFlashDrafter:
    drafter = DFlashDrafter.for_target(
        target, mask_token_id=3, num_layers=1, block_size=6, target_layer_ids=(0, 1), intermediate_size=128, seed=seed
    )
    with torch.no_grad():
        for p in drafter.model.parameters():
            if p.dim() == 2:
                p.mul_(scale)
    return drafter


def prompt(n: int = 12, seed: int = 0) -> torch.Tensor:
    return torch.randint(4, 128, (1, n), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("arch", ARCHS)
def test_fast_round_equals_hf_greedy(arch):
    target = tiny_model(arch, scale=2.0)
    drafter = sharp_drafter(target)
    for seed in range(2):
        ids = prompt(seed=seed)
        ref = target.generate(ids, max_new_tokens=30, min_new_tokens=30, do_sample=False)
        out = specdec.generate(target, ids, max_new_tokens=30, cuda_graphs=True)
        assert out.stats.path == "fast" and torch.equal(out.sequences, ref)
        for tree in TREES:
            out = specdec.generate(target, ids, drafter=drafter, tree=tree, max_new_tokens=30, cuda_graphs=True)
            assert out.stats.path == "fast", tree
            assert torch.equal(out.sequences, ref), (arch, tree)


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gpt2"])
def test_fast_model_drafter_equals_hf_greedy_and_the_eager_drafts(arch):
    """The small-LM drafter on the fast path drafts what the eager drafter drafts (same acceptance, same forwards),
    including prompts shorter than its re-run window."""
    target = tiny_model(arch, scale=2.0)
    drafter = specdec.ModelDrafter(perturbed_copy(target, noise=0.3))
    for length in (3, 15):
        ids = prompt(n=length, seed=length)
        ref = target.generate(ids, max_new_tokens=30, min_new_tokens=30, do_sample=False)
        for tree in (specdec.Chain(k=4), specdec.DDTree(budget=10, topk=3)):
            fast = specdec.generate(target, ids, drafter=drafter, tree=tree, max_new_tokens=30, cuda_graphs=True)
            eager = specdec.generate(target, ids, drafter=drafter, tree=tree, max_new_tokens=30, cuda_graphs=False)
            assert fast.stats.path == "fast" and torch.equal(fast.sequences, ref), (arch, tree, length)
            assert fast.stats.accept_hist == eager.stats.accept_hist
            assert fast.stats.draft_forwards == eager.stats.draft_forwards


def test_fast_round_equals_eager_round_on_the_zoo(zoo):
    """The trained zoo pair accepts long paths (tau > 2), so commits of deep paths and bonuses are exercised."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specdec.loading import load_prompts

    target = AutoModelForCausalLM.from_pretrained(zoo / "target-dense", dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(zoo / "tokenizer")
    drafter = DFlashDrafter.from_pretrained("assets/drafters/zoo-dense", target=target)
    taus = []
    for row in load_prompts(zoo / "prompts_dev.jsonl")[:3]:
        ids = tok(row["prompt"], return_tensors="pt").input_ids
        ref = target.generate(ids, max_new_tokens=48, do_sample=False)
        for tree in (specdec.Chain(k=15), specdec.DDTree(budget=32, topk=8)):
            fast = specdec.generate(target, ids, drafter=drafter, tree=tree, max_new_tokens=48, cuda_graphs=True)
            eager = specdec.generate(target, ids, drafter=drafter, tree=tree, max_new_tokens=48, cuda_graphs=False)
            assert torch.equal(fast.sequences, ref) and torch.equal(eager.sequences, ref)
            assert fast.stats.accept_hist == eager.stats.accept_hist  # the same trees, the same acceptance
            taus.append(fast.stats.tau)
    assert max(taus) > 2.5


def test_eos_on_the_fast_path_matches_hf():
    target = tiny_model("qwen3", scale=2.0)
    drafter = sharp_drafter(target)
    ids = prompt()
    free = target.generate(ids, max_new_tokens=30, min_new_tokens=30, do_sample=False)[0, ids.shape[1] :].tolist()
    for eos in (free[0], free[7], [free[5], free[11]]):
        ref = target.generate(ids, max_new_tokens=30, do_sample=False, eos_token_id=eos, pad_token_id=0)
        for tree in (None, specdec.DDTree(budget=12, topk=3)):
            out = specdec.generate(
                target,
                ids,
                drafter=drafter if tree else None,
                tree=tree,
                max_new_tokens=30,
                eos_token_id=eos,
                cuda_graphs=True,
            )
            assert torch.equal(out.sequences, ref[:, : out.sequences.shape[1]]) and ref.shape == out.sequences.shape


@pytest.mark.parametrize("arch", ["qwen3", "gpt2"])
def test_padded_and_eager_prefills_equal_hf_greedy(arch):
    """Prompts at the edges of the prefill buckets run padded (pads after the prompt, masked until overwritten);
    a prompt past PREFILL_CAPTURE_MAX runs the eager prefill. Both give HF's tokens, for both drafter kinds."""
    from specdec.engine import PREFILL_BUCKET, PREFILL_CAPTURE_MAX

    positions = {"n_positions": 1024} if arch == "gpt2" else {"max_position_embeddings": 1024}
    target = tiny_model(arch, scale=2.0, **positions)
    drafters = [(sharp_drafter(target), specdec.DDTree(budget=12, topk=3)),
                (specdec.ModelDrafter(perturbed_copy(target, noise=0.3)), specdec.Chain(k=3))]  # fmt: skip

    def engine():
        return FastEngine.for_target(TargetModel.wrap(target), capacity=1)

    for n in (1, PREFILL_BUCKET - 1, PREFILL_BUCKET, PREFILL_BUCKET + 1, PREFILL_CAPTURE_MAX + 7):
        ids = prompt(n=n, seed=n)
        ref = target.generate(ids, max_new_tokens=12, min_new_tokens=12, do_sample=False)
        for drafter, tree in [(None, None), *drafters]:
            out = specdec.generate(target, ids, drafter=drafter, tree=tree, max_new_tokens=12, cuda_graphs=True)
            assert out.stats.path == "fast" and torch.equal(out.sequences, ref), (arch, n, type(drafter).__name__)
        sizes = {key[1] for key in engine()._prefills}
        if n <= PREFILL_BUCKET + 1:
            assert sizes == {PREFILL_BUCKET} | ({2 * PREFILL_BUCKET} if n > PREFILL_BUCKET else set())
        else:  # the long prompt took the eager prefill
            assert max(sizes, default=0) <= PREFILL_CAPTURE_MAX


def test_commit_rows_equals_per_row_reference():
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        kv = torch.randn(3, 2, 1, 2, 40, 4, generator=gen)
        prefix = int(torch.randint(0, 10, (1,), generator=gen))
        steps = int(torch.randint(1, 8, (1,), generator=gen))
        path = sorted(set([0] + torch.randint(1, 20, (steps,), generator=gen).tolist()))
        padded = path + [path[-1]] * (8 - len(path))
        want = kv.clone()
        commit_rows_reference(want, prefix, padded)
        commit_rows(kv, torch.tensor(prefix), torch.tensor(padded))
        assert torch.equal(kv[..., : prefix + len(path), :], want[..., : prefix + len(path), :])


def test_engine_is_reused_and_grows_outside_rounds():
    target = tiny_model("llama", scale=2.0)
    drafter = sharp_drafter(target)
    tree = specdec.DDTree(budget=12, topk=3)
    specdec.generate(target, prompt(), drafter=drafter, tree=tree, max_new_tokens=20, cuda_graphs=True)
    engine = FastEngine.for_target(TargetModel.wrap(target), capacity=1)
    rounds = dict(engine._rounds)
    specdec.generate(target, prompt(seed=3), drafter=drafter, tree=tree, max_new_tokens=20, cuda_graphs=True)
    assert FastEngine.for_target(TargetModel.wrap(target), capacity=1) is engine and engine._rounds == rounds
    ids = prompt(n=300, seed=4)  # needs more slots than the engine holds: new storage, same tokens as HF
    ref = target.generate(ids, max_new_tokens=20, min_new_tokens=20, do_sample=False)
    out = specdec.generate(target, ids, drafter=drafter, tree=tree, max_new_tokens=20, cuda_graphs=True)
    assert torch.equal(out.sequences, ref)
    assert FastEngine.for_target(TargetModel.wrap(target), capacity=1).capacity >= 300 + 20 + bucket_size(13)


def test_unsupported_pairs_fall_back_to_the_eager_path_with_a_reason(caplog):
    target = tiny_model("qwen3", scale=2.0)
    ids = prompt()
    ref = target.generate(ids, max_new_tokens=12, min_new_tokens=12, do_sample=False)
    with caplog.at_level(logging.WARNING, logger="specdec.generate"):
        out = specdec.generate(target, ids, drafter=specdec.NGramDrafter(), max_new_tokens=12, cuda_graphs=True)
    assert out.stats.path == "eager" and torch.equal(out.sequences, ref)
    assert "NGramDrafter has no fast path" in caplog.text
    gemma = tiny_model("gemma3", scale=2.0)
    with caplog.at_level(logging.WARNING, logger="specdec.generate"):
        out = specdec.generate(gemma, ids, max_new_tokens=8, cuda_graphs=True)
    assert out.stats.path == "eager" and "sliding-window" in caplog.text
    assert specdec.generate(target, ids, max_new_tokens=8).stats.path == "eager"  # CPU default


def test_fast_sampling_matches_hf_processed_distribution():
    """First two tokens at T=0.8, top_k=4 through a DDTree round (Gumbel-max on the device): the joint counts fit
    the exact joint built from HF's own warpers, and the same counts reject the joint at temperature 1.3 (the
    test has power against a wrong temperature at this sample size)."""
    target = tiny_model("qwen3", scale=2.0)
    with torch.no_grad():
        target.get_output_embeddings().weight.mul_(8.0)  # sharp distributions: the temperature matters
    drafter = sharp_drafter(target)
    ids = prompt()

    def joint_of(temperature):
        warp = [TemperatureLogitsWarper(temperature), TopKLogitsWarper(4)]

        def probs(seq):
            logits = target(seq).logits[:, -1].float()
            for w in warp:
                logits = w(seq, logits)
            return torch.softmax(logits, -1)[0]

        with torch.no_grad():
            p1, joint = probs(ids), {}
            for t1 in p1.nonzero().flatten().tolist():
                p2 = probs(torch.cat([ids, torch.tensor([[t1]])], 1))
                for t2 in p2.nonzero().flatten().tolist():
                    joint[(t1, t2)] = float(p1[t1] * p2[t2])
        return joint

    joint, wrong = joint_of(0.8), joint_of(1.3)
    assert set(joint) == set(wrong)
    counts = dict.fromkeys(joint, 0)
    gen = torch.Generator().manual_seed(0)
    n = 1500
    for _ in range(n):
        out = specdec.generate(
            target,
            ids,
            drafter=drafter,
            tree=specdec.DDTree(budget=6, topk=2),
            max_new_tokens=2,
            do_sample=True,
            temperature=0.8,
            top_k=4,
            generator=gen,
            cuda_graphs=True,
        )
        counts[tuple(out.sequences[0, -2:].tolist())] += 1
    keys = sorted(joint)
    observed = torch.tensor([counts[k] for k in keys])
    assert gof_pvalue(observed, torch.tensor([joint[k] for k in keys])) > 1e-3
    assert gof_pvalue(observed, torch.tensor([wrong[k] for k in keys])) < 1e-3


def test_rounds_switch_span_buckets_as_the_sequence_grows():
    """Past SPAN_MIN committed slots the rounds move to a larger span bucket (a second graph): still HF greedy."""
    from specdec.engine import SPAN_MIN

    target = tiny_model("qwen3", scale=2.0)
    drafter = sharp_drafter(target)
    ids = prompt(n=20, seed=4)
    new = SPAN_MIN + 40
    ref = target.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False)
    for d, tree in ((None, None), (drafter, specdec.DDTree(budget=12, topk=3))):
        out = specdec.generate(target, ids, drafter=d, tree=tree, max_new_tokens=new, cuda_graphs=True)
        assert out.stats.path == "fast" and torch.equal(out.sequences, ref), tree
        engine = FastEngine._engines[target]
        spans = {key[-1] for key, rnd in engine._rounds.items() if rnd.drafter is d}
        assert SPAN_MIN in spans and max(spans) > SPAN_MIN, spans


def test_round_reads_nothing_on_the_host(monkeypatch):
    """Inside a round (drafter, build, mask, verify, acceptance, commit) no tensor value reaches the host: on CUDA
    each would be a device sync in the middle of the round. Plain decoding, chain and DDTree, DFlash and small-LM
    drafters; the one read per round is ``_Round.read`` of the pinned copy, outside the round."""
    reads = spy_round_reads(monkeypatch)
    target = tiny_model("qwen3", scale=2.0)
    drafters = [sharp_drafter(target), specdec.ModelDrafter(perturbed_copy(target, noise=0.3))]
    ids = prompt()
    rounds = 0
    for d, tree in [(None, None)] + [(d, t) for d in drafters for t in (specdec.Chain(k=4), specdec.DDTree(budget=12))]:
        out = specdec.generate(target, ids, drafter=d, tree=tree, max_new_tokens=20, cuda_graphs=True)
        rounds += out.stats.rounds
    assert rounds > 10 and reads == []


@pytest.mark.parametrize("do_sample", [False, True])
def test_a_call_reads_the_host_once_per_round(monkeypatch, do_sample):
    """Around the rounds, the loop's budget: one read per round (the pinned copy of its accepted tokens and counts)
    and one for the prefill's first token, for plain decoding, a chain and a DDTree, greedy and sampling."""
    target = tiny_model("qwen3", scale=2.0)
    drafter = sharp_drafter(target)  # its identity check reads the target's embedding once, before the spy
    reads = spy_round_reads(monkeypatch, everywhere=True)
    for d, tree in [(None, None), (drafter, specdec.Chain(k=4)), (drafter, specdec.DDTree(budget=12))]:
        reads.clear()
        out = specdec.generate(target, prompt(), drafter=d, tree=tree, max_new_tokens=20, do_sample=do_sample,
                               generator=torch.Generator().manual_seed(0), cuda_graphs=True)  # fmt: skip
        assert out.stats.path == "fast" and out.stats.rounds > 0
        assert len(reads) == out.stats.rounds + 1, reads
