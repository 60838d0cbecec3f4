"""Bench settings and method specs: ``BenchConfig`` (the defaults of ``specdec/conf/bench.yaml``), plain-dict
method specs turned into ``Method`` objects, and ``main_bench``, which loads everything and runs the bench.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from specdec.bench.harness import Method, run_bench
from specdec.loading import build_drafter, load_prompts, load_target, resolve_device, zoo_dir
from specdec.runtime import check_compile
from specdec.target import TargetModel
from specdec.trees import Chain, DDTree
from specdec.trees import TreePolicy as TreeSpec

__all__ = ["DEFAULT_METHODS", "BenchConfig", "main_bench", "methods_from_specs"]

logger = logging.getLogger(__name__)

DEFAULT_METHODS: tuple[dict, ...] = (
    {"name": "hf-generate", "hf": "generate"},
    {"name": "hf-static", "hf": "static"},
    {"name": "hf-assisted", "hf": "assisted", "drafter": {"kind": "model", "truncate_layers": 2}},
    {"name": "ar"},
    {"name": "dflash-chain", "drafter": {"kind": "dflash"}, "tree": {"kind": "chain", "k": 15}},
    {"name": "ddtree", "drafter": {"kind": "dflash"}, "tree": {"kind": "ddtree", "budget": [15, 32], "topk": [8]}},
)


@dataclass(frozen=True, kw_only=True)
class BenchConfig:
    """Settings of ``main_bench``; ``python -m specdec bench`` fills them from ``bench.yaml`` and its groups.

    Args:
        target (str): target checkpoint folder (a name inside the zoo resolves). Default `target-dense`.
        tokenizer (str | None): tokenizer path; null = the target's. Default `null`.
        attn_implementation (str): attention of the loaded target (``sdpa`` or ``eager``). Default `sdpa`.
        dflash (str | None): DFlash checkpoint of the method specs ``{kind: dflash}`` that give no ``path``.
            Default `null`.
        prompts (str | None): prompt JSONL; null = the zoo's ``prompts_dev.jsonl``. Default `null`.
        prompt_text (str | None): one literal prompt instead of a file. Default `null`.
        num_prompts (int | None): the first N prompts (>= 1; null = all). Default `20`.
        max_prompt_tokens (int | None): keep the last N tokens of longer prompts; null = all. Default `null`.
        max_new_tokens (int): tokens generated per prompt. Default `128`.
        temperatures (list[float]): 0 = greedy. Default `[0.0]`.
        warmup (int): untimed passes over all prompts per method before timing (0 = cold). Default `1`.
        device (str): "auto" = the current accelerator if there is one, else CPU. Default `auto`.
        dtype (str): torch dtype name, or "auto" = bfloat16 on an accelerator, float32 on CPU. Default `auto`.
        hybrid_mode (str): ``exact`` or ``snapshot`` state handling of hybrid targets. Default `exact`.
        cuda_graphs (bool | None): passed to ``generate`` when set. Default `null`.
        compile (bool | str | dict | None): passed to ``generate`` when set (``true``, a mode name or a dict of
            inductor options). Default `null`.
        graph_floor (bool): time one CUDA-graph-captured 1-token target forward (CUDA only). Default `true`.
        out_dir (str): output folder. Default `bench_out`.
        seed (int): base seed of the per-prompt generators. Default `0`.
        ignore_eos (bool): decode exactly ``max_new_tokens`` tokens. Default `false`.
        top_k (int | None): sampling filter for temperatures > 0. Default `null`.
        top_p (float | None): sampling filter for temperatures > 0. Default `null`.
        hf_baseline (bool): add an ``hf-generate`` row when ``methods`` has none. Default `false`.
        progress (bool): show a progress bar with ETA. Default `true`.
        methods (list[dict]): method specs (see ``methods_from_specs``). Default ``DEFAULT_METHODS``.
    """

    target: str = "target-dense"
    tokenizer: str | None = None
    attn_implementation: str = "sdpa"
    dflash: str | None = None
    prompts: str | None = None
    prompt_text: str | None = None
    num_prompts: int | None = 20
    max_prompt_tokens: int | None = None
    max_new_tokens: int = 128
    temperatures: list[float] = field(default_factory=lambda: [0.0])
    warmup: int = 1
    device: str = "auto"
    dtype: str = "auto"
    hybrid_mode: str = "exact"
    cuda_graphs: bool | None = None
    compile: bool | str | dict | None = None
    graph_floor: bool = True
    out_dir: str = "bench_out"
    seed: int = 0
    ignore_eos: bool = False
    top_k: int | None = None
    top_p: float | None = None
    hf_baseline: bool = False
    progress: bool = True
    methods: list[dict[str, Any]] = field(default_factory=lambda: [dict(m) for m in DEFAULT_METHODS])

    def __post_init__(self) -> None:
        for name in ("num_prompts", "max_prompt_tokens"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name}={value!r}: give an int >= 1, or None for all.")
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={self.max_new_tokens!r} must be an int >= 1.")
        if not isinstance(self.warmup, int) or self.warmup < 0:
            raise ValueError(f"warmup={self.warmup!r} must be an int >= 0 (untimed passes over all prompts).")
        if not self.temperatures:
            raise ValueError("temperatures is empty: give at least one, e.g. [0.0].")
        check_compile(self.compile)


DrafterFactory = Callable[..., object]


def _resolve_path(path: str | os.PathLike) -> str:
    """An existing path as given, else the same name inside the zoo, else unchanged (e.g. a hub id)."""
    if Path(path).exists() or not (zoo_dir() / path).exists():
        return str(path)
    return str(zoo_dir() / path)


def _tree_specs(spec: Mapping | None) -> list[tuple[str, TreeSpec | None]]:
    """Expand a tree spec whose fields may be lists into (suffix, TreeSpec) pairs, in product order."""
    if spec is None:
        return [("", None)]
    spec = dict(spec)
    kind = spec.pop("kind", "ddtree" if "budget" in spec else "chain")
    values = {k: v if isinstance(v, list | tuple) else [v] for k, v in spec.items()}
    combos = [dict(zip(values, combo, strict=True)) for combo in itertools.product(*values.values())]
    if kind == "chain":
        return [(f"chain{c.get('k', 4)}", Chain(**c)) for c in combos]
    if kind == "ddtree":
        out = []
        for c in combos:
            tree = DDTree(**c)
            out.append((f"ddtree-b{tree.budget}-k{'b' if tree.topk is None else tree.topk}", tree))
        return out
    raise ValueError(f"Unknown tree kind {kind!r}: use 'chain' (k) or 'ddtree' (budget, topk).")


def _attention_only(target) -> bool:
    from specdec.state.kv import KVState

    return target is None or isinstance(TargetModel.wrap(target).state, KVState)


def methods_from_specs(
    specs: Sequence[Mapping],
    *,
    target,
    tokenizer,
    drafter_factories: Mapping[str, DrafterFactory] | None = None,
    dflash: str | None = None,
) -> list[Method]:
    """Turn plain method specs into ``Method`` objects; list-valued tree fields expand to one method each.

    A spec is ``{"name"?: str, "hf"?: "generate" | "static" | "assisted", "drafter"?: None | kind |
    {"kind": kind, **kwargs}, "tree"?: None | {"kind": "chain", "k": int | list} | {"kind": "ddtree",
    "budget": int | list, "topk": int | None | list}}``. Drafters are built once per distinct drafter spec, by
    ``drafter_factories[kind](target, tokenizer, **kwargs)`` when given, else by ``specdec.loading.build_drafter``
    (``{kind: dflash}`` without ``path`` loads ``dflash``). ``hf: assisted`` takes the small model of a
    ``model`` drafter; it is skipped, with a warning, on targets with recurrent layers (HF's assisted
    generation needs an attention-only target).
    """
    factories = dict(drafter_factories or {})
    built: dict[str, object] = {}
    methods = []
    for spec in specs:
        unknown = set(spec) - {"name", "drafter", "tree", "hf"}
        if unknown:
            raise ValueError(
                f"Method spec {dict(spec)} has unknown keys {sorted(unknown)}; use name, hf, drafter, tree."
            )
        if spec.get("hf") == "assisted" and not _attention_only(target):
            logger.warning("skipping %s: HF assisted generation needs an attention-only target", spec.get("name"))
            continue
        drafter_spec = spec.get("drafter")
        if isinstance(drafter_spec, str):
            drafter_spec = {"kind": drafter_spec}
        drafter = None
        if drafter_spec is not None and drafter_spec.get("kind") != "none":
            key = json.dumps(dict(drafter_spec), sort_keys=True, default=str)
            if key not in built:
                built[key] = _build(dict(drafter_spec), target, tokenizer, factories, dflash)
            drafter = built[key]
        if spec.get("hf"):
            methods.append(Method(name=spec.get("name") or f"hf-{spec['hf']}", hf=spec["hf"], drafter=drafter))
            continue
        base = spec.get("name") or (drafter_spec["kind"] if drafter_spec else "ar")
        trees = _tree_specs(spec.get("tree")) if drafter is not None else [("", None)]
        for suffix, tree in trees:
            if not suffix or (spec.get("name") and len(trees) == 1):
                name = base
            elif suffix.startswith(base):  # {name: ddtree} over budgets: "ddtree-b8-k4", not "ddtree/ddtree-b8-k4"
                name = suffix
            else:
                name = f"{base}/{suffix}"
            methods.append(Method(name=name, drafter=drafter, tree=tree))
    return methods


def _build(kwargs: dict, target, tokenizer, factories: Mapping, dflash: str | None) -> object:
    kind = kwargs.pop("kind")
    if kind in factories:
        return factories[kind](target, tokenizer, **kwargs)
    if kind == "dflash" and not kwargs.get("path"):
        if dflash is None:
            raise ValueError("A {kind: dflash} method has no path: give drafter.path or the bench setting dflash=.")
        kwargs["path"] = dflash
    if kwargs.get("path"):
        kwargs["path"] = _resolve_path(kwargs["path"])
    return build_drafter(kind, target, **kwargs)


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
    model = load_target(target_path, device=device, dtype=dtype, attn_implementation=cfg.attn_implementation)
    target = TargetModel.wrap(model, hybrid_mode=cfg.hybrid_mode)
    tokenizer = AutoTokenizer.from_pretrained(_resolve_path(cfg.tokenizer or target_path))
    prompts = load_prompts(cfg.prompts, limit=cfg.num_prompts, text=cfg.prompt_text)
    methods = methods_from_specs(
        cfg.methods, target=model, tokenizer=tokenizer, drafter_factories=drafter_factories, dflash=cfg.dflash
    )
    return run_bench(
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
        cuda_graphs=cfg.cuda_graphs,
        compile=cfg.compile,
        graph_floor=cfg.graph_floor,
        progress=cfg.progress,
        meta={"config": asdict(cfg), "target": target_path},
    )
