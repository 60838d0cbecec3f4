"""Benchmark harness: time ``specdec.generate`` and HF's own ``generate`` over methods x temperatures x prompts.

Measured warm: before timing a method, every prompt it will time is decoded untimed (``warmup`` full passes),
so no row pays for a first-use cost (kernel selection, allocator growth, CUDA-graph capture, compilation); the
warm-up time and the capture / compile times are reported apart. ``repeat`` timed passes follow, method by
method or, with ``interleave``, pass p of every method before pass p + 1 of any (slow drifts of the machine then
reach every row alike). Timing brackets each call with a device synchronisation; decode time excludes the
prefill. Before each timed pass the garbage collector runs untimed and its survivors are frozen (``gc.freeze``,
undone when the bench returns), so a full collection of the process's long-lived objects never lands in a call.
After the timed passes, optional checks run untimed: the eager path's tokens (``eager_compare``),
reference-style τ (``tau_reference``), flat memory over many rounds (``memory_rounds``), a ``torch.profiler``
trace per method (``profile``). Only the public ``specdec.generate`` is called.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import torch

import specdec
from specdec.bench.floor import bandwidth_floor, graph_floor_ms
from specdec.bench.hf import HF_KINDS, hf_row, run_hf
from specdec.bench.report import environment, load_rows, write_report

__all__ = ["Method", "run_bench"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class Method:
    """One decoding configuration to benchmark.

    Args:
        name (str): label used in rows, tables and plots; unique within a run.
        drafter: a drafter object, a zero-argument callable returning one (called once per run), or ``None``
            for plain autoregressive decoding through the same loop (the AR baseline). Default None.
        tree (Chain | DDTree | None): tree spec (any tree policy); ignored when ``drafter`` is None. Default None
            (drafter's own).
        verifier (VerificationRule | None): the rule passed to ``generate`` (``specdec.verify.RULES``). Default None
            (the library's default: greedy, or sample-and-match when sampling).
        hf (str | None): run HF's own ``generate`` instead of specdec: ``"generate"`` (eager), ``"static"``
            (``cache_implementation="static"``) or ``"assisted"`` (``assistant_model=`` the small model of the
            ``ModelDrafter`` given as ``drafter``). Default None (specdec).
        cuda_graphs (bool | None), compile (bool | str | dict | None): this method's ``generate`` settings, over
            the run's. Default None (the run's).
        backends (Mapping[str, str] | None): this method's ``specdec.Backends`` fields (kernel choices, e.g.
            ``{"hybrid_prefill": "scan"}``), over the run's. Default None (the run's).
        series (str | None): the plot line this method belongs to (DDTree methods of one spec share one over
            their budgets). Default None (from the drafter and topk).
        generation (Mapping | None): HF ``generate`` options for this method's calls (specdec's and HF's), e.g.
            ``{"repetition_penalty": 1.1}``. Default None.
    """

    name: str
    drafter: object | Callable[[], object] | None = None
    tree: object | None = None
    verifier: object | None = None
    hf: str | None = None
    cuda_graphs: bool | None = None
    compile: bool | str | dict | None = None
    backends: Mapping[str, str] | None = field(default=None, compare=False)
    series: str | None = None
    generation: Mapping | None = field(default=None, compare=False)

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


def _assistant_model(drafter):
    """The HF model inside a ``ModelDrafter`` (HF assisted generation takes it as ``assistant_model``)."""
    for path in (("lm", "model"), ("model",)):
        obj = drafter
        for attr in path:
            obj = getattr(obj, attr, None)
        if obj is not None and hasattr(obj, "generate"):
            return obj
    raise ValueError("hf-assisted needs a model drafter: {hf: assisted, drafter: {kind: model, ...}}.")


def _depth_accept(accept_hist: Sequence[int], rounds: int) -> list[float]:
    rounds = max(rounds, 1)
    return [sum(accept_hist[d + 1 :]) / rounds for d in range(len(accept_hist) - 1)]


def _tree_kind(tree) -> str:
    """``ddtree``, ``chain`` or the name a policy is registered under (``specdec.TREES``)."""
    if isinstance(tree, specdec.DDTree):
        return "ddtree"
    if isinstance(tree, specdec.Chain):
        return "chain"
    return next((name for name, cls in specdec.TREES.items() if type(tree) is cls), type(tree).__name__)


class _Runner:
    """Runs one method on one prompt (specdec or HF), returning (sequences, row)."""

    def __init__(self, model, method: Method, gen_kwargs: dict, fast_kwargs: dict, hybrid_mode: str) -> None:
        self.model, self.method = model, method
        self.drafter = method.make_drafter()
        # Resolve the tree as generate does, so rows record what actually ran.
        self.tree = None
        if self.drafter is not None:
            self.tree = method.tree or getattr(self.drafter, "default_tree", None) or specdec.Chain(k=4)
        self.gen_kwargs = {**gen_kwargs, **(method.generation or {})}
        self.fast_kwargs = dict(fast_kwargs)
        for key in ("cuda_graphs", "compile"):
            if getattr(method, key) is not None:
                self.fast_kwargs[key] = getattr(method, key)
        if method.backends:
            self.fast_kwargs["backends"] = {**self.fast_kwargs.get("backends", {}), **method.backends}
        if "backends" in self.fast_kwargs:  # values as Backends spells them (a config may give 0 for "0")
            self.fast_kwargs["backends"] = {k: str(v) for k, v in self.fast_kwargs["backends"].items()}
        # The public wrapper carries a hybrid mode other than the default; plain generate otherwise.
        self.spec = None if hybrid_mode == "exact" else specdec.SpeculativeModel(model, hybrid_mode=hybrid_mode)
        self.series = method.series
        if self.series is None and isinstance(self.tree, specdec.DDTree):
            self.series = f"{type(self.drafter).__name__} topk={self.tree.topk or 'budget'}"
        self.sequences: dict[tuple[float, int], torch.Tensor] = {}  # first timed pass: (temperature, prompt)

    @property
    def name(self) -> str:
        return self.method.name

    def generate(self, ids: torch.Tensor, temperature: float, seed: int, **override):
        """One timed ``specdec.generate`` call; returns (output, wall seconds)."""
        device = ids.device
        generator = torch.Generator(device=device).manual_seed(seed)
        sampling = {"do_sample": False} if temperature == 0 else {"do_sample": True, "temperature": temperature}
        kwargs = {**self.gen_kwargs, **self.fast_kwargs, **sampling, **override}
        kwargs = {k: v for k, v in kwargs.items() if v is not None or k in ("top_k", "top_p")}
        _sync(device)
        start = time.perf_counter()
        if self.spec is None:
            out = specdec.generate(self.model, ids, drafter=self.drafter, tree=self.tree,
                                   verifier=self.method.verifier, generator=generator, **kwargs)  # fmt: skip
        else:
            out = self.spec.generate(ids, drafter=self.drafter, tree=self.tree, verifier=self.method.verifier,
                                     generator=generator, return_dict_in_generate=True, **kwargs)  # fmt: skip
        _sync(device)
        return out, time.perf_counter() - start

    def __call__(self, temperature: float, seed: int, prompt_id, ids: torch.Tensor) -> tuple[torch.Tensor, dict]:
        method = self.method
        if method.hf is not None:
            torch.manual_seed(seed)
            assistant = _assistant_model(self.drafter) if method.hf == "assisted" else None
            seqs, total_s, prefill_s = run_hf(
                self.model, ids, method.hf, temperature, self.gen_kwargs, assistant=assistant
            )
            row = hf_row(method.name, method.hf, temperature, prompt_id, ids, seqs, total_s, prefill_s)
            row["series"] = method.series or method.name
            return seqs, row
        out, total_s = self.generate(ids, temperature, seed)
        return out.sequences, self._row(temperature, prompt_id, ids, out, total_s)

    def batch(self, temperature: float, seed: int, prompt_ids: Sequence, encoded: Sequence[torch.Tensor],
              padded: tuple[torch.Tensor, torch.Tensor], pad_id: int, eos: Sequence[int], batch_size: int,
              index: int) -> list[tuple[torch.Tensor, dict]]:  # fmt: skip
        """One call over a left-padded batch ``padded`` = (ids, mask) ``[n, T]`` of the prompts ``encoded``: per
        prompt its sequence ``[1, T_i + n_i]`` (its own prompt and new tokens, as a call of its own returns them) and
        its row (its own counts; the call's wall time shared evenly by its rows, see ``_share_call``)."""
        ids, mask = padded
        width, method = ids.shape[1], self.method
        if method.hf is not None:
            torch.manual_seed(seed)
            seqs, total_s, prefill_s = run_hf(
                self.model, ids, method.hf, temperature, self.gen_kwargs, attention_mask=mask, pad_token_id=pad_id
            )
            news = [_until_eos(seqs[b, width:].tolist(), eos) for b in range(len(encoded))]
            out = []
            for prompt_id, prompt, tokens in zip(prompt_ids, encoded, news, strict=True):
                seq = torch.cat([prompt, torch.tensor([tokens], dtype=torch.long, device=prompt.device)], 1)
                row = hf_row(method.name, method.hf, temperature, prompt_id, prompt, seq, total_s, prefill_s)
                row["series"] = method.series or method.name
                out.append((seq, row))
            call = {"phase_ms": {}, "rounds": max(len(t) for t in news) - 1, "tau": 1.0, "path": "hf",
                    "target_forwards": max(len(t) for t in news), "draft_forwards": 0}  # fmt: skip
        else:
            result, total_s = self.generate(ids, temperature, seed, attention_mask=mask)
            stats = result.stats
            per_row = stats.rows or [stats]
            out = []
            for b, (prompt_id, prompt) in enumerate(zip(prompt_ids, encoded, strict=True)):
                tokens = result.sequences[b : b + 1, width : width + per_row[b].new_tokens]
                seq = torch.cat([prompt, tokens], 1)
                row = self._row(temperature, prompt_id, prompt, SimpleNamespace(sequences=seq, stats=per_row[b]), 0.0)
                out.append((seq, row))
            prefill_s = stats.phase_ms.get("prefill", 0.0) / 1e3
            call = {"phase_ms": dict(stats.phase_ms), "rounds": stats.target_forwards - 1, "tau": float(stats.tau),
                    "path": stats.path, "target_forwards": stats.target_forwards,
                    "draft_forwards": stats.draft_forwards, "capture_ms": float(stats.capture_ms or 0.0),
                    "compile_ms": float(stats.compile_ms or 0.0),
                    "compile_fallbacks": int(stats.compile_fallbacks or 0),
                    "captures": int(getattr(stats, "captures", 0) or 0),
                    "budgets": {str(b): n for b, n in sorted(Counter(stats.budgets).items())},
                    "budget_costs": {str(b): ms for b, ms in sorted(getattr(stats, "budget_costs", {}).items())},
                    "budget_rounds": _budget_rounds(stats),
                    **_round_times(stats),
                    }  # fmt: skip
        _share_call([row for _, row in out], total_s, prefill_s, call, batch_size, index)
        return out

    def _row(self, temperature: float, prompt_id, ids: torch.Tensor, out, total_s: float) -> dict:
        stats = out.stats
        phase_ms = dict(stats.phase_ms)
        prefill_s = phase_ms.get("prefill", 0.0) / 1e3
        decode_s = max(total_s - prefill_s, 0.0)
        decode_tokens = max(stats.new_tokens - 1, 0)  # the first new token comes out of the prefill
        tree = self.tree
        accept_hist = [int(a) for a in stats.accept_hist]
        return {
            "method": self.name,
            "series": self.series or self.name,
            "drafter": "none" if self.drafter is None else type(self.drafter).__name__,
            "tree": "ar" if self.drafter is None else _tree_kind(tree),
            "budget": 0 if tree is None else tree.budget,
            "topk": None if tree is None else getattr(tree, "topk", None if getattr(tree, "branching", False) else 1),
            "verifier": getattr(self.method.verifier, "name", None),
            "temperature": float(temperature),
            "prompt_id": prompt_id,
            "prompt_tokens": int(ids.shape[1]),
            "new_tokens": int(stats.new_tokens),
            "decode_tokens": decode_tokens,
            "tau": float(stats.tau),
            "rounds": int(stats.rounds),
            "target_forwards": getattr(stats, "target_forwards", None),
            "draft_forwards": getattr(stats, "draft_forwards", None),
            "tree_nodes": getattr(stats, "tree_nodes", None),
            "total_s": total_s,
            "prefill_s": prefill_s,
            "decode_s": decode_s,
            "decode_tok_s": decode_tokens / decode_s if decode_s > 0 else None,
            "phase_ms": phase_ms,
            "accept_hist": accept_hist,
            "depth_accept": _depth_accept(accept_hist, stats.rounds),
            "capture_ms": float(getattr(stats, "capture_ms", 0.0) or 0.0),
            "compile_ms": float(getattr(stats, "compile_ms", 0.0) or 0.0),
            "compile_fallbacks": int(getattr(stats, "compile_fallbacks", 0) or 0),
            "captures": int(getattr(stats, "captures", 0) or 0),
            "budgets": {str(b): n for b, n in sorted(Counter(getattr(stats, "budgets", [])).items())},
            "budget_costs": {str(b): ms for b, ms in sorted(getattr(stats, "budget_costs", {}).items())},
            "budget_rounds": _budget_rounds(stats),
            **_round_times(stats),
            "path": getattr(stats, "path", None),
            "tokens": out.sequences[0, ids.shape[1] :].tolist(),
            "identical_to_ar": None,
            "identical_to_hf": None,
        }


def _budget_rounds(stats) -> list[list]:
    """``DDTree(budget="auto")``: each round's ``[budget, ms]`` in round order (ms as its controller was told it, None
    where not timed); empty for other methods."""
    budgets = getattr(stats, "budgets", None) or []
    ms = getattr(stats, "budget_ms", None) or [None] * len(budgets)
    return [[int(b), None if t is None else float(t)] for b, t in zip(budgets, ms, strict=False)]


def _round_times(stats) -> dict[str, list[float | None]]:
    """Each round's ``round_wall_ms`` (None where not timed), ``round_wait_ms`` and ``round_launch_ms``
    (``SpecStats``), in round order."""
    keys = ("round_wall_ms", "round_wait_ms", "round_launch_ms")
    return {k: [None if t is None else float(t) for t in getattr(stats, k, None) or []] for k in keys}


def _until_eos(tokens: list[int], eos: Sequence[int]) -> list[int]:
    """A row's new tokens of a batched HF call: up to its first EOS (included); the rest is padding."""
    stop = next((i for i, t in enumerate(tokens) if t in eos), None)
    return tokens if stop is None else tokens[: stop + 1]


def _share_call(rows: list[dict], total_s: float, prefill_s: float, call: dict, batch_size: int, index: int) -> None:
    """Fill the rows of one batched call: its wall time, prefill, phases, capture and compile split evenly over its
    rows (so sums over rows are the pass's), ``decode_tok_s`` the call's (all its rows' decode tokens over its
    decode time), and the call's facts: ``batch_size`` (B), ``batch_index``, ``batch_rows``, ``batch_tau`` (its τ
    over every (row, round) pair), ``call_s``, ``call_decode_s``, ``call_rounds``, ``call_target_forwards``,
    ``call_draft_forwards``, ``call_budgets`` (``DDTree(budget="auto")``: rounds per budget, 0 = plain),
    ``call_budget_rounds`` (its rounds' ``[budget, ms]`` in order), ``call_round_wall_ms``, ``call_round_wait_ms``
    and ``call_round_launch_ms`` (its rounds' wall times, read waits and launches' host times, ``SpecStats``), and
    ``captures`` (the call's new graph keys, ``SpecStats.captures``) on its first row, 0 on the others."""
    n = len(rows)
    decode_s = max(total_s - prefill_s, 0.0)
    decode_tokens = sum(r["decode_tokens"] for r in rows)
    for r in rows:
        r.update(
            total_s=total_s / n,
            prefill_s=prefill_s / n,
            decode_s=decode_s / n,
            decode_tok_s=decode_tokens / decode_s if decode_s > 0 else None,
            phase_ms={k: v / n for k, v in call["phase_ms"].items()},
            capture_ms=call.get("capture_ms", 0.0) / n,
            compile_ms=call.get("compile_ms", 0.0) / n,
            compile_fallbacks=call.get("compile_fallbacks", 0),
            captures=0,
            path=call["path"],
            call_budgets=call.get("budgets", {}),
            call_budget_costs=call.get("budget_costs", {}),
            call_budget_rounds=call.get("budget_rounds", []),
            call_round_wall_ms=call.get("round_wall_ms", []),
            call_round_wait_ms=call.get("round_wait_ms", []),
            call_round_launch_ms=call.get("round_launch_ms", []),
            batch_size=batch_size,
            batch_index=index,
            batch_rows=n,
            batch_tau=call["tau"],
            call_s=total_s,
            call_decode_s=decode_s,
            call_rounds=call["rounds"],
            call_target_forwards=call["target_forwards"],
            call_draft_forwards=call["draft_forwards"],
        )
    if rows:  # the call's new graph keys, on its first row (a sum over rows is the pass's)
        rows[0]["captures"] = call.get("captures", 0)


def _pad_id(tokenizer, model) -> int:
    """The id that left-pads a batch: the tokenizer's pad token, else its EOS (as HF does), else the model's."""
    for source in (tokenizer, getattr(model, "generation_config", None), getattr(model, "config", None)):
        for name in ("pad_token_id", "eos_token_id"):
            value = getattr(source, name, None)
            value = (value[0] if value else None) if isinstance(value, list | tuple) else value
            if isinstance(value, int) and not isinstance(value, bool):
                return value
    return 0


def _eos_ids(model, gen_kwargs: Mapping) -> list[int]:
    """The stop tokens of the HF rows (the target's generation config, or ``eos_token_id`` of the run)."""
    eos = gen_kwargs.get("eos_token_id", getattr(getattr(model, "generation_config", None), "eos_token_id", None))
    return [] if eos is None else [int(e) for e in (eos if isinstance(eos, list | tuple) else [eos])]


def _left_pad(encoded: Sequence[torch.Tensor], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The prompts ``[1, T_i]`` as one left-padded batch: (ids, attention mask) ``[n, max T_i]``."""
    width = max(ids.shape[1] for ids in encoded)
    ids = torch.full((len(encoded), width), pad_id, dtype=torch.long, device=encoded[0].device)
    mask = torch.zeros_like(ids)
    for b, prompt in enumerate(encoded):
        ids[b, width - prompt.shape[1] :] = prompt[0]
        mask[b, width - prompt.shape[1] :] = 1
    return ids, mask


def _mark_batch_one(rows: list[dict]) -> None:
    """``identical_to_b1`` of the greedy rows of batch sizes > 1: their tokens equal the same method's batch-1
    tokens for that prompt (first timed pass); left unset without batch-1 rows."""
    one = {(r["method"], str(r["prompt_id"])): r["tokens"] for r in rows
           if r.get("batch_size", 1) == 1 and r["temperature"] == 0 and r.get("pass", 0) == 0}  # fmt: skip
    for r in rows:
        if r.get("batch_size", 1) != 1 and r["temperature"] == 0:
            ref = one.get((r["method"], str(r["prompt_id"])))
            r["identical_to_b1"] = None if ref is None else r["tokens"] == ref


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
    """Each prompt's ``[1, T]`` ids: its ``input_ids`` when the record has them, else the tokenized ``prompt``."""
    encoded = []
    for p in prompts:
        if p.get("input_ids") is not None:
            ids = torch.tensor([list(p["input_ids"])], dtype=torch.long)
        elif tokenizer is None:
            raise ValueError(f"prompt {p.get('id')!r} has no input_ids and no tokenizer was given.")
        else:
            ids = tokenizer(p["prompt"], return_tensors="pt").input_ids
        encoded.append((ids[:, -max_prompt_tokens:] if max_prompt_tokens else ids).to(device))
    return encoded


def _device_dtype(model) -> tuple[torch.device, torch.dtype]:
    param = next(model.parameters())
    return param.device, param.dtype


def _settle_gc() -> None:
    """Collect garbage now, untimed, and move every object that survives out of the collector's generations
    (``gc.freeze``): a full collection scans only what a timed call allocates afterwards, not the ~400 k objects
    of torch, transformers and the loaded models (240 ms on the 2-core development machine; a stall of that size,
    ~190 ms, once landed in one timed batch of 8 calls on an H100), as serving engines do after start-up."""
    gc.collect()
    gc.freeze()


@contextlib.contextmanager
def _frozen_gc():
    """Give the frozen objects back to the collector when the bench ends (the caller's process goes on as before)."""
    try:
        yield
    finally:
        gc.unfreeze()


def run_bench(
    target,
    tokenizer,
    prompts: Sequence[Mapping],
    methods: Sequence[Method],
    *,
    max_new_tokens: int,
    temperatures: Sequence[float] = (0.0,),
    batch_sizes: Sequence[int] = (1,),
    warmup: int = 1,
    repeat: int = 1,
    interleave: bool = False,
    out_dir: str | os.PathLike | None = None,
    seed: int = 0,
    max_prompt_tokens: int | None = None,
    ignore_eos: bool = False,
    top_k: int | None = None,
    top_p: float | None = None,
    hf_baseline: bool = False,
    hybrid_mode: str = "exact",
    cuda_graphs: bool | None = None,
    compile: bool | str | dict | None = None,
    backends: Mapping[str, str] | None = None,
    graph_floor: bool = False,
    eager_compare: bool | Sequence[str] = False,
    tau_reference: bool = False,
    memory_rounds: int = 0,
    profile: bool = False,
    compare_to: str | os.PathLike | None = None,
    compare_against: str | None = None,
    progress: bool | object = True,
    meta: Mapping | None = None,
) -> list[dict]:
    """Benchmark every method at every temperature on every prompt, warm; one JSON-ready row per timed call.

    Order: HF ``generate`` (its greedy outputs fill ``identical_to_hf``), other HF rows, methods without a
    drafter (their greedy outputs fill ``identical_to_ar``; without one the reference is decoded untimed),
    then drafters. Prompt i uses the seed ``seed + i`` for every method, temperature and pass.

    Args:
        target: HF causal LM, already on its device.
        tokenizer: HF tokenizer of the target (None when every prompt record carries ``input_ids``).
        prompts (Sequence[Mapping]): records with ``"id"`` and ``"prompt"`` or ``"input_ids"``.
        methods (Sequence[Method]): configurations; names must be unique.
        max_new_tokens (int): tokens to generate per prompt.
        temperatures (Sequence[float]): 0 means greedy. Default (0.0,).
        batch_sizes (Sequence[int]): each method is timed (and warmed) at each batch size B: the prompts in order,
            B per call, left-padded (the last call may hold fewer). Batch-1 calls are single-prompt calls without a
            mask, as before. ``hf: assisted`` runs at B = 1 only (HF refuses batches there; skipped with a log
            line). The greedy rows of B > 1 record ``identical_to_b1``. Default (1,).
        warmup (int): untimed passes over all (temperature, prompt) pairs per method before timing it; their
            wall time is reported as ``warmup_s``. Default 1.
        repeat (int): timed passes per method; tok/s pools them, the report lists each. Default 1.
        interleave (bool): run pass p (warm-up, then timed) of every method before pass p + 1 of any. Default False.
        out_dir (str | PathLike | None): if set, write ``results.jsonl``, ``results.md``, ``plot.png`` and
            ``meta.json`` (the report header: target, prompts, max_new_tokens, device, dtype, commit, date, ...).
        seed (int): base seed of the per-prompt generators. Default 0.
        max_prompt_tokens (int | None): keep only the last tokens of longer prompts. Default None (all).
        ignore_eos (bool): decode exactly ``max_new_tokens`` tokens. Default False.
        top_k, top_p: HF sampling filters for temperatures > 0 (HF semantics when None).
        hf_baseline (bool): add an ``hf-generate`` method if ``methods`` has none. Default False.
        hybrid_mode (str): hybrid targets, ``specdec.SpeculativeModel``: ``exact`` (the round refuses
            ``snapshot``). Default exact.
        cuda_graphs (bool | None), compile (bool | str | dict | None): passed to ``generate`` when not None (a
            method's own setting wins). Default None.
        backends (Mapping[str, str] | None): ``specdec.Backends`` fields passed to ``generate`` (a method's own
            fields win). Default None (the process setting).
        graph_floor (bool): time one CUDA-graph-captured 1-token target forward (``graph_floor_ms``) and the
            weights' bandwidth floor. Default False.
        eager_compare (bool | Sequence[str]): decode the greedy cases again with ``cuda_graphs=False`` (all
            specdec methods, or the named ones) and record ``identical_to_eager``. Default False.
        tau_reference (bool): also decode each drafted case ``budget + 1`` tokens longer and record
            ``tau_reference``: the mean accepted length of the rounds up to the one that reaches
            ``max_new_tokens``, counted whole (as reference loops count). Default False.
        memory_rounds (int): on CUDA, decode the first prompt with the first DDTree (else drafted) method until
            this many more rounds ran, and report allocated memory before and after. Default 0 (no check).
        profile (bool): profile one call per method and temperature under ``torch.profiler``; writes
            ``profile.md`` and ``profile/<method>.trace.json`` into ``out_dir``. Default False.
        compare_to (str | PathLike | None): an earlier run folder; rows record ``identical_to_run`` and
            ``first_difference`` against its tokens (the same method's, or ``compare_against``'s). Default None.
        compare_against (str | None): the method of ``compare_to`` to compare every row with. Default None.
        progress (bool | rich.progress.Progress): show a progress bar (or drive the one given). Default True.
        meta (Mapping | None): extra facts for the report header (e.g. ``{"target": "..."}``).

    Returns:
        list[dict]: one row per (method, temperature, prompt, timed pass): ``method, series, drafter, tree``
        ("hf", "ar", "chain", "ddtree"), ``budget, topk, temperature, prompt_id, prompt_tokens, new_tokens,
        decode_tokens`` (new tokens after the first, which the prefill yields), ``tau, rounds, total_s,
        prefill_s, decode_s`` (total - prefill), ``decode_tok_s, phase_ms, accept_hist, depth_accept``,
        ``capture_ms, compile_ms, path`` (from the call's stats), ``tokens`` (the new token ids), ``pass``,
        ``warmup_s, warmup_capture_ms, warmup_compile_ms`` (the method's warm-up), ``identical_to_ar`` and
        ``identical_to_hf`` (bool at temperature 0 when the reference exists, else None), and with the checks
        ``identical_to_eager``, ``tau_reference``, ``identical_to_run`` and ``first_difference``.
    """
    names = [m.name for m in methods]
    if len(set(names)) != len(names):
        raise ValueError(f"Method names must be unique, got {names}.")
    if not prompts or not methods:
        raise ValueError("run_bench needs at least one prompt and one method.")
    for name, value, low in (("warmup", warmup, 0), ("repeat", repeat, 1), ("memory_rounds", memory_rounds, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name}={value!r} must be an int >= {low}.")
    if profile and out_dir is None:
        raise ValueError("profile=True writes its traces into out_dir: give out_dir.")
    from specdec.bench.config import check_batch_sizes

    check_batch_sizes(batch_sizes)
    if 1 not in batch_sizes and (eager_compare or tau_reference):
        raise ValueError("eager_compare and tau_reference check batch-1 decoding: add 1 to batch_sizes.")
    other_run = _load_other_run(compare_to, compare_against) if compare_to is not None else None
    model = getattr(target, "model", target) if not hasattr(target, "generate") else target
    device, dtype = _device_dtype(model)
    if hf_baseline and not any(m.hf == "generate" for m in methods):
        methods = [Method(name="hf-generate", hf="generate"), *methods]
    methods = sorted(methods, key=_order)
    gen_kwargs = {"max_new_tokens": max_new_tokens, "top_k": top_k, "top_p": top_p}
    if ignore_eos:
        gen_kwargs["eos_token_id"] = []
    fast_kwargs = {k: v for k, v in (("cuda_graphs", cuda_graphs), ("compile", compile)) if v is not None}
    if backends:
        fast_kwargs["backends"] = dict(backends)
    encoded = _encode(tokenizer, prompts, max_prompt_tokens, device)
    cases = list(itertools.product(temperatures, enumerate(encoded)))
    runners = [_Runner(model, m, gen_kwargs, fast_kwargs, hybrid_mode) for m in methods]
    eager_names = _eager_names(eager_compare, runners)
    pad_id, eos = _pad_id(tokenizer, model), _eos_ids(model, gen_kwargs)
    batched = {  # batch size -> its calls (temperature, (call index, prompt indices, left-padded batch))
        b: list(itertools.product(temperatures, [
            (k, list(range(s, min(s + b, len(encoded)))), _left_pad(encoded[s : s + b], pad_id))
            for k, s in enumerate(range(0, len(encoded), b))]))
        for b in batch_sizes if b > 1
    }  # fmt: skip
    units = []  # (runner, batch size), method by method
    for run in runners:
        for b in batch_sizes:
            if run.method.hf == "assisted" and b > 1:
                logger.warning("skipping %s at batch size %d: HF assisted generation takes one sequence", run.name, b)
            else:
                units.append((run, b))

    reference: dict[tuple[int, str], torch.Tensor] = {}  # (prompt, HF options) -> AR's greedy tokens
    drafted = any(r.method.hf is None and r.drafter is not None for r in runners)
    if 0 in temperatures and drafted and not any(r.method.hf is None and r.drafter is None for r in runners):
        plain = _Runner(model, Method(name="reference"), gen_kwargs, fast_kwargs, hybrid_mode)
        for i, ids in enumerate(encoded):
            reference[i, ""] = plain.generate(ids, 0.0, seed + i)[0].sequences
    hf_reference: dict[tuple[int, str], torch.Tensor] = {}
    rows: list[dict] = []
    greedy = [(t, c) for t, c in cases if t == 0]
    extra = len(greedy) * len(eager_names) + (len(cases) * sum(r.drafter is not None for r in runners) * tau_reference)
    calls = sum(len(cases) if b == 1 else len(batched[b]) for _, b in units)
    bar, task = _progress(progress, calls * (warmup + repeat) + extra)
    warm: dict[tuple[str, int], dict] = {(r.name, b): {"warmup_s": 0.0, "warmup_capture_ms": 0.0,
                                                       "warmup_compile_ms": 0.0} for r, b in units}  # fmt: skip

    def batch_calls(run: _Runner, b: int):
        """(temperature, [(prompt index, sequence, row)]) of every call of one pass at batch size b."""
        if b == 1:
            for temperature, (i, ids) in cases:
                seqs, row = run(temperature, seed + i, prompts[i]["id"], ids)
                row["batch_size"] = 1
                yield temperature, [(i, seqs, row)]
            return
        for temperature, (k, indices, padded) in batched[b]:
            results = run.batch(temperature, seed + indices[0], [prompts[i]["id"] for i in indices],
                                [encoded[i] for i in indices], padded, pad_id, eos, b, k)  # fmt: skip
            yield temperature, [(i, seqs, row) for i, (seqs, row) in zip(indices, results, strict=True)]

    def label(run: _Runner, b: int) -> str:
        return run.name if len(batch_sizes) == 1 and b == 1 else f"{run.name} B={b}"

    def warm_pass(run: _Runner, b: int) -> None:
        _describe(bar, task, f"{label(run, b)}: warm-up")
        start, facts = time.perf_counter(), warm[(run.name, b)]
        for _, done in batch_calls(run, b):
            for _, _, row in done:
                facts["warmup_capture_ms"] += row["capture_ms"]
                facts["warmup_compile_ms"] += row["compile_ms"]
            _advance(bar, task)
        facts["warmup_s"] += time.perf_counter() - start

    def timed_pass(run: _Runner, b: int, number: int) -> None:
        _describe(bar, task, f"{label(run, b)}: timed" + (f" pass {number + 1}/{repeat}" if repeat > 1 else ""))
        _settle_gc()
        for temperature, done in batch_calls(run, b):
            for i, seqs, row in done:
                row["pass"] = number
                if number == 0 and b == 1:
                    run.sequences[(temperature, i)] = seqs
                _mark_identical(row, run.method, temperature, i, seqs, reference, hf_reference)
                rows.append(row)
                logger.info("%s T=%g %s: tau %s", label(run, b), temperature, row["prompt_id"], row["tau"])
            _advance(bar, task)

    with bar or nullcontext(), _frozen_gc():
        if interleave:
            for _ in range(warmup):
                for run, b in units:
                    warm_pass(run, b)
            for number in range(repeat):
                for run, b in units:
                    timed_pass(run, b, number)
        else:
            for run, b in units:
                for _ in range(warmup):
                    warm_pass(run, b)
                for number in range(repeat):
                    timed_pass(run, b, number)
        for row in rows:
            row.update(warm[(row["method"], row.get("batch_size", 1))])
        if len(batch_sizes) > 1:
            _mark_batch_one(rows)
        for run in runners:
            if run.name in eager_names:
                _describe(bar, task, f"{run.name}: eager path")
                _compare_eager(run, rows, greedy, prompts, seed, bar, task)
            if tau_reference and run.drafter is not None:
                _describe(bar, task, f"{run.name}: whole-round τ")
                _tau_reference(run, rows, cases, prompts, seed, max_new_tokens, bar, task)
    header = _header(model, device, dtype, encoded, max_new_tokens, warmup, graph_floor, meta)
    header.update(repeat=repeat, interleave=interleave, eager_compare=sorted(eager_names) or None)
    if list(batch_sizes) != [1]:
        header["batch_sizes"] = list(batch_sizes)
    if memory_rounds:
        header["memory"] = _memory_check(runners, encoded[0], seed, memory_rounds)
    if profile:
        from specdec.bench.profiling import profile_methods

        header["profile"] = profile_methods(runners, cases, Path(out_dir), seed)
    if other_run is not None:
        _compare_other_run(rows, other_run, compare_against)
        header.update(compare_to=str(compare_to), compare_against=compare_against)
    if out_dir is not None:
        write_report(rows, out_dir, meta=header)
    return rows


def _describe(bar, task, text: str) -> None:
    if bar is not None:
        bar.update(task, description=text)


def _advance(bar, task) -> None:
    if bar is not None:
        bar.advance(task)


def _eager_names(eager_compare: bool | Sequence[str], runners: Sequence[_Runner]) -> set[str]:
    """The specdec methods whose greedy tokens are checked against the eager path."""
    specdec_names = [r.name for r in runners if r.method.hf is None]
    if eager_compare is True:
        return set(specdec_names)
    if not eager_compare:
        return set()
    unknown = sorted(set(eager_compare) - set(specdec_names))
    if unknown:
        raise ValueError(f"eager_compare names {unknown}, not specdec methods of this run ({specdec_names}).")
    return set(eager_compare)


def _generation_key(method: Method) -> str:
    """Methods with the same HF options (``Method.generation``) share their references (AR, HF generate): a
    processor given as an object counts by its class and settings."""
    if not method.generation:
        return ""

    def norm(value):
        if isinstance(value, list | tuple):
            return [norm(v) for v in value]
        if hasattr(value, "__dict__") and not isinstance(value, type):
            return [type(value).__name__, sorted((k, repr(v)) for k, v in vars(value).items())]
        return value

    return repr(sorted((k, norm(v)) for k, v in method.generation.items()))


def _mark_identical(row: dict, method: Method, temperature: float, i: int, seqs, reference, hf_reference) -> None:
    """``identical_to_hf`` / ``identical_to_ar``: the row's greedy tokens against HF generate's / AR's for the same
    prompt and the same HF options."""
    if temperature != 0:
        return
    key = (i, _generation_key(method))
    if method.hf == "generate":
        hf_reference.setdefault(key, seqs)
    elif method.hf is None and method.drafter is None:
        reference.setdefault(key, seqs)
    if key in hf_reference:
        row["identical_to_hf"] = bool(torch.equal(seqs, hf_reference[key]))
    if method.hf is None and key in reference:
        row["identical_to_ar"] = bool(torch.equal(seqs, reference[key]))


def _compare_eager(run: _Runner, rows: list[dict], greedy, prompts, seed: int, bar, task) -> None:
    """Decode the method's greedy cases on the eager path; mark its rows equal or not to the timed tokens."""
    for temperature, (i, ids) in greedy:
        out, _ = run.generate(ids, temperature, seed + i, cuda_graphs=False, compile=False)
        same = bool(torch.equal(out.sequences, run.sequences[(temperature, i)]))
        for row in rows:
            if (row["method"], row["temperature"], row["prompt_id"], row.get("batch_size", 1)) == (
                run.name, temperature, prompts[i]["id"], 1
            ):  # fmt: skip
                row["identical_to_eager"] = same
        _advance(bar, task)


def _tau_reference(run: _Runner, rows: list[dict], cases, prompts, seed: int, max_new_tokens: int, bar, task) -> None:
    """Reference-style τ: decode ``budget + 1`` tokens more and count whole the rounds up to the one that reaches
    ``max_new_tokens`` (reference loops draft their full block in the last round and count all it accepts)."""
    for temperature, (i, ids) in cases:
        out, _ = run.generate(ids, temperature, seed + i, max_new_tokens=max_new_tokens + run.tree.budget + 1)
        lengths = getattr(out.stats, "accept_lengths", None)
        value = None
        if lengths:
            done, counted = 1, []  # the prefill commits the first token
            for length in lengths:
                if done >= max_new_tokens:
                    break
                counted.append(int(length))
                done += int(length)
            value = sum(counted) / len(counted) if counted else None
        for row in rows:
            if (row["method"], row["temperature"], row["prompt_id"], row.get("batch_size", 1)) == (
                run.name, temperature, prompts[i]["id"], 1
            ):  # fmt: skip
                row["tau_reference"] = value
        _advance(bar, task)


def _memory_check(runners: Sequence[_Runner], ids: torch.Tensor, seed: int, rounds: int) -> dict | None:
    """Allocated memory before and after ``rounds`` more rounds of one drafted method (CUDA only)."""
    if ids.device.type != "cuda":
        logger.info("memory check skipped: it reads the CUDA allocator")
        return None
    drafted = [r for r in runners if r.method.hf is None and r.drafter is not None]
    candidates = [r for r in drafted if isinstance(r.tree, specdec.DDTree)] or drafted
    if not candidates:
        return None
    run = candidates[0]
    torch.cuda.synchronize(ids.device)
    before, done = torch.cuda.memory_allocated(ids.device), 0
    while done < rounds:
        out, _ = run.generate(ids, 0.0, seed)
        done += max(int(out.stats.rounds), 1)
    torch.cuda.synchronize(ids.device)
    after = torch.cuda.memory_allocated(ids.device)
    logger.info(
        "memory: %.1f MiB before, %.1f MiB after %d rounds of %s", before / 2**20, after / 2**20, done, run.name
    )
    return {"method": run.name, "rounds": done, "before_mib": before / 2**20, "after_mib": after / 2**20}


def _load_other_run(compare_to, compare_against: str | None) -> dict:
    """(method, temperature, prompt id) -> tokens of the first timed pass of an earlier run."""
    path = Path(compare_to)
    if not (path / "results.jsonl").is_file() and not path.is_file():
        raise FileNotFoundError(f"compare_to={compare_to}: no results.jsonl there (give an earlier run's folder).")
    tokens = {}
    for r in load_rows(path):
        if r.get("tokens") is not None and r.get("pass", 0) == 0:
            tokens[(r["method"], r["temperature"], str(r["prompt_id"]), r.get("batch_size", 1))] = r["tokens"]
    methods = sorted({key[0] for key in tokens})
    if not tokens:
        raise ValueError(f"compare_to={compare_to}: its rows hold no tokens; run that bench again.")
    if compare_against is not None and compare_against not in methods:
        raise ValueError(f"compare_against={compare_against!r}: {compare_to} has no such method; it has {methods}.")
    return tokens


def _compare_other_run(rows: list[dict], other: dict, against: str | None) -> None:
    for row in rows:
        key = (against or row["method"], row["temperature"], str(row["prompt_id"]))
        theirs = other.get((*key, row.get("batch_size", 1)), other.get((*key, 1)))
        if theirs is None:
            continue
        mine = row["tokens"]
        row["identical_to_run"] = mine == theirs
        row["first_difference"] = next(
            (i for i, (a, b) in enumerate(zip(mine, theirs, strict=False)) if a != b),
            None if mine == theirs else min(len(mine), len(theirs)),
        )


def _header(model, device, dtype, encoded, max_new_tokens: int, warmup: int, graph_floor: bool, meta) -> dict:
    """The facts every report states: target, prompts, max_new_tokens, device, dtype, commit, date, warm-up,
    graph floor."""
    config = getattr(model, "config", None)
    header = {
        "target_name": Path(getattr(config, "_name_or_path", "") or type(model).__name__).name,
        "prompts": len(encoded),
        "max_new_tokens": max_new_tokens,
        "warmup": warmup,
        "dtype": str(dtype).removeprefix("torch."),
        **environment(device),
        **dict(meta or {}),
    }
    if graph_floor:
        context_len = max(ids.shape[1] for ids in encoded) + max_new_tokens
        header["graph_floor_ms"] = graph_floor_ms(model, context_len=context_len)
        if header["graph_floor_ms"] is not None:
            logger.info("graph floor: %.3f ms per 1-token forward (context %d)", header["graph_floor_ms"], context_len)
            header.update(bandwidth_floor(model))
    return header
