"""Paths resolve wherever the working directory is; a missing local path never reaches the hub; the shipped
assets (dense target, tokenizer, dev prompts, drafters) serve a clone with no zoo beside it and an installed wheel."""

import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import huggingface_hub
import pytest
import torch
import transformers

import specdec.loading as loading
import specdec.paths
from specdec.drafters.dflash import DFlashDrafter
from specdec.loading import (
    asset_path,
    build_drafter,
    load_prompts,
    load_target,
    load_tokenizer,
    resolve_model_path,
    zoo_dir,
    zoo_path,
)
from specdec.paths import is_local_path, repo_root

REPO = Path(__file__).resolve().parents[1]
SHIPPED = (
    "zoo/target-dense",
    "zoo/tokenizer",
    "zoo/prompts_dev.jsonl",
    "drafters/zoo-dense",
    "drafters/zoo-hybrid",
    "drafters/zoo-dense-eagle3",
    "drafters/zoo-hybrid-eagle3",
    "drafters/zoo-hybrid-mtp",
)


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
    beside = REPO.parent / "shared" / "zoo"
    assert zoo_dir() == (beside if beside.is_dir() else REPO / "assets" / "zoo")
    monkeypatch.setenv("SPECDEC_ZOO", str(tmp_path / "z"))
    assert zoo_dir() == tmp_path / "z"


def test_the_shipped_assets_are_found_from_any_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in SHIPPED:
        assert asset_path(name) == REPO / "assets" / name and asset_path(name).exists()
    assert (asset_path("zoo/target-dense") / "config.json").is_file()
    with pytest.raises(FileNotFoundError, match=r"No project asset 'zoo/target-hybrid' \(tried .*assets"):
        asset_path("zoo/target-hybrid")


def test_without_a_zoo_the_shipped_part_serves_and_the_rest_is_a_clear_error(tmp_path, monkeypatch):
    """No SPECDEC_ZOO and nothing beside the project (a fresh clone): the zoo is assets/zoo."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SPECDEC_ZOO", raising=False)
    for module in (loading, specdec.paths):  # no ../shared/zoo beside it
        monkeypatch.setattr(module, "repo_root", lambda: tmp_path / "clone")
    monkeypatch.setattr(specdec.paths, "zoo_dir", lambda: tmp_path / "clone" / "no-zoo")
    for module in (loading, specdec.paths):
        monkeypatch.setattr(module, "asset_roots", lambda: [REPO / "assets"])
    assert zoo_dir() == REPO / "assets" / "zoo"
    assert Path(resolve_model_path("target-dense")) == REPO / "assets" / "zoo" / "target-dense"
    assert Path(resolve_model_path(str(zoo_dir() / "tokenizer"))) == REPO / "assets" / "zoo" / "tokenizer"
    assert len(load_prompts(limit=2)) == 2
    for missing in ("target-hybrid", str(zoo_dir() / "target-hybrid")):
        with pytest.raises(FileNotFoundError, match=r"No model folder at .*'target-hybrid' is not in the zoo") as err:
            load_target(missing, device=torch.device("cpu"), dtype=torch.float32)
        assert "SPECDEC_ZOO" in str(err.value) and "export SPECDEC_ZOO=" in str(err.value)
        assert "target.path=" in str(err.value)  # the other fix: a model folder or a hub id


def test_an_external_zoo_without_an_item_falls_back_to_the_shipped_one(tmp_path, monkeypatch):
    (tmp_path / "zoo" / "target-hybrid").mkdir(parents=True)  # a zoo copy that holds only the hybrid target
    monkeypatch.setenv("SPECDEC_ZOO", str(tmp_path / "zoo"))
    assert zoo_path("target-hybrid") == tmp_path / "zoo" / "target-hybrid"
    assert zoo_path("tokenizer") == REPO / "assets" / "zoo" / "tokenizer"
    assert Path(resolve_model_path(str(tmp_path / "zoo" / "target-dense"))) == REPO / "assets" / "zoo" / "target-dense"
    with pytest.raises(FileNotFoundError, match="export SPECDEC_ZOO"):
        zoo_path("target-other")


def test_the_checkouts_asset_paths_resolve_into_an_installed_package(tmp_path, monkeypatch):
    """After a non-editable install the project root is site-packages: ``<root>/assets/x`` (the CLI's ${asset:x})
    and ``assets/x`` resolve to ``specdec/assets/x``."""
    installed = tmp_path / "site" / "specdec" / "assets"
    shutil.copytree(REPO / "assets" / "drafters" / "zoo-dense", installed / "drafters" / "zoo-dense")
    monkeypatch.chdir(tmp_path)
    for module in (loading, specdec.paths):
        monkeypatch.setattr(module, "repo_root", lambda: tmp_path / "site")
        monkeypatch.setattr(module, "asset_roots", lambda: [installed, tmp_path / "site" / "assets"])
    want = installed / "drafters" / "zoo-dense"
    assert Path(resolve_model_path(str(tmp_path / "site" / "assets" / "drafters" / "zoo-dense"))) == want
    assert asset_path("drafters/zoo-dense") == want


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


def _copy_checkout(dest: Path) -> None:
    """What a clone holds: the tracked files and the new ones git does not ignore (uncommitted work included)."""
    names = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, check=True, capture_output=True, text=True,
    ).stdout.split("\0")  # fmt: skip
    for name in filter(None, names):
        if (REPO / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, dest / name)


def _clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("SPECDEC_ZOO", "PYTHONPATH")}
    return {**env, "PYTHONDONTWRITEBYTECODE": "1", **extra}


@pytest.fixture(scope="module")
def fresh_clone(tmp_path_factory) -> Path:
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("needs a git checkout")
    dest = tmp_path_factory.mktemp("fresh") / "specdec"
    _copy_checkout(dest)
    assert not (dest.parent / "shared").exists()
    return dest


def test_a_fresh_clone_runs_the_demo_with_the_shipped_assets(fresh_clone):
    """`make demo`'s command (fewer prompts and tokens) in a clone with no zoo beside it and no SPECDEC_ZOO; then
    the hybrid target, which does not ship: an error naming SPECDEC_ZOO and the fix."""
    demo = ["target=dense", "drafter=dflash", "tree=ddtree", "tree.budget=32", "tree.topk=8", "prompts.limit=1",
            "max_new_tokens=8", "show_text=false", "threads=1"]  # fmt: skip
    env = _clean_env(PYTHONPATH=str(fresh_clone))
    run = subprocess.run([sys.executable, "-m", "specdec", *demo, "hydra.run.dir=out"], cwd=fresh_clone, env=env,
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert (fresh_clone / "out" / "generations.jsonl").read_text().count("\n") == 1
    hybrid = subprocess.run([sys.executable, "-m", "specdec", "target=hybrid", "prompts.limit=1", "max_new_tokens=4",
                             "hydra.run.dir=out2"], cwd=fresh_clone, env=env, capture_output=True, text=True,
                            timeout=300)  # fmt: skip
    assert hybrid.returncode != 0
    assert "'target-hybrid' is not in the zoo" in hybrid.stderr and "export SPECDEC_ZOO=" in hybrid.stderr


@pytest.mark.slow  # builds and unpacks a 40 MB wheel
def test_a_wheel_ships_the_assets_and_finds_them_once_installed(fresh_clone, tmp_path):
    """A non-editable install: the wheel holds specdec/assets; installed elsewhere, with no checkout and no zoo,
    loading finds the dense target, tokenizer, prompts and drafters there."""
    # the build needs setuptools: this environment's when it has one (no download), else pip's isolated one
    isolation = [] if importlib.util.find_spec("setuptools") is None else ["--no-build-isolation"]
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", ".", "--no-deps", *isolation, "-q", "-w", str(tmp_path)],
        cwd=fresh_clone, env=_clean_env(), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    if build.returncode != 0 and "No module named pip" in build.stderr:
        pytest.skip("needs pip")
    assert build.returncode == 0, build.stderr[-3000:]
    (wheel,) = tmp_path.glob("specdec-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in SHIPPED:
        folder = REPO / "assets" / name
        files = [folder] if folder.is_file() else [f for f in folder.rglob("*") if f.is_file()]
        for file in files:
            assert "specdec/assets/" + file.relative_to(REPO / "assets").as_posix() in names
    assert "specdec/conf/target/dense.yaml" in names and not any(n.startswith(("assets/", "tests/")) for n in names)
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)  # what pip install puts in site-packages
    check = """
import specdec, specdec.loading as L
from pathlib import Path
assets = Path(specdec.__file__).parent / "assets"
assert L.zoo_dir() == assets / "zoo", L.zoo_dir()
assert Path(L.resolve_model_path("target-dense")) == assets / "zoo" / "target-dense"
assert Path(L.resolve_model_path("assets/drafters/zoo-dense")) == assets / "drafters" / "zoo-dense"
assert L.load_tokenizer("tokenizer").mask_token_id == 2 and len(L.load_prompts(limit=2)) == 2
print("ok")
"""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run = subprocess.run([sys.executable, "-c", check], cwd=elsewhere, env=_clean_env(PYTHONPATH=str(site)),
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-3000:]
