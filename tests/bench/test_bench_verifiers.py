"""Bench methods that take a verification rule and the sampled tree policies: spec parsing (names carry the rule,
clear errors, refused pairs), the rule reaching ``generate``, and the per-depth acceptance column of the report."""

from __future__ import annotations

import pytest
import torch
from models import perturbed_copy, tiny_model

import specdec
from specdec.bench import Method, aggregate, format_table, methods_from_specs, run_bench

RSD = {"name": "multi-draft", "replacement": False}


def _methods(specs):
    return methods_from_specs(specs, target=None, tokenizer=None, drafter_factories={"dflash": lambda t, k: object()})


def test_a_method_takes_a_rule_and_every_registered_tree():
    specs = [
        {"drafter": "dflash", "tree": {"kind": "ddtree", "budget": [15, 32], "topk": 8}, "verifier": "sample-match"},
        {"drafter": "dflash", "tree": {"kind": "sampled-chain", "k": 15}, "verifier": {"name": "speculative-sampling"}},
        {"drafter": "dflash", "tree": {"kind": "sampled-trees", "k": 3, "depth": 5, "merge": False},
         "verifier": {"name": "multi-draft", "replacement": True}},
        {"drafter": "dflash", "tree": {"kind": "gumbel-topk", "widths": [[3, 1], [2, 2, 2]]}, "verifier": RSD},
        {"drafter": "dflash", "tree": {"kind": "gumbel-topk", "widths": [2, 2]}, "verifier": RSD},
        {"drafter": "dflash", "tree": {"kind": "stochastic-ddtree", "budget": [15, 63], "topk": 8}, "verifier": RSD},
        {"name": "trav", "drafter": "dflash", "tree": {"kind": "sampled-trees", "k": 3, "depth": 5},
         "verifier": {"name": "traversal"}},
        {"name": "default", "drafter": "dflash", "tree": {"kind": "stochastic-ddtree", "budget": 15}},
    ]  # fmt: skip
    methods = _methods(specs)
    assert [m.name for m in methods] == [
        "sample-match/ddtree-b15-k8", "sample-match/ddtree-b32-k8", "speculative-sampling/sampled-chain15",
        "multi-draft-replacement/sampled-trees-k3-d5-unmerged", "multi-draft-no-replacement/gumbel-topk-w3x1",
        "multi-draft-no-replacement/gumbel-topk-w2x2x2", "multi-draft-no-replacement/gumbel-topk-w2x2",
        "multi-draft-no-replacement/stochastic-ddtree-b15-k8", "multi-draft-no-replacement/stochastic-ddtree-b63-k8",
        "trav+traversal", "default",
    ]  # fmt: skip
    assert methods[0].verifier == specdec.SampleMatch() and methods[-1].verifier is None
    assert methods[3].verifier == specdec.MultiDraftRejection(replacement=True)
    assert methods[3].tree == specdec.SampledTrees(3, 5, merge=False)
    assert methods[4].tree == specdec.GumbelTopKTree((3, 1)) and methods[6].tree == specdec.GumbelTopKTree((2, 2))
    assert methods[8].tree == specdec.StochasticDDTree(63, 8)
    assert methods[9].verifier == specdec.TraversalVerification()
    # budgets of one spec and kind share a plot line
    assert methods[7].series == methods[8].series and methods[0].series == methods[1].series


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ({"verifier": "nope"}, r"Unknown verifier 'nope'; choose one of block, greedy, multi-draft"),
        (
            {"verifier": {"name": "block", "replacement": True}},
            r"verifier \{name: block\} does not take \['replacement'\]",
        ),
        ({"verifier": {"replacement": True}}, r"give a rule name or \{name: \.\.\., \.\.\.settings\}"),
        ({"tree": {"kind": "star"}}, r"Unknown tree kind 'star': choose one of .*stochastic-ddtree"),
        (
            {"tree": {"kind": "stochastic-ddtree", "width": 2}},
            r"unknown fields \['width'\]; it takes \['budget', 'topk'\]",
        ),
        (
            {"verifier": {"name": "traversal"}, "tree": {"kind": "stochastic-ddtree", "budget": 15}},
            r"\(verifier traversal\): TraversalVerification is not exact for StochasticDDTree",
        ),
        ({"verifier": {"name": "multi-draft"}, "tree": {"kind": "stochastic-ddtree"}}, r"got tree=StochasticDDTree"),
        ({"verifier": "speculative-sampling", "tree": {"kind": "ddtree", "budget": 8}}, r"got tree=DDTree"),
    ],
    ids=["rule", "setting", "no-name", "tree", "tree-field", "traversal-sddtree", "specinfer-sddtree", "ddtree"],
)
def test_bad_rules_and_pairs_are_refused_before_loading(spec, match):
    with pytest.raises(ValueError, match=match):
        _methods([{"drafter": "dflash", "tree": {"kind": "sampled-chain", "k": 4}, **spec}])


def test_an_hf_row_takes_no_rule():
    with pytest.raises(ValueError, match="an hf row runs HF's own generate; drop verifier"):
        _methods([{"hf": "generate", "verifier": "greedy"}])


def test_the_rule_reaches_generate_and_the_report_shows_depth_acceptance(tmp_path):
    """A tiny target and a drafter close to it: the RSD row over the stochastic DDTree records its rule, and
    ``results.md`` has the ``accepted ≥ d`` column with each row's shares (from its own ``accept_hist``)."""
    target = tiny_model("qwen3", scale=2.0)
    drafter = specdec.ModelDrafter(perturbed_copy(target, noise=0.05), tree_depth=3)
    methods = [
        Method(name="ar"),
        Method(
            name="rsd",
            drafter=drafter,
            tree=specdec.StochasticDDTree(6, 2),
            verifier=specdec.MultiDraftRejection(replacement=False),
        ),  # fmt: skip
    ]
    prompts = [{"id": "p0", "prompt": "x"}]

    def tokenizer(text, return_tensors="pt"):
        return type("T", (), {"input_ids": torch.tensor([[5, 9, 11, 5, 9, 11, 5, 9]])})()

    rows = run_bench(target, tokenizer, prompts, methods, max_new_tokens=12, temperatures=[1.0], warmup=0,
                     out_dir=tmp_path, seed=0, ignore_eos=True, graph_floor=False, progress=False)  # fmt: skip
    rsd = [r for r in rows if r["method"] == "rsd"]
    assert rsd and all(r["verifier"] == "multi-draft" and r["tree"] == "stochastic-ddtree" for r in rsd)
    hist = rsd[0]["accept_hist"]
    assert sum(hist[1:]) > 0, hist  # some round accepted a draft
    (summary,) = [s for s in aggregate(rows) if s["method"] == "rsd"]
    want = [sum(hist[d:]) / sum(hist) for d in range(1, len(hist))]
    assert summary["depth_accept"] == pytest.approx(want)
    table = (tmp_path / "results.md").read_text()
    assert "accepted ≥ d (d = 1, 2, …)" in table
    line = next(line for line in table.splitlines() if line.startswith("| rsd |"))
    assert " ".join(f"{x:.2f}" for x in want) in line


def test_depth_acceptance_column_exact():
    """Shares of rounds accepting at least d drafts over all rows of a method, deeper than 8 cut with an ellipsis;
    the column is left out when no round accepted a draft."""
    base = {"series": None, "drafter": "D", "budget": 8, "topk": None, "temperature": 1.0, "new_tokens": 5,
            "decode_tokens": 4, "decode_s": 1.0, "tau": 2.0, "phase_ms": {"prefill": 1.0}}  # fmt: skip
    rows = [
        dict(base, method="m", tree="stochastic-ddtree", prompt_id="a", rounds=4, accept_hist=[1, 1, 2]),
        dict(base, method="m", tree="stochastic-ddtree", prompt_id="b", rounds=4, accept_hist=[2, 0, 1, 1]),
        dict(base, method="deep", tree="gumbel-topk", prompt_id="a", rounds=10, accept_hist=[0] * 9 + [1] + [0]),
    ]
    summaries = aggregate(rows)
    assert summaries[0]["depth_accept"] == [5 / 8, 4 / 8, 1 / 8]
    lines = format_table(summaries).splitlines()
    assert lines[0].startswith("| method | T | budget | topk | τ | accepted ≥ d (d = 1, 2, …) | tok/s (warm) |")
    assert lines[2].startswith("| m | 1 | 8 | budget | 2.00 | 0.62 0.50 0.12 | ")
    assert lines[3].startswith("| deep | 1 | 8 | – | 2.00 | 1.00 1.00 1.00 1.00 1.00 1.00 1.00 1.00 … | ")
    none = [dict(r, accept_hist=[r["rounds"]]) for r in rows]
    assert "accepted" not in format_table(aggregate(none))
