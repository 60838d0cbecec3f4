"""Benchmark harness: time ``specdec.generate`` and HF's own ``generate`` over methods x temperatures x prompts.

Measured warm: before timing a method, every prompt it will time is decoded untimed (``warmup`` full passes),
so no row pays for a first-use cost (kernel selection, allocator growth, CUDA-graph capture, compilation); the
warm-up time and the capture / compile times are reported apart. Timing brackets each call with a device
synchronisation; decode time excludes the prefill. A rich progress bar with an ETA counts every call.
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass

import torch

from specdec.bench.floor import graph_floor_ms
from specdec.bench.hf import HF_KINDS, hf_row, run_hf
from specdec.bench.report import environment, write_report
from specdec.generate import generate
from specdec.target import TargetModel
from specdec.types import Chain, DDTree, TreeSpec

__all__ = ["Method", "run_bench"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class Method:
    """One decoding configuration to benchmark.

    Args:
        name (str): label used in rows, tables and plots; unique within a run.
        drafter: a drafter object, a zero-argument callable returning one (called once per run), or ``None``
            for plain autoregressive decoding through the same loop (the AR baseline). Default None.
        tree (Chain | DDTree | None): tree spec; ignored when ``drafter`` is None. Default None (drafter's own).
        hf (str | None): run HF's own ``generate`` instead of specdec: ``"generate"`` (eager), ``"static"``
            (``cache_implementation="static"``) or ``"assisted"`` (``assistant_model=`` the small model of the
            ``ModelDrafter`` given as ``drafter``). Default None (specdec).
    """

    name: str
    drafter: object | Callable[[], object] | None = None
    tree: TreeSpec | None = None
    hf: str | None = None

    def __post_init__(self) -> None:
        if self.hf is not None and self.hf not in HF_KINDS:
            raise ValueError(f"Method {self.name!r}: hf={self.hf!r}; choose one of {HF_KINDS} (or None).")

    def make_drafter(self) -> object | None:
        """The drafter object (calling the factory if ``drafter`` is one), or None."""
        # A class or a function builds the drafter; a drafter object is used as it is.
        is_factory = isinstance(self.drafter, type) or (callable(self.drafter) and not hasattr(self.drafter, "propose"))
        return self.drafter() if is_factory else self.drafter


def _order(method: Method) -> int:
    """HF generate first (the reference of identical_to_hf), other HF rows, AR (the reference), drafters."""
    return 0 if method.hf == "generate" else 1 if method.hf else 2 if method.drafter is None else 3


def _sync(device: torch.device) -> None:
    if device.type != "cpu" and torch.accelerator.is_available():
        torch.accelerator.synchronize(device)


def _run_one(target, input_ids, drafter, tree, temperature: float, seed: int, gen_kwargs: dict):
    """One timed ``generate`` call; returns (output, wall seconds)."""
    device = input_ids.device
    generator = torch.Generator(device=device).manual_seed(seed)
    sampling = {"do_sample": False} if temperature == 0 else {"do_sample": True, "temperature": temperature}
    _sync(device)
    start = time.perf_counter()
    out = generate(target, input_ids, drafter=drafter, tree=tree, generator=generator, **sampling, **gen_kwargs)
    _sync(device)
    return out, time.perf_counter() - start


def _row(method: Method, drafter, tree, temperature: float, prompt_id, input_ids, out, total_s: float) -> dict:
    stats = out.stats
    prefill_s = stats.phase_ms.get("prefill", 0.0) / 1e3
    decode_s = max(total_s - prefill_s, 0.0)
    decode_tokens = max(stats.new_tokens - 1, 0)  # the first new token comes out of the prefill
    tree = tree if drafter is not None else None
    return {
        "method": method.name,
        "drafter": "none" if drafter is None else type(drafter).__name__,
        "tree": "ar" if drafter is None else ("ddtree" if isinstance(tree, DDTree) else "chain"),
        "budget": 0 if tree is None else tree.budget,
        "topk": None if tree is None else tree.topk,
        "temperature": float(temperature),
        "prompt_id": prompt_id,
        "prompt_tokens": int(input_ids.shape[1]),
        "new_tokens": stats.new_tokens,
        "decode_tokens": decode_tokens,
        "tau": stats.tau,
        "rounds": stats.rounds,
        "target_forwards": stats.target_forwards,
        "draft_forwards": stats.draft_forwards,
        "tree_nodes": stats.tree_nodes,
        "total_s": total_s,
        "prefill_s": prefill_s,
        "decode_s": decode_s,
        "decode_tok_s": decode_tokens / decode_s if decode_s > 0 else None,
        "phase_ms": dict(stats.phase_ms),
        "accept_hist": list(stats.accept_hist),
        "depth_accept": list(stats.depth_accept),
        "capture_ms": float(getattr(stats, "capture_ms", 0.0) or 0.0),
        "compile_ms": float(getattr(stats, "compile_ms", 0.0) or 0.0),
        "compile_fallbacks": int(getattr(stats, "compile_fallbacks", 0) or 0),
        "path": getattr(stats, "path", None),
        "identical_to_ar": None,
        "identical_to_hf": None,
    }


class _Runner:
    """Runs one method on one prompt (specdec or HF), returning (sequences, row)."""

    def __init__(self, target: TargetModel, method: Method, gen_kwargs: dict, fast_kwargs: dict) -> None:
        self.target, self.method = target, method
        self.drafter = method.make_drafter()
        # Resolve the tree as generate does, so rows record what actually ran.
        self.tree = method.tree or getattr(self.drafter, "default_tree", None) or Chain(k=4)
        self.gen_kwargs, self.fast_kwargs = gen_kwargs, fast_kwargs

    def __call__(self, temperature: float, seed: int, prompt_id, ids: torch.Tensor) -> tuple[torch.Tensor, dict]:
        method = self.method
        if method.hf is not None:
            torch.manual_seed(seed)
            assistant = getattr(getattr(self.drafter, "lm", None), "model", self.drafter)
            seqs, total_s, prefill_s = run_hf(
                self.target.model, ids, method.hf, temperature, self.gen_kwargs, assistant=assistant
            )
            return seqs, hf_row(method.name, method.hf, temperature, prompt_id, ids, seqs, total_s, prefill_s)
        kwargs = {**self.gen_kwargs, **self.fast_kwargs}
        out, total_s = _run_one(self.target, ids, self.drafter, self.tree, temperature, seed, kwargs)
        return out.sequences, _row(method, self.drafter, self.tree, temperature, prompt_id, ids, out, total_s)


def _progress(enabled: bool | object, total: int):
    """A rich progress bar with ETA (or the ``rich.progress.Progress`` given), and its task id."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    if enabled is False:
        return None, None
    bar = (
        enabled
        if enabled is not True
        else Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
        )
    )
    return bar, bar.add_task("bench", total=total)


def _encode(tokenizer, prompts, max_prompt_tokens, device) -> list[torch.Tensor]:
    encoded = []
    for p in prompts:
        ids = tokenizer(p["prompt"], return_tensors="pt").input_ids
        encoded.append((ids[:, -max_prompt_tokens:] if max_prompt_tokens else ids).to(device))
    return encoded


def run_bench(
    target,
    tokenizer,
    prompts: Sequence[Mapping],
    methods: Sequence[Method],
    *,
    max_new_tokens: int,
    temperatures: Sequence[float] = (0.0,),
    warmup: int = 1,
    out_dir: str | os.PathLike | None = None,
    seed: int = 0,
    max_prompt_tokens: int | None = None,
    ignore_eos: bool = False,
    top_k: int | None = None,
    top_p: float | None = None,
    hf_baseline: bool = False,
    cuda_graphs: bool | None = None,
    compile: bool | str | dict | None = None,
    graph_floor: bool = False,
    progress: bool | object = True,
    meta: Mapping | None = None,
) -> list[dict]:
    """Benchmark every method at every temperature on every prompt, warm; one JSON-ready row per run.

    Order: HF ``generate`` (its greedy outputs fill ``identical_to_hf``), other HF rows, methods without a
    drafter (their greedy outputs fill ``identical_to_ar``; without one the reference is decoded untimed),
    then drafters. Prompt i uses the seed ``seed + i`` for every method and temperature.

    Args:
        target: HF causal LM (or ``specdec.target.TargetModel``), already on its device.
        tokenizer: HF tokenizer of the target.
        prompts (Sequence[Mapping]): records with ``"id"`` and ``"prompt"`` (see ``specdec.loading.load_prompts``).
        methods (Sequence[Method]): configurations; names must be unique.
        max_new_tokens (int): tokens to generate per prompt.
        temperatures (Sequence[float]): 0 means greedy. Default (0.0,).
        warmup (int): untimed passes over all (temperature, prompt) pairs per method before timing it; their
            wall time is reported as ``warmup_s``. Default 1.
        out_dir (str | PathLike | None): if set, write ``results.jsonl``, ``results.md``, ``plot.png`` and
            ``meta.json`` (the report header: prompts, max_new_tokens, device, dtype, commit, date, graph floor).
        seed (int): base seed of the per-prompt generators. Default 0.
        max_prompt_tokens (int | None): keep only the last tokens of longer prompts. Default None (all).
        ignore_eos (bool): decode exactly ``max_new_tokens`` tokens. Default False.
        top_k, top_p: HF sampling filters for temperatures > 0 (HF semantics when None).
        hf_baseline (bool): add an ``hf-generate`` method if ``methods`` has none. Default False.
        cuda_graphs (bool | None), compile (bool | str | dict | None): passed to ``generate`` when not None.
            Default None.
        graph_floor (bool): time one CUDA-graph-captured 1-token target forward (``graph_floor_ms``). Default False.
        progress (bool | rich.progress.Progress): show a progress bar (or drive the one given). Default True.
        meta (Mapping | None): extra facts for the report header (e.g. ``{"dtype": "bfloat16"}``).

    Returns:
        list[dict]: one row per (method, temperature, prompt): ``method, drafter, tree`` ("hf", "ar",
        "chain", "ddtree"), ``budget, topk, temperature, prompt_id, prompt_tokens, new_tokens, decode_tokens``
        (new tokens after the first, which the prefill yields), ``tau, rounds, target_forwards,
        draft_forwards, tree_nodes, total_s, prefill_s, decode_s`` (total - prefill), ``decode_tok_s``,
        ``phase_ms, accept_hist, depth_accept``, ``capture_ms, compile_ms, path`` (from the call's stats),
        ``warmup_s, warmup_capture_ms, warmup_compile_ms`` (the method's warm-up), ``identical_to_ar`` and
        ``identical_to_hf`` (bool at temperature 0 when the reference exists, else None).
    """
    names = [m.name for m in methods]
    if len(set(names)) != len(names):
        raise ValueError(f"Method names must be unique, got {names}.")
    if not prompts or not methods:
        raise ValueError("run_bench needs at least one prompt and one method.")
    if not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup={warmup!r} must be an int >= 0 (untimed passes over all prompts).")
    tgt = TargetModel.wrap(target)
    if hf_baseline and not any(m.hf == "generate" for m in methods):
        methods = [Method(name="hf-generate", hf="generate"), *methods]
    methods = sorted(methods, key=_order)
    gen_kwargs = {"max_new_tokens": max_new_tokens, "top_k": top_k, "top_p": top_p}
    if ignore_eos:
        gen_kwargs["eos_token_id"] = []
    fast_kwargs = {k: v for k, v in (("cuda_graphs", cuda_graphs), ("compile", compile)) if v is not None}
    encoded = _encode(tokenizer, prompts, max_prompt_tokens, tgt.device)
    cases = list(itertools.product(temperatures, enumerate(encoded)))

    reference: dict[int, torch.Tensor] = {}
    drafted = any(m.hf is None and m.drafter is not None for m in methods)
    if 0 in temperatures and drafted and not any(m.hf is None and m.drafter is None for m in methods):
        for i, ids in enumerate(encoded):
            reference[i] = _run_one(tgt, ids, None, None, 0.0, seed + i, {**gen_kwargs, **fast_kwargs})[0].sequences
    hf_reference: dict[int, torch.Tensor] = {}
    rows: list[dict] = []
    bar, task = _progress(progress, len(methods) * len(cases) * (1 + warmup))
    with bar or nullcontext():
        for method in methods:
            run = _Runner(tgt, method, gen_kwargs, fast_kwargs)
            warm = _warm_up(run, cases, prompts, seed, warmup, bar, task)
            if bar is not None:
                bar.update(task, description=f"{method.name}: timed")
            for temperature, (i, ids) in cases:
                seqs, row = run(temperature, seed + i, prompts[i]["id"], ids)
                row.update(warm)
                _mark_identical(row, method, temperature, i, seqs, reference, hf_reference)
                rows.append(row)
                if bar is not None:
                    bar.advance(task)
                logger.info("%s T=%g %s: tau %s", method.name, temperature, row["prompt_id"], row["tau"])
    header = _header(tgt, encoded, max_new_tokens, warmup, graph_floor, meta)
    if out_dir is not None:
        write_report(rows, out_dir, meta=header)
    return rows


def _warm_up(run: _Runner, cases, prompts, seed: int, warmup: int, bar, task) -> dict:
    """``warmup`` untimed passes over all cases; returns the method's warm-up facts for its rows."""
    if bar is not None:
        bar.update(task, description=f"{run.method.name}: warm-up")
    start, capture_ms, compile_ms = time.perf_counter(), 0.0, 0.0
    for _ in range(warmup):
        for temperature, (i, ids) in cases:
            _, row = run(temperature, seed + i, prompts[i]["id"], ids)
            capture_ms += row["capture_ms"]
            compile_ms += row["compile_ms"]
            if bar is not None:
                bar.advance(task)
    return {"warmup_s": time.perf_counter() - start, "warmup_capture_ms": capture_ms, "warmup_compile_ms": compile_ms}


def _mark_identical(row: dict, method: Method, temperature: float, i: int, seqs, reference, hf_reference) -> None:
    if temperature != 0:
        return
    if method.hf == "generate":
        hf_reference[i] = seqs
    elif method.hf is None and method.drafter is None:
        reference.setdefault(i, seqs)
    if i in hf_reference:
        row["identical_to_hf"] = bool(torch.equal(seqs, hf_reference[i]))
    if method.hf is None and i in reference:
        row["identical_to_ar"] = bool(torch.equal(seqs, reference[i]))


def _header(tgt: TargetModel, encoded, max_new_tokens: int, warmup: int, graph_floor: bool, meta) -> dict:
    """The facts every report states: prompts, max_new_tokens, device, dtype, commit, date, warm-up, graph floor."""
    header = {
        "prompts": len(encoded),
        "max_new_tokens": max_new_tokens,
        "warmup": warmup,
        "dtype": str(tgt.dtype).removeprefix("torch."),
        **environment(tgt.device),
        **dict(meta or {}),
    }
    if graph_floor:
        context_len = max(ids.shape[1] for ids in encoded) + max_new_tokens
        header["graph_floor_ms"] = graph_floor_ms(tgt.model, context_len=context_len)
        if header["graph_floor_ms"] is not None:
            logger.info("graph floor: %.3f ms per 1-token forward (context %d)", header["graph_floor_ms"], context_len)
    return header
