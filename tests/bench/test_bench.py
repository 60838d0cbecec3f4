"""Tests of the benchmark harness: aggregation on synthetic rows, spec parsing, and tiny end-to-end runs."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from models import tiny_model

import specdec
from specdec import Chain, DDTree, NGramDrafter
from specdec.bench import (
    Method,
    aggregate,
    format_table,
    load_prompts,
    load_rows,
    main_bench,
    methods_from_specs,
    run_bench,
    write_report,
    zoo_dir,
)


def _row(method, tree, temperature, prompt_id, *, tau, rounds, decode_tokens, decode_s, phase_ms, same=None, **kw):
    row = {
        "method": method,
        "drafter": "none" if tree == "ar" else "NGramDrafter",
        "tree": tree,
        "budget": kw.get("budget", 0),
        "topk": kw.get("topk"),
        "temperature": temperature,
        "prompt_id": prompt_id,
        "prompt_tokens": 10,
        "new_tokens": decode_tokens + 1,
        "decode_tokens": decode_tokens,
        "tau": tau,
        "rounds": rounds,
        "target_forwards": rounds + 1,
        "draft_forwards": 0,
        "tree_nodes": rounds,
        "total_s": decode_s + phase_ms["prefill"] / 1e3,
        "prefill_s": phase_ms["prefill"] / 1e3,
        "decode_s": decode_s,
        "decode_tok_s": decode_tokens / decode_s,
        "phase_ms": phase_ms,
        "accept_hist": [rounds],
        "identical_to_ar": same,
    }
    return row


@pytest.fixture
def rows():
    return [
        _row("ar", "ar", 0.0, "a", tau=1.0, rounds=10, decode_tokens=10, decode_s=1.0, same=True,
             phase_ms={"prefill": 5.0, "draft": 1.0, "verify": 100.0}),
        _row("ar", "ar", 0.0, "b", tau=1.0, rounds=20, decode_tokens=20, decode_s=3.0, same=True,
             phase_ms={"prefill": 7.0, "draft": 2.0, "verify": 300.0}),
        _row("dd", "ddtree", 0.0, "a", tau=2.0, rounds=5, decode_tokens=10, decode_s=0.5, same=True, budget=8,
             topk=4, phase_ms={"prefill": 5.0, "draft": 5.0, "verify": 40.0, "accept": 2.0}),
        _row("dd", "ddtree", 0.0, "b", tau=3.0, rounds=5, decode_tokens=20, decode_s=1.5, same=False, budget=8,
             topk=4, phase_ms={"prefill": 9.0, "draft": 5.0, "verify": 60.0, "accept": 3.0}),
        _row("ar", "ar", 1.0, "a", tau=1.0, rounds=8, decode_tokens=8, decode_s=2.0,
             phase_ms={"prefill": 5.0, "verify": 80.0}),
        _row("dd", "ddtree", 1.0, "a", tau=1.5, rounds=4, decode_tokens=6, decode_s=1.0, budget=8, topk=4,
             phase_ms={"prefill": 5.0, "verify": 40.0}),
    ]  # fmt: skip


def test_aggregate_exact_numbers(rows):
    summary = {(s["method"], s["temperature"]): s for s in aggregate(rows)}
    assert list(summary) == [("ar", 0.0), ("dd", 0.0), ("ar", 1.0), ("dd", 1.0)]
    ar0, dd0, ar1, dd1 = summary.values()
    assert ar0["tau"] == 1.0 and dd0["tau"] == 2.5
    assert ar0["tok_s"] == 30 / 4.0 and dd0["tok_s"] == 30 / 2.0
    assert ar0["speedup"] == 1.0 and dd0["speedup"] == 2.0
    assert ar1["tok_s"] == 4.0 and dd1["tok_s"] == 6.0 and dd1["speedup"] == 1.5
    assert dd0["phase_ms_per_round"] == {"draft": 1.0, "verify": 10.0, "accept": 0.5}
    assert ar0["phase_ms_per_round"] == {"draft": 0.1, "verify": 400 / 30, "accept": 0.0}
    assert ar0["prefill_ms"] == 6.0 and dd0["prefill_ms"] == 7.0
    assert ar0["identical_share"] == 1.0 and dd0["identical_share"] == 0.5 and dd1["identical_share"] is None
    assert (dd0["budget"], dd0["topk"], dd0["prompts"], dd0["decode_tokens"]) == (8, 4, 2, 30)


def test_aggregate_without_ar_has_no_speedup(rows):
    summary = aggregate([r for r in rows if r["tree"] != "ar"])
    assert [s["speedup"] for s in summary] == [None, None]


def test_format_table_exact_lines(rows):
    lines = format_table(aggregate(rows)).splitlines()
    head = (
        "| method | T | budget | topk | τ | tok/s (warm) | speedup | ms/round | prefill ms | = AR | = HF | warm-up s "
        "| capture ms | compile ms | draft ms | verify ms | accept ms |"
    )
    assert lines[0] == head
    assert lines[2] == (
        "| ar | 0 | – | – | 1.00 | 7.5 | 1.00× | 133.333 | 6.00 | 100% | – | 0.0 | 0 | 0 | 0.100 | 13.333 | 0.000 |"
    )
    assert lines[3] == (
        "| dd | 0 | 8 | 4 | 2.50 | 15.0 | 2.00× | 200.000 | 7.00 | 50% | – | 0.0 | 0 | 0 | 1.000 | 10.000 | 0.500 |"
    )
    assert lines[5] == (
        "| dd | 1 | 8 | 4 | 1.50 | 6.0 | 1.50× | 250.000 | 5.00 | – | – | 0.0 | 0 | 0 | 0.000 | 10.000 | 0.000 |"
    )
    assert len(lines) == 6


def test_format_table_marks_rounds_that_ran_uncompiled(rows):
    """A method whose calls ran compiled rounds uncompiled (their compile failed) says so in its compile cell: the
    most in one call, not a sum over calls."""
    marked = [dict(r, compile_ms=5.0, compile_fallbacks=2 if r["prompt_id"] == "a" else 1) for r in rows]
    summary = {(s["method"], s["temperature"]): s for s in aggregate(marked)}
    assert summary[("dd", 0.0)]["compile_fallbacks"] == 2
    lines = format_table(aggregate(marked)).splitlines()
    want = (
        "| dd | 0 | 8 | 4 | 2.50 | 15.0 | 2.00× | 200.000 | 7.00 | 50% | – | 0.0 | 0 | 10 (2 uncompiled) | 1.000 "
        "| 10.000 | 0.500 |"
    )
    assert lines[3] == want
    assert "uncompiled" not in format_table(aggregate(rows))


def test_write_report_writes_all_files(rows, tmp_path):
    more = [dict(r, method="dd16", budget=16) for r in rows if r["method"] == "dd"]
    summaries = write_report(rows + more, tmp_path)
    assert load_rows(tmp_path / "results.jsonl") == rows + more
    assert (tmp_path / "results.md").read_text() == format_table(summaries)
    assert (tmp_path / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_load_prompts_reads_zoo_from_env(tmp_path, monkeypatch):
    (tmp_path / "prompts_dev.jsonl").write_text('{"id": "x", "prompt": "a"}\n\n{"prompt": "b"}\n{"prompt": "c"}\n')
    monkeypatch.setenv("SPECDEC_ZOO", str(tmp_path))
    assert zoo_dir() == tmp_path
    assert load_prompts(limit=2) == [{"id": "x", "prompt": "a"}, {"id": "1", "prompt": "b"}]
    (tmp_path / "bad.jsonl").write_text('{"id": "x"}\n')
    with pytest.raises(ValueError, match="no 'prompt' field"):
        load_prompts(tmp_path / "bad.jsonl")


def test_methods_from_specs_expands_tree_lists():
    specs = [
        {"name": "ar"},
        {"drafter": {"kind": "ngram", "max_ngram": 2}, "tree": {"kind": "ddtree", "budget": [4, 8], "topk": [1, None]}},
        {"name": "lookup", "drafter": "ngram", "tree": {"kind": "chain", "k": 3}},
        {"drafter": {"kind": "ngram", "max_ngram": 2}, "tree": {"kind": "chain", "k": [2]}},
    ]
    methods = methods_from_specs(specs, target=None, tokenizer=None)
    assert [m.name for m in methods] == [
        "ar", "ngram/ddtree-b4-k1", "ngram/ddtree-b4-kb", "ngram/ddtree-b8-k1", "ngram/ddtree-b8-kb", "lookup",
        "ngram/chain2",
    ]  # fmt: skip
    assert methods[0].drafter is None
    assert methods[2].tree == DDTree(budget=4, topk=None) and methods[5].tree == Chain(k=3)
    assert methods[1].drafter is methods[6].drafter and methods[1].drafter is not methods[5].drafter
    assert methods[1].drafter.config.max_ngram == 2


def test_methods_from_specs_rejects_unknown_names():
    with pytest.raises(ValueError, match="Unknown drafter 'nope'"):
        methods_from_specs([{"drafter": "nope"}], target=None, tokenizer=None)
    with pytest.raises(ValueError, match="unknown keys"):
        methods_from_specs([{"drafter": "ngram", "budget": 3}], target=None, tokenizer=None)
    with pytest.raises(ValueError, match="Unknown tree kind"):
        methods_from_specs([{"drafter": "ngram", "tree": {"kind": "star"}}], target=None, tokenizer=None)
    factory = methods_from_specs(
        [{"drafter": {"kind": "mine", "n": 2}}], target="T", tokenizer="K",
        drafter_factories={"mine": lambda target, tokenizer, n: (target, tokenizer, n)},
    )  # fmt: skip
    assert factory[0].drafter == ("T", "K", 2)


def _tiny_target():
    return tiny_model("qwen3")  # hidden 64, 2 layers, vocab 128


def _char_tokenizer(text: str, return_tensors: str = "pt"):
    return SimpleNamespace(input_ids=torch.tensor([[3 + ord(c) % 125 for c in text]]))


def test_run_bench_tiny_model_end_to_end(tmp_path):
    prompts = [{"id": "p0", "prompt": "def f(x):\n    return x + x + x + x"}, {"id": "p1", "prompt": "abcabcabcabc"}]
    methods = [Method(name="ngram", drafter=NGramDrafter, tree=DDTree(budget=6, topk=2)), Method(name="ar")]
    rows = run_bench(
        _tiny_target(), _char_tokenizer, prompts, methods, max_new_tokens=8, temperatures=[0.0, 1.0], warmup=1,
        out_dir=tmp_path, seed=0, ignore_eos=True,
    )  # fmt: skip
    assert len(rows) == 2 * 2 * 2
    assert [r["method"] for r in rows[::4]] == ["ar", "ngram"]  # AR runs first: it is the reference
    for r in rows:
        assert r["new_tokens"] == 8 and r["decode_tokens"] == 7 and r["decode_s"] > 0
        assert r["identical_to_ar"] is (True if r["temperature"] == 0 else None)
        assert r["tau"] >= 1.0 and sum(r["accept_hist"]) == r["rounds"]
    assert {(r["tree"], r["budget"], r["topk"]) for r in rows} == {("ar", 0, None), ("ddtree", 6, 2)}
    assert load_rows(tmp_path / "results.jsonl") == json.loads(json.dumps(rows))
    assert (tmp_path / "results.md").exists() and (tmp_path / "plot.png").exists()


def test_run_bench_computes_reference_without_ar_method():
    method = Method(name="ngram", drafter=NGramDrafter())  # tree None: the drafter's default, Chain(k=4)
    rows = run_bench(
        _tiny_target(), _char_tokenizer, [{"id": "p", "prompt": "xyzxyzxyz"}], [method], max_new_tokens=8,
        warmup=0, seed=0, max_prompt_tokens=4,
    )  # fmt: skip
    assert len(rows) == 1 and rows[0]["identical_to_ar"] is True and rows[0]["prompt_tokens"] == 4
    assert (rows[0]["tree"], rows[0]["budget"], rows[0]["topk"]) == ("chain", 4, 1)


def test_main_bench_zoo_target(tmp_path, zoo):
    cfg = {
        "device": "cpu", "num_prompts": 1, "max_prompt_tokens": 48, "max_new_tokens": 6, "warmup": 0,
        "methods": [{"name": "ar"}, {"drafter": "ngram", "tree": {"kind": "chain", "k": 3}}], "out_dir": str(tmp_path),
    }  # fmt: skip
    rows = main_bench(cfg)
    assert [r["method"] for r in rows] == ["ar", "ngram/chain3"]
    assert all(r["identical_to_ar"] for r in rows)
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert meta["config"]["max_new_tokens"] == 6 and meta["torch"] == torch.__version__


def test_main_bench_rejects_unknown_settings():
    with pytest.raises(ValueError, match="Unknown bench settings"):
        main_bench({"max_tokens": 5})


def test_main_bench_rejects_a_bad_compile_setting_before_loading_anything():
    # "max-autotune" captures its own CUDA graphs; a dict must name inductor options (no model is loaded first:
    # the target below does not exist)
    for bad, error in (("max-autotune", "max-autotune-no-cudagraphs"), ({"max_autotun": True}, "not inductor")):
        with pytest.raises(ValueError, match=error):
            main_bench({"compile": bad, "target": "/nonexistent/target"})


def test_run_bench_hf_baseline_marks_identical_outputs():
    class Tok:
        def __call__(self, text, return_tensors=None):
            class Enc:
                input_ids = torch.tensor([[int(c) + 3 for c in text]])

            return Enc()

    target = tiny_model("qwen3", scale=2.0)
    prompts = [{"id": "a", "prompt": "1231231"}, {"id": "b", "prompt": "4564564"}]
    methods = [Method(name="ar"), Method(name="ng", drafter=specdec.NGramDrafter(), tree=specdec.Chain(k=3))]
    rows = run_bench(target, Tok(), prompts, methods, max_new_tokens=12, warmup=0, hf_baseline=True)
    hf = [r for r in rows if r["method"] == "hf-generate"]
    assert len(hf) == 2 and all(r["new_tokens"] == 12 for r in hf)
    assert all(r["identical_to_hf"] for r in rows)
