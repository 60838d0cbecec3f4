"""Plant realistic bugs, one at a time, in a temporary copy of the repository and show that CPU tests catch each.

Each mutant is a list of ``(file, old, new)`` string replacements plus the tests to run on it. A replacement
whose ``old`` text is not found exactly once aborts the script, so a refactor that moves the code is noticed:
update the tuple to the new code. A baseline row runs every listed test on the unmodified copy first (it must
pass, or a kill would prove nothing).

Usage (from the repository root)::

    python scripts/mutants.py              # all mutants, 2 at a time
    python scripts/mutants.py --jobs 1 --only eos_truncation_removed tie_order_reversed
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

SAMPLING = "specdec/verify/sampling.py"
TOP_K_THEN_TOP_P = """    if sampling.top_k:
        procs.append(TopKLogitsWarper(top_k=sampling.top_k, min_tokens_to_keep=1))
    if sampling.top_p is not None and sampling.top_p < 1.0:
        procs.append(TopPLogitsWarper(top_p=sampling.top_p, min_tokens_to_keep=1))
"""
TOP_P_THEN_TOP_K = """    if sampling.top_p is not None and sampling.top_p < 1.0:
        procs.append(TopPLogitsWarper(top_p=sampling.top_p, min_tokens_to_keep=1))
    if sampling.top_k:
        procs.append(TopKLogitsWarper(top_k=sampling.top_k, min_tokens_to_keep=1))
"""
# A top-p warper that keeps only the tokens whose cumulative mass stays <= top_p (drops the crossing token).
TOP_P_NO_CROSSING = """class _TopPNoCrossing:
    def __init__(self, top_p):
        self.top_p = top_p

    def __call__(self, input_ids, scores):
        sorted_p, order = scores.softmax(-1).sort(-1, descending=True)
        drop = sorted_p.cumsum(-1) > self.top_p
        drop[..., 0] = False
        return scores.masked_fill(drop.scatter(-1, order, drop), float("-inf"))


def process_logits("""

SAMPLING_TESTS = ["tests/unit/test_verify_sampling.py"]
CHI2_TESTS = ("tests/unit/test_verify_sampling.py", "-k", "not equals_hf_warpers")  # the statistical tests alone
GREEDY_TESTS = ["tests/unit/test_generate_greedy.py"]


@dataclass(frozen=True)
class Mutant:
    name: str
    edits: tuple[tuple[str, str, str], ...]  # (file, old, new)
    tests: tuple[str, ...]


MUTANTS = [
    # -- sampling: the distribution each node samples from ------------------------------------------------
    Mutant(  # temperature applied inverted: logits x T instead of logits / T
        "temperature_inverted",
        (
            (
                SAMPLING,
                "TemperatureLogitsWarper(sampling.temperature)",
                "TemperatureLogitsWarper(1 / sampling.temperature)",
            ),
        ),
        tuple(SAMPLING_TESTS),
    ),
    Mutant(  # top-p drops the token that crosses the cutoff
        "top_p_crossing_dropped",
        (
            (
                SAMPLING,
                "procs.append(TopPLogitsWarper(top_p=sampling.top_p, min_tokens_to_keep=1))",
                "procs.append(_TopPNoCrossing(sampling.top_p))",
            ),
            (SAMPLING, "def process_logits(", TOP_P_NO_CROSSING),
        ),
        tuple(SAMPLING_TESTS),
    ),
    Mutant(  # top-p applied before top-k
        "top_p_before_top_k", ((SAMPLING, TOP_K_THEN_TOP_P, TOP_P_THEN_TOP_K),), tuple(SAMPLING_TESTS)
    ),
    Mutant(  # HF's fallback top_k=50 forgotten when neither the call nor generation_config sets top_k
        "top_k_default_ignored",
        (("specdec/hf_args.py", '"top_k": 50,', '"top_k": None,'),),
        tuple(SAMPLING_TESTS),
    ),
    Mutant(  # the sample-and-match walk reads each node's sample from the previous node's logits
        "sample_wrong_node",
        (
            (
                SAMPLING,
                "sample_tokens(target_logits, sampling, generator).tolist()",
                "sample_tokens(target_logits.roll(1, dims=0), sampling, generator).tolist()",
            ),
        ),
        tuple(SAMPLING_TESTS),
    ),
    # -- EOS ---------------------------------------------------------------------------------------------
    Mutant(  # stop at EOS but keep the rest of the round's tokens
        "eos_truncation_removed",
        (("specdec/generate.py", "accepted, done = accepted[: i + 1], True", "done = True"),),
        ("tests/unit/test_eos.py",),
    ),
    # -- structure: verification, commit, trees, recurrent state -----------------------------------------
    Mutant(  # greedy acceptance on the wrong logits (node i judged by node i-1's logits)
        "accept_wrong_logits",
        (
            (
                "specdec/verify/greedy.py",
                "walk_tree(tree, target_logits.argmax(dim=-1).tolist())",
                "walk_tree(tree, target_logits.roll(1, dims=0).argmax(dim=-1).tolist())",
            ),
        ),
        tuple(GREEDY_TESTS),
    ),
    Mutant(  # KV commit crops to the path length without gathering the accepted nodes' entries
        "commit_without_gather",
        (("specdec/state/kv.py", "if list(path) != list(range(n)):", "if False:"),),
        tuple(GREEDY_TESTS),
    ),
    Mutant(  # equal log-probs ranked by decreasing token id
        "tie_order_reversed",
        (
            (
                "specdec/trees/ddtree.py",
                "ids, by_id = ids.sort(dim=-1)",
                "ids, by_id = ids.sort(dim=-1, descending=True)",
            ),
        ),
        ("tests/trees/test_ddtree.py",),
    ),
    Mutant(  # tree positions one too far
        "position_off_by_one",
        (
            (
                "specdec/trees/mask.py",
                "return (depth + prefix_len).to(device)",
                "return (depth + prefix_len + 1).to(device)",
            ),
        ),
        ("tests/trees/test_tree_basics.py", *GREEDY_TESTS),
    ),
    Mutant(  # each node sees the previous node's ancestors instead of its parent's
        "ancestor_mask_wrong",
        (("specdec/trees/mask.py", "mask[i] = mask[par[i]]", "mask[i] = mask[i - 1]"),),
        ("tests/trees/test_tree_basics.py", *GREEDY_TESTS),
    ),
    Mutant(  # Gated DeltaNet recurrence continues from the previous node's state instead of the parent's
        "recurrent_parent_state_wrong",
        (("specdec/state/gdn.py", "parents = index[:, -2] - conv.shape[-1]", "parents = torch.arange(n) - 1"),),
        ("tests/state/test_hybrid_tree.py", "tests/state/test_hybrid_generate.py"),
    ),
    Mutant(  # prune_depth keeps the old parent indices instead of re-indexing them among the kept nodes
        "prune_parents_not_remapped",
        (("specdec/trees/paths.py", "remap[parents.clamp(min=0)]", "parents.clamp(min=0)"),),
        ("tests/trees/test_tree_basics.py",),
    ),
]


# The sampling bugs again, against the chi-square tests only (without the exact comparison with HF's warpers).
MUTANTS += [Mutant(f"{m.name}/chi2", m.edits, CHI2_TESTS) for m in MUTANTS[:5]]


def copy_repo(dest: Path) -> None:
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, check=True, capture_output=True, text=True,
    ).stdout.split("\0")  # fmt: skip
    for name in filter(None, files):
        src = REPO / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


def apply(dest: Path, edits) -> None:
    for file, old, new in edits:
        path = dest / file
        text = path.read_text()
        count = text.count(old)
        if count != 1:
            raise SystemExit(f"mutation target not found exactly once ({count}x) in {file}: {old!r}; update MUTANTS")
        path.write_text(text.replace(old, new))


def run(mutant: Mutant, zoo: str, stop_first: bool = True) -> tuple[str, int, str, float]:
    """Returns (name, pytest exit code, first failing test or summary, seconds)."""
    start = time.time()
    with tempfile.TemporaryDirectory(prefix=f"mutant-{mutant.name.replace('/', '-')}-") as tmp:
        dest = Path(tmp)
        copy_repo(dest)
        apply(dest, mutant.edits)
        env = {**os.environ, "PYTHONPATH": str(dest), "SPECDEC_ZOO": zoo, "PYTHONDONTWRITEBYTECODE": "1"}
        stop = ["-x"] if stop_first else []
        cmd = [sys.executable, "-m", "pytest", *stop, "-q", "-p", "no:cacheprovider", "--durations=0", *mutant.tests]
        proc = subprocess.run(cmd, cwd=dest, env=env, capture_output=True, text=True)
    failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", proc.stdout, flags=re.M)
    summary = failed[0] if failed else (proc.stdout.strip().splitlines() or ["(no output)"])[-1]
    if len(failed) > 1:
        summary = f"{len(failed)} failed: " + ", ".join(f.split("::")[-1] for f in failed)
    return mutant.name, proc.returncode, summary, time.time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--only", nargs="*", help="mutant names")
    parser.add_argument("--no-baseline", action="store_true")
    parser.add_argument("--all-failures", action="store_true", help="run each subset to the end (no -x)")
    args = parser.parse_args()
    mutants = [m for m in MUTANTS if not args.only or m.name in args.only]
    zoo = os.environ.get("SPECDEC_ZOO", str((REPO.parent / "shared" / "zoo").resolve()))
    if not args.no_baseline:
        tests = tuple(dict.fromkeys(t for m in mutants for t in m.tests if t.startswith("tests/")))
        name, code, summary, secs = run(Mutant("(none: baseline)", (), tests), zoo)
        print(f"baseline: exit {code}, {summary} ({secs:.0f} s)", flush=True)
        if code != 0:
            raise SystemExit("the unmodified copy fails its tests: fix that first")
    print("| mutant | tests failed | killed? | s |\n|---|---|---|---|", flush=True)
    survived = []
    with ThreadPoolExecutor(args.jobs) as pool:
        for name, code, summary, secs in pool.map(lambda m: run(m, zoo, not args.all_failures), mutants):
            killed = code == 1  # 1 = tests failed; other codes are collection/usage errors
            if not killed:
                survived.append(name)
            print(f"| {name} | {summary if code else '-'} | {'yes' if killed else 'NO'} | {secs:.0f} |", flush=True)
    if survived:
        raise SystemExit(f"mutants not killed: {survived}")


if __name__ == "__main__":
    main()
