"""``python -m specdec bench +experiment=NAME``: every experiment composes with valid keys, ``smoke`` runs end to
end on CPU into hydra's run folder, an unknown name is a clear error, and the plot keeps one colour per method."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf, open_dict

import specdec
from specdec import cli
from specdec.bench import (
    BenchConfig,
    aggregate,
    check_method_specs,
    load_rows,
    method_colors,
    methods_from_specs,
    plot_summary,
    series_label,
)

REPO = Path(__file__).resolve().parents[2]
EXPERIMENTS = sorted(p.stem for p in (REPO / "specdec" / "conf" / "experiment").glob("*.yaml"))
REQUIRED = {"smoke", "dense", "hybrid", "compile", "shape-8b", "profile", "sweep", "eager-vs-graph"}


def _compose(overrides: list[str]):
    cli._register_resolvers()
    with initialize_config_module("specdec.conf", version_base="1.3"):
        cfg = compose(config_name="bench", overrides=overrides, return_hydra_config=True)
    choices = dict(cfg.hydra.runtime.choices)
    with open_dict(cfg):
        del cfg["hydra"]
    return OmegaConf.to_container(cfg, resolve=True), choices


def _stub(target, tokenizer, **kwargs):
    return object()


def _method_names(specs) -> list[str]:
    """The names the specs expand to, without loading any drafter."""
    stubs = dict.fromkeys(("ngram", "model", "dflash"), _stub)
    return [m.name for m in methods_from_specs(specs, target=None, tokenizer=None, drafter_factories=stubs)]


def test_the_required_experiments_exist_and_the_help_lists_them_all():
    assert set(EXPERIMENTS) >= REQUIRED
    template = yaml.safe_load((REPO / "specdec" / "conf" / "bench.yaml").read_text())["hydra"]["help"]["template"]
    listed = template.split("experiment (+experiment=NAME):")[1].split("==")[0]
    assert sorted(name.strip() for name in listed.replace("\n", " ").split(",")) == EXPERIMENTS
    docs = (REPO / "docs" / "bench.md").read_text()
    for name in EXPERIMENTS:
        assert f"+experiment={name}" in docs, name


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_experiment_composes_with_valid_keys(name, zoo):
    c, choices = _compose([f"+experiment={name}"])
    assert choices["experiment"] == name
    cli.check_keys(c, choices, "bench")
    settings = cli.bench_settings(c)
    cfg = BenchConfig(**settings)  # every key is a BenchConfig field with a valid value
    assert cfg.title == name and cfg.out_dir is None  # the report is titled; it goes to hydra's run folder
    check_method_specs(cfg.methods)  # known drafter kinds and settings only
    names = _method_names(cfg.methods)
    assert len(names) == len(set(names)), names
    if not isinstance(cfg.eager_compare, bool):
        assert set(cfg.eager_compare) <= set(names), (cfg.eager_compare, names)
    # keys given after the experiment override it
    c, _ = _compose([f"+experiment={name}", "num_prompts=3", "target=hybrid"])
    assert c["num_prompts"] == 3 and Path(c["target"]["path"]).name == "target-hybrid"


def test_experiments_set_what_they_promise(zoo):
    settings = {name: BenchConfig(**cli.bench_settings(_compose([f"+experiment={name}"])[0])) for name in EXPERIMENTS}
    dense = settings["dense"]
    assert _method_names(dense.methods) == [
        "hf-generate", "hf-static", "ar", "dflash-chain", "ddtree-b15-k8", "ddtree-b32-k8", "ddtree-b63-k8",
    ]  # fmt: skip
    assert dense.interleave and dense.repeat > 1 and dense.warmup >= 2 and dense.memory_rounds > 0
    hybrid = settings["hybrid"]
    assert Path(hybrid.target).name == "target-hybrid"
    assert _method_names(hybrid.methods) == ["ar", "dflash-chain", "ddtree-b16-k8", "ddtree-b32-k8", "ddtree-b64-k8"]
    assert settings["compile"].compile is True and settings["compile"].methods == dense.methods
    shape = settings["shape-8b"]
    assert shape.random_target["preset"] == "qwen3-8b" and shape.compile is True and shape.dtype == "bfloat16"
    assert _method_names(shape.methods) == ["ar", "ddtree-b15-k8", "ddtree-b31-k8", "ddtree-b63-k8"]
    assert settings["profile"].profile is True
    assert settings["eager-vs-graph"].cuda_graphs is True and settings["eager-vs-graph"].eager_compare is True
    assert settings["sweep"].temperatures == [0.0, 1.0] and len(_method_names(settings["sweep"].methods)) > 10
    smoke = settings["smoke"]
    assert (smoke.num_prompts, smoke.max_new_tokens) == (2, 16) and Path(smoke.target).name == "target-dense"


def test_the_verifiers_experiment_resolves_on_both_targets(zoo):
    """``+experiment=verifiers``: sampling at T = 1.0 and 0.7, every rule of ``specdec.verify.RULES`` but greedy
    over trees it is exact for (refused pairs would raise here), one row name per (rule, tree), about 20 rows;
    ``target=hybrid`` swaps the target and keeps the rows."""
    stubs = dict.fromkeys(("ngram", "model", "dflash"), _stub)
    for extra in ([], ["target=hybrid"]):
        cfg = BenchConfig(**cli.bench_settings(_compose(["+experiment=verifiers", *extra])[0]))
        assert cfg.temperatures == [1.0, 0.7] and (cfg.num_prompts, cfg.max_new_tokens) == (20, 128) and cfg.warmup
        assert Path(cfg.target).name == ("target-hybrid" if extra else "target-dense")
        methods = methods_from_specs(cfg.methods, target=None, tokenizer=None, drafter_factories=stubs)
        names = [m.name for m in methods]
        assert len(names) == len(set(names)) and len(names) <= 22, names
        rules = {type(m.verifier).__name__ for m in methods if m.verifier is not None}
        assert rules == {"SampleMatch", "SpeculativeSampling", "BlockVerification", "MultiDraftRejection",
                         "TraversalVerification"}  # fmt: skip
        rsd = [m.tree for m in methods if m.verifier == specdec.MultiDraftRejection(replacement=False)]
        assert {type(t).__name__ for t in rsd} == {"SampledTrees", "GumbelTopKTree", "StochasticDDTree"}
        assert all(12 <= t.budget <= 63 for m in methods if m.tree is not None for t in [m.tree])
        assert "sample-match/ddtree-b63-k8" in names and "multi-draft-no-replacement/stochastic-ddtree-b32-k8" in names


def _cli(*args, cwd, timeout=240) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run([sys.executable, "-m", "specdec", "bench", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)  # fmt: skip


def test_an_unknown_experiment_is_an_error_listing_the_available_ones(tmp_path):
    run = _cli("+experiment=nope", cwd=tmp_path, timeout=120)
    assert run.returncode != 0
    assert "Could not find 'experiment/nope'" in run.stderr
    listed = re.split(r"[\s,]+", run.stderr.split("Available options in 'experiment':")[1].strip())
    assert sorted(listed) == EXPERIMENTS
    assert not (tmp_path / "outputs").exists() or not any((tmp_path / "outputs").rglob("results.md"))


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory, zoo):
    """``python -m specdec bench +experiment=smoke`` on the CPU, from an empty folder."""
    cwd = tmp_path_factory.mktemp("smoke")
    start = time.perf_counter()
    run = _cli("+experiment=smoke", "device=cpu", "progress=false", cwd=cwd)
    assert run.returncode == 0, run.stderr[-3000:]
    return cwd, run, time.perf_counter() - start


def test_smoke_runs_end_to_end_on_cpu_into_the_run_folder(smoke_run):
    cwd, run, seconds = smoke_run
    assert seconds < 60
    (folder,) = [p.parent for p in (cwd / "outputs" / "bench").glob("*/*/.hydra")]  # hydra's run folder
    assert {"results.md", "plot.png", "results.jsonl", "meta.json"} <= {p.name for p in folder.iterdir()}
    text = (folder / "results.md").read_text()
    facts = text.splitlines()[2]
    commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO, capture_output=True, text=True)
    for fact in ("target target-dense", "prompts 2", "max_new_tokens 16", "cpu", "float32",
                 f"commit {commit.stdout.strip()}", time.strftime("%Y-%m-%d")):  # fmt: skip
        assert fact in facts, (fact, facts)
    assert text.startswith("# Benchmark: smoke (warm)")
    assert (folder / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = load_rows(folder)
    assert [r["method"] for r in rows[::2]] == ["hf-generate", "ar", "dflash-chain", "ddtree"]
    assert all(r["new_tokens"] <= 16 and r["identical_to_hf"] for r in rows)
    # the summary table and the output folder close the output
    assert "specdec bench: smoke" in run.stdout
    assert all(f"│ {name} " in run.stdout for name in ("hf-generate", "ar", "dflash-chain", "ddtree"))  # uncut
    assert f"results in {folder.resolve()}/" in run.stdout.replace("\n", "")


def test_plot_of_a_run_keeps_a_colour_per_method_and_tau_from_zero(smoke_run, tmp_path):
    cwd, _, _ = smoke_run
    (folder,) = [p.parent for p in (cwd / "outputs" / "bench").glob("*/*/.hydra")]
    rows = load_rows(folder)
    rows += [dict(r, temperature=1.0) for r in rows]  # a second row of panels
    summaries = aggregate(rows)
    fig = plot_summary(summaries, tmp_path / "plot.png", meta=json.loads((folder / "meta.json").read_text()))
    assert "smoke: target target-dense" in fig._suptitle.get_text()
    colors = method_colors(series_label(s) for s in summaries)
    seen: dict[str, set] = {}
    for ax in fig.axes:
        assert ax.get_ylim()[0] == 0, ax.get_title()
        for line in ax.get_lines():
            seen.setdefault(line.get_label(), set()).add(line.get_color())
    assert set(seen) == set(colors)
    assert all(found == {colors[label]} for label, found in seen.items())
    assert len(set(colors.values())) == len(colors)
    tau_axes = [ax for ax in fig.axes if ax.get_title().startswith("τ")]
    assert len(tau_axes) == 2 and all(ax.get_ylim()[0] == 0 for ax in tau_axes)


def test_method_colors_are_stable_and_one_per_label():
    colors = method_colors(["hf-generate", "ar", "ddtree topk=8", "ar", "dflash-chain"])
    assert list(colors) == ["hf-generate", "ar", "ddtree topk=8", "dflash-chain"]
    assert len(set(colors.values())) == 4
    assert method_colors(["hf-generate", "ar", "ddtree topk=8", "dflash-chain"]) == colors  # deterministic
    many = method_colors(f"m{i}" for i in range(25))
    assert len(set(list(many.values())[:20])) == 20  # distinct up to the palette's size
    summaries = [
        {"tree": "ddtree", "series": "ddtree topk=8", "method": "ddtree-b15-k8", "drafter": "D", "topk": 8},
        {"tree": "ddtree", "series": "ddtree topk=8", "method": "ddtree-b32-k8", "drafter": "D", "topk": 8},
        {"tree": "chain", "series": "dflash-chain", "method": "dflash-chain", "drafter": "D", "topk": 1},
    ]
    assert [series_label(s) for s in summaries] == ["ddtree topk=8", "ddtree topk=8", "dflash-chain"]


def test_the_processors_experiment_passes_hf_options_per_method(zoo):
    from transformers import RepetitionPenaltyLogitsProcessor

    from specdec.bench.config import check_method_specs as check

    cfg = BenchConfig(**cli.bench_settings(_compose(["+experiment=processors"])[0]))
    stubs = dict.fromkeys(("ngram", "model", "dflash"), _stub)
    methods = {m.name: m for m in methods_from_specs(cfg.methods, target=None, tokenizer=None, drafter_factories=stubs)}
    assert methods["ddtree-penalty"].generation == {"repetition_penalty": 1.1, "no_repeat_ngram_size": 4}
    assert methods["ddtree"].generation is None and methods["ddtree"].tree == methods["ddtree-penalty"].tree
    proc, ngram = methods["ddtree-user-processor"].generation["logits_processor"]
    assert isinstance(proc, RepetitionPenaltyLogitsProcessor) and proc.penalty == 1.1 and ngram.ngram_size == 4
    assert methods["hf-generate-penalty"].generation["repetition_penalty"] == 1.1
    with pytest.raises(ValueError, match="must be a mapping"):
        check([{"name": "ar", "generation": 3}])
    with pytest.raises(ValueError, match="no LogitsProcessor class"):
        check([{"name": "ar", "generation": {"logits_processor": [{"class": "Nope"}]}}])


def test_the_multi_turn_experiment_decodes_conversations_with_and_without_reuse(zoo, tmp_path):
    """``+experiment=multi-turn`` on the CPU, two conversations of two turns: the second turns reuse the first turns'
    sequences (``reused_tokens`` > 0, fewer tokens prefilled), and their tokens equal those decoded without reuse."""
    c, _ = _compose(["+experiment=multi-turn", "num_prompts=4", "max_new_tokens=12", "warmup=0", "device=cpu",
                     "multi_turn={turns: 2, turn_tokens: 24}", "methods=[{name: ar}]",
                     f"out_dir={tmp_path}"])  # fmt: skip
    from specdec.bench.config import main_bench

    rows = main_bench(cli.bench_settings(c))
    assert {(r["reuse"], r["turn"]) for r in rows} == {(True, 0), (True, 1), (False, 0), (False, 1)}
    for r in rows:  # a first turn may share a few leading tokens with the last conversation: reused as well
        assert r["reused_tokens"] == 0 if not r["reuse"] else (r["reused_tokens"] > 0 or r["turn"] == 0), r
        if r["reused_tokens"]:
            key = (r["conversation"], r["turn"])
            off = next(o for o in rows if not o["reuse"] and (o["conversation"], o["turn"]) == key)
            assert r["tokens"] == off["tokens"]
            assert r["turn"] == 0 or r["reused_tokens"] >= r["prompt_tokens"] - 24 - 1
    table = (tmp_path / "multi_turn.md").read_text()
    assert "| ar | on |" in table and "| ar | off |" in table and "100%" in table
