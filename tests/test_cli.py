"""The ``python -m specdec`` app: config groups in every command, strict keys, hybrid_mode, threads, outputs."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf, open_dict

from specdec import cli
from specdec.train import Eagle3TrainConfig, MTPTrainConfig, TrainConfig

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
    keys = set(raw) - {"defaults", "hydra", "prompts", "threads", "eagle3", "mtp"}
    mapped = {"target", "tokenizer", "eval_prompts", "eval_num_prompts"}  # from the target and prompts groups
    assert keys | mapped == {f.name for f in dataclasses.fields(TrainConfig)}
    # drafter=eagle3: the eagle3 node and the top-level keys it shares (cli.train_settings drops DFlash's own)
    shared = keys - set(cli._DFLASH_ONLY)
    assert shared | set(raw.eagle3) | mapped == {f.name for f in dataclasses.fields(Eagle3TrainConfig)}
    # drafter=mtp: the mtp node and the shared keys without DFlash's taps and MLP width
    shared_mtp = shared - {"target_layer_ids", "intermediate_size"}
    assert shared_mtp | set(raw.mtp) | mapped == {f.name for f in dataclasses.fields(MTPTrainConfig)}


@pytest.mark.parametrize(
    ("command", "overrides", "message"),
    [
        ("generate", ["+tree.budget=8"],
         r"tree\.budget is not a setting of tree=chain .*\(tree=ddtree or tree=stochastic-ddtree\)"),  # fmt: skip
        ("generate", ["tree=ddtree", "+tree.k=3"], r"tree\.k is not a setting of tree=ddtree"),
        ("generate", ["drafter=ngram", "+drafter.path=x"],
         r"drafter\.path .*drafter=dflash or drafter=eagle3 or drafter=model or drafter=mtp"),  # fmt: skip
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
    groups = ("target=hybrid", "drafter=dflash", "drafter=eagle3", "drafter=model", "drafter=mtp", "drafter=none",
              "tree=ddtree", "sampling=sample")  # fmt: skip
    for group in groups:
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
    cfg, choices = _compose("generate", [*overrides, "hybrid_mode=exact", "threads=1"])
    cli.run_command("generate", cfg, choices, tmp_path)
    assert seen[0] == "exact"
    cfg, choices = _compose("generate", [*overrides, "hybrid_mode=snapshot", "threads=1"])
    with pytest.raises(ValueError, match="hybrid_mode='snapshot'"):  # reaches the target, which refuses it by name
        cli.run_command("generate", cfg, choices, tmp_path)
    assert "snapshot" in seen
    cfg, choices = _compose("generate", [*overrides, "hybrid_mode=approximate", "threads=1"])
    with pytest.raises(ValueError, match="hybrid_mode='approximate'"):
        cli.run_command("generate", cfg, choices, tmp_path)


def test_generate_with_the_mtp_drafter(zoo, tmp_path):
    """``drafter=mtp``: the zoo hybrid has no MTP head, so the default (the target's own checkpoint) names the fix;
    ``drafter.init=random`` decodes with a random head, token for token as HF's greedy generate."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    overrides = ["target=hybrid", "drafter=mtp", "tree=ddtree", "tree.budget=6", "prompts.limit=1",
                 "max_new_tokens=10", "show_text=false", "threads=1", "device=cpu"]  # fmt: skip
    cfg, choices = _compose("generate", overrides)
    with pytest.raises(ValueError, match=r"no mtp\.\* tensors"):
        cli.run_command("generate", cfg, choices, tmp_path)
    cfg, choices = _compose("generate", [*overrides, "drafter.init=random"])
    (record,) = cli.run_command("generate", cfg, choices, tmp_path)
    model = AutoModelForCausalLM.from_pretrained(zoo / "target-hybrid", dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(zoo / "tokenizer")
    ids = tok(record["prompt"], return_tensors="pt").input_ids
    assert record["tokens"] == model.generate(ids, do_sample=False, max_new_tokens=10)[0, ids.shape[1] :].tolist()


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


def test_generate_takes_stop_strings_as_hf(zoo, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    overrides = ["drafter=ngram", "prompts.limit=1", "max_new_tokens=40", "show_text=false", "threads=1",
                 "sampling.stop_strings=[graph,'):']"]  # fmt: skip
    cfg, choices = _compose("generate", overrides)
    (record,) = cli.run_command("generate", cfg, choices, tmp_path)
    model = AutoModelForCausalLM.from_pretrained(zoo / "target-dense", dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(zoo / "tokenizer")
    ids = tok(record["prompt"], return_tensors="pt").input_ids
    expected = model.generate(ids, do_sample=False, max_new_tokens=40, stop_strings=["graph", "):"], tokenizer=tok)
    assert record["tokens"] == expected[0, ids.shape[1] :].tolist()
    assert len(record["tokens"]) < 40  # a stop string ended it


def test_generate_takes_hf_processors_as_sampling_keys(zoo, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    overrides = ["drafter=dflash", "tree=ddtree", "tree.budget=8", "prompts.limit=1", "max_new_tokens=24",
                 "show_text=false", "threads=1", "device=cpu", "sampling.repetition_penalty=1.3",
                 "sampling.no_repeat_ngram_size=3", "sampling.bad_words_ids=[[11],[12,13]]"]  # fmt: skip
    cfg, choices = _compose("generate", overrides)
    (record,) = cli.run_command("generate", cfg, choices, tmp_path)
    model = AutoModelForCausalLM.from_pretrained(zoo / "target-dense", dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(zoo / "tokenizer")
    ids = tok(record["prompt"], return_tensors="pt").input_ids
    expected = model.generate(ids, do_sample=False, max_new_tokens=24, repetition_penalty=1.3, no_repeat_ngram_size=3,
                              bad_words_ids=[[11], [12, 13]])  # fmt: skip
    assert record["tokens"] == expected[0, ids.shape[1] :].tolist()
    assert expected[0].tolist() != model.generate(ids, do_sample=False, max_new_tokens=24)[0].tolist()


def test_generate_in_batches_gives_the_texts_of_one_prompt_at_a_time(tmp_path):
    """``prompts.batch_size=2`` over 3 prompts (a batch of 2, then 1, left-padded): the greedy texts of batch size 1;
    each record carries its own rounds and tau, and the call it ran in."""
    base = ["drafter=dflash", "tree=ddtree", "tree.budget=8", "prompts.limit=3", "max_new_tokens=16",
            "show_text=false", "threads=1", "device=cpu"]  # fmt: skip
    runs = {}
    for size in (1, 2):
        cfg, choices = _compose("generate", [*base, f"prompts.batch_size={size}"])
        runs[size] = cli.run_command("generate", cfg, choices, tmp_path / str(size))
    one, two = runs[1], runs[2]
    assert [r["completion"] for r in two] == [r["completion"] for r in one]
    assert [r["tokens"] for r in two] == [r["tokens"] for r in one]
    assert [(r["stats"]["batch"], r["stats"]["batch_size"]) for r in two] == [(0, 2), (0, 2), (1, 1)]
    for a, b in zip(one, two, strict=True):
        assert (b["stats"]["rounds"], b["stats"]["tau"], b["stats"]["new_tokens"]) == (
            a["stats"]["rounds"], a["stats"]["tau"], a["stats"]["new_tokens"],
        )  # fmt: skip
    stats = [json.loads(line) for line in (tmp_path / "2" / "stats.jsonl").read_text().splitlines()]
    assert [s["id"] for s in stats] == ["dev-000", "dev-001", "dev-002"] and "batch_tau" in stats[0]
    assert "batch" not in one[0]["stats"]  # batch size 1: the records of today


@pytest.mark.parametrize("value", [0, -2, True, "two"])
def test_a_bad_batch_size_is_an_error(value, tmp_path):
    cfg, choices = _compose("generate", [f"prompts.batch_size={value}"])
    with pytest.raises(ValueError, match=r"prompts\.batch_size .*int >= 1"):
        cli.run_command("generate", cfg, choices, tmp_path)
    cfg, _ = _compose("bench", ["prompts.batch_size=4"])
    with pytest.raises(ValueError, match=r"batch_sizes=\["):
        cli.bench_settings(_plain(cfg))


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


@pytest.mark.slow  # about 12-30 s: in the slow tier, which CI runs
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


# -- user-facing behaviour of the commands ------------------------------------------------------------------
def _user_cli(*args: str, cwd: Path, env: dict | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    """``python -m specdec ARGS`` as a user runs it: no HYDRA_FULL_ERROR / SPECDEC_DEBUG unless ``env`` sets them."""
    base = {k: v for k, v in os.environ.items() if k not in ("HYDRA_FULL_ERROR", "SPECDEC_DEBUG")}
    return subprocess.run([sys.executable, "-m", "specdec", *args], cwd=cwd, env={**base, "PYTHONPATH": str(REPO),
                          **(env or {})}, capture_output=True, text=True, timeout=timeout)  # fmt: skip


def test_train_refuses_max_steps_below_one_before_any_work(tmp_path):
    cfg, choices = _compose("train", [f"corpus={tmp_path / 'missing'}", f"out_dir={tmp_path / 'out'}", "max_steps=0"])
    with pytest.raises(ValueError, match=r"max_steps=0 .*max_steps=\d+"):
        cli.run_command("train", cfg, choices)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("command", "override", "message"),
    [
        ("train", "+verifier=greedy", r"`python -m specdec train` has no verifier group"),
        ("train", "+tree=ddtree", r"`python -m specdec train` has no tree group"),
        ("bench", "+drafter=dflash", r"`python -m specdec bench` has no drafter group.*methods="),
        ("bench", "+sampling=sample", r"`python -m specdec bench` has no sampling group.*temperatures="),
    ],
)
def test_groups_a_command_does_not_take_are_errors(command, override, message):
    cfg, choices = _compose(command, [override, "corpus=src"] if command == "train" else [override])
    with pytest.raises(ValueError, match=message):
        cli.check_keys(_plain(cfg), choices, command)


def test_main_bench_takes_the_threads_key_of_bench_yaml(monkeypatch):
    from specdec.bench import config as bench_config

    class Accepted(Exception):
        pass

    def resolve_device(*args, **kwargs):
        raise Accepted

    monkeypatch.setattr(bench_config, "resolve_device", resolve_device)
    assert "threads" in OmegaConf.load(REPO / "specdec" / "conf" / "bench.yaml")
    try:
        torch.set_num_threads(2)
        with pytest.raises(Accepted):  # the settings are accepted; the run gets as far as picking the device
            bench_config.main_bench({"threads": 1, "num_prompts": 1})
        assert torch.get_num_threads() == 1
        with pytest.raises(Accepted):
            bench_config.main_bench({"threads": "auto"})
        with pytest.raises(ValueError, match="threads=0"):
            bench_config.main_bench({"threads": 0})
    finally:
        torch.set_num_threads(1)


def _doc_commands(path: Path) -> list[str]:
    """Every ``python -m specdec ...`` command of a markdown file: fenced code lines and inline code spans."""
    import re

    commands, fenced = [], False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        if fenced and line.lstrip().startswith("python -m specdec"):
            commands.append(line.strip())
        elif not fenced:
            commands += [s for s in re.findall(r"`(python -m specdec[^`]*)`", line) if "..." not in s]
    return commands


def test_every_command_line_of_docs_cli_parses_as_hydra_overrides():
    import shlex

    from hydra.core.override_parser.overrides_parser import OverridesParser

    commands = _doc_commands(REPO / "docs" / "cli.md")
    assert len(commands) >= 7 and any("prompts.text=" in c for c in commands)
    parser, values = OverridesParser.create(), {}
    for command in commands:
        words = shlex.split(command, comments=True)[3:]  # a shell's words after `python -m specdec`
        if words[:1] and words[0] in cli._COMMANDS:
            words = words[1:]
        overrides = [w for w in words if not w.startswith("-")]
        parsed = parser.parse_overrides(overrides)  # raises OverrideParseException on a bad example
        assert len(parsed) == len(overrides), command
        values.update({o.key_or_group: o.value() for o in parsed})
    assert values["prompts.text"] == "def quicksort(xs):"  # the example prompt reaches the config whole


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["+foo=1"], "Unknown key 'foo'"),  # specdec's key check (ValueError)
        (["foo=1"], "Could not override 'foo'"),  # hydra's (ConfigCompositionException)
        (["tree=nope"], "Could not find 'tree/nope'"),  # an unknown group option
        (["tree.k=[1"], "no viable alternative"),  # an override that does not parse (OverrideParseException)
        (["train"], "corpus is required"),  # a missing required key (ValueError)
    ],
)
def test_user_errors_are_one_line_with_status_2(tmp_path, args, message):
    run = _user_cli(*args, f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert run.returncode == 2, run.stderr[-2000:]
    assert "Traceback" not in run.stderr
    (line,) = [ln for ln in run.stderr.splitlines() if ln.startswith("error: ")]
    assert message in line


def test_user_errors_keep_their_traceback_in_debug_mode(tmp_path):
    for env in ({"SPECDEC_DEBUG": "1"}, {"HYDRA_FULL_ERROR": "1"}):
        run = _user_cli("+foo=1", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path, env=env)
        assert run.returncode not in (0, 2) and "Traceback" in run.stderr and "Unknown key 'foo'" in run.stderr


def test_help_imports_neither_torch_nor_transformers(tmp_path):
    command = [sys.executable, "-X", "importtime", "-m", "specdec", "--help"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    run = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "Commands:" in run.stdout
    imported = {ln.rsplit("|", 1)[-1].strip() for ln in run.stderr.splitlines() if ln.startswith("import time:")}
    assert "hydra" in imported and not imported & {"torch", "transformers"}


def test_the_package_exports_stay_importable_after_submodule_imports():
    import specdec.generate  # noqa: F401  (the submodule of the same name as the function)

    code = (
        "import specdec.loading, specdec.train, specdec\n"
        "assert callable(specdec.generate) and specdec.generate.__name__ == 'generate'\n"
        "assert specdec.train.TrainConfig and specdec.Chain.__name__ == 'Chain'"
    )
    run = subprocess.run([sys.executable, "-W", "error::ImportWarning", "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    import specdec

    assert callable(specdec.generate) and specdec.SpeculativeModel.__name__ == "SpeculativeModel"
    assert set(specdec.__all__) <= set(dir(specdec))


def test_train_says_where_it_saved_and_its_progress_reaches_the_last_step(zoo, tmp_path):
    corpus = tmp_path / "corpus.py"
    corpus.write_text("def value(self, index):\n    return range(index) + self.cache[index]\n" * 200)
    out = tmp_path / "drafter"
    run = _user_cli(
        "train", f"corpus={corpus}", f"out_dir={out}", "max_steps=5", "num_layers=1", "intermediate_size=64",
        "target_layer_ids=[1,3]", "block_size=4", "seq_len=64", "num_anchors=4", "batch_size=2",
        "prompts.limit=1", "eval_prompt_tokens=8", "eval_new_tokens=4", "eval_every=0", "save_dtype=float32",
        "threads=1", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    assert "5/5" in run.stdout and "1/5" not in run.stdout.replace("5/5", "")
    assert any("saved" in ln and ln.rstrip().endswith(str(out)) for ln in run.stdout.splitlines()), run.stdout
    assert json.loads((out / "train_summary.json").read_text())["steps"] == 5


def test_pyproject_license_is_an_spdx_string_without_setuptools_warnings():
    import warnings

    from setuptools.config.pyprojecttoml import apply_configuration
    from setuptools.dist import Distribution

    meta = pytest.importorskip("tomllib").loads((REPO / "pyproject.toml").read_text())
    assert meta["project"]["license"] == "Apache-2.0"
    assert "setuptools>=77" in meta["build-system"]["requires"]  # the first release that takes an SPDX string
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        apply_configuration(Distribution(), REPO / "pyproject.toml")
    assert not [w for w in caught if "license" in str(w.message).lower()], [str(w.message) for w in caught]


def test_the_tour_notebook_has_a_documented_way_to_run():
    meta = pytest.importorskip("tomllib").loads((REPO / "pyproject.toml").read_text())
    assert "nbconvert" in meta["project"]["optional-dependencies"]["dev"]
    command = ".venv/bin/jupyter nbconvert --to notebook --execute examples/tour.ipynb --output /tmp/tour.out.ipynb"
    assert command in (REPO / "docs" / "cli.md").read_text()


def test_tp_plan_reaches_the_bench_and_is_refused_by_train():
    cfg, _ = _compose("bench", ["target.tp_plan=auto"])
    assert cli.bench_settings(_plain(cfg))["tp_plan"] == "auto"
    cfg, _ = _compose("train", ["target.tp_plan=auto"])
    with pytest.raises(ValueError, match=r"target\.tp_plan shards the target of generate and bench"):
        cli.train_settings(_plain(cfg))


# -- bad values: one error line naming the key and the fix, before anything loads -----------------------------
def _main(args: list[str], tmp_path: Path, monkeypatch, capsys) -> tuple[int | str | None, str]:
    """``python -m specdec ARGS`` in this process, as a user runs it (no HYDRA_FULL_ERROR / SPECDEC_DEBUG): its exit
    status and what it printed to stderr. A call that does not exit fails the test."""
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    monkeypatch.delenv("SPECDEC_DEBUG", raising=False)
    hydra_args = [f"hydra.run.dir={tmp_path / 'run'}", "hydra/job_logging=none", "hydra/hydra_logging=none"]
    monkeypatch.setattr(sys, "argv", ["specdec", *args, *hydra_args])
    with pytest.raises(SystemExit) as exited:
        cli.main()
    return exited.value.code, capsys.readouterr().err


def _error_line(args: list[str], tmp_path: Path, monkeypatch, capsys) -> str:
    """The one ``error:`` line of a user error (status 2, no traceback)."""
    code, err = _main(args, tmp_path, monkeypatch, capsys)
    assert code == 2, err[-2000:]
    assert "Traceback" not in err, err[-2000:]
    (line,) = [ln for ln in err.splitlines() if ln.startswith("error: ")]
    return line


_NO_ACCELERATOR = pytest.mark.skipif(torch.accelerator.is_available(), reason="this machine has an accelerator")

# (arguments, the key as the message names it, the fix it gives): about 100 bad values of the three commands
BAD_VALUES = [
    # generate: top-level keys
    (["dtype=float13"], "dtype='float13'", "use auto or one of float32, bfloat16"),
    (["dtype=int8"], "dtype='int8'", "use auto or one of float32, bfloat16"),
    (["device=xyz"], "device='xyz'", "device=auto"),
    (["device=meta"], "device='meta'", "device=cpu"),
    pytest.param(["device=cuda"], "device='cuda'", "device=cpu", marks=_NO_ACCELERATOR),
    (["seed=null"], "seed=None", "give an int"),
    (["seed=abc"], "seed='abc'", "give an int"),
    (["seed=${nope}"], "seed:", "give a plain value"),
    (["max_new_tokens=0"], "max_new_tokens=0", "int >= 1"),
    (["max_new_tokens=-5"], "max_new_tokens=-5", "int >= 1"),
    (["max_new_tokens=abc"], "max_new_tokens='abc'", "int >= 1"),
    (["max_new_tokens=1.5"], "max_new_tokens=1.5", "int >= 1"),
    (["threads=0"], "threads=0", "int >= 1 or auto"),
    (["threads=abc"], "threads='abc'", "int >= 1 or auto"),
    (["show_text=maybe"], "show_text='maybe'", "true or false"),
    (["hybrid_mode=foo"], "hybrid_mode='foo'", "'exact'"),
    (["cuda_graphs=maybe"], "cuda_graphs='maybe'", "true or false"),
    (["compile=foo"], "compile='foo'", "'max-autotune-no-cudagraphs'"),
    (["+experiment=smoke"], "experiment=smoke", "python -m specdec bench +experiment=smoke"),
    # groups: unknown options (hydra lists the options)
    (["drafter=nope"], "drafter/nope", "ngram, none"),
    (["tree=nope"], "tree/nope", "chain, ddtree"),
    (["target=nope"], "target/nope", "dense, hybrid"),
    (["verifier=nope"], "verifier/nope", "sample-match"),
    (["sampling=nope"], "sampling/nope", "greedy, sample"),
    (["drafter.name=nope"], "drafter 'nope'", "ngram"),
    # sampling
    (["sampling.top_k=abc"], "sampling.top_k='abc'", "add sampling=sample"),
    (["sampling.temperature=-1"], "sampling.temperature=-1", "add sampling=sample"),
    (["sampling=sample", "sampling.temperature=-1"], "sampling.temperature=-1.0", "must be > 0"),
    (["sampling=sample", "sampling.temperature=abc"], "sampling.temperature='abc'", "must be a number"),
    (["sampling=sample", "sampling.top_k=abc"], "sampling.top_k='abc'", "int >= 0"),
    (["sampling=sample", "sampling.top_k=-3"], "sampling.top_k=-3", "int >= 0"),
    (["sampling=sample", "sampling.top_p=2"], "sampling.top_p=2", "in [0, 1]"),
    (["sampling=sample", "sampling.top_p=abc"], "sampling.top_p='abc'", "in [0, 1]"),
    (["sampling=sample", "sampling.min_p=5"], "sampling.min_p=5", "[0, 1]"),
    (["sampling.do_sample=maybe"], "sampling.do_sample='maybe'", "true or false"),
    (["sampling.repetition_penalty=-1"], "sampling.repetition_penalty=-1", "strictly positive"),
    (["sampling.no_repeat_ngram_size=1.5"], "sampling.no_repeat_ngram_size=1.5", "strictly positive integer"),
    (["sampling.stop_strings=5"], "sampling.stop_strings=5", "must be a string or a list"),
    (["sampling.max_time=-1"], "sampling.max_time=-1", ">= 0"),
    # trees
    (["tree.k=0"], "tree.k=0", "int >= 1"),
    (["tree.k=abc"], "tree.k='abc'", "whole number >= 1"),
    (["tree=ddtree", "tree.budget=0"], "tree.budget=0", "int >= 1"),
    (["tree=ddtree", "tree.budget=abc"], "tree.budget='abc'", "or auto"),
    (["tree=ddtree", "tree.topk=0"], "tree.topk=0", "int >= 1"),
    (["tree=ddtree", "tree.candidates=maybe"], "tree.candidates='maybe'", "True or False"),
    (["tree=sampled-trees", "tree.merge=maybe"], "tree.merge='maybe'", "True or False"),
    (["tree=gumbel-topk", "tree.widths=abc"], "tree.widths='abc'", "ints >= 1"),
    (["tree=dynamic", "tree.depth=0"], "tree.depth=0", "int >= 1"),
    # drafters and verifiers
    (["drafter.max_ngram=abc"], "drafter.max_ngram='abc'", "int >= 1"),
    (["drafter.min_ngram=5"], "min_ngram (5) <= max_ngram (3)", "drafter=ngram"),
    (["drafter=model", "drafter.truncate_layers=0"], "drafter.truncate_layers=0", "int >= 1"),
    (["drafter=model", "drafter.tree_depth=abc"], "drafter.tree_depth='abc'", "int >= 1"),
    (["drafter=mtp", "drafter.init=foo"], "drafter.init='foo'", "random"),
    (["drafter=eagle3"], "drafter=eagle3", "drafter.path=<folder"),
    (["drafter=dflash", "drafter.path=/no/such/dflash"], "(drafter.path)", "Give an existing path"),
    (["verifier=multi-draft", "verifier.replacement=maybe"], "verifier.replacement='maybe'", "True"),
    # a checkpoint of another drafter kind: named, with the drafter that reads it
    (["drafter=model", "drafter.path=assets/drafters/zoo-dense"], "a DFlash drafter checkpoint", "use drafter=dflash"),
    (["drafter=model", "drafter.path=assets/drafters/zoo-dense-eagle3"], "an EAGLE-3 head", "use drafter=eagle3"),
    (["drafter=eagle3", "drafter.path=assets/drafters/zoo-dense"], "a DFlash drafter's", "drafter=dflash"),
    (["drafter=dflash", "drafter.path=assets/drafters/zoo-dense-eagle3"], "is an EAGLE-3 head", "drafter=eagle3"),
    (["verifier=speculative-sampling"], "verifier=SpeculativeSampling()", "Pass one of those trees"),
    # prompts and target
    (["prompts.limit=-1"], "prompts.limit", "int >= 1"),
    (["prompts.limit=abc"], "prompts.limit", "int >= 1"),
    (["prompts.batch_size=0"], "prompts.batch_size", "int >= 1"),
    (["prompts.path=/no/such/prompts.jsonl"], "(prompts.path)", "Give an existing path"),
    (["prompts=text", "prompts.text=''"], "prompts.text=''", "non-empty string"),
    (["prompts=text", "prompts.text=5"], "prompts.text=5", "non-empty string"),
    (["target.path=/no/such/model"], "(target.path)", "Give an existing path"),
    (["target.tokenizer=/no/such/tokenizer"], "(target.tokenizer)", "Give an existing path"),
    (["target.tp_plan=foo"], "target.tp_plan='foo'", "use auto"),
    (["target.attn_implementation=flash_attention_2"], "attn_implementation='flash_attention_2'", "=sdpa"),
    (["target.attn_implementation=foo"], "target.attn_implementation='foo'", "use target.attn_implementation=sdpa"),
    # bench, as it is usually run
    (["bench", "num_prompts=0"], "num_prompts", "int >= 1"),
    (["bench", "max_new_tokens=0"], "max_new_tokens=0", "int >= 1"),
    (["bench", "temperatures=[abc]"], "temperatures=['abc']", "number >= 0"),
    (["bench", "temperatures=[-1]"], "temperatures=[-1]", "number >= 0"),
    (["bench", "temperatures=0.5"], "temperatures=0.5", "e.g. [0.0, 1.0]"),
    (["bench", "top_k=abc"], "top_k='abc'", "int >= 0"),
    (["bench", "seed=null"], "seed=None", "give an int"),
    (["bench", "dtype=float13"], "dtype='float13'", "use auto or one of"),
    (["bench", "device=xyz"], "device='xyz'", "device=cpu"),
    (["bench", "progress=maybe"], "progress='maybe'", "true or false"),
    (["bench", "hybrid_mode=foo"], "hybrid_mode='foo'", "'exact'"),
    (["bench", "batch_sizes=[0]"], "batch_sizes=[0]", "int >= 1"),
    (["bench", "target.attn_implementation=flex_attention"], "target.attn_implementation='flex_attention'", "or eager"),
    (["bench", "methods=[{drafter: {kind: nope}}]"], "methods[0]: Unknown drafter 'nope'", "ngram"),
    (["bench", "methods=[{drafter: dflash, tree: {kind: nope}}]"], "methods[0]: Unknown tree kind 'nope'", "ddtree"),
    (["bench", "methods=[{drafter: dflash, tree: {kind: ddtree, budget: [0]}}]"], "methods[0]: DDTree(budget=0)",
     "int >= 1"),  # fmt: skip
    (["bench", "methods=[{drafter: {kind: ngram, max_ngram: abc}}]"], "methods[0]", "max_ngram='abc' must be"),
    (["bench", "methods=[{drafter: {kind: mtp, init: foo}}]"], "methods[0]: drafter.init='foo'", "random"),
    (["bench", "methods=[{name: ar}, {drafter: ngram, verifier: nope}]"], "methods[1]: Unknown verifier", "greedy"),
    (["bench", "methods=[{drafter: {kind: dflash, path: /no/such/d}}]"], "(methods[0].drafter.path)",
     "Give an existing path"),  # fmt: skip
    (["bench", "prompts.path=/no/such/prompts.jsonl"], "(prompts.path)", "Give an existing path"),
    # train
    (["train", "corpus=x", "device=xyz"], "device='xyz'", "device=cpu"),
    (["train", "corpus=x", "seed=abc"], "seed='abc'", "give an int"),
    (["train", "corpus=x", "autocast_dtype=float13"], "autocast_dtype='float13'", "use null or one of"),
    (["train", "corpus=x", "lr=abc"], "lr='abc'", "give a number"),
    (["train", "corpus=x", "batch_size=abc"], "batch_size='abc'", "give an int"),
    (["train", "corpus=x", "num_layers=0"], "num_layers=0", "int >= 1"),
    (["train", "corpus=x", "block_size=1"], "block_size=1", "int >= 2"),
    (["train", "corpus=x", "log_every=0"], "log_every=0", "int >= 1"),
    (["train", "corpus=x", "drafter=eagle3", "eagle3.lr=abc"], "eagle3.lr='abc'", "give a number"),
    (["train", "corpus=x", "+experiment=smoke"], "experiment=smoke", "python -m specdec bench"),
]


@pytest.mark.parametrize(("args", "key", "fix"), BAD_VALUES)
def test_a_bad_value_is_one_error_line_naming_the_key_and_the_fix(args, key, fix, tmp_path, monkeypatch, capsys):
    line = _error_line(args, tmp_path, monkeypatch, capsys)
    assert key in line and fix in line, line


def test_the_bad_values_fail_before_any_model_loads(tmp_path, monkeypatch, capsys):
    import specdec.loading

    def no_load(*args, **kwargs):
        raise AssertionError("a model was loaded before the values were checked")

    monkeypatch.setattr(specdec.loading, "load_target", no_load)
    for args in (["max_new_tokens=0"], ["tree=ddtree", "tree.budget=0"], ["sampling.stop_strings=5"],
                 ["verifier=speculative-sampling"], ["drafter=eagle3"], ["prompts.path=/no/such/p.jsonl"],
                 ["target.attn_implementation=flash_attention_2"]):  # fmt: skip
        _error_line(args, tmp_path, monkeypatch, capsys)


def test_a_checkpoint_variant_the_drafter_refuses_is_one_error_line(tmp_path, monkeypatch, capsys):
    """The drafters refuse checkpoint variants they do not implement with a ``NotImplementedError`` (here an EAGLE-3
    head of three layers); the command line used to print its traceback."""
    import json
    import shutil

    head = tmp_path / "head"
    shutil.copytree(specdec_root() / "assets" / "drafters" / "zoo-dense-eagle3", head)
    config = json.loads((head / "config.json").read_text())
    (head / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 3}))
    line = _error_line(["drafter=eagle3", f"drafter.path={head}"], tmp_path, monkeypatch, capsys)
    assert "num_hidden_layers=3: only one-layer EAGLE-3 heads are supported" in line, line


def specdec_root() -> Path:
    return Path(__file__).resolve().parents[1]


def test_a_missing_zoo_folder_is_named(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPECDEC_ZOO", str(tmp_path / "no-zoo"))
    for args in (["target=hybrid"], ["bench", "num_prompts=1"]):
        line = _error_line(args, tmp_path, monkeypatch, capsys)
        assert f"SPECDEC_ZOO={tmp_path / 'no-zoo'} is not a folder" in line and "export SPECDEC_ZOO=" in line


def test_a_hub_id_that_cannot_be_loaded_names_its_key(tmp_path, monkeypatch, capsys):
    import specdec.loading

    def offline(*args, **kwargs):
        raise OSError("We couldn't connect to 'https://huggingface.co' to load the files.")

    monkeypatch.setattr(specdec.loading, "load_target", offline)
    line = _error_line(["target.path=nobody/nothing"], tmp_path, monkeypatch, capsys)
    assert "target.path='nobody/nothing' could not be loaded: We couldn't connect" in line and "local folder" in line


def test_the_help_lists_the_groups_and_defaults_of_the_code():
    """The group lists of each command's help template are the options in specdec/conf; the generate help's footer
    names the options that define tree.budget and drafter.path, and its examples keep hybrid_mode at the one mode
    the round runs."""
    conf = REPO / "specdec" / "conf"
    for command, name in cli._COMMANDS.items():
        template = OmegaConf.to_container(OmegaConf.load(conf / f"{name}.yaml").hydra.help)["template"]
        groups = template.split("== Config groups")[1].split("== Config (")[0]
        listed = dict(re.findall(r"^(\w+)(?: \(\+experiment=NAME\))?: (.+(?:\n  .+)*)$", groups, flags=re.M))
        assert set(listed) == set(cli._COMMAND_GROUPS[command]) | ({"experiment"} if command == "bench" else set())
        for group, options in listed.items():
            shown = {o.strip() for o in options.split(",")}
            expected = {p.stem for p in (conf / group).glob("*.yaml")}
            if (command, group) == ("train", "drafter"):
                expected = set(cli._TRAINED)  # the drafters train trains
            assert shown == expected, (command, group)
    footer = OmegaConf.load(conf / "config.yaml").hydra.help.footer
    for group, key in (("tree", "budget"), ("drafter", "path")):
        owners = {p.stem for p in (conf / group).glob("*.yaml") if key in OmegaConf.load(p)}
        (claim,) = re.findall(rf"{group}\.{key} needs ([^;)]*)", footer)
        assert set(re.findall(r"[\w-]+", claim.replace(f"{group}=", ""))) - {"or"} == owners, claim
    header = OmegaConf.load(conf / "config.yaml").hydra.help.header
    assert "hybrid_mode=snapshot" not in header
    assert OmegaConf.load(conf / "config.yaml").hybrid_mode == "exact" == specdec_default_hybrid_mode()


def specdec_default_hybrid_mode() -> str:
    import inspect

    import specdec

    return inspect.signature(specdec.SpeculativeModel).parameters["hybrid_mode"].default


def test_every_example_of_docs_cli_and_the_help_passes_the_value_check():
    import shlex

    from specdec.paths import zoo_dir

    header = OmegaConf.load(REPO / "specdec" / "conf" / "config.yaml").hydra.help.header
    commands = _doc_commands(REPO / "docs" / "cli.md")
    commands += [ln.strip() for ln in header.splitlines() if ln.strip().startswith("python -m specdec")]
    for command in commands:
        words = [w for w in shlex.split(command, comments=True)[3:] if not w.startswith("-")]
        name = words.pop(0) if words[:1] and words[0] in cli._COMMANDS else "generate"
        no_hybrid = "target=hybrid" in words and not (zoo_dir() / "target-hybrid").is_dir()  # the shipped zoo alone
        if no_hybrid or re.search(r"=(N|PATH|NAME)\b|<|\.\.\.|\[[A-Z]", command):
            continue  # a placeholder (threads=N, [COMMAND]) is not a value
        overrides = []
        for word in words:  # a sweep (key=a,b,c) checked at its first value
            key, _, value = word.partition("=")
            sweep = "," in value and not value.startswith(("[", "{", "'", '"'))
            overrides.append(f"{key}={value.split(',')[0]}" if sweep else word)
        cfg, choices = _compose(name, overrides)
        cli.check_keys(_plain(cfg), choices, name)
        cli.check_values(_plain(cfg), choices, name)


def test_device_is_checked_against_the_accelerator_torch_sees(monkeypatch):
    """As on a machine with two CUDA devices (``torch.accelerator`` stubbed): cuda and cuda:1 pass, cuda:2 and mps
    are refused naming what torch sees; without an accelerator only cpu passes."""
    from specdec.loading import check_device, resolve_device

    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda *a, **k: torch.device("cuda"))
    monkeypatch.setattr(torch.accelerator, "device_count", lambda: 2)
    assert check_device("cuda") == torch.device("cuda") and check_device("cuda:1") == torch.device("cuda", 1)
    assert resolve_device("auto", "auto") == (torch.device("cuda"), torch.bfloat16)
    with pytest.raises(ValueError, match=r"device='cuda:2' but torch sees 2 cuda device\(s\) \(cuda:0 to cuda:1\)"):
        check_device("cuda:2")
    with pytest.raises(ValueError, match=r"device='mps' but torch sees a cuda device .*device=cpu"):
        check_device("mps")
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: False)
    assert resolve_device("auto", "auto") == (torch.device("cpu"), torch.float32)
    with pytest.raises(ValueError, match=r"device='cuda' but torch sees no accelerator .*device=cpu"):
        check_device("cuda")
