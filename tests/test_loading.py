"""Paths resolve wherever the working directory is; a missing local path never reaches the hub."""

from pathlib import Path

import huggingface_hub
import pytest
import torch
import transformers

from specdec.drafters.dflash import DFlashDrafter
from specdec.loading import build_drafter, load_prompts, load_target, load_tokenizer, resolve_model_path
from specdec.paths import is_local_path, repo_root, zoo_dir

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def no_hub(monkeypatch):
    """Fail the test if anything tries to download."""

    def refuse(*args, **kwargs):
        raise AssertionError(f"hub download attempted for {args} {kwargs}")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", refuse)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", refuse)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)


@pytest.mark.parametrize(
    "path, local",
    [
        ("z-lab/Qwen3-8B-DFlash-b16", False),
        ("Qwen/Qwen3-0.6B", False),
        ("./zoo-dense", True),
        ("/models/zoo-dense", True),
        ("~/zoo-dense", True),
        ("assets/drafters/zoo-dense", True),
        ("assets/zoo-dense", True),  # its first folder exists in the repository
        ("zoo-dense", True),
        ("owner/name/", True),
    ],
)
def test_is_local_path(path, local):
    assert is_local_path(path) is local


def test_repo_and_zoo_do_not_depend_on_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert repo_root() == REPO
    monkeypatch.delenv("SPECDEC_ZOO", raising=False)
    assert zoo_dir() == REPO.parent / "shared" / "zoo"
    monkeypatch.setenv("SPECDEC_ZOO", str(tmp_path / "z"))
    assert zoo_dir() == tmp_path / "z"


def test_project_assets_and_zoo_resolve_from_any_folder(zoo, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SPECDEC_ZOO", str(zoo))
    assert Path(resolve_model_path("assets/drafters/zoo-dense")) == REPO / "assets" / "drafters" / "zoo-dense"
    assert Path(resolve_model_path("target-dense")) == zoo / "target-dense"
    target = load_target("target-dense", device=torch.device("cpu"), dtype=torch.float32)
    drafter = build_drafter("dflash", target, path="assets/drafters/zoo-dense")
    assert isinstance(drafter, DFlashDrafter) and drafter.config.block_size == 16
    assert DFlashDrafter.from_pretrained("assets/drafters/zoo-hybrid").config.block_size == 16
    assert load_tokenizer("tokenizer").mask_token_id == 2
    assert len(load_prompts("prompts_dev.jsonl", limit=3)) == 3


@pytest.mark.parametrize("path", ["./missing", "/no/such/folder", "assets/drafters/missing", "a/b/c", "missing"])
def test_missing_local_paths_name_what_was_tried_and_never_reach_the_hub(path, no_hub, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"No DFlash checkpoint folder at .*\(tried "):
        DFlashDrafter.from_pretrained(path)
    with pytest.raises(FileNotFoundError, match=r"No model folder at .*\(tried "):
        load_target(path, device=torch.device("cpu"), dtype=torch.float32)
    with pytest.raises(FileNotFoundError) as err:
        build_drafter("dflash", None, path=path)
    if not path.startswith("/"):
        assert str((tmp_path / path).resolve()) in str(err.value) and str(REPO) in str(err.value)


def test_dflash_without_a_path_is_a_clear_error():
    with pytest.raises(ValueError, match="drafter=dflash needs a checkpoint"):
        build_drafter("dflash", None)
