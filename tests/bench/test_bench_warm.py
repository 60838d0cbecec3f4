"""The bench measures warm, shows progress, states its run in the report, has HF baselines and a graph floor."""

from __future__ import annotations

import dataclasses
import io
import re
import subprocess
import time
from pathlib import Path

import pytest
import torch
import yaml
from models import tiny_model
from rich.console import Console
from rich.progress import Progress

import specdec
from specdec import DDTree, ModelDrafter, NGramDrafter
from specdec.bench import (
    DEFAULT_METHODS,
    BenchConfig,
    Method,
    aggregate,
    graph_floor_ms,
    main_bench,
    methods_from_specs,
    plot_summary,
    run_bench,
)

REPO = Path(__file__).resolve().parents[2]


class _Tok:
    def __call__(self, text, return_tensors=None):
        return type("Enc", (), {"input_ids": torch.tensor([[3 + ord(c) % 120 for c in text]])})()


PROMPTS = [{"id": "a", "prompt": "abcabcabcab"}, {"id": "b", "prompt": "xyz xyz xyz"}]


def _count_generate_calls(monkeypatch) -> list:
    """Record the drafter of every ``specdec.generate`` call (the only library call the bench makes)."""
    calls, real = [], specdec.generate

    def counted(*args, **kwargs):
        calls.append(kwargs.get("drafter"))
        return real(*args, **kwargs)

    monkeypatch.setattr(specdec, "generate", counted)
    return calls


def test_warm_up_decodes_every_prompt_before_timing_and_progress_counts_every_call(monkeypatch):
    calls = _count_generate_calls(monkeypatch)
    progress = Progress(console=Console(file=io.StringIO(), force_terminal=True))
    drafter = NGramDrafter()
    methods = [Method(name="ar"), Method(name="ng", drafter=drafter, tree=DDTree(budget=4, topk=2))]
    rows = run_bench(
        tiny_model("qwen3", scale=2.0), _Tok(), PROMPTS, methods, max_new_tokens=6, temperatures=[0.0, 1.0],
        warmup=1, ignore_eos=True, progress=progress,
    )  # fmt: skip
    cases = len(PROMPTS) * 2  # prompts x temperatures
    # one untimed pass over every case, then the timed pass, method by method
    assert calls == [None] * 2 * cases + [drafter] * 2 * cases
    (task,) = progress.tasks
    assert task.total == task.completed == len(methods) * cases * 2
    assert all(r["warmup_s"] > 0 and r["warmup_capture_ms"] == 0 and r["warmup_compile_ms"] == 0 for r in rows)
    assert {s["method"]: s["warmup_s"] > 0 for s in aggregate(rows)} == {"ar": True, "ng": True}


def test_report_states_the_run_and_plot_axes_start_at_zero(tmp_path):
    rows = run_bench(
        tiny_model("qwen3", scale=2.0), _Tok(), PROMPTS, [Method(name="ar"), Method(name="ng", drafter=NGramDrafter())],
        max_new_tokens=8, warmup=1, out_dir=tmp_path, ignore_eos=True, graph_floor=True, progress=False,
    )  # fmt: skip
    text = (tmp_path / "results.md").read_text()
    commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO, capture_output=True, text=True)
    first = text.splitlines()[2]
    facts = (
        "target Qwen3ForCausalLM",
        "prompts 2",
        "max_new_tokens 8",
        "cpu",
        "float32",
        f"commit {commit.stdout.strip()}",
    )
    for fact in facts:
        assert fact in first, (fact, first)
    assert time.strftime("%Y-%m-%d") in first
    assert text.startswith("# Benchmark (warm)") and "tok/s (warm)" in text and "graph-floor: n/a" in text
    meta = {"target": "t", "prompts": 2, "max_new_tokens": 8, "dtype": "x", "title": "mine"}
    fig = plot_summary(aggregate(rows), tmp_path / "p.png", meta=meta)
    assert fig._suptitle.get_text().startswith("mine: target t · prompts 2 · max_new_tokens 8 · ? · x")
    tok_s_axes = [ax for ax in fig.axes if ax.get_title().startswith("decode tok/s")]
    tau_axes = [ax for ax in fig.axes if ax.get_title().startswith("τ")]
    assert tok_s_axes and tau_axes and all(ax.get_ylim()[0] == 0 for ax in fig.axes)


@pytest.mark.parametrize("bad", [{"num_prompts": 0}, {"num_prompts": -2}, {"max_new_tokens": 0}, {"warmup": -1}])
def test_bench_config_refuses_bad_counts(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        BenchConfig(**bad)
    with pytest.raises(ValueError, match=next(iter(bad))):
        main_bench(bad)  # before loading anything


def test_hf_static_and_assisted_rows_match_hf_greedy():
    target = tiny_model("qwen3", scale=2.0, num_hidden_layers=3)
    drafter = ModelDrafter.from_target_layers(target, 1)
    methods = [
        Method(name="hf-generate", hf="generate"),
        Method(name="hf-static", hf="static"),
        Method(name="hf-assisted", hf="assisted", drafter=drafter),
        Method(name="model", drafter=drafter),
    ]
    rows = run_bench(target, _Tok(), PROMPTS, methods, max_new_tokens=10, warmup=0, ignore_eos=True, progress=False)
    assert [r["method"] for r in rows[::2]] == ["hf-generate", "hf-static", "hf-assisted", "model"]
    for r in rows:
        assert r["new_tokens"] == 10 and r["identical_to_hf"] is True
    assert all(r["tree"] == "hf" for r in rows[:6]) and rows[4]["tau"] is None  # HF reports no acceptance


def test_methods_from_specs_builds_hf_rows_and_skips_assisted_on_hybrid_targets():
    from state.hybrid_harness import tiny_hybrid

    specs = [{"hf": "static"}, {"name": "asst", "hf": "assisted", "drafter": {"kind": "model", "truncate_layers": 1}}]
    dense = methods_from_specs(specs, target=tiny_model("qwen3"), tokenizer=None)
    assert [(m.name, m.hf) for m in dense] == [("hf-static", "static"), ("asst", "assisted")]
    assert isinstance(dense[1].drafter, ModelDrafter)
    hybrid = methods_from_specs(specs, target=tiny_hybrid("qwen3_5"), tokenizer=None)
    assert [m.name for m in hybrid] == ["hf-static"]
    with pytest.raises(ValueError, match="hf='beam'"):
        Method(name="x", hf="beam")
    with pytest.raises(ValueError, match="no path"):
        methods_from_specs([{"drafter": {"kind": "dflash"}}], target=tiny_model("qwen3"), tokenizer=None)


def test_graph_floor_is_none_on_cpu():
    assert graph_floor_ms(tiny_model("qwen3"), context_len=32) is None


@pytest.mark.gpu
def test_graph_floor_ms_on_cuda():
    model = tiny_model("qwen3").to("cuda")
    floor = graph_floor_ms(model, context_len=96, replays=20)
    assert isinstance(floor, float) and 0 < floor < 100
    with pytest.raises(ValueError, match="context_len"):
        graph_floor_ms(model, context_len=0)


def _documented_defaults() -> dict[str, object]:
    """``name -> value`` from the ``Default `value`.`` ends of BenchConfig's Args entries."""
    doc = BenchConfig.__doc__.split("Args:")[1]
    entries = re.split(r"\n        (?=\w+ \()", doc)
    out = {}
    for entry in entries:
        match = re.match(r"\s*(\w+) \(.*Default `([^`]*)`\.", entry, flags=re.S)
        if match:
            out[match.group(1)] = yaml.safe_load(match.group(2))
    return out


def test_bench_config_defaults_equal_the_yaml_and_the_docstring():
    raw = yaml.safe_load((REPO / "specdec" / "conf" / "bench.yaml").read_text())
    defaults = {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
                for f in dataclasses.fields(BenchConfig)}  # fmt: skip
    from_groups = {"target", "tokenizer", "attn_implementation", "tp_plan", "dflash", "prompts", "prompt_text"}
    documented = _documented_defaults()
    for name, value in defaults.items():
        if name in from_groups:
            continue
        assert raw[name] == value, name
        if name != "methods":
            assert documented[name] == value, name
    assert raw["methods"] == [dict(m) for m in DEFAULT_METHODS]
    assert set(raw) - {"defaults", "hydra", "threads"} == set(defaults) - from_groups | {"prompts"}
    assert documented.keys() == set(defaults) - {"methods"}


def test_a_batch_run_is_plotted_against_the_batch_size():
    """Several batch sizes: every panel's x axis is B, one line per method (not one per (method, B) pair)."""
    summaries = [
        {"method": m, "temperature": 0.0, "batch_size": b, "tree": tree, "budget": budget, "drafter": "dflash",
         "topk": 8, "tau": tau, "tok_s": 100.0 * b * tau, "ms_per_round": 1.0 + b / 8}
        for m, tree, budget, tau in (("ar", "ar", None, 1.0), ("ddtree-b32", "ddtree", 32, 3.0),
                                     ("ddtree-b8", "ddtree", 8, 2.5))
        for b in (1, 2, 4, 8, 16, 32)
    ]  # fmt: skip
    fig = plot_summary(summaries)
    for ax in fig.axes:
        assert ax.get_xlabel() == "batch size B"
        lines = ax.get_lines()
        assert sorted(line.get_label() for line in lines) == ["ar", "ddtree-b32", "ddtree-b8"]
        assert all(list(line.get_xdata()) == [1, 2, 4, 8, 16, 32] for line in lines)
    tok_s = next(ax for ax in fig.axes if ax.get_title().startswith("decode tok/s"))
    ar = next(line for line in tok_s.get_lines() if line.get_label() == "ar")
    assert list(ar.get_ydata()) == [100.0 * b for b in (1, 2, 4, 8, 16, 32)]
