"""Packaging beside pyproject.toml: the shipped assets (``assets/``: the zoo's dense target, tokenizer and dev
prompts, the trained drafters) install as the package data folder ``specdec/assets``, where
``specdec.loading.asset_path`` finds them after a non-editable ``pip install .``."""

from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).resolve().parent
# Every asset folder whose name Python could import is declared, so that setuptools takes it as data, not as a
# package it would leave out; the files themselves come from package-data "specdec.assets" (pyproject.toml).
ASSET_FOLDERS = [
    ".".join(("specdec.assets", *path.relative_to(ROOT / "assets").parts))
    for path in sorted([ROOT / "assets", *(ROOT / "assets").rglob("*")])
    if path.is_dir() and all(part.isidentifier() for part in path.relative_to(ROOT / "assets").parts)
]

setup(
    packages=[*find_packages(include=["specdec*"]), *ASSET_FOLDERS],
    package_dir={"specdec.assets": "assets"},
)
