"""Batches: every row of a batched call equals the same prompt decoded alone, by HF ``generate`` and by specdec.

The prompts differ in length and are left-padded (a tokenizer's ``padding=True, padding_side="left"``); some rows
end at an EOS rounds before the others. Expected tokens come from HF's own ``generate`` of each row alone; the
sampled distribution of each row from HF's own warpers (``oracles``). CPU, fp32, tiny random targets, rounds
called (not replayed).
"""

from __future__ import annotations

import importlib
import re

import pytest
import torch
from models import tiny_model
from oracles import gof_pvalue
from state.hybrid_harness import tiny_hybrid
from test_round import sharp_drafter
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper

import specdec
from specdec.drafters.dflash import DFlashDrafter
from specdec.trees import TREES
from specdec.types import SamplingParams
from specdec.verify import RULES

PAD = 0
LENGTHS = (5, 12, 8, 3, 10)


def prompts(count: int, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(4, 128, (n,), generator=gen) for n in LENGTHS[:count]]


def left_pad(rows: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """``input_ids`` and ``attention_mask`` ``[B, T]`` as a tokenizer pads on the left."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), PAD, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for b, row in enumerate(rows):
        ids[b, width - len(row) :] = row
        mask[b, width - len(row) :] = 1
    return ids, mask


def hf_alone(target, row: torch.Tensor, max_new: int, eos=None) -> list[int]:
    """HF greedy ``generate`` of one unpadded prompt: its new tokens (up to and including an EOS)."""
    out = target.generate(row[None], max_new_tokens=max_new, do_sample=False, eos_token_id=eos, pad_token_id=PAD)
    return out[0, len(row) :].tolist()


def check_rows(target, rows, out, max_new, eos=None, alone=None):
    """Each row of ``out`` = its prompt as given, then HF's tokens of the row alone, then padding."""
    ids, _ = left_pad(rows)
    width = ids.shape[1]
    assert torch.equal(out.sequences[:, :width], ids)
    wants = [hf_alone(target, row, max_new, eos) for row in rows]
    assert out.sequences.shape[1] == width + max(len(w) for w in wants)
    for b, want in enumerate(wants):
        got = out.sequences[b, width:].tolist()
        assert got[: len(want)] == want, (b, got, want)
        assert all(t == PAD for t in got[len(want) :]), (b, got)
        if alone is not None:  # specdec on the row alone: the same tokens
            single = alone(row=rows[b])
            assert single.sequences[0, len(rows[b]) :].tolist() == want
    if len(rows) > 1:
        assert [r.new_tokens for r in out.stats.rows] == [len(w) for w in wants]
        assert out.stats.new_tokens == sum(len(w) for w in wants)
        assert out.stats.rounds == sum(r.rounds for r in out.stats.rows)
    return wants


def model_drafter(target, seed: int = 1) -> specdec.ModelDrafter:
    """A draft LM: the target with its weights perturbed (agrees often, not always)."""
    import copy

    draft = copy.deepcopy(target)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(0.05 * p.std() * torch.randn(p.shape, generator=gen))
    return specdec.ModelDrafter(draft)


def eagle3_drafter(target) -> specdec.Eagle3Drafter:
    """A random EAGLE-3 head fusing hidden_states 2, 1, 2 of a two- or three-layer target; sharp drafts over a
    draft vocabulary of 100 ids."""
    drafter = specdec.Eagle3Drafter.for_target(target, layer_ids=(2, 1, 2), intermediate_size=128,
                                               draft_vocab_size=100, seed=1)  # fmt: skip
    with torch.no_grad():
        for p in drafter.model.parameters():
            if p.dim() == 2:
                p.mul_(8.0)
    return drafter


DRAFTERS = {
    "ar": lambda t: (None, None),
    "ngram-chain": lambda t: (specdec.NGramDrafter(), specdec.Chain(4)),
    "ngram-tree": lambda t: (specdec.NGramDrafter(max_matches=4), specdec.DDTree(budget=10)),
    "model-tree": lambda t: (model_drafter(t), specdec.DDTree(budget=8, topk=3)),
    "dflash-chain": lambda t: (sharp_drafter(t), specdec.Chain(5)),
    "dflash-tree": lambda t: (sharp_drafter(t), specdec.DDTree(budget=12, topk=3)),
    "mtp-tree": lambda t: (specdec.MTPDrafter.random(t, seed=1, std=0.3), specdec.DDTree(budget=8, topk=3)),
    "eagle3-chain": lambda t: (eagle3_drafter(t), specdec.Chain(4)),
    "eagle3-tree": lambda t: (eagle3_drafter(t), specdec.DDTree(budget=10, topk=3)),
}


@pytest.mark.parametrize("arch", ["llama", "gemma3", "gpt2"])
@pytest.mark.parametrize("method", list(DRAFTERS))
def test_batch_rows_equal_hf_alone(arch, method):
    if method.startswith("mtp") and arch != "llama":
        pytest.skip("an MTP head is built from a full-attention decoder layer of the target (none in gpt2 or here)")
    settings = {"sliding_window": 6} if arch == "gemma3" else {}  # a window that acts on these sequences
    target = tiny_model(arch, scale=2.0, **settings)
    drafter, tree = DRAFTERS[method](target)
    rows = prompts(3)
    ids, mask = left_pad(rows)

    def alone(row):
        return specdec.generate(target, row[None], drafter=drafter, tree=tree, max_new_tokens=20)

    out = specdec.generate(target, ids, attention_mask=mask, drafter=drafter, tree=tree, max_new_tokens=20)
    check_rows(target, rows, out, 20, alone=alone)
    if drafter is not None:
        assert out.stats.rows and all(r.rounds > 0 for r in out.stats.rows)


@pytest.mark.parametrize("batch", [2, 3, 5])
def test_batch_sizes_with_rows_ending_at_different_rounds(batch):
    """An EOS that some rows produce early and others late or never: finished rows stop committing, are padded,
    and the rest go on exactly."""
    target = tiny_model("qwen3", scale=2.0)
    drafter = sharp_drafter(target)
    rows = prompts(batch, seed=3)
    free = [hf_alone(target, row, 24) for row in rows]
    # row 0 ends at a token it first produces after a few steps; the others wherever (or if) they produce it
    stop = next(i for i in range(4, 24) if free[0][i] not in free[0][:i])
    eos = free[0][stop]
    ids, mask = left_pad(rows)
    for tree in (specdec.Chain(5), specdec.DDTree(budget=12, topk=3)):
        out = specdec.generate(target, ids, attention_mask=mask, drafter=drafter, tree=tree, max_new_tokens=24,
                               eos_token_id=eos, pad_token_id=PAD)  # fmt: skip
        wants = check_rows(target, rows, out, 24, eos=eos)
        assert len(wants[0]) == stop + 1 and len({len(w) for w in wants}) > 1, wants


def test_a_first_token_that_ends_a_row_while_the_first_round_is_in_flight():
    """The first round is launched before the first token is read: a row whose first token is its EOS is masked
    after that round (the batch's other rows go on exactly), a single row's call ends with its launched round
    dropped, and the calls after it on the same storage still equal HF (a continuation included)."""
    target = tiny_model("qwen3", scale=2.0)
    drafter = sharp_drafter(target)
    rows = prompts(3, seed=5)
    eos = hf_alone(target, rows[1], 1)[0]  # row 1 ends at its first token
    assert any(hf_alone(target, row, 12)[0] != eos for row in rows)
    ids, mask = left_pad(rows)
    for tree in (specdec.Chain(4), specdec.DDTree(budget=10, topk=3)):
        out = specdec.generate(target, ids, attention_mask=mask, drafter=drafter, tree=tree, max_new_tokens=12,
                               eos_token_id=eos, pad_token_id=PAD)  # fmt: skip
        wants = check_rows(target, rows, out, 12, eos=eos)
        assert wants[1] == [eos]
        one = specdec.generate(target, rows[1][None], drafter=drafter, tree=tree, max_new_tokens=12,
                               eos_token_id=eos, pad_token_id=PAD)  # fmt: skip
        assert one.sequences[0, len(rows[1]) :].tolist() == [eos]
        longer = torch.cat([rows[1], torch.tensor([eos, 9, 17])])  # the next turn on the same storage
        again = specdec.generate(target, longer[None], drafter=drafter, tree=tree, max_new_tokens=12)
        assert again.sequences[0, len(longer) :].tolist() == hf_alone(target, longer, 12)


def test_batch_edge_cases():
    """A row of one token among long ones, identical rows, and B = 1 through the batched path (a mask of ones)."""
    target = tiny_model("llama", scale=2.0)
    drafter = sharp_drafter(target)
    tree = specdec.DDTree(budget=10, topk=3)
    long = prompts(2)[1]
    rows = [long, torch.tensor([7]), long.clone()]
    ids, mask = left_pad(rows)
    out = specdec.generate(target, ids, attention_mask=mask, drafter=drafter, tree=tree, max_new_tokens=16)
    check_rows(target, rows, out, 16)
    assert torch.equal(out.sequences[0], out.sequences[2])
    one = specdec.generate(target, long[None], attention_mask=torch.ones(1, len(long), dtype=torch.long),
                           drafter=drafter, tree=tree, max_new_tokens=16)  # fmt: skip
    check_rows(target, [long], one, 16)


def test_batch_bucket_rows_decode_nothing(monkeypatch):
    """With CUDA graphs a batch runs in its bucket (3 -> 4 rows); the extra row must not change any output. The
    bucket is forced here on the CPU."""
    module = importlib.import_module("specdec.generate")
    monkeypatch.setattr(module, "batch_bucket", lambda batch, graph: 4 if batch == 3 else batch)
    target = tiny_model("qwen3", scale=2.0)
    drafter = sharp_drafter(target)
    rows = prompts(3, seed=5)
    ids, mask = left_pad(rows)
    out = specdec.generate(target, ids, attention_mask=mask, drafter=drafter, tree=specdec.DDTree(budget=8),
                           max_new_tokens=16)  # fmt: skip
    check_rows(target, rows, out, 16)
    assert len(out.stats.rows) == 3


@pytest.mark.parametrize("family", ["qwen3_5", "falcon_h1"])
@pytest.mark.parametrize(
    "method", ["ar", "model-tree", "dflash-chain", "dflash-tree", "mtp-chain", "mtp-tree", "eagle3-tree"]
)
def test_batch_hybrid_rows_equal_hf_alone(family, method):
    """Hybrid targets: each row commits its recurrent state from its own accepted node."""
    if method.startswith("mtp") and family == "falcon_h1":
        pytest.skip("FalconH1's attention layers hold a recurrent mixer: no MTP layer class")
    target = tiny_hybrid(family)
    if method.startswith("mtp"):
        drafter = specdec.MTPDrafter.random(target, seed=1, std=0.3)
        tree = specdec.Chain(4) if method == "mtp-chain" else specdec.DDTree(budget=10, topk=3)
    elif method == "model-tree":  # an attention draft LM of the same vocabulary
        drafter, tree = specdec.ModelDrafter(tiny_model("llama", seed=3)), specdec.DDTree(budget=8, topk=3)
    elif method.startswith("dflash"):
        drafter = DFlashDrafter.for_target(target, mask_token_id=3, num_layers=1, block_size=6,
                                           target_layer_ids=(0, 1), intermediate_size=128, seed=1)  # fmt: skip
        tree = specdec.Chain(5) if method == "dflash-chain" else specdec.DDTree(budget=12, topk=3)
    elif method == "eagle3-tree":
        drafter, tree = eagle3_drafter(target), specdec.DDTree(budget=10, topk=3)
    else:
        drafter, tree = None, None
    rows = prompts(3, seed=2)
    ids, mask = left_pad(rows)
    out = specdec.generate(target, ids, attention_mask=mask, drafter=drafter, tree=tree, max_new_tokens=16)
    check_rows(target, rows, out, 16)


def _instantiate(cls):
    return cls()


@pytest.mark.parametrize("rule_name", sorted(RULES))
@pytest.mark.parametrize("policy_name", sorted(TREES))
def test_batch_every_policy_and_rule_greedy(policy_name, rule_name):
    """Every registered policy x rule that accepts greedy settings decodes a batch row by row as HF (the T = 0
    limit of the sampling rules)."""
    policy, rule = _instantiate(TREES[policy_name]), _instantiate(RULES[rule_name])
    target = tiny_model("qwen3", scale=2.0)
    drafter = sharp_drafter(target) if "logq" in policy.reads else specdec.NGramDrafter(max_matches=4)
    if "candidates" in policy.reads:  # a candidate tree (DynamicTree): a drafter that drafts one
        drafter = specdec.Eagle3Drafter.for_target(target, layer_ids=(2, 1, 2), seed=1)
    rows = prompts(3, seed=4)
    ids, mask = left_pad(rows)

    def run():
        return specdec.generate(target, ids, attention_mask=mask, drafter=drafter, tree=policy, verifier=rule,
                                max_new_tokens=12)  # fmt: skip

    try:
        rule.check(SamplingParams(), policy)
    except ValueError as err:  # a pair the rule is not exact for: refused by name, for a batch too
        with pytest.raises(ValueError, match=re.escape(str(err).split(":")[0])):
            run()
        return
    check_rows(target, rows, run(), 12)


def _joint(target, row, temperature, top_k):
    """HF's exact distribution of the first two new tokens of ``row`` under its own warpers."""
    warpers = [TemperatureLogitsWarper(temperature), TopKLogitsWarper(top_k)]

    def probs(ids):
        logits = target(ids).logits[:, -1]
        for w in warpers:
            logits = w(ids, logits)
        return torch.softmax(logits, -1)[0]

    with torch.no_grad():
        p1, joint = probs(row[None]), {}
        for t1 in p1.nonzero().flatten().tolist():
            p2 = probs(torch.cat([row, torch.tensor([t1])])[None])
            for t2 in p2.nonzero().flatten().tolist():
                joint[(t1, t2)] = float(p1[t1] * p2[t2])
    return joint


@pytest.mark.parametrize(
    "policy,rule",
    [
        (specdec.DDTree(budget=6, topk=2), None),  # sample-and-match
        (TREES["sampled-chain"](k=3), RULES["speculative-sampling"]()),
    ],
    ids=["ddtree-sample-match", "sampled-chain-speculative"],
)
def test_batch_sampling_per_row_matches_hf(policy, rule):
    """Sampling: the first two tokens of each row, over many rows of one batch, follow HF's distribution of that
    row (and not the distribution at a planted wrong temperature: the test has the power to see it)."""
    target = tiny_model("qwen3", scale=2.5)
    drafter = sharp_drafter(target)
    first, second = prompts(2, seed=6)
    copies = 50
    rows = [first] * copies + [second] * copies
    ids, mask = left_pad(rows)
    gen = torch.Generator().manual_seed(0)
    counts = [{}, {}]
    for _ in range(40):  # 2000 draws per prompt: temperature 0.8 rejected at p < 1e-3 (at 1000 draws, not always)
        out = specdec.generate(target, ids, attention_mask=mask, drafter=drafter, tree=policy, verifier=rule,
                               max_new_tokens=2, do_sample=True, temperature=0.5, top_k=4, generator=gen)  # fmt: skip
        for b in range(len(rows)):
            key = tuple(out.sequences[b, -2:].tolist())
            counts[b // copies][key] = counts[b // copies].get(key, 0) + 1
    for which, row in enumerate((first, second)):
        joint, wrong = _joint(target, row, 0.5, 4), _joint(target, row, 0.8, 4)
        keys = sorted(joint)
        assert set(counts[which]) <= set(keys)
        observed = torch.tensor([counts[which].get(k, 0) for k in keys])
        assert gof_pvalue(observed, torch.tensor([joint[k] for k in keys])) > 1e-3
        assert gof_pvalue(observed, torch.tensor([wrong[k] for k in keys])) < 1e-3


def test_speculative_model_decodes_a_batch():
    """The drop-in wrapper takes a tokenizer's left-padded batch as HF's generate does."""
    target = tiny_model("llama", scale=2.0)
    model = specdec.SpeculativeModel(target, drafter=sharp_drafter(target), tree=specdec.DDTree(budget=10, topk=3))
    rows = prompts(3, seed=7)
    ids, mask = left_pad(rows)
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=16, do_sample=False,
                         return_dict_in_generate=True)  # fmt: skip
    check_rows(target, rows, out, 16)
    assert len(model.last_stats.rows) == 3
