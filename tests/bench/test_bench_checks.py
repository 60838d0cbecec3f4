"""The bench's passes and checks on tiny models: interleaved repeats, backends per run and per method, the
eager-path comparison, whole-round τ, a comparison with an earlier run, profiling, and a random-weight target."""

from __future__ import annotations

import json

import pytest
import torch
from models import tiny_model

import specdec
from specdec import Chain, DDTree, NGramDrafter
from specdec.bench import BenchConfig, Method, aggregate, format_table, main_bench, run_bench


class _Tok:
    def __call__(self, text, return_tensors=None):
        return type("Enc", (), {"input_ids": torch.tensor([[3 + ord(c) % 120 for c in text]])})()


PROMPTS = [{"id": "a", "prompt": "abcabcabcab"}, {"id": "b", "prompt": "xyz xyz xyz"}]


def _target():
    return tiny_model("qwen3", scale=2.0)


def _log_calls(monkeypatch) -> list:
    """Log (drafter, backends) of every ``specdec.generate`` call (the only library call the bench makes)."""
    calls, real = [], specdec.generate

    def logged(*args, **kwargs):
        calls.append((kwargs.get("drafter"), kwargs.get("backends")))
        return real(*args, **kwargs)

    monkeypatch.setattr(specdec, "generate", logged)
    return calls


@pytest.mark.parametrize("interleave", [False, True])
def test_repeat_and_interleave_order_the_passes(interleave, monkeypatch):
    calls = _log_calls(monkeypatch)
    a, b = NGramDrafter(), NGramDrafter()
    methods = [Method(name="A", drafter=a, tree=Chain(k=3)), Method(name="B", drafter=b)]
    rows = run_bench(
        _target(), _Tok(), PROMPTS[:1], methods, max_new_tokens=6, warmup=1, repeat=2, interleave=interleave,
        ignore_eos=True, progress=False,
    )  # fmt: skip
    drafters = [d for d, _ in calls]
    assert drafters[0] is None  # the AR reference (the run has no AR method)
    assert drafters[1:] == ([a, b, a, b, a, b] if interleave else [a, a, a, b, b, b])
    assert [(r["method"], r["pass"]) for r in rows] == (
        [("A", 0), ("B", 0), ("A", 1), ("B", 1)] if interleave else [("A", 0), ("A", 1), ("B", 0), ("B", 1)]
    )
    summary = {s["method"]: s for s in aggregate(rows)}
    assert summary["A"]["passes"] == 2 and summary["A"]["prompts"] == 1 and len(summary["A"]["tok_s_passes"]) == 2
    assert all(r["identical_to_ar"] for r in rows)


def test_timed_calls_run_with_the_collector_settled_and_the_process_gets_it_back(monkeypatch):
    """Every timed call runs after a collection and with the survivors frozen (so a full collection of the
    process's long-lived objects cannot land in it); warm-up calls need not; the bench unfreezes when it returns."""
    import gc

    seen, real = [], specdec.generate

    def logged(*args, **kwargs):
        seen.append(gc.get_freeze_count())
        return real(*args, **kwargs)

    monkeypatch.setattr(specdec, "generate", logged)
    gc.unfreeze()
    before = gc.get_freeze_count()
    methods = [Method(name="A", drafter=NGramDrafter(), tree=Chain(k=3))]
    rows = run_bench(_target(), _Tok(), PROMPTS, methods, max_new_tokens=4, warmup=1, repeat=2, progress=False)
    timed = seen[-2 * len(PROMPTS):]  # the AR reference and the warm-up ran first
    assert len(rows) == 2 * len(PROMPTS) and all(count > 0 for count in timed)
    assert gc.get_freeze_count() == before == 0


def test_backends_of_the_run_and_of_a_method_reach_generate(monkeypatch):
    calls = _log_calls(monkeypatch)
    methods = [Method(name="ar"), Method(name="ng", drafter=NGramDrafter(), backends={"ddtree": "torch"})]
    run_bench(_target(), _Tok(), PROMPTS[:1], methods, max_new_tokens=4, warmup=0, backends={"ddtree_topk": "torch"},
              progress=False)  # fmt: skip
    assert [backends for _, backends in calls] == [
        {"ddtree_topk": "torch"},
        {"ddtree_topk": "torch", "ddtree": "torch"},
    ]


def test_eager_compare_and_tau_reference(tmp_path):
    methods = [Method(name="ar"), Method(name="tree", drafter=NGramDrafter(), tree=DDTree(budget=6, topk=2),
                                         cuda_graphs=True)]  # fmt: skip
    rows = run_bench(
        _target(), _Tok(), PROMPTS, methods, max_new_tokens=8, warmup=0, ignore_eos=True, eager_compare=["tree"],
        tau_reference=True, progress=False, out_dir=tmp_path,
    )  # fmt: skip
    tree = [r for r in rows if r["method"] == "tree"]
    assert all(r["identical_to_eager"] is True for r in tree)
    assert all(r.get("identical_to_eager") is None for r in rows if r["method"] == "ar")
    assert all(r["tau_reference"] is not None and r["tau_reference"] >= 1 for r in tree)
    summaries = aggregate(rows)
    table = format_table(summaries)
    assert "| = eager |" in table and "τ (whole rounds)" in table
    assert "= eager: greedy tokens equal" in (tmp_path / "results.md").read_text()
    with pytest.raises(ValueError, match="eager_compare names"):
        run_bench(_target(), _Tok(), PROMPTS, methods, max_new_tokens=4, eager_compare=["nope"], progress=False)


def test_compare_to_an_earlier_run(tmp_path):
    methods = [Method(name="ar"), Method(name="ng", drafter=NGramDrafter(), tree=Chain(k=3))]
    kwargs = dict(max_new_tokens=6, warmup=0, ignore_eos=True, progress=False)
    run_bench(_target(), _Tok(), PROMPTS, methods, out_dir=tmp_path / "a", **kwargs)
    rows = run_bench(_target(), _Tok(), PROMPTS, methods, out_dir=tmp_path / "b", compare_to=tmp_path / "a", **kwargs)
    assert all(r["identical_to_run"] is True and r["first_difference"] is None for r in rows)
    rows = run_bench(_target(), _Tok(), PROMPTS, methods, compare_to=tmp_path / "a", compare_against="ar", **kwargs)
    assert all(r["identical_to_run"] for r in rows)  # lossless: every row equals AR's tokens
    assert "= other run" in (tmp_path / "b" / "results.md").read_text()
    with pytest.raises(ValueError, match="compare_against='nope'.*has no such method"):
        run_bench(_target(), _Tok(), PROMPTS, methods, compare_to=tmp_path / "a", compare_against="nope", **kwargs)
    with pytest.raises(FileNotFoundError, match="no results.jsonl"):
        run_bench(_target(), _Tok(), PROMPTS, methods, compare_to=tmp_path / "none", **kwargs)


def test_profile_writes_a_summary_and_a_trace_per_method(tmp_path):
    methods = [Method(name="ar"), Method(name="ng/chain", drafter=NGramDrafter(), tree=Chain(k=3))]
    run_bench(_target(), _Tok(), PROMPTS, methods, max_new_tokens=6, warmup=0, progress=False, profile=True,
              out_dir=tmp_path)  # fmt: skip
    text = (tmp_path / "profile.md").read_text()
    assert "| ar | 0 |" in text and "| ng/chain | 0 |" in text and "## ng/chain, T=0" in text
    traces = sorted(p.name for p in (tmp_path / "profile").iterdir())
    assert traces == ["ar.trace.json", "ng_chain.trace.json"]
    assert json.loads((tmp_path / "profile" / "ar.trace.json").read_text())["traceEvents"]
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert [p["method"] for p in meta["profile"]] == ["ar", "ng/chain"]
    with pytest.raises(ValueError, match="out_dir"):
        run_bench(_target(), _Tok(), PROMPTS, methods, max_new_tokens=4, profile=True, progress=False)


def test_random_target_runs_a_random_dflash_drafter_on_cpu(tmp_path):
    tiny = {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 16}  # fmt: skip
    cfg = {
        "random_target": {"preset": "qwen3-8b", "layers": 2, "prompt_tokens": 12, "config": tiny},
        "device": "cpu", "dtype": "float32", "num_prompts": 1, "max_new_tokens": 6, "warmup": 0, "ignore_eos": True,
        "progress": False, "out_dir": str(tmp_path), "title": "shape",
        "methods": [{"name": "ar"}, {"name": "ddtree", "drafter": {"kind": "dflash", "init": "random", "num_layers": 1},
                                     "tree": {"kind": "ddtree", "budget": [3, 7], "topk": 2}}],
    }  # fmt: skip
    rows = main_bench(cfg)
    assert [r["method"] for r in rows] == ["ar", "ddtree-b3-k2", "ddtree-b7-k2"]
    assert all(r["new_tokens"] == 6 and r["prompt_tokens"] == 12 and r["identical_to_ar"] for r in rows)
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert meta["target_name"].startswith("random qwen3-8b shape (2 layers")
    assert (tmp_path / "results.md").read_text().startswith("# Benchmark: shape (cold)")


@pytest.mark.parametrize(
    "bad, error",
    [
        ({"repeat": 0}, "repeat"),
        ({"eager_compare": "yes"}, "eager_compare"),
        ({"compare_against": "hf-generate"}, "compare_to"),
        ({"random_target": {"preset": "llama-70b"}}, "preset"),
        ({"random_target": {"preset": "qwen3-8b", "width": 3}}, "unknown keys"),
        ({"methods": [{"name": "x", "drafter": {"kind": "dflash", "budget": 3}}]}, "unknown settings"),
        ({"methods": [{"name": "x", "tree": {"kind": "chain", "budget": 3}}]}, "unknown fields"),
        ({"methods": [{"name": "x", "compile": "max-autotune"}]}, "max-autotune-no-cudagraphs"),
        ({"methods": [{"name": "x", "backends": {"hybrid_prefill": "fast"}}]}, "hybrid_prefill"),
        ({"backends": {"kernel": "triton"}}, "unknown fields"),
        ({"hybrid_mode": "fast"}, "hybrid_mode"),
    ],
)
def test_bench_config_refuses_bad_settings_before_loading(bad, error):
    with pytest.raises(ValueError, match=error):
        BenchConfig(**bad)


def test_contexts_run_once_per_prompt_length_into_the_long_context_table(tmp_path):
    tiny = {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 16}  # fmt: skip
    cfg = {
        "random_target": {"preset": "qwen3-8b", "layers": 2, "prompt_tokens": 12, "config": tiny},
        "contexts": [10, 40], "device": "cpu", "dtype": "float32", "num_prompts": 1, "max_new_tokens": 4,
        "warmup": 0, "ignore_eos": True, "progress": False, "out_dir": str(tmp_path), "title": "long-context",
        "methods": [{"name": "ar"}, {"name": "ddtree", "drafter": {"kind": "dflash", "init": "random", "num_layers": 1},
                                     "tree": {"kind": "ddtree", "budget": [3], "topk": 2}}],
    }  # fmt: skip
    rows = main_bench(cfg)
    assert [(r["prompt_tokens"], r["method"]) for r in rows] == [(10, "ar"), (10, "ddtree"), (40, "ar"),
                                                                 (40, "ddtree")]  # fmt: skip
    table = (tmp_path / "long_context.md").read_text().splitlines()
    assert table[0].startswith("| context | method | default ms/round | × AR step |")
    assert [line.split(" | ")[:2] for line in table[2:]] == [["| 10", "ar"], ["| 10", "ddtree"], ["| 40", "ar"],
                                                            ["| 40", "ddtree"]]  # fmt: skip
    assert all(line.split(" | ")[3] == "1.00" for line in table[2:] if " ar " in line)
    assert (tmp_path / "context-40" / "results.jsonl").exists()


def test_kv_bytes_count_the_full_attention_layers():
    from transformers import Qwen3_5TextConfig, Qwen3Config

    from specdec.bench.contexts import kv_bytes

    dense = Qwen3Config(num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8, head_dim=128)
    assert kv_bytes(dense, 32768, 2) == 36 * 2 * 8 * 128 * 32768 * 2  # 4.83 GB: the 8 B shape at 32 k
    types = ["linear_attention"] * 3 + ["full_attention"]
    hybrid = Qwen3_5TextConfig(num_hidden_layers=8, layer_types=types * 2, num_key_value_heads=2, head_dim=256)
    assert kv_bytes(hybrid, 1000, 2) == 2 * 2 * 2 * 256 * 1000 * 2


def test_the_commit_stamp_is_none_for_a_copy_inside_another_repository(tmp_path):
    """A copy of the library inside some other git repository is stamped with no commit, not that repository's;
    this checkout is stamped with its own."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    import specdec
    from specdec.bench.report import _git_commit

    here = _git_commit()
    repo = Path(specdec.__file__).resolve().parents[1]
    if (repo / ".git").exists():
        head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=repo, capture_output=True, text=True)
        assert here is not None and here.split("+")[0] == head.stdout.strip()
    other = tmp_path / "other"
    (other / "vendor").mkdir(parents=True)
    subprocess.run(["git", "init", "-q"], cwd=other, check=True)
    (other / "README").write_text("another project\n")
    subprocess.run(["git", "add", "README"], cwd=other, check=True)
    subprocess.run(["git", "-c", "user.name=x", "-c", "user.email=x@x", "commit", "-qm", "x"], cwd=other, check=True)
    shutil.copytree(Path(specdec.__file__).parent, other / "vendor" / "specdec",
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    code = "from specdec.bench.report import _git_commit; print(_git_commit())"
    proc = subprocess.run([sys.executable, "-c", code], cwd=other / "vendor", capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "None"
