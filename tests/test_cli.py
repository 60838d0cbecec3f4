"""The ``python -m specdec`` app: config groups in every command, strict keys, hybrid_mode, threads, outputs."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf, open_dict

from specdec import cli
from specdec.train import TrainConfig

REPO = Path(__file__).resolve().parents[1]


def _compose(command: str, overrides: list[str]):
    """The config ``python -m specdec <command> <overrides>`` runs on, and the chosen group options."""
    cli._register_resolvers()
    with initialize_config_module("specdec.conf", version_base="1.3"):
        cfg = compose(config_name=cli._COMMANDS[command], overrides=overrides, return_hydra_config=True)
    choices = dict(cfg.hydra.runtime.choices)
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg, choices


def _plain(cfg) -> dict:
    return OmegaConf.to_container(cfg, resolve=True)


def test_bench_takes_target_and_prompts_groups(zoo):
    cfg, choices = _compose("bench", ["target=hybrid", "prompts=text", "num_prompts=1"])
    cli.check_keys(_plain(cfg), choices, "bench")
    settings = cli.bench_settings(_plain(cfg))
    assert Path(settings["target"]) == zoo / "target-hybrid" and Path(settings["tokenizer"]) == zoo / "tokenizer"
    assert Path(settings["dflash"]) == REPO / "assets" / "drafters" / "zoo-hybrid"
    assert settings["prompt_text"] == "def fibonacci(n):\n    " and settings["num_prompts"] == 1
    cfg, _ = _compose("bench", ["target.path=/models/mine", "prompts.path=/data/p.jsonl", "num_prompts=7"])
    settings = cli.bench_settings(_plain(cfg))
    assert (settings["target"], settings["prompts"], settings["num_prompts"]) == ("/models/mine", "/data/p.jsonl", 7)


def test_train_takes_target_group_and_a_string_corpus_is_one_path(zoo):
    cfg, choices = _compose("train", ["target=hybrid", "corpus=/src/my_code", "prompts.limit=4", "max_steps=3"])
    cli.check_keys(_plain(cfg), choices, "train")
    settings = cli.train_settings(_plain(cfg))
    assert settings["corpus"] == ("/src/my_code",)
    assert Path(settings["target"]) == zoo / "target-hybrid" and Path(settings["tokenizer"]) == zoo / "tokenizer"
    assert Path(settings["eval_prompts"]) == zoo / "prompts_dev.jsonl" and settings["eval_num_prompts"] == 4
    train = TrainConfig(**settings)
    assert train.max_steps == 3 and train.target_layer_ids == (1, 3, 4, 6)
    assert train.autocast_dtype == TrainConfig.autocast_dtype  # null keys take the TrainConfig default
    cfg, _ = _compose("train", ["corpus=[a,b]"])
    assert cli.train_settings(_plain(cfg))["corpus"] == ("a", "b")
    cfg, _ = _compose("train", [])
    with pytest.raises(ValueError, match="corpus is required"):
        cli.train_settings(_plain(cfg))


def test_train_yaml_has_every_train_config_field():
    raw = OmegaConf.load(REPO / "specdec" / "conf" / "train.yaml")
    keys = set(raw) - {"defaults", "hydra", "prompts", "threads"}
    mapped = {"target", "tokenizer", "eval_prompts", "eval_num_prompts"}  # from the target and prompts groups
    assert keys | mapped == {f.name for f in dataclasses.fields(TrainConfig)}


@pytest.mark.parametrize(
    ("command", "overrides", "message"),
    [
        ("generate", ["+tree.budget=8"], r"tree\.budget is not a setting of tree=chain .*\(tree=ddtree\)"),
        ("generate", ["tree=ddtree", "+tree.k=3"], r"tree\.k is not a setting of tree=ddtree"),
        ("generate", ["drafter=ngram", "+drafter.path=x"], r"drafter\.path .*drafter=dflash or drafter=model"),
        ("generate", ["+foo=1"], "Unknown key 'foo'"),
        ("bench", ["+budget=8"], "Unknown key 'budget' for `python -m specdec bench`"),
        ("train", ["+target.dflash_path=x"], r"target\.dflash_path is not a setting of target=dense"),
    ],
)
def test_unknown_or_misplaced_keys_are_errors(command, overrides, message):
    cfg, choices = _compose(command, overrides)
    with pytest.raises(ValueError, match=message):
        cli.check_keys(_plain(cfg), choices, command)


def test_every_default_config_passes_the_key_check():
    for command in cli._COMMANDS:
        cfg, choices = _compose(command, [])
        cli.check_keys(_plain(cfg), choices, command)
    for group in ("target=hybrid", "drafter=dflash", "drafter=model", "drafter=none", "tree=ddtree", "sampling=sample"):
        cfg, choices = _compose("generate", [group])
        cli.check_keys(_plain(cfg), choices, "generate")


@pytest.mark.parametrize("value", [0, -1, True])
def test_zero_or_negative_prompt_counts_are_errors(value):
    cfg, _ = _compose("bench", [f"num_prompts={value}"])
    with pytest.raises(ValueError, match="int >= 1"):
        cli.bench_settings(_plain(cfg))
    cfg, choices = _compose("generate", [f"prompts.limit={value}"])
    with pytest.raises(ValueError, match="int >= 1"):
        cli.run_command("generate", cfg, choices)


def test_resolve_threads(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert cli.resolve_threads("auto") == 1
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)), raising=False)
    assert cli.resolve_threads("auto") == 8
    assert cli.resolve_threads(3) == 3
    for bad in (0, "two", 1.5):
        with pytest.raises(ValueError, match="threads"):
            cli.resolve_threads(bad)


def test_generate_passes_hybrid_mode_to_the_target_wrapper(zoo, tmp_path, monkeypatch):
    from specdec.target import TargetModel

    seen = []
    original = TargetModel.wrap.__func__

    def spy(cls, target, **kwargs):
        seen.append(kwargs.get("hybrid_mode"))
        return original(cls, target, **kwargs)

    monkeypatch.setattr(TargetModel, "wrap", classmethod(spy))
    overrides = ["target=hybrid", "drafter=none", "prompts.limit=1", "max_new_tokens=3", "show_text=false"]
    cfg, choices = _compose("generate", [*overrides, "hybrid_mode=snapshot", "threads=1"])
    cli.run_command("generate", cfg, choices, tmp_path)
    assert seen[0] == "snapshot"
    cfg, choices = _compose("generate", [*overrides, "hybrid_mode=approximate", "threads=1"])
    with pytest.raises(ValueError, match="hybrid_mode='approximate'"):
        cli.run_command("generate", cfg, choices, tmp_path)


def test_generate_writes_generations_and_stats_jsonl(zoo, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    overrides = ["drafter=ngram", "tree.k=3", "prompts.limit=2", "max_new_tokens=12", "show_text=false", "threads=1"]
    cfg, choices = _compose("generate", overrides)
    records = cli.run_command("generate", cfg, choices, tmp_path)
    generations = [json.loads(line) for line in (tmp_path / "generations.jsonl").read_text().splitlines()]
    stats = [json.loads(line) for line in (tmp_path / "stats.jsonl").read_text().splitlines()]
    assert [g["id"] for g in generations] == [s["id"] for s in stats] == ["dev-000", "dev-001"]
    model = AutoModelForCausalLM.from_pretrained(zoo / "target-dense", dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(zoo / "tokenizer")
    for g, s, r in zip(generations, stats, records, strict=True):
        ids = tok(g["prompt"], return_tensors="pt").input_ids
        expected = model.generate(ids, do_sample=False, max_new_tokens=12)[0, ids.shape[1] :].tolist()
        assert g["tokens"] == expected and s["new_tokens"] == len(expected) and g["completion"] == tok.decode(expected)
        assert s["rounds"] == r["stats"]["rounds"] and sum(s["accept_hist"]) == s["rounds"] and "tau" in s


def _cli(*args: str, cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HYDRA_FULL_ERROR": "1"}
    return subprocess.run([sys.executable, "-m", "specdec", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)  # fmt: skip


def test_help_lists_commands_and_their_keys(tmp_path):
    top = _cli("--help", cwd=tmp_path)
    assert top.returncode == 0 and "bench" in top.stdout and "train" in top.stdout
    assert "tree: chain, ddtree" in top.stdout
    bench = _cli("bench", "--help", cwd=tmp_path)
    assert bench.returncode == 0 and "num_prompts: 20" in bench.stdout and "target: dense, hybrid" in bench.stdout
    assert "tree: chain" not in bench.stdout  # bench takes trees in its methods, not the tree group
    train = _cli("train", "--help", cwd=tmp_path)
    assert train.returncode == 0 and "corpus: null" in train.stdout and "target: dense, hybrid" in train.stdout


def test_cli_bench_on_the_hybrid_target_from_another_folder(zoo, tmp_path):
    """Runs in an empty folder: the zoo paths of the config resolve independently of the working directory."""
    out = tmp_path / "bench"
    run = _cli(
        "bench", "target=hybrid", "num_prompts=1", "max_new_tokens=4", "methods=[{name: ar}]", "progress=false",
        f"out_dir={out}", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    meta = json.loads((out / "meta.json").read_text())
    assert Path(meta["target"]) == zoo / "target-hybrid" and meta["prompts"] == 1 and meta["max_new_tokens"] == 4


def test_cli_multirun_saves_each_jobs_generations(zoo, tmp_path):
    sweep = tmp_path / "sweep"
    run = _cli(
        "-m", "drafter=ngram", "tree.k=2,3", "prompts.limit=1", "max_new_tokens=4", "show_text=false",
        f"hydra.sweep.dir={sweep}", cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    for job in ("0", "1"):
        assert len((sweep / job / "generations.jsonl").read_text().splitlines()) == 1
        assert json.loads((sweep / job / "stats.jsonl").read_text())["new_tokens"] == 4
