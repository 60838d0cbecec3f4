"""The round on CPU (called, not replayed): token-identical to HF greedy and to an eager decode written from the
oracles, exact storage commit, engine reuse, refusals with a reason, no host reads inside a round, and the sampled
distribution against HF's own processing."""

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
from specdec.engine import Engine, tree_slots
from specdec.state.storage import commit_rows, commit_rows_reference
from specdec.target import TargetModel
from specdec.types import Accept

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
def test_round_equals_hf_greedy(arch):
    target = tiny_model(arch, scale=2.0)
    drafter = sharp_drafter(target)
    for seed in range(2):
        ids = prompt(seed=seed)
        ref = target.generate(ids, max_new_tokens=30, min_new_tokens=30, do_sample=False)
        out = specdec.generate(target, ids, max_new_tokens=30)
        assert out.stats.path == "eager" and torch.equal(out.sequences, ref)
        for tree in TREES:
            out = specdec.generate(target, ids, drafter=drafter, tree=tree, max_new_tokens=30)
            assert out.stats.path == "eager", tree
            assert torch.equal(out.sequences, ref), (arch, tree)


@torch.no_grad()
def hf_greedy_logq(draft_model, committed: list[int], depth: int) -> torch.Tensor:
    """Oracle: the draft model's own forward over the whole committed sequence, then ``depth - 1`` greedy steps
    (first maximum), each over the whole sequence: the per-depth log-probs ``[depth, V]``."""
    seq, rows = torch.tensor([committed]), []
    for _ in range(depth):
        row = torch.log_softmax(draft_model(seq).logits[0, -1].float(), dim=-1)
        rows.append(row)
        seq = torch.cat([seq, row.argmax().view(1, 1)], 1)
    return torch.stack(rows)


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gpt2"])
@torch.no_grad()
def test_model_drafter_equals_hf_greedy_and_drafts_its_own_greedy_logq(arch):
    """The small-LM drafter in the round: HF's greedy tokens, ``depth`` draft forwards per round, and each round's
    proposal equals the draft model's own forwards over the committed tokens (after the prompt and after commits
    of accepted paths), including prompts shorter than its re-run window."""
    target = tiny_model(arch, scale=2.0)
    draft_model = perturbed_copy(target, noise=0.3)
    drafter = specdec.ModelDrafter(draft_model)
    for length in (3, 15):
        ids = prompt(n=length, seed=length)
        ref = target.generate(ids, max_new_tokens=30, min_new_tokens=30, do_sample=False)
        for tree in (specdec.Chain(k=4), specdec.DDTree(budget=10, topk=3)):
            out = specdec.generate(target, ids, drafter=drafter, tree=tree, max_new_tokens=30)
            assert out.stats.path == "eager" and torch.equal(out.sequences, ref), (arch, tree, length)
            assert out.stats.draft_forwards == drafter.forwards_per_round(tree) * out.stats.rounds
            depth = drafter.draft_depth(tree)
            state = drafter.attach(TargetModel.wrap(target), 64)
            state.prefill(ids)
            committed, step = ref[0, : length + 1].tolist(), 0
            while len(committed) < ref.shape[1] - depth - 1:
                prefix = torch.tensor([len(committed) - 1])
                proposal = state.propose(torch.tensor(committed[-1:]), prefix, depth, 64)
                torch.testing.assert_close(proposal.logq[0], hf_greedy_logq(draft_model, committed, depth),
                                           atol=1e-5, rtol=1e-5)  # fmt: skip
                num = 1 + step % (depth + 1)  # accepted drafts + bonus: 1 .. depth + 1 tokens
                tokens = torch.zeros(depth + 1, dtype=torch.long)  # the round leaves 0 past the path
                tokens[:num] = ref[0, len(committed) : len(committed) + num]
                path = torch.arange(depth + 1).clamp(max=num - 1)
                state.commit(Accept(path[None], torch.tensor([num]), tokens[None]), None, prefix)
                committed, step = ref[0, : len(committed) + num].tolist(), step + 1


@pytest.mark.slow  # about 12-30 s: in the slow tier, which CI runs
def test_round_equals_the_eager_oracle_decode_on_the_zoo(zoo):
    """The trained zoo pair accepts long paths (tau > 2), so commits of deep paths and bonuses are exercised; the
    round builds the trees and accepts the paths an eager decode written from the oracles does (dynamic caches, the
    heap DDTree, the host walk): same tokens, same accepted length in every round."""
    from oracles.dflash_eager import eager_decode
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specdec.loading import load_prompts

    target = AutoModelForCausalLM.from_pretrained(zoo / "target-dense", dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(zoo / "tokenizer")
    drafter = DFlashDrafter.from_pretrained("assets/drafters/zoo-dense", target=target)
    taus = []
    for row in load_prompts(zoo / "prompts_dev.jsonl")[:3]:
        ids = tok(row["prompt"], return_tensors="pt").input_ids
        ref = target.generate(ids, max_new_tokens=48, min_new_tokens=48, do_sample=False)
        for tree in (specdec.Chain(k=15), specdec.DDTree(budget=32, topk=8)):
            out = specdec.generate(target, ids, drafter=drafter, tree=tree, max_new_tokens=48, eos_token_id=[])
            tokens, lengths = eager_decode(target, drafter, ids, tree, 48)
            assert torch.equal(out.sequences, ref) and tokens == ref[0, ids.shape[1] :].tolist()
            # the same trees, the same acceptance (the last round may be cut by max_new_tokens)
            assert out.stats.accept_lengths[:-1] == lengths[: out.stats.rounds - 1]
            taus.append(out.stats.tau)
    assert max(taus) > 2.5


def test_eos_in_the_round_matches_hf():
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
            )
            assert torch.equal(out.sequences, ref[:, : out.sequences.shape[1]]) and ref.shape == out.sequences.shape


@pytest.mark.parametrize("arch", ["qwen3", "gpt2"])
def test_padded_and_uncaptured_prefills_equal_hf_greedy(arch):
    """Prompts at the edges of the prefill buckets run padded (pads after the prompt, masked until overwritten);
    a prompt past PREFILL_WHOLE the coarse buckets, one past PREFILL_CAPTURE_MAX the uncaptured prefill. Both give
    HF's tokens, for both drafter kinds."""
    from specdec.engine import PREFILL_BUCKET, PREFILL_CAPTURE_MAX, PREFILL_COARSE_BUCKET, PREFILL_WHOLE

    positions = {"n_positions": 4096} if arch == "gpt2" else {"max_position_embeddings": 4096}
    target = tiny_model(arch, scale=2.0, **positions)
    drafters = [(sharp_drafter(target), specdec.DDTree(budget=12, topk=3)),
                (specdec.ModelDrafter(perturbed_copy(target, noise=0.3)), specdec.Chain(k=3))]  # fmt: skip

    def engine():
        return Engine.for_target(TargetModel.wrap(target), capacity=1)

    for n in (1, PREFILL_BUCKET - 1, PREFILL_BUCKET, PREFILL_BUCKET + 1, PREFILL_WHOLE + 1, PREFILL_CAPTURE_MAX + 7):
        ids = prompt(n=n, seed=n)
        ref = target.generate(ids, max_new_tokens=12, min_new_tokens=12, do_sample=False)
        for drafter, tree in [(None, None), *drafters]:
            out = specdec.generate(target, ids, drafter=drafter, tree=tree, max_new_tokens=12)
            assert out.stats.path == "eager" and torch.equal(out.sequences, ref), (arch, n, type(drafter).__name__)
        sizes = {key[1] for key in engine()._prefills}
        if n <= PREFILL_BUCKET + 1:
            assert sizes == {PREFILL_BUCKET} | ({2 * PREFILL_BUCKET} if n > PREFILL_BUCKET else set())
        elif n <= PREFILL_CAPTURE_MAX:  # past PREFILL_WHOLE: the coarse buckets
            assert max(sizes) == PREFILL_WHOLE + PREFILL_COARSE_BUCKET
        else:  # the long prompt took the uncaptured prefill
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
    specdec.generate(target, prompt(), drafter=drafter, tree=tree, max_new_tokens=20)
    engine = Engine.for_target(TargetModel.wrap(target), capacity=1)
    rounds = dict(engine._rounds)
    specdec.generate(target, prompt(seed=3), drafter=drafter, tree=tree, max_new_tokens=20)
    assert Engine.for_target(TargetModel.wrap(target), capacity=1) is engine and engine._rounds == rounds
    ids = prompt(n=300, seed=4)  # needs more slots than the engine holds: new storage, same tokens as HF
    ref = target.generate(ids, max_new_tokens=20, min_new_tokens=20, do_sample=False)
    out = specdec.generate(target, ids, drafter=drafter, tree=tree, max_new_tokens=20)
    assert torch.equal(out.sequences, ref)
    assert Engine.for_target(TargetModel.wrap(target), capacity=1).capacity >= 300 + 20 + tree_slots(drafter, tree)


def test_cuda_graphs_on_cpu_warn_and_run_the_same_round(caplog):
    """``cuda_graphs=True`` where graphs cannot be captured (CPU): a warning names why, and the same round runs
    (called), for every drafter; the CPU default calls it without a warning."""
    target = tiny_model("qwen3", scale=2.0)
    ids = prompt()
    ref = target.generate(ids, max_new_tokens=12, min_new_tokens=12, do_sample=False)
    for drafter in (None, specdec.NGramDrafter(), sharp_drafter(target)):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="specdec.generate"):
            out = specdec.generate(target, ids, drafter=drafter, max_new_tokens=12, cuda_graphs=True)
        assert out.stats.path == "eager" and torch.equal(out.sequences, ref)
        assert "cuda_graphs=True" in caplog.text and "CUDA graphs need a CUDA device" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="specdec.generate"):
        assert specdec.generate(target, ids, max_new_tokens=8).stats.path == "eager"  # CPU default
    assert not caplog.text


class _PathsOnly(specdec.DDTree):
    """A tree policy that builds from drafted paths only."""

    reads = ("paths",)


def test_a_policy_that_cannot_read_the_proposal_is_refused_with_a_reason():
    target = tiny_model("qwen3", scale=2.0)
    drafter = specdec.ModelDrafter(perturbed_copy(target, noise=0.3))  # proposes logq
    with pytest.raises(ValueError, match=r"_PathsOnly builds from \['paths'\] but ModelDrafter proposes \['logq'\]"):
        specdec.generate(target, prompt(), drafter=drafter, tree=_PathsOnly(budget=4), max_new_tokens=4)
    ref = target.generate(prompt(), max_new_tokens=6, min_new_tokens=6, do_sample=False)
    out = specdec.generate(target, prompt(), drafter=specdec.NGramDrafter(), tree=_PathsOnly(4), max_new_tokens=6)
    assert torch.equal(out.sequences, ref)


def test_round_sampling_matches_hf_processed_distribution():
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
        out = specdec.generate(target, ids, drafter=d, tree=tree, max_new_tokens=new)
        assert out.stats.path == "eager" and torch.equal(out.sequences, ref), tree
        engine = Engine._engines[target][1]
        spans = {rnd.span for rnd in engine._rounds.values() if rnd.drafter is d}
        assert SPAN_MIN in spans and max(spans) > SPAN_MIN, spans


def test_round_reads_nothing_on_the_host(monkeypatch):
    """Inside a round (drafter, build, mask, verify, acceptance, commit) no tensor value reaches the host: on CUDA
    each would be a device sync in the middle of the round. Plain decoding, chain and DDTree, DFlash, small-LM and
    n-gram drafters, and ``min_new_tokens``; the one read per round is ``Round.read`` of the pinned copy, outside
    the round."""
    reads = spy_round_reads(monkeypatch)
    target = tiny_model("qwen3", scale=2.0)
    drafters = [sharp_drafter(target), specdec.ModelDrafter(perturbed_copy(target, noise=0.3)), specdec.NGramDrafter()]
    ids = prompt()
    rounds = 0
    for d, tree in [(None, None)] + [(d, t) for d in drafters for t in (specdec.Chain(k=4), specdec.DDTree(budget=12))]:
        out = specdec.generate(target, ids, drafter=d, tree=tree, max_new_tokens=20)
        rounds += out.stats.rounds
    eos = int(target.generate(ids, max_new_tokens=3, do_sample=False)[0, -1])
    for d in (None, drafters[0]):
        out = specdec.generate(target, ids, drafter=d, max_new_tokens=20, min_new_tokens=10, eos_token_id=eos)
        rounds += out.stats.rounds
    assert rounds > 10 and reads == []


@pytest.mark.parametrize("do_sample", [False, True])
def test_a_call_reads_the_host_once_per_round(monkeypatch, do_sample):
    """Around the rounds, the loop's budget: one read per round (the pinned copy of its accepted tokens and counts),
    one for the prefill's first token and one of the prompt (whether it holds pad tokens, from which HF infers the
    attention mask: tests/test_input_rules.py), for plain decoding, a chain and a DDTree, greedy and sampling; and
    one more where the storage holds the previous call's sequence to compare the prompt with (multi-turn reuse).
    ``DDTree(budget="auto")`` too: its expectations ride in the same copy, its round times come from events."""
    target = tiny_model("qwen3", scale=2.0)
    drafter = sharp_drafter(target)  # its identity check reads the target's embedding once, before the spy
    reads = spy_round_reads(monkeypatch, everywhere=True)
    for d, tree in [(None, None), (drafter, specdec.Chain(k=4)), (drafter, specdec.DDTree(budget=12))]:
        reads.clear()
        out = specdec.generate(target, prompt(), drafter=d, tree=tree, max_new_tokens=20, do_sample=do_sample,
                               generator=torch.Generator().manual_seed(0), reuse_prefix=False)  # fmt: skip
        assert out.stats.path == "eager" and out.stats.rounds > 0
        assert len(reads) == out.stats.rounds + 2, reads
        reads.clear()
        again = specdec.generate(target, out.sequences, drafter=d, tree=tree, max_new_tokens=20, do_sample=do_sample,
                                 pad_token_id=10_000, generator=torch.Generator().manual_seed(0))  # fmt: skip
        assert again.stats.reused_tokens > 0 and len(reads) == again.stats.rounds + 3, reads
    reads.clear()
    auto = specdec.DDTree(budget="auto", topk=3, sizes=(2, 6, 12))
    out = specdec.generate(target, prompt(), drafter=drafter, tree=auto,
                           max_new_tokens=20, do_sample=do_sample, generator=torch.Generator().manual_seed(0),
                           reuse_prefix=False)  # fmt: skip
    assert out.stats.budgets and len(reads) == out.stats.rounds + 2, reads


def test_the_tail_of_a_call_is_launched_ahead_and_at_most_one_round_is_dropped(monkeypatch):
    """The loop launches round t + 1 before reading round t unless round t may well finish the call: with a drafter
    that gets about one token per round, only the last two rounds wait for the read before them (not the last
    ``D + 1``, the most a round can commit), at most one launched round is never read, and the tokens are HF's."""
    import specdec.engine as engine_module

    target = tiny_model("qwen3", scale=2.0)
    drafter = DFlashDrafter.for_target(target, mask_token_id=3, num_layers=1, block_size=6, target_layer_ids=(0, 1),
                                       intermediate_size=128, seed=5)  # fmt: skip
    events: list[str] = []
    launch, read = engine_module.Round.launch, engine_module.Round.read
    monkeypatch.setattr(engine_module.Round, "launch", lambda self, *a: events.append("L") or launch(self, *a))
    monkeypatch.setattr(engine_module.Round, "read", lambda self, t: events.append("R") or read(self, t))
    for max_new in (17, 30, 41):
        ids = prompt(seed=max_new)
        ref = target.generate(ids, max_new_tokens=max_new, min_new_tokens=max_new, do_sample=False)
        events.clear()
        out = specdec.generate(target, ids, drafter=drafter, tree=specdec.Chain(k=5), max_new_tokens=max_new,
                               min_new_tokens=max_new)  # fmt: skip
        assert torch.equal(out.sequences, ref)
        assert out.stats.rounds > max_new / 2  # a poor drafter: about one token per round
        in_flight, waited = 0, 0
        for event in events:
            if event == "L":
                waited += in_flight == 0
                in_flight += 1
            else:
                in_flight -= 1
        assert in_flight <= 1 and events.count("R") == out.stats.rounds
        assert waited <= 3, "".join(events)  # the first round and the last two
