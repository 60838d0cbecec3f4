"""The bench in batches (``batch_sizes``): every method timed at each batch size on left-padded batches of the zoo
dense pair, rows carrying B, pooled tok/s, per-row and batch τ, identity against batch 1, HF rows batched too and
``hf-assisted`` skipped at B > 1; bad batch sizes are refused before anything loads."""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path

import pytest

from specdec.bench import BenchConfig, aggregate, format_table, main_bench, run_bench
from specdec.bench.harness import Method

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def batch_run(tmp_path_factory, zoo):
    out = tmp_path_factory.mktemp("batch")
    cfg = {
        "device": "cpu", "dtype": "float32", "num_prompts": 3, "max_new_tokens": 8, "batch_sizes": [1, 2],
        "warmup": 0, "graph_floor": False, "progress": False, "out_dir": str(out), "threads": 1,
        "dflash": str(REPO / "assets" / "drafters" / "zoo-dense"),
        "methods": [
            {"name": "hf-static", "hf": "static"},
            {"name": "hf-assisted", "hf": "assisted", "drafter": {"kind": "model", "truncate_layers": 2}},
            {"name": "ar"},
            {"name": "dflash-chain", "drafter": {"kind": "dflash"}, "tree": {"kind": "chain", "k": 15}},
            {"name": "ddtree", "drafter": {"kind": "dflash"}, "tree": {"kind": "ddtree", "budget": [8], "topk": [4]}},
        ],
    }  # fmt: skip
    return main_bench(cfg), out


def test_every_method_at_every_batch_size_with_identity_against_batch_one(batch_run):
    rows, out = batch_run
    by = {}
    for r in rows:
        by.setdefault((r["method"], r["batch_size"]), []).append(r)
    methods = ["hf-static", "hf-assisted", "ar", "dflash-chain", "ddtree"]
    assert set(by) == {(m, b) for m in methods for b in (1, 2)} - {("hf-assisted", 2)}  # HF refuses batches there
    assert all(len(group) == 3 for group in by.values())  # one row per prompt
    # 3 prompts at B = 2: a call of two, then a call of one
    assert [(r["batch_index"], r["batch_rows"]) for r in by[("ddtree", 2)]] == [(0, 2), (0, 2), (1, 1)]
    for (method, b), group in by.items():
        if b == 2:
            assert all(r["identical_to_b1"] is True for r in group), method  # fp32 CPU greedy: the same tokens
            assert all(r["identical_to_ar"] is True for r in group if not method.startswith("hf"))
            one = {r["prompt_id"]: r for r in by[(method, 1)]}
            for r in group:  # the row's own counts, as alone
                assert (r["rounds"], r["tau"], r["new_tokens"]) == tuple(
                    one[r["prompt_id"]][k] for k in ("rounds", "tau", "new_tokens")
                )
            pair = group[:2]
            assert pair[0]["call_s"] == pair[1]["call_s"] and pair[0]["total_s"] == pytest.approx(pair[0]["call_s"] / 2)
    summaries = {(s["method"], s["batch_size"]): s for s in aggregate(rows)}
    for (method, b), s in summaries.items():
        group = by[(method, b)]
        calls = {(r["batch_index"], r["call_decode_s"]) for r in group} if b > 1 else None
        decode_s = sum(c for _, c in calls) if calls else sum(r["decode_s"] for r in group)
        assert s["tok_s"] == pytest.approx(sum(r["decode_tokens"] for r in group) / decode_s)
        assert s["identical_b1_share"] == (1.0 if b == 2 else None)
        taus = [r["tau"] for r in group if r["rounds"] and r["tau"] is not None]
        assert s["tau_rows"] == (pytest.approx(sum(taus) / len(taus)) if taus else None)
    assert summaries[("ddtree", 2)]["tau"] == pytest.approx(summaries[("ddtree", 1)]["tau"])
    table = (out / "results.md").read_text()
    head = next(line for line in table.splitlines() if line.startswith("| method"))
    assert "| T | B | budget |" in head and "| τ rows |" in head and "| = B1 |" in head
    assert "| ddtree | 0 | 2 | 8 | 4 |" in table and "batch sizes 1, 2" in table


def test_one_batch_size_keeps_the_table_of_batch_one(zoo, tmp_path):
    rows = main_bench({"device": "cpu", "num_prompts": 1, "max_new_tokens": 4, "warmup": 0, "graph_floor": False,
                       "progress": False, "out_dir": str(tmp_path), "methods": [{"name": "ar"}]})  # fmt: skip
    assert [r["batch_size"] for r in rows] == [1] and "identical_to_b1" not in rows[0]
    head = format_table(aggregate(rows)).splitlines()[0]
    assert "| B |" not in head and "τ rows" not in head and "= B1" not in head


@pytest.mark.parametrize(
    ("bad", "error"),
    [([], "non-empty"), ([0], "not an int >= 1"), ([1, 1], "repeats"), ([2.5], "not an int"), (4, "non-empty list")],
)
def test_bad_batch_sizes_are_refused_before_loading(bad, error):
    with pytest.raises(ValueError, match=error):
        BenchConfig(batch_sizes=bad)


def test_checks_of_batch_one_need_batch_one_in_the_list():
    with pytest.raises(ValueError, match="add 1 to batch_sizes"):
        run_bench(object(), None, [{"id": "a", "input_ids": [1, 2]}], [Method(name="ar")], max_new_tokens=2,
                  batch_sizes=[2], eager_compare=True, progress=False)  # fmt: skip


def test_hf_assisted_is_skipped_at_batch_sizes_above_one_with_a_reason(caplog):
    from models import tiny_model

    from specdec import ModelDrafter

    target = tiny_model("qwen3", scale=2.0)
    drafter = ModelDrafter.from_target_layers(target, 1)
    methods = [Method(name="hf-assisted", hf="assisted", drafter=drafter)]
    prompts = [{"id": "a", "input_ids": [3, 4, 5, 3, 4]}, {"id": "b", "input_ids": [7, 8, 9]}]
    with caplog.at_level(logging.WARNING, logger="specdec.bench.harness"):
        rows = run_bench(target, None, prompts, methods, max_new_tokens=4, batch_sizes=[1, 2], warmup=0,
                         progress=False)  # fmt: skip
    assert [r["batch_size"] for r in rows] == [1, 1]
    assert "skipping hf-assisted at batch size 2: HF assisted generation takes one sequence" in caplog.text


def test_the_batch_experiment_resolves_on_both_targets(zoo):
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf, open_dict

    from specdec import cli
    from specdec.bench import methods_from_specs

    cli._register_resolvers()
    for extra in ([], ["target=hybrid"]):
        with initialize_config_module("specdec.conf", version_base="1.3"):
            cfg = compose(config_name="bench", overrides=["+experiment=batch", *extra], return_hydra_config=True)
        choices = dict(cfg.hydra.runtime.choices)
        with open_dict(cfg):
            del cfg["hydra"]
        c = OmegaConf.to_container(cfg, resolve=True)
        cli.check_keys(c, choices, "bench")
        bench = BenchConfig(**cli.bench_settings(c))
        assert bench.batch_sizes == [1, 2, 4, 8, 16, 32] and (bench.num_prompts, bench.max_new_tokens) == (32, 128)
        assert (bench.warmup, bench.repeat, bench.title) == (1, 1, "batch")
        assert Path(bench.target).name == ("target-hybrid" if extra else "target-dense")
        stub = dict.fromkeys(("dflash",), lambda target, tokenizer, **kw: object())
        names = [m.name for m in methods_from_specs(bench.methods, target=None, tokenizer=None, drafter_factories=stub)]
        trees = ["ddtree-b15-k8", "ddtree-b32-k8", "ddtree-b63-k8", "ddtree-auto"]
        assert names == ["hf-static", "ar", "dflash-chain", *trees]


def test_report_checks_the_round_cost_model_point_by_point():
    """The notes predict each measured (B, slots) round cost from the other points (a + b·B + c·B·n + d·T): exact
    on costs built from that form, and the largest error named; nothing without several B and tree sizes."""
    from specdec.bench.report import _cost_model_lines

    def summary(tree, batch, budget, ms):
        return {"temperature": 0.0, "tree": tree, "batch_size": batch, "budget": budget,
                "phase_ms_per_round": {"round": ms}, "ms_per_round": ms}  # fmt: skip

    def cost(b, n):
        return 0.9 + 0.02 * b + 0.001 * b * n + (0.6 if n > 1 else 0.0)

    rows = [summary("ar", b, 0, cost(b, 1)) for b in (1, 4, 16)]
    rows += [summary("ddtree", b, budget, cost(b, budget + 1)) for b in (1, 4, 16) for budget in (15, 31, 63)]
    (line,) = _cost_model_lines(rows)
    assert "(largest error 0.0 %)" in line and "B=4 n=32:" in line and "0.6·T" in line
    skewed = rows[:-1] + [summary("ddtree", 16, 63, 2 * cost(16, 64))]  # one point far off the model
    assert "(largest error 0.0 %)" not in _cost_model_lines(skewed)[0]
    assert _cost_model_lines([r for r in rows if r["batch_size"] == 1]) == []


def test_auto_rows_carry_each_rounds_budget_and_time(tmp_path, zoo):
    """``DDTree(budget="auto")`` rows: the call's rounds as ``[budget, ms]`` in order, as many as the call's rounds
    (alone: ``budget_rounds``; in a batch: ``call_budget_rounds`` on every row of the call), their budgets counted
    as ``budgets`` / ``call_budgets``."""
    cfg = {
        "device": "cpu", "dtype": "float32", "num_prompts": 3, "max_new_tokens": 8, "batch_sizes": [1, 2],
        "warmup": 0, "graph_floor": False, "progress": False, "out_dir": str(tmp_path), "threads": 1,
        "dflash": str(REPO / "assets" / "drafters" / "zoo-dense"),
        "methods": [{"name": "auto", "drafter": {"kind": "dflash"}, "tree": {"kind": "ddtree", "budget": "auto"}}],
    }  # fmt: skip
    rows = main_bench(cfg)
    assert {r["batch_size"] for r in rows} == {1, 2}
    for r in rows:
        rounds, counts, calls = ((r["budget_rounds"], r["budgets"], r["rounds"]) if r["batch_size"] == 1 else
                                 (r["call_budget_rounds"], r["call_budgets"], r["call_rounds"]))  # fmt: skip
        assert len(rounds) == calls > 0, r
        assert {str(b): n for b, n in Counter(b for b, _ in rounds).items()} == counts
        assert all(ms is None or ms > 0 for _, ms in rounds) and any(ms for _, ms in rounds)
