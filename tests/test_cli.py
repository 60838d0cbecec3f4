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
