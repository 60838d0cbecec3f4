"""Every planted bug of ``scripts/mutants.py`` still applies to the code: each of its replacements finds its text
exactly once, and each mutant names tests that exist. The script aborts on a replacement it cannot place, so a
refactor that moves the code a mutant targets would otherwise leave that bug unplanted until someone runs it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def mutants():
    spec = importlib.util.spec_from_file_location("specdec_mutants", REPO / "scripts" / "mutants.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules.pop(spec.name, None)
    return module.MUTANTS


def test_every_replacement_finds_its_text_once(mutants):
    stale = []
    for mutant in mutants:
        for file, old, new in mutant.edits:
            count = (REPO / file).read_text().count(old)
            if count != 1 or old == new:
                stale.append(f"{mutant.name}: {file} holds {old!r} {count} times")
    assert not stale, "\n".join(stale)


def test_mutants_have_unique_names_and_existing_tests(mutants):
    names = [m.name for m in mutants]
    assert len(names) == len(set(names)) and len(names) > 100
    for mutant in mutants:
        assert mutant.edits and mutant.tests, mutant.name
        for target in mutant.tests:
            if target.startswith("tests/"):
                assert (REPO / target.split("::")[0]).exists(), (mutant.name, target)
