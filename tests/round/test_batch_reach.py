"""Batches where bugs hide: rows hundreds of tokens apart (a second span bucket, the storage growing between
calls), long decodes after one row has finished, ``min_new_tokens``, the scan prefill and the n-gram lookup with
several rows; and acceptance as an observable: a row's accept lengths in a batch equal the same row alone.

Expected tokens come from HF ``generate`` of each row alone (``check_rows``); expected accept lengths from
specdec on the row alone (tokens equal to HF's too). CPU, fp32, tiny random targets.
"""

from __future__ import annotations

import pytest
import torch
from models import tiny_model
from state.hybrid_harness import tiny_hybrid
from test_batch import PAD, check_rows, left_pad, model_drafter
from test_round import sharp_drafter

import specdec
from specdec.engine import SPAN_MIN, Engine
from specdec.state import hybrid


def _rows(lengths, seed: int, vocab: int = 128) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(4, vocab, (n,), generator=gen) for n in lengths]


def _repetitive(lengths, seed: int) -> list[torch.Tensor]:
    """Prompts built from a short repeated motif (with noise): the n-gram lookup finds matches in them."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for n in lengths:
        motif = torch.randint(4, 128, (5,), generator=gen)
        row = motif.repeat(n // 5 + 1)[:n].clone()
        row[torch.randint(0, n, (max(1, n // 10),), generator=gen)] = 7
        out.append(row)
    return out


def _hf(target, row, max_new, **kw) -> list[int]:
    out = target.generate(row[None], max_new_tokens=max_new, do_sample=False, pad_token_id=PAD, **kw)
    return out[0, len(row) :].tolist()


METHODS = {
    "dflash-tree": lambda t: (sharp_drafter(t), specdec.DDTree(budget=12, topk=3)),
    "ngram-chain": lambda t: (specdec.NGramDrafter(), specdec.Chain(4)),
    "model-tree": lambda t: (model_drafter(t), specdec.DDTree(budget=8, topk=3)),
}


@pytest.mark.parametrize("method", list(METHODS))
def test_ragged_rows_hundreds_apart_cross_a_span_bucket_and_grow_the_storage(method):
    """A short call first (the storage sized for it), then rows of 3, 40 and 250 tokens decoding 40 more: the
    storage is reallocated, the long row crosses the first span bucket while the short ones sit far below it."""
    target = tiny_model("llama", scale=2.0)
    drafter, tree = METHODS[method](target)
    short = _rows((6, 9, 4), seed=1)
    ids, mask = left_pad(short)
    check_rows(target, short, specdec.generate(target, ids, attention_mask=mask, drafter=drafter, tree=tree,
                                               max_new_tokens=8), 8)  # fmt: skip
    before = Engine._engines[target][3].capacity
    # n-gram: repetitive rows, so that its long accepted paths cross the bucket with a round in flight
    rows = (_repetitive if method.startswith("ngram") else _rows)((3, 40, 250), seed=2)
    ids, mask = left_pad(rows)
    out = specdec.generate(target, ids, attention_mask=mask, drafter=drafter, tree=tree, max_new_tokens=40)
    assert Engine._engines[target][3].capacity > before and SPAN_MIN < 250 + 40
    check_rows(target, rows, out, 40)


def _finished_early(prompt_lengths, new: int, trees, seed: int) -> None:
    """Row 0 stops at an EOS within a few tokens; the others decode ``new`` tokens past the first span bucket,
    the finished row still in the batch (masked, committing nothing) all the while."""
    target = tiny_model("qwen3", scale=2.0)
    drafter = model_drafter(target)
    rows = _rows(prompt_lengths, seed=seed)
    free = _hf(target, rows[0], 12)
    others = [_hf(target, r, new) for r in rows[1:]]
    # the EOS: a token row 0 produces early and the other rows never produce
    stop = next(i for i in range(2, 12) if free[i] not in free[:i] and not any(free[i] in o for o in others))
    eos = free[stop]
    assert max(prompt_lengths) + new > SPAN_MIN
    ids, mask = left_pad(rows)
    for tree in trees:
        out = specdec.generate(target, ids, attention_mask=mask, drafter=drafter, tree=tree, max_new_tokens=new,
                               eos_token_id=eos)  # fmt: skip
        wants = check_rows(target, rows, out, new, eos=eos)
        assert len(wants[0]) == stop + 1 and [len(w) for w in wants[1:]] == [new] * (len(rows) - 1)
        # the finished row commits nothing once the host has read its EOS: its length grows by at most the round
        # that produced it and the one launched ahead (each at most path_len), while the others ran many more rounds
        engine, path_len = Engine._engines[target][len(rows)], drafter.draft_depth(tree) + 1
        extra = int(engine.prefix[0]) - len(rows[0]) - len(wants[0])
        assert extra <= 2 * path_len, extra
        assert out.stats.rows[1].rounds - out.stats.rows[0].rounds > 3 * path_len


def test_long_decode_after_a_row_finished_early():
    _finished_early((6, 200, 11), 90, (specdec.DDTree(budget=8, topk=3),), seed=5)


@pytest.mark.slow
def test_long_decode_after_a_row_finished_early_slow():
    _finished_early((6, 30, 11, 120), 370, (specdec.DDTree(budget=12, topk=3), specdec.Chain(5)), seed=5)  # 490 < 512


def test_min_new_tokens_with_several_rows():
    """``min_new_tokens`` holds back an EOS per row, counted from each row's own prompt, as HF does alone. The EOS
    is picked (from HF runs only) so that counting a row's tokens from another row's prompt length changes its
    output: HF with ``min_new_tokens`` shifted by the prompts' difference differs from HF with the true value."""
    target = tiny_model("llama", scale=2.0)
    drafter = sharp_drafter(target)
    rows = _rows((5, 12, 8), seed=3)
    m, new = 10, 20

    def hf(b, eos, min_new):
        return _hf(target, rows[b], new, eos_token_id=eos, min_new_tokens=max(min_new, 0))

    candidates = sorted({t for b in (1, 2) for t in _hf(target, rows[b], new)[:m]})
    eos = next(t for t in candidates
               if any(hf(b, t, m) != hf(b, t, m - (len(rows[b]) - len(rows[0]))) for b in (1, 2)))  # fmt: skip
    wants = [hf(b, eos, m) for b in range(3)]
    ids, mask = left_pad(rows)
    for drafter_, tree in ((drafter, specdec.DDTree(budget=10, topk=3)), (specdec.NGramDrafter(), specdec.Chain(3)),
                           (None, None)):  # fmt: skip
        out = specdec.generate(target, ids, attention_mask=mask, drafter=drafter_, tree=tree, max_new_tokens=new,
                               eos_token_id=eos, min_new_tokens=m)  # fmt: skip
        width = ids.shape[1]
        for b, want in enumerate(wants):
            got = out.sequences[b, width:].tolist()
            assert got[: len(want)] == want and all(t == PAD for t in got[len(want) :]), (b, got, want)


@pytest.mark.parametrize("family", ["qwen3_5"])
def test_scan_prefill_with_several_rows(monkeypatch, family):
    """The hybrid prefill through the chain-tree verify (``scan``, CUDA's default, selected here on the CPU) on
    ragged rows, decoded by a drafter and by plain decoding: each row equals HF alone."""
    monkeypatch.setattr(hybrid, "PREFILL", "scan")
    target = tiny_hybrid(family)
    rows = _rows((4, 21, 9), seed=6)
    ids, mask = left_pad(rows)
    for drafter, tree in ((None, None), (specdec.NGramDrafter(), specdec.Chain(4))):
        out = specdec.generate(target, ids, attention_mask=mask, drafter=drafter, tree=tree, max_new_tokens=16)
        check_rows(target, rows, out, 16)


def test_ngram_lookup_with_several_rows():
    """Repetitive prompts of different lengths: the n-gram lookup drafts from each row's own text (accepts
    happen) and every row equals HF alone, for a chain and a tree of matches."""
    target = tiny_model("llama", scale=2.0)
    rows = _repetitive((23, 60, 14), seed=4)
    ids, mask = left_pad(rows)
    for drafter, tree in ((specdec.NGramDrafter(), specdec.Chain(4)),
                          (specdec.NGramDrafter(max_matches=4), specdec.DDTree(budget=10))):  # fmt: skip
        out = specdec.generate(target, ids, attention_mask=mask, drafter=drafter, tree=tree, max_new_tokens=32)
        check_rows(target, rows, out, 32)


# -- acceptance as an observable -------------------------------------------------------------------------
ACCEPT_METHODS = {
    "model-chain": lambda t: (model_drafter(t), specdec.Chain(4)),
    "model-tree": lambda t: (model_drafter(t), specdec.DDTree(budget=8, topk=3)),
    "ngram-chain": lambda t: (specdec.NGramDrafter(), specdec.Chain(4)),
    "ngram-tree": lambda t: (specdec.NGramDrafter(max_matches=4), specdec.DDTree(budget=10)),
}


@pytest.mark.parametrize("method", list(ACCEPT_METHODS))
def test_row_accept_lengths_in_a_batch_equal_the_row_alone(method):
    """Greedy: each row's rounds in a batch accept exactly what the same row's rounds accept alone (the drafter
    sees only its own row), so ``stats.rows[b].accept_lengths`` equals the row-alone call's; a drafter that
    leaks another row's context or a budget applied to the wrong row shows here even when tokens stay exact.
    (A random DFlash drafter accepts nothing on a random target: the trained zoo pair runs below.)"""
    target = tiny_model("llama", scale=2.0)
    drafter, tree = ACCEPT_METHODS[method](target)
    rows = _repetitive((9, 31, 16), seed=7) if method.startswith("ngram") else _rows((9, 31, 16), seed=7)
    ids, mask = left_pad(rows)
    out = specdec.generate(target, ids, attention_mask=mask, drafter=drafter, tree=tree, max_new_tokens=30)
    check_rows(target, rows, out, 30)
    accepted = 0
    for b, row in enumerate(rows):
        alone = specdec.generate(target, row[None], drafter=drafter, tree=tree, max_new_tokens=30)
        assert out.stats.rows[b].accept_lengths == alone.stats.accept_lengths, b
        accepted += sum(a - 1 for a in alone.stats.accept_lengths)
    assert accepted > 0  # the drafts are accepted somewhere: the comparison is not of all-ones


@pytest.mark.parametrize("tree", [specdec.DDTree(budget=15), specdec.Chain(6)], ids=["ddtree15", "chain6"])
def test_zoo_dflash_row_accept_lengths_in_a_batch_equal_the_row_alone(zoo, tree):
    """The trained DFlash drafter of the zoo dense pair (real acceptance): three dev prompts of different lengths
    in one left-padded batch; each row's tokens equal HF alone and its accept lengths equal the row alone."""
    import json

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specdec.drafters.dflash import DFlashDrafter
    from specdec.loading import asset_path

    model = AutoModelForCausalLM.from_pretrained(zoo / "target-dense", dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(zoo / "tokenizer")
    drafter = DFlashDrafter.from_pretrained(asset_path("drafters") / "zoo-dense", target=model)
    lines = (zoo / "prompts_dev.jsonl").read_text().splitlines()[:3]
    rows = [tok(json.loads(line)["prompt"], return_tensors="pt").input_ids[0, -n:] for line, n in
            zip(lines, (40, 9, 23), strict=True)]  # fmt: skip
    width = max(len(r) for r in rows)
    ids = torch.full((3, width), tok.pad_token_id or 0, dtype=torch.long)
    mask = torch.zeros(3, width, dtype=torch.long)
    for b, row in enumerate(rows):
        ids[b, width - len(row) :], mask[b, width - len(row) :] = row, 1
    out = specdec.generate(model, ids, attention_mask=mask, drafter=drafter, tree=tree, max_new_tokens=24)
    drafted = 0
    for b, row in enumerate(rows):
        want = model.generate(row[None], do_sample=False, max_new_tokens=24)[0, len(row) :].tolist()
        assert out.sequences[b, width : width + len(want)].tolist() == want, b
        alone = specdec.generate(model, row[None], drafter=drafter, tree=tree, max_new_tokens=24)
        assert out.stats.rows[b].accept_lengths == alone.stats.accept_lengths, b
        drafted += sum(a - 1 for a in alone.stats.accept_lengths)
    assert drafted >= 10, drafted  # a trained drafter: many drafts accepted
