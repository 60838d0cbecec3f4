"""Shared test settings: the zoo fixture, the ``interpreter`` tier and the per-test time budget.

Tiers (``make test`` runs the default selection; ``.ci/run`` runs every tier but ``gpu``):

* default: ``python -m pytest`` (``make test``), CPU, a few minutes.
* ``slow``: zoo targets over all dev prompts (``make test-slow``).
* ``interpreter``: the Triton kernels through ``TRITON_INTERPRET=1`` on the CPU (``make test-interpreter``); left
  out of the default selection here, run with ``-m interpreter``.
* ``gpu``: needs a CUDA device (``make test-gpu``, with a per-test budget: ``--test-budget``).
* ``examples``: every example script and the tour notebook (``make test-examples``).
"""

import inspect
import os
import re
import signal
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
torch.set_num_threads(1)  # tiny models: threads only add contention

REPO = Path(__file__).resolve().parents[1]
SHIPPED_ZOO = REPO / "assets" / "zoo"  # the dense target, the tokenizer and the dev prompts ship with the project
INTERPRETER = "interpreter"
# tests outside tests/kernels that run Triton through the interpreter, recognised by name (tests/kernels marks its own)
_INTERPRETED_NAME = re.compile(r"(^|_)interpreted(_|$)|_in_the_interpreter$")


if not os.environ.get("SPECDEC_ZOO") and not (REPO.parent / "shared" / "zoo").is_dir():
    # A clone with nothing beside it: the shipped part is the zoo, for this process and the CLI runs it starts too
    # (the configs' ${zoo:...} paths resolve through specdec.paths.zoo_dir, which has no shipped fallback).
    os.environ["SPECDEC_ZOO"] = str(SHIPPED_ZOO)


def zoo_path() -> Path:
    """As ``specdec.loading.zoo_dir``: ``$SPECDEC_ZOO``, else ``../shared/zoo`` beside the repository when it exists,
    else the shipped ``assets/zoo``."""
    if os.environ.get("SPECDEC_ZOO"):
        return Path(os.environ["SPECDEC_ZOO"]).expanduser().resolve()
    beside = REPO.parent / "shared" / "zoo"
    return beside.resolve() if beside.is_dir() else SHIPPED_ZOO


def only_shipped_zoo() -> bool:
    """No external zoo: only what ships in ``assets/zoo`` (a fresh clone); tests of the hybrid target are skipped."""
    return zoo_path() == SHIPPED_ZOO.resolve()


class _Zoo(type(Path())):
    """The zoo folder; ``zoo / name`` for an item that only a full zoo holds (``target-hybrid``) skips the test
    when the tests run on the shipped part of the zoo alone."""

    def __truediv__(self, name):
        path = super().__truediv__(name)
        if getattr(self, "_zoo_root", False) and not path.exists() and only_shipped_zoo():
            pytest.skip(f"{name} does not ship with the project: set SPECDEC_ZOO to a zoo folder that holds it")
        return path


@pytest.fixture(scope="session")
def zoo() -> Path:
    path = zoo_path()
    # The tokenizer is shared; a zoo copy may hold one target only (a test of the other fails naming its folder).
    if not (path / "tokenizer").is_dir() or not any((path / t).is_dir() for t in ("target-dense", "target-hybrid")):
        pytest.fail(f"zoo fixtures not found at {path}; set SPECDEC_ZOO to the zoo folder")
    root = _Zoo(path)
    root._zoo_root = True
    return root


def _needs_zoo_hybrid(item) -> bool:
    """A test that takes the zoo and names its hybrid target in its own code (``target=hybrid``, ``target-hybrid``)."""
    if "zoo" not in getattr(item, "fixturenames", ()):
        return False
    try:
        source = inspect.getsource(item.function)
    except (OSError, TypeError, AttributeError):
        return False
    return "target=hybrid" in source or "target-hybrid" in source


# --- tiers ------------------------------------------------------------------------------------------------------


def pytest_addoption(parser):
    parser.addoption(
        "--test-budget",
        type=float,
        default=float(os.environ.get("SPECDEC_TEST_BUDGET", 0) or 0),
        help="seconds each test's setup and each test's call may take before it fails (0 = no limit; "
        "env SPECDEC_TEST_BUDGET). make test-gpu sets one.",
    )


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        f"{INTERPRETER}: Triton kernels through TRITON_INTERPRET=1 on the CPU (minutes); not in the default "
        "selection: run with -m interpreter (make test-interpreter, run by .ci/run)",
    )


@pytest.hookimpl(tryfirst=True)  # before -m selects: tests marked here are selectable with -m interpreter
def pytest_collection_modifyitems(config, items):
    for item in items:
        if _INTERPRETED_NAME.search(getattr(item, "originalname", item.name)):
            item.add_marker(INTERPRETER)
    if not re.search(rf"\b{INTERPRETER}\b", config.option.markexpr or ""):
        deselected = [item for item in items if item.get_closest_marker(INTERPRETER)]
        if deselected:
            config.hook.pytest_deselected(items=deselected)
            items[:] = [item for item in items if not item.get_closest_marker(INTERPRETER)]
    if only_shipped_zoo():
        skip = pytest.mark.skip(reason="needs the zoo's hybrid target, which does not ship: set SPECDEC_ZOO")
        for item in items:
            if _needs_zoo_hybrid(item):
                item.add_marker(skip)


# --- per-test budget ----------------------------------------------------------------------------------------------


class BudgetExceeded(Exception):
    pass


def _budgeted(item, phase: str):
    budget = item.config.getoption("--test-budget")
    if not budget or not hasattr(signal, "SIGALRM"):
        return None
    marker = item.get_closest_marker("budget")  # a test that compiles many kernels states its own, larger one
    if marker is not None:
        budget = max(budget, float(marker.args[0]))

    def expire(signum, frame):
        raise BudgetExceeded(f"{item.nodeid}: {phase} took longer than the {budget:g} s budget (--test-budget)")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, budget)
    return previous


def _disarm(previous) -> None:
    if previous is not None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    previous = _budgeted(item, "setup")
    try:
        yield
    finally:
        _disarm(previous)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    previous = _budgeted(item, "call")
    try:
        yield
    finally:
        _disarm(previous)
