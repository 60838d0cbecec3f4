"""The ``verifier`` group of ``python -m specdec`` (generate): every option builds its rule from
``specdec.verify.RULES``, the sampled tree options build their policies, keys are checked, a run uses the rule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf, open_dict

import specdec
from specdec import cli
from specdec.loading import build_tree

CONF = Path(cli.__file__).resolve().parent / "conf"


def compose_generate(overrides: list[str]):
    cli._register_resolvers()
    with initialize_config_module("specdec.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides, return_hydra_config=True)
    choices = dict(cfg.hydra.runtime.choices)
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg, choices


def test_every_verifier_option_builds_its_rule():
    options = {p.stem: OmegaConf.to_container(OmegaConf.load(p)) for p in (CONF / "verifier").glob("*.yaml")}
    assert cli.build_rule(**options.pop("default")) is None  # the library's default rule
    built = {stem: cli.build_rule(**cfg) for stem, cfg in options.items()}
    assert set(built) == set(specdec.RULES)
    for stem, rule in built.items():
        assert isinstance(rule, specdec.RULES[stem]) and isinstance(rule, specdec.VerificationRule)
    assert built["multi-draft"].replacement and not built["traversal"].replacement
    with pytest.raises(ValueError, match="Unknown verifier 'nope'"):
        cli.build_rule("nope")


@pytest.mark.parametrize("option", ["sampled-chain", "sampled-trees", "gumbel-topk", "stochastic-ddtree"])
def test_sampled_tree_options_build_their_policies(option):
    cfg = OmegaConf.to_container(OmegaConf.load(CONF / "tree" / f"{option}.yaml"))
    tree = build_tree(cfg.pop("name"), **cfg)
    assert isinstance(tree, specdec.TREES[option])


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["verifier=block", "+verifier.replacement=true"], r"verifier\.replacement is not a setting of verifier=block"),
        (["+verifier.k=3"], r"verifier\.k is not a setting of verifier=default"),
    ],
)
def test_verifier_keys_are_checked(overrides, message):
    cfg, choices = compose_generate(overrides)
    with pytest.raises(ValueError, match=message):
        cli.check_keys(OmegaConf.to_container(cfg, resolve=True), choices, "generate")


def test_bench_and_train_have_no_verifier_group():
    for command in ("bench", "train"):
        assert ("verifier" not in cli._COMMAND_GROUPS[command]) and (command, "verifier") in cli._INSTEAD


def test_generate_runs_the_chosen_rule(zoo, tmp_path):
    """``verifier=speculative-sampling`` with ``tree=sampled-chain`` at greedy settings decodes the target's greedy
    tokens; with ``tree=chain`` the rule refuses the tree by name."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    overrides = ["drafter=model", "tree=sampled-chain", "tree.k=3", "verifier=speculative-sampling", "prompts.limit=1",
                 "max_new_tokens=10", "show_text=false", "threads=1"]  # fmt: skip
    cfg, choices = compose_generate(overrides)
    cli.run_command("generate", cfg, choices, tmp_path)
    (generation,) = [json.loads(line) for line in (tmp_path / "generations.jsonl").read_text().splitlines()]
    model = AutoModelForCausalLM.from_pretrained(zoo / "target-dense", dtype=torch.float32).eval()
    ids = AutoTokenizer.from_pretrained(zoo / "tokenizer")(generation["prompt"], return_tensors="pt").input_ids
    assert generation["tokens"] == model.generate(ids, do_sample=False, max_new_tokens=10)[0, ids.shape[1] :].tolist()
    cfg, choices = compose_generate([*overrides[:1], "tree=chain", *overrides[3:]])
    with pytest.raises(ValueError, match="SampledChain.*got tree=Chain"):
        cli.run_command("generate", cfg, choices, tmp_path)
