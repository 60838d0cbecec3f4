"""Benchmark harness: run ``specdec.generate`` for methods x temperatures x prompts and record one row per run.

Every method decodes the same prompts with the same seeds after a warm-up; timing brackets each call with a
device synchronisation, and decode time excludes the prefill. ``main_bench`` is the plain-dict entry point
(model loading, method specs, report files); ``run_bench`` takes loaded models and ``Method`` objects.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import torch

from specdec.bench.report import write_report
from specdec.generate import generate
from specdec.loading import build_drafter, load_prompts, load_target, resolve_device, zoo_dir
from specdec.target import TargetModel
from specdec.types import Chain, DDTree, TreeSpec

__all__ = [
    "DEFAULT_METHODS",
    "BenchConfig",
    "Method",
    "load_prompts",
    "main_bench",
    "methods_from_specs",
    "run_bench",
    "zoo_dir",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class Method:
    """One decoding configuration to benchmark.

    Args:
        name (str): label used in rows, tables and plots; unique within a run.
        drafter: a drafter object, a zero-argument callable returning one (called once per run), or ``None``
            for plain autoregressive decoding through the same loop (the AR baseline). Default None.
        tree (Chain | DDTree | None): tree spec; ignored when ``drafter`` is None. Default None (drafter's own).
    """

    name: str
    drafter: object | Callable[[], object] | None = None
    tree: TreeSpec | None = None

    def make_drafter(self) -> object | None:
        """The drafter object (calling the factory if ``drafter`` is one), or None."""
        # A class or a function builds the drafter; a drafter object is used as it is.
        is_factory = isinstance(self.drafter, type) or (callable(self.drafter) and not hasattr(self.drafter, "propose"))
        return self.drafter() if is_factory else self.drafter


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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


def _run_hf(model, input_ids, temperature: float, gen_kwargs: dict):
    """HF ``generate`` with the same arguments, timed; the prompt forward is timed apart so that decode time
    excludes prefill as in ``_row``. Returns (sequences, total seconds, prefill seconds)."""
    device = input_ids.device
    kwargs = {k: v for k, v in gen_kwargs.items() if v is not None}
    sampling = {"do_sample": False} if temperature == 0 else {"do_sample": True, "temperature": temperature}
    with torch.no_grad():
        _sync(device)
        start = time.perf_counter()
        model(input_ids)
        _sync(device)
        prefill_s = time.perf_counter() - start
        start = time.perf_counter()
        seqs = model.generate(input_ids, **sampling, **kwargs)
        _sync(device)
    return seqs, time.perf_counter() - start, prefill_s


def _hf_row(temperature: float, prompt_id, input_ids, seqs, total_s: float, prefill_s: float) -> dict:
    new = int(seqs.shape[1] - input_ids.shape[1])
    decode_s = max(total_s - prefill_s, 0.0)
    return {
        "method": "hf-generate",
        "drafter": "none",
        "tree": "hf",
        "budget": 0,
        "topk": None,
        "temperature": float(temperature),
        "prompt_id": prompt_id,
        "prompt_tokens": int(input_ids.shape[1]),
        "new_tokens": new,
        "decode_tokens": max(new - 1, 0),
        "tau": 1.0 if new > 1 else 0.0,
        "rounds": max(new - 1, 0),
        "target_forwards": new,
        "draft_forwards": 0,
        "tree_nodes": max(new - 1, 0),
        "total_s": total_s,
        "prefill_s": prefill_s,
        "decode_s": decode_s,
        "decode_tok_s": max(new - 1, 0) / decode_s if decode_s > 0 else None,
        "phase_ms": {},
        "accept_hist": [0, 0] if new <= 1 else [new - 1],
        "depth_accept": [],
        "identical_to_ar": None,
        "identical_to_hf": True if temperature == 0 else None,
    }


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
        "identical_to_ar": None,
        "identical_to_hf": None,
    }


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
) -> list[dict]:
    """Benchmark every method at every temperature on every prompt; one JSON-ready row per run.

    Methods without a drafter run first, so their temperature-0 outputs are the reference for
    ``identical_to_ar`` (if none is given, the reference is decoded untimed). Prompt i uses the seed
    ``seed + i`` for every method and temperature.

    Args:
        target: HF causal LM (or ``specdec.target.TargetModel``), already on its device.
        tokenizer: HF tokenizer of the target.
        prompts (Sequence[Mapping]): records with ``"id"`` and ``"prompt"`` (see ``load_prompts``).
        methods (Sequence[Method]): configurations; names must be unique.
        max_new_tokens (int): tokens to generate per prompt.
        temperatures (Sequence[float]): 0 means greedy. Default (0.0,).
        warmup (int): untimed ``generate`` calls per method before timing it. Default 1.
        out_dir (str | PathLike | None): if set, write ``results.jsonl``, ``results.md`` and ``plot.png``.
        seed (int): base seed of the per-prompt generators. Default 0.
        max_prompt_tokens (int | None): keep only the last tokens of longer prompts. Default None (all).
        ignore_eos (bool): decode exactly ``max_new_tokens`` tokens. Default False.
        top_k, top_p: HF sampling filters for temperatures > 0 (HF semantics when None).
        hf_baseline (bool): also time the target's own HF ``generate`` (method ``hf-generate``); its greedy
            outputs fill ``identical_to_hf`` of every temperature-0 row. Default False.

    Returns:
        list[dict]: one row per (method, temperature, prompt): ``method, drafter, tree`` ("ar", "chain",
        "ddtree"), ``budget, topk, temperature, prompt_id, prompt_tokens, new_tokens, decode_tokens``
        (new tokens after the first, which the prefill yields), ``tau, rounds, target_forwards,
        draft_forwards, tree_nodes, total_s, prefill_s, decode_s`` (total - prefill), ``decode_tok_s``
        (decode_tokens / decode_s), ``phase_ms, accept_hist, depth_accept`` and ``identical_to_ar`` (bool at
        temperature 0, else None).
    """
    names = [m.name for m in methods]
    if len(set(names)) != len(names):
        raise ValueError(f"Method names must be unique, got {names}.")
    if not prompts or not methods:
        raise ValueError("run_bench needs at least one prompt and one method.")
    device = torch.device(target.device)
    gen_kwargs = {"max_new_tokens": max_new_tokens, "top_k": top_k, "top_p": top_p}
    if ignore_eos:
        gen_kwargs["eos_token_id"] = []
    encoded = []
    for p in prompts:
        ids = tokenizer(p["prompt"], return_tensors="pt").input_ids
        encoded.append(ids[:, -max_prompt_tokens:] if max_prompt_tokens else ids)
    encoded = [ids.to(device) for ids in encoded]

    methods = sorted(methods, key=lambda m: m.drafter is not None)
    reference: dict[int, torch.Tensor] = {}
    if 0 in temperatures and methods[0].drafter is not None:
        for i, ids in enumerate(encoded):
            reference[i] = _run_one(target, ids, None, None, 0.0, seed + i, gen_kwargs)[0].sequences

    rows: list[dict] = []
    jsonl = None
    if out_dir is not None:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        jsonl = (Path(out_dir) / "results.jsonl").open("w")
    hf_reference: dict[int, torch.Tensor] = {}
    try:
        if hf_baseline:
            model = target.model if isinstance(target, TargetModel) else target
            _run_hf(model, encoded[0], temperatures[0], gen_kwargs)  # warm-up
            for temperature, (i, ids) in itertools.product(temperatures, enumerate(encoded)):
                torch.manual_seed(seed + i)
                seqs, total_s, prefill_s = _run_hf(model, ids, temperature, gen_kwargs)
                if temperature == 0:
                    hf_reference[i] = seqs
                rows.append(_hf_row(temperature, prompts[i]["id"], ids, seqs, total_s, prefill_s))
                if jsonl is not None:
                    jsonl.write(json.dumps(rows[-1]) + "\n")
        for method in methods:
            drafter = method.make_drafter()
            # Resolve the tree as generate does, so rows record what actually ran.
            tree = method.tree or getattr(drafter, "default_tree", None) or Chain(k=4)
            for w in range(warmup):
                _run_one(target, encoded[w % len(encoded)], drafter, tree, temperatures[0], seed, gen_kwargs)
            for temperature, (i, ids) in itertools.product(temperatures, enumerate(encoded)):
                out, total_s = _run_one(target, ids, drafter, tree, temperature, seed + i, gen_kwargs)
                row = _row(method, drafter, tree, temperature, prompts[i]["id"], ids, out, total_s)
                if temperature == 0:
                    reference.setdefault(i, out.sequences)
                    row["identical_to_ar"] = bool(torch.equal(out.sequences, reference[i]))
                    if i in hf_reference:
                        row["identical_to_hf"] = bool(torch.equal(out.sequences, hf_reference[i]))
                rows.append(row)
                if jsonl is not None:
                    jsonl.write(json.dumps(row) + "\n")
                    jsonl.flush()
                logger.info("%s T=%g %s: tau %.2f", method.name, temperature, row["prompt_id"], row["tau"])
    finally:
        if jsonl is not None:
            jsonl.close()
    if out_dir is not None:
        write_report(rows, out_dir)
    return rows


DEFAULT_METHODS: tuple[dict, ...] = (
    {"name": "ar"},
    {"drafter": "ngram", "tree": {"kind": "chain", "k": 4}},
    {"drafter": "ngram", "tree": {"kind": "ddtree", "budget": [8, 16, 32], "topk": [2, 4]}},
)


@dataclass(frozen=True, kw_only=True)
class BenchConfig:
    """Settings of ``main_bench``; the run-level ones mirror ``run_bench``'s arguments.

    Args:
        target (str): target checkpoint folder (a name inside the zoo resolves). Default "target-dense".
        tokenizer (str | None): tokenizer path; default the target's.
        device (str): "auto" = the first CUDA device if there is one, else CPU. Default "auto".
        dtype (str): torch dtype name, or "auto" = bfloat16 on CUDA, float32 otherwise. Default "auto".
        prompts (str | None): prompt JSONL; default the zoo's ``prompts_dev.jsonl``.
        num_prompts (int | None): first prompts to use; default all.
        max_prompt_tokens (int | None): keep the last tokens of longer prompts; default all.
        methods (list[dict]): method specs (see ``methods_from_specs``). Default ``DEFAULT_METHODS``.
        max_new_tokens (int): default 128. temperatures (list[float]): default [0.0]. warmup (int): default 1.
        out_dir (str): output folder. Default "bench_out". seed (int): default 0.
        ignore_eos (bool): default False. top_k (int | None), top_p (float | None): sampling filters.
        hf_baseline (bool): also time HF ``generate`` and compare greedy outputs with it. Default False.
    """

    target: str = "target-dense"
    tokenizer: str | None = None
    device: str = "auto"
    dtype: str = "auto"
    prompts: str | None = None
    num_prompts: int | None = None
    max_prompt_tokens: int | None = None
    methods: list[dict[str, Any]] = field(default_factory=lambda: [dict(m) for m in DEFAULT_METHODS])
    max_new_tokens: int = 128
    temperatures: list[float] = field(default_factory=lambda: [0.0])
    warmup: int = 1
    out_dir: str = "bench_out"
    seed: int = 0
    ignore_eos: bool = False
    top_k: int | None = None
    top_p: float | None = None
    hf_baseline: bool = False


DrafterFactory = Callable[..., object]


def _resolve_path(path: str | os.PathLike) -> str:
    """An existing path as given, else the same name inside the zoo, else unchanged (e.g. a hub id)."""
    if Path(path).exists() or not (zoo_dir() / path).exists():
        return str(path)
    return str(zoo_dir() / path)


def _build_drafter(kind: str, target, tokenizer, **kwargs) -> object:
    if "path" in kwargs:
        kwargs["path"] = _resolve_path(kwargs["path"])
    return build_drafter(kind, target, **kwargs)


def _tree_specs(spec: Mapping | None) -> list[tuple[str, TreeSpec | None]]:
    """Expand a tree spec whose fields may be lists into (suffix, TreeSpec) pairs, in product order."""
    if spec is None:
        return [("", None)]
    spec = dict(spec)
    kind = spec.pop("kind", "ddtree" if "budget" in spec else "chain")
    fields = {k: v if isinstance(v, list | tuple) else [v] for k, v in spec.items()}
    combos = [dict(zip(fields, values, strict=True)) for values in itertools.product(*fields.values())]
    if kind == "chain":
        return [(f"chain{c.get('k', 4)}", Chain(**c)) for c in combos]
    if kind == "ddtree":
        out = []
        for c in combos:
            tree = DDTree(**c)
            out.append((f"ddtree-b{tree.budget}-k{'b' if tree.topk is None else tree.topk}", tree))
        return out
    raise ValueError(f"Unknown tree kind {kind!r}: use 'chain' (k) or 'ddtree' (budget, topk).")


def methods_from_specs(
    specs: Sequence[Mapping], *, target, tokenizer, drafter_factories: Mapping[str, DrafterFactory] | None = None
) -> list[Method]:
    """Turn plain method specs into ``Method`` objects; list-valued tree fields expand to one method each.

    A spec is ``{"name"?: str, "drafter"?: None | kind | {"kind": kind, **kwargs}, "tree"?: None |
    {"kind": "chain", "k": int | list} | {"kind": "ddtree", "budget": int | list, "topk": int | None | list}}``.
    Drafters are built once per distinct drafter spec, by ``drafter_factories[kind](target, tokenizer, **kwargs)``
    when given, else from ``specdec.drafters.DRAFTERS`` (``"model"`` loads ``path`` as a small HF LM).
    """
    factories = dict(drafter_factories or {})
    built: dict[str, object] = {}
    methods = []
    for spec in specs:
        unknown = set(spec) - {"name", "drafter", "tree"}
        if unknown:
            raise ValueError(f"Method spec {dict(spec)} has unknown keys {sorted(unknown)}; use name, drafter, tree.")
        drafter_spec = spec.get("drafter")
        if isinstance(drafter_spec, str):
            drafter_spec = {"kind": drafter_spec}
        drafter = None
        if drafter_spec is not None:
            key = json.dumps(dict(drafter_spec), sort_keys=True, default=str)
            if key not in built:
                kwargs = dict(drafter_spec)
                kind = kwargs.pop("kind")
                if kind in factories:
                    built[key] = factories[kind](target, tokenizer, **kwargs)
                else:
                    built[key] = _build_drafter(kind, target, tokenizer, **kwargs)
            drafter = built[key]
        base = spec.get("name") or (drafter_spec["kind"] if drafter_spec else "ar")
        trees = _tree_specs(spec.get("tree")) if drafter is not None else [("", None)]
        for suffix, tree in trees:
            name = base if (spec.get("name") and len(trees) == 1) or not suffix else f"{base}/{suffix}"
            methods.append(Method(name=name, drafter=drafter, tree=tree))
    return methods


def _environment(device: torch.device) -> dict:
    import platform
    import subprocess

    import transformers

    try:
        repo = Path(__file__).resolve().parent
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
    except OSError:
        sha = ""
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "commit": sha or None,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
    }


def main_bench(
    cfg: BenchConfig | Mapping, *, drafter_factories: Mapping[str, DrafterFactory] | None = None
) -> list[dict]:
    """Load the target, tokenizer, prompts and methods named in ``cfg``, run the benchmark, write the report.

    Args:
        cfg (BenchConfig | Mapping): the settings, or a plain dict of ``BenchConfig`` fields.
        drafter_factories (Mapping[str, Callable] | None): extra drafter kinds, called as
            ``factory(target, tokenizer, **kwargs)``.

    Returns:
        list[dict]: the rows; ``cfg.out_dir`` receives results.jsonl, results.md, plot.png and meta.json.
    """
    from transformers import AutoTokenizer

    if not isinstance(cfg, BenchConfig):
        unknown = set(cfg) - {f.name for f in fields(BenchConfig)}
        if unknown:
            raise ValueError(f"Unknown bench settings {sorted(unknown)}; see specdec.bench.BenchConfig.")
        cfg = BenchConfig(**cfg)
    device, dtype = resolve_device(cfg.device, cfg.dtype)
    target_path = _resolve_path(cfg.target)
    target = load_target(target_path, device=device, dtype=dtype)
    tokenizer = AutoTokenizer.from_pretrained(_resolve_path(cfg.tokenizer or target_path))
    prompts = load_prompts(cfg.prompts, limit=cfg.num_prompts)
    methods = methods_from_specs(cfg.methods, target=target, tokenizer=tokenizer, drafter_factories=drafter_factories)
    rows = run_bench(
        target,
        tokenizer,
        prompts,
        methods,
        max_new_tokens=cfg.max_new_tokens,
        temperatures=[float(t) for t in cfg.temperatures],
        warmup=cfg.warmup,
        out_dir=cfg.out_dir,
        seed=cfg.seed,
        max_prompt_tokens=cfg.max_prompt_tokens,
        ignore_eos=cfg.ignore_eos,
        top_k=cfg.top_k,
        top_p=cfg.top_p,
        hf_baseline=cfg.hf_baseline,
    )
    meta = {"config": asdict(cfg), "target": target_path, **_environment(device)}
    (Path(cfg.out_dir) / "meta.json").write_text(json.dumps(meta, indent=2, default=str) + "\n")
    return rows
