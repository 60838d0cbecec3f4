"""Bench settings and method specs: ``BenchConfig`` (the defaults of ``specdec/conf/bench.yaml``), plain-dict
method specs turned into ``Method`` objects, and ``main_bench``, which loads everything, runs the bench, prints
the summary and writes the report.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

import torch

import specdec
from specdec.bench.harness import Method, run_bench
from specdec.bench.hf import HF_KINDS
from specdec.distributed import rank
from specdec.loading import (
    check_drafter_settings,
    check_dtype,
    load_prompts,
    load_target,
    resolve_device,
    resolve_model_path,
    zoo_dir,
)
from specdec.runtime import check_compile
from specdec.state.hybrid import check_hybrid_mode
from specdec.types import SamplingParams

__all__ = [
    "DEFAULT_METHODS",
    "BenchConfig",
    "check_backends_setting",
    "check_compile_setting",
    "check_method_specs",
    "check_temperatures",
    "default_out_dir",
    "main_bench",
    "methods_from_specs",
]

logger = logging.getLogger(__name__)

DEFAULT_METHODS: tuple[dict, ...] = (
    {"name": "hf-generate", "hf": "generate"},
    {"name": "hf-static", "hf": "static"},
    {"name": "hf-assisted", "hf": "assisted", "drafter": {"kind": "model", "truncate_layers": 2}},
    {"name": "ar"},
    {"name": "dflash-chain", "drafter": {"kind": "dflash"}, "tree": {"kind": "chain", "k": 15}},
    {"name": "ddtree", "drafter": {"kind": "dflash"}, "tree": {"kind": "ddtree", "budget": [15, 32], "topk": [8]}},
)

BOOL_SETTINGS = ("interleave", "graph_floor", "tau_reference", "profile", "ignore_eos", "hf_baseline", "progress")
METHOD_KEYS = ("name", "hf", "drafter", "tree", "verifier", "cuda_graphs", "compile", "backends", "generation")
# and every other policy of specdec.TREES (its fields)
TREE_FIELDS = {"chain": {"k"}, "ddtree": {"budget", "topk", "candidates", "sizes", "clock", "lookahead"}}
DRAFTER_KEYS = {
    "none": set(),
    "ngram": {"max_ngram", "min_ngram", "max_matches"},
    "model": {"path", "truncate_layers", "tree_depth"},
    "dflash": {"path", "strict", "init", "num_layers", "block_size", "num_taps", "scale", "seed"},
    "eagle3": {"path", "tree_depth", "init", "seed", "draft_vocab_size"},
    "mtp": {"path", "init", "seed", "tree_depth"},
}


@dataclass(frozen=True, kw_only=True)
class BenchConfig:
    """Settings of ``main_bench``; ``python -m specdec bench`` fills them from ``bench.yaml``, its groups and an
    experiment (``+experiment=NAME``).

    Args:
        target (str): target checkpoint folder (a name inside the zoo resolves). Default `target-dense`.
        tokenizer (str | None): tokenizer path; null = the target's. Default `null`.
        attn_implementation (str): attention of the loaded target (``sdpa`` or ``eager``). Default `sdpa`.
        tp_plan (str | None): ``auto``: the target sharded with HF's tensor-parallel plan over the ranks of
            ``torchrun`` (``docs/distributed.md``); every rank runs the bench, rank 0 writes ``out_dir`` and prints,
            rank ``r`` writes ``out_dir/rank<r>``. Default `null`.
        dflash (str | None): DFlash checkpoint of the method specs ``{kind: dflash}`` that give no ``path``.
            Default `null`.
        prompts (str | None): prompt JSONL; null = the zoo's ``prompts_dev.jsonl``. Default `null`.
        prompt_text (str | None): one literal prompt instead of a file. Default `null`.
        num_prompts (int | None): the first N prompts (>= 1; null = all). Default `20`.
        max_prompt_tokens (int | None): keep the last N tokens of longer prompts; null = all. Default `null`.
        max_new_tokens (int): tokens generated per prompt. Default `128`.
        temperatures (list[float]): 0 = greedy. Default `[0.0]`.
        batch_sizes (list[int]): each method is timed at each batch size B: the prompts decoded B per call
            (left-padded). Default `[1]`.
        warmup (int): untimed passes over all prompts per method before timing (0 = cold). Default `1`.
        repeat (int): timed passes per method (the report lists each pass's tok/s). Default `1`.
        interleave (bool): pass p of every method before pass p + 1 of any (warm-up passes too). Default `false`.
        device (str): "auto" = the current accelerator if there is one, else CPU. Default `auto`.
        dtype (str): torch dtype name, or "auto" = bfloat16 on an accelerator, float32 on CPU. Default `auto`.
        hybrid_mode (str): state handling of hybrid targets: ``exact`` (the round's; ``snapshot`` is refused by
            the round, ``docs/hybrid.md``). Default `exact`.
        cuda_graphs (bool | None): passed to ``generate`` when set. Default `null`.
        compile (bool | str | dict | None): passed to ``generate`` when set (``true``, a mode name or a dict of
            inductor options). Default `null`.
        backends (dict | None): ``specdec.Backends`` fields for every ``generate`` call (kernel choices, e.g.
            ``{tree_gdn_walk: chunk}``); null = the process setting (``SPECDEC_<FIELD>`` variables). Default `null`.
        graph_floor (bool): time one CUDA-graph-captured 1-token target forward and the weights' bandwidth floor
            (CUDA only). Default `true`.
        eager_compare (bool | list[str]): decode the greedy cases again with ``cuda_graphs=False`` (every specdec
            method, or the named ones) and report the share of identical outputs. Default `false`.
        tau_reference (bool): also report τ counted as reference loops count it (whole rounds). Default `false`.
        memory_rounds (int): CUDA: allocated memory before and after this many more rounds of a DDTree method
            (0 = no check). Default `0`.
        profile (bool): one warm call per method under ``torch.profiler``: ``profile.md`` and the traces.
            Default `false`.
        compare_to (str | None): an earlier run folder whose tokens every row is compared with. Default `null`.
        compare_against (str | None): compare with this method of ``compare_to`` (e.g. ``hf-generate``) instead
            of the same method. Default `null`.
        random_target (dict | None): a random-weight target instead of ``target``: ``{preset: qwen3-8b |
            qwen3.5-hybrid-8b, layers, prompt_tokens, config}`` (see ``specdec.bench.synthetic``). Default `null`.
        contexts (list[int] | None): with ``random_target``: run the methods once per prompt length in this list
            (one target, built once) and print the long-context table (``specdec.bench.contexts``): decode ms per
            round beside the bytes floor (weights + the K / V a step reads) and the prefill. Default `null`.
        multi_turn (dict | None): ``{turns, turn_tokens}``: decode conversations instead of single prompts
            (``specdec.bench.multiturn``): each turn's prompt is the whole sequence so far plus the last
            ``turn_tokens`` tokens of the next prompt, with prefix reuse on and off; ``multi_turn.md`` holds the
            prefill ms per turn and the end-to-end tok/s. Default `null`.
        inductor_cache_dir (str | None): torch inductor's cache folder for this run (reused across runs).
            Default `null`.
        title (str | None): the report's title (experiments set their name). Default `null`.
        out_dir (str | None): output folder; null = hydra's run folder (``outputs/bench/<date>/<time>``).
            Default `null`.
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
    tp_plan: str | None = None
    dflash: str | None = None
    prompts: str | None = None
    prompt_text: str | None = None
    num_prompts: int | None = 20
    max_prompt_tokens: int | None = None
    max_new_tokens: int = 128
    temperatures: list[float] = field(default_factory=lambda: [0.0])
    batch_sizes: list[int] = field(default_factory=lambda: [1])
    warmup: int = 1
    repeat: int = 1
    interleave: bool = False
    device: str = "auto"
    dtype: str = "auto"
    hybrid_mode: str = "exact"
    cuda_graphs: bool | None = None
    compile: bool | str | dict | None = None
    backends: dict[str, str] | None = None
    graph_floor: bool = True
    eager_compare: bool | list[str] = False
    tau_reference: bool = False
    memory_rounds: int = 0
    profile: bool = False
    compare_to: str | None = None
    compare_against: str | None = None
    random_target: dict | None = None
    contexts: list[int] | None = None
    multi_turn: dict | None = None
    inductor_cache_dir: str | None = None
    title: str | None = None
    out_dir: str | None = None
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
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={self.max_new_tokens!r} must be an int >= 1.")
        for name, low in (("warmup", 0), ("repeat", 1), ("memory_rounds", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name}={value!r} must be an int >= {low}.")
        check_temperatures(self.temperatures)
        SamplingParams(do_sample=True, top_k=self.top_k, top_p=self.top_p)  # its messages name top_k= and top_p=
        check_batch_sizes(self.batch_sizes)
        check_hybrid_mode(self.hybrid_mode)
        if self.dtype != "auto":
            check_dtype(self.dtype)
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"seed={self.seed!r}: give an int (the prompts' generators are seeded from it).")
        for name in BOOL_SETTINGS:
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}={getattr(self, name)!r}: give true or false.")
        if self.cuda_graphs is not None and not isinstance(self.cuda_graphs, bool):
            raise ValueError(f"cuda_graphs={self.cuda_graphs!r}: give true, false or null (the library's default).")
        if not isinstance(self.eager_compare, bool) and not (
            isinstance(self.eager_compare, list | tuple) and all(isinstance(n, str) for n in self.eager_compare)
        ):
            raise ValueError(f"eager_compare={self.eager_compare!r}: give true, false or a list of method names.")
        if self.compare_against is not None and self.compare_to is None:
            raise ValueError("compare_against names a method of compare_to: give compare_to=<an earlier run folder>.")
        if self.random_target is not None:
            from specdec.bench.synthetic import check_random_target

            check_random_target(self.random_target)
        check_compile_setting(self.compile)
        check_backends_setting(self.backends)
        check_method_specs(self.methods, custom_drafters=None)  # main_bench may add drafter kinds


def check_temperatures(temperatures) -> None:
    """Refuse ``temperatures`` other than a non-empty list of numbers >= 0 (0 = greedy)."""
    if not isinstance(temperatures, list | tuple) or not temperatures:
        raise ValueError(
            f"temperatures={temperatures!r}: give a non-empty list of numbers >= 0 (0 = greedy), e.g. [0.0, 1.0]."
        )
    for t in temperatures:
        if isinstance(t, bool) or not isinstance(t, int | float) or t < 0:
            raise ValueError(
                f"temperatures={list(temperatures)!r}: {t!r} is not a number >= 0 (0 = greedy), e.g. [0.0, 1.0]."
            )


def check_batch_sizes(batch_sizes) -> None:
    """Refuse ``batch_sizes`` other than a non-empty list of distinct ints >= 1."""
    if not isinstance(batch_sizes, list | tuple) or not batch_sizes:
        raise ValueError(f"batch_sizes={batch_sizes!r}: give a non-empty list of ints >= 1, e.g. [1, 8].")
    for b in batch_sizes:
        if isinstance(b, bool) or not isinstance(b, int) or b < 1:
            raise ValueError(f"batch_sizes={list(batch_sizes)!r}: {b!r} is not an int >= 1.")
    if len(set(batch_sizes)) != len(batch_sizes):
        raise ValueError(f"batch_sizes={list(batch_sizes)!r} repeats a batch size.")


def check_compile_setting(compile) -> None:
    """Refuse a ``compile`` setting ``generate`` cannot use, before anything is loaded (``specdec.runtime.
    check_compile``'s rules and messages: a bool or None, a mode name, or a non-empty dict of inductor options)."""
    try:
        check_compile(compile)
    except TypeError as err:  # a value of the wrong type: a bad setting, as the others
        raise ValueError(str(err)) from err


def check_backends_setting(backends) -> None:
    """Refuse a ``backends`` setting that is not a mapping of ``specdec.Backends`` fields to allowed values."""
    if backends is None:
        return
    if not isinstance(backends, Mapping):
        raise ValueError(
            f"backends={backends!r}: give a mapping of specdec.Backends fields, e.g. {{linear_kernel: triton}}."
        )
    from dataclasses import fields as dataclass_fields

    known = {f.name for f in dataclass_fields(specdec.Backends)}
    unknown = sorted(set(backends) - known)
    if unknown:
        raise ValueError(f"backends: unknown fields {unknown}; fields: {', '.join(sorted(known))}.")
    specdec.Backends(**{k: str(v) for k, v in backends.items()})


DrafterFactory = Callable[..., object]


def _resolve_path(path: str | os.PathLike) -> str:
    """An existing path as given, else the same name inside the zoo, else unchanged (e.g. a hub id)."""
    if Path(path).exists() or not (zoo_dir() / path).exists():
        return str(path)
    return str(zoo_dir() / path)


def _tree_fields(kind: str) -> set[str]:
    """The settings a ``{kind: ...}`` tree spec takes: ``TREE_FIELDS``, else the registered policy's dataclass
    fields (``sampling`` excluded: ``generate`` binds it)."""
    if kind in TREE_FIELDS:
        return TREE_FIELDS[kind]
    policy = specdec.TREES.get(kind)
    if policy is None:
        raise ValueError(f"Unknown tree kind {kind!r}: choose one of {', '.join(sorted(specdec.TREES))}.")
    if not is_dataclass(policy):
        return set()
    return {f.name for f in fields(policy) if f.name != "sampling"}


def _tuple_fields(kind: str) -> set[str]:
    """Fields of a registered policy whose one value is a tuple (``widths``): a list of ints is one value there,
    a list of lists one row per inner list."""
    policy = specdec.TREES.get(kind)
    if policy is None or not is_dataclass(policy):
        return set()
    return {f.name for f in fields(policy) if isinstance(f.default, tuple)}


def _tree_label(kind: str, tree, values: Mapping) -> str:
    """The row-name suffix of a tree: ``chain15``, ``ddtree-b15-k8`` (``-candidates``; for an auto budget ``-wall``
    timed by the host's clock, ``-look`` with lookahead, ``-s3x15`` for other sizes than the default),
    ``dynamic-d7-k10-t60``,
    ``sampled-chain15``, ``sampled-trees-k4-d4`` (``-unmerged``), ``gumbel-topk-w4x2x2``, ``stochastic-ddtree-b15-k8``;
    other policies ``kind-field<value>``."""
    if kind == "chain":
        return f"chain{tree.k}"
    if kind in ("ddtree", "stochastic-ddtree"):
        over = "-candidates" if getattr(tree, "candidates", False) else ""
        if getattr(tree, "auto", False) and tree.clock != "device":
            over += f"-{tree.clock}"
        if getattr(tree, "auto", False) and getattr(tree, "lookahead", False):
            over += "-look"
        if getattr(tree, "auto", False) and tree.sizes != type(tree).sizes:
            over += "-s" + "x".join(map(str, tree.sizes))
        return f"{kind}-b{tree.budget}-k{'b' if tree.topk is None else tree.topk}{over}"
    if kind == "dynamic":
        return f"dynamic-d{tree.depth}-k{tree.topk}-t{tree.total_tokens}"
    if kind == "sampled-chain":
        return f"sampled-chain{tree.k}"
    if kind == "sampled-trees":
        return f"sampled-trees-k{tree.k}-d{tree.depth}" + ("" if tree.merge else "-unmerged")
    if kind == "gumbel-topk":
        return "gumbel-topk-w" + "x".join(str(w) for w in tree.widths)
    parts = [f"{k}{'x'.join(map(str, v)) if isinstance(v, list | tuple) else v}" for k, v in values.items()]
    return "-".join([kind, *parts])


def _tree_specs(spec: Mapping | None) -> list[tuple[str, object | None]]:
    """Expand a tree spec whose fields may be lists into (suffix, tree) pairs, in product order."""
    if spec is None:
        return [("", None)]
    spec = dict(spec)
    kind = spec.pop("kind", "ddtree" if "budget" in spec else "chain")
    allowed = _tree_fields(kind)
    unknown = set(spec) - allowed
    if unknown:
        raise ValueError(f"tree {{kind: {kind}}} has unknown fields {sorted(unknown)}; it takes {sorted(allowed)}.")
    tuples = _tuple_fields(kind)
    values = {}
    for k, v in spec.items():
        if k in tuples:
            many = isinstance(v, list | tuple) and bool(v) and all(isinstance(x, list | tuple) for x in v)
            values[k] = [tuple(x) for x in v] if many else [tuple(v) if isinstance(v, list | tuple) else v]
        else:
            values[k] = list(v) if isinstance(v, list | tuple) else [v]
    combos = [dict(zip(values, combo, strict=True)) for combo in itertools.product(*values.values())]
    out = []
    for c in combos:
        tree = specdec.TREES[kind](**c)
        out.append((_tree_label(kind, tree, c), tree))
    return out


def _rule_spec(spec) -> tuple[str, object] | None:
    """A method's ``verifier`` (a ``specdec.verify.RULES`` name or ``{name, ...settings}``) -> (label, rule); None
    when unset (the library's default rule). The label is the name with its settings: ``multi-draft`` with
    ``replacement: false`` is ``multi-draft-no-replacement``, other values ``-key=value``."""
    if spec is None:
        return None
    from specdec.verify import RULES

    if isinstance(spec, str):
        spec = {"name": spec}
    if not isinstance(spec, Mapping) or not isinstance(spec.get("name"), str):
        raise ValueError(
            f"verifier {spec!r}: give a rule name or {{name: ..., ...settings}}; names: {', '.join(sorted(RULES))}."
        )
    settings = dict(spec)
    name = settings.pop("name")
    if name not in RULES:
        raise ValueError(f"Unknown verifier {name!r}; choose one of {', '.join(sorted(RULES))}.")
    cls = RULES[name]
    try:
        rule = cls(**settings)
    except TypeError as err:
        takes = sorted(f.name for f in fields(cls)) if is_dataclass(cls) else []
        raise ValueError(
            f"verifier {{name: {name}}} does not take {sorted(settings)} ({err}); it takes {takes or 'no settings'}."
        ) from err
    parts = [name]
    for key, value in settings.items():
        if isinstance(value, bool):
            parts.append(key if value else f"no-{key}")
        else:
            parts.append(f"{key}={value}")
    return "-".join(parts), rule


def _check_pair(spec: Mapping, label: str, rule, trees) -> None:
    """Refuse a rule that is not exact for one of the method's trees, by the rule's own message."""
    from specdec.types import SamplingParams

    for _, tree in trees:
        try:
            rule.check(SamplingParams(), tree)
        except ValueError as err:
            raise ValueError(f"Method spec {dict(spec)} (verifier {label}): {err}") from err


def _drafter_spec(spec) -> dict | None:
    if spec is None:
        return None
    if isinstance(spec, str):
        return {"kind": spec}
    if isinstance(spec, Mapping) and "kind" in spec:
        return dict(spec)
    raise ValueError(f"drafter {spec!r}: give a kind (none, ngram, model, dflash, eagle3, mtp) or {{kind: ..., ...}}.")


def check_method_specs(specs: Sequence[Mapping], *, custom_drafters: Sequence[str] | None = ()) -> None:
    """Refuse malformed method specs without loading anything: unknown keys, HF kinds, drafter kinds or their
    settings, tree kinds or fields, ``compile`` and ``backends`` values.

    Args:
        specs (Sequence[Mapping]): the method specs.
        custom_drafters (Sequence[str] | None): drafter kinds of ``drafter_factories`` (their settings are not
            checked); None accepts any kind besides the built-in ones. Default ().
    """
    if not isinstance(specs, list | tuple) or not specs:
        raise ValueError("methods is empty: give at least one method spec, e.g. [{name: ar}].")
    for i, spec in enumerate(specs):
        try:
            _check_method_spec(spec, custom_drafters)
        except (ValueError, TypeError) as err:  # a policy's or rule's TypeError is a bad setting here too
            raise ValueError(f"methods[{i}]: {err}") from err


def _check_method_spec(spec, custom_drafters: Sequence[str] | None) -> None:
    if not isinstance(spec, Mapping):
        raise ValueError(f"Method spec {spec!r} is not a mapping; e.g. {{name: ar}}.")
    unknown = set(spec) - set(METHOD_KEYS)
    if unknown:
        raise ValueError(f"Method spec {dict(spec)} has unknown keys {sorted(unknown)}; use {', '.join(METHOD_KEYS)}.")
    if spec.get("hf") is not None and spec["hf"] not in HF_KINDS:
        raise ValueError(f"Method spec {dict(spec)}: hf={spec['hf']!r}; choose one of {HF_KINDS}.")
    drafter = _drafter_spec(spec.get("drafter"))
    if drafter is not None:
        kind = drafter.pop("kind")
        custom = kind in (custom_drafters or ())
        if kind not in DRAFTER_KEYS and not custom and custom_drafters is not None:
            check_drafter_settings(kind, drafter)  # raises the unknown drafter's message
        extra = set(drafter) - DRAFTER_KEYS[kind] if kind in DRAFTER_KEYS and not custom else set()
        if extra:
            raise ValueError(
                f"drafter {{kind: {kind}}} has unknown settings {sorted(extra)}; it takes "
                f"{sorted(DRAFTER_KEYS[kind]) or 'none'}."
            )
        if kind in DRAFTER_KEYS and not custom:
            check_drafter_settings(kind, drafter)
    trees = _tree_specs(spec.get("tree"))
    rule = _rule_spec(spec.get("verifier"))
    if rule is not None:
        if spec.get("hf"):
            raise ValueError(f"Method spec {dict(spec)}: an hf row runs HF's own generate; drop verifier there.")
        _check_pair(spec, *rule, trees)
    check_compile_setting(spec.get("compile"))
    check_backends_setting(spec.get("backends"))
    generation_kwargs(spec.get("generation"))


def generation_kwargs(spec: Mapping | None) -> dict:
    """A method's ``generation`` spec as ``generate`` keyword arguments: HF options as given (e.g.
    ``repetition_penalty: 1.1``), and ``logits_processor: [{class: <an HF LogitsProcessor class>, **its arguments}]``
    built into processor objects (``specdec`` runs them per tree node, uncaptured)."""
    if spec is None:
        return {}
    if not isinstance(spec, Mapping):
        raise ValueError(
            f"generation={spec!r} must be a mapping of HF generate options, e.g. {{repetition_penalty: 1.1}}."
        )
    out = dict(spec)
    procs = out.pop("logits_processor", None)
    if procs is not None:
        from transformers.generation import logits_process

        built = []
        for item in procs if isinstance(procs, list | tuple) else [procs]:
            if not isinstance(item, Mapping) or "class" not in item:
                raise ValueError(
                    f"generation.logits_processor: {item!r} must be {{class: <HF LogitsProcessor class>, **arguments}},"
                    " e.g. {class: RepetitionPenaltyLogitsProcessor, penalty: 1.1}."
                )
            item = dict(item)
            cls = getattr(logits_process, str(item.pop("class")), None)
            if not isinstance(cls, type) or not issubclass(cls, logits_process.LogitsProcessor):
                raise ValueError(f"generation.logits_processor: no LogitsProcessor class {item!r} in "
                                 "transformers.generation.logits_process.")  # fmt: skip
            built.append(cls(**item))
        out["logits_processor"] = built
    return out


def _attention_only(target) -> bool:
    """True for targets whose every layer is attention (HF assisted generation needs one)."""
    if target is None:
        return True
    config = getattr(target, "config", None)
    attention = {"full_attention", "sliding_attention", "chunked_attention", "attention"}
    for key in ("layer_types", "layers_block_type"):
        kinds = getattr(config, key, None)
        if kinds and not set(kinds) <= attention:
            return False
    model_type = str(getattr(config, "model_type", ""))
    return not any(name in model_type for name in ("mamba", "rwkv", "xlstm"))


def _series(base: str, tree) -> str | None:
    """The plot line of a tree's rows: one per spec and kind, over the budgets (chains stand alone)."""
    if isinstance(tree, specdec.DDTree):
        return f"{base} topk={'budget' if tree.topk is None else tree.topk}"
    if tree is None or isinstance(tree, specdec.Chain | specdec.SampledChain):
        return None
    kind = next((k for k, cls in specdec.TREES.items() if type(tree) is cls), type(tree).__name__)
    topk = getattr(tree, "topk", False)
    return f"{base} {kind}" + ("" if topk is False else f" topk={'budget' if topk is None else topk}")


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
    "budget": int | list, "topk": int | None | list} | {"kind": <a name of specdec.TREES>, **its fields},
    "verifier"?: <a name of specdec.verify.RULES> | {"name": ..., **settings}, "cuda_graphs"?: bool,
    "compile"?: ..., "backends"?: {field: value}, "generation"?: {HF generate option: value}}``; ``generation``
    holds HF options for this method's calls (specdec and ``hf`` rows alike, see :func:`generation_kwargs`). A
    verifier is passed to ``generate``; the row's name then
    carries the rule (``<rule>/<tree>`` without a ``name``, ``<name>+<rule>`` with one), and a rule that is not
    exact for the tree is refused before anything loads. Drafters are built once per distinct drafter spec, by
    ``drafter_factories[kind](target, tokenizer, **kwargs)`` when given, else from the public drafter classes:
    ``ngram`` (``NGramDrafter``), ``model`` (``ModelDrafter``: ``path``, or the target's first ``truncate_layers``
    layers), ``dflash`` (``DFlashDrafter.from_pretrained``; without ``path`` it loads ``dflash``; ``init: random``
    builds a random one of the target's width, ``specdec.bench.synthetic.random_dflash``), ``mtp``
    (``MTPDrafter.from_pretrained`` of ``path``, default the target's own checkpoint; ``init: random`` a random
    head). ``hf: assisted`` takes
    the small model of a ``model`` drafter; it is skipped, with a warning, on targets with recurrent layers (HF's
    assisted generation needs an attention-only target).
    """
    factories = dict(drafter_factories or {})
    check_method_specs(specs, custom_drafters=list(factories))
    built: dict[str, object] = {}
    methods = []
    for spec in specs:
        if spec.get("hf") == "assisted" and not _attention_only(target):
            logger.warning("skipping %s: HF assisted generation needs an attention-only target", spec.get("name"))
            continue
        drafter_spec = _drafter_spec(spec.get("drafter"))
        drafter = None
        if drafter_spec is not None and drafter_spec.get("kind") != "none":
            key = json.dumps(drafter_spec, sort_keys=True, default=str)
            if key not in built:
                built[key] = _build(dict(drafter_spec), target, tokenizer, factories, dflash)
            drafter = built[key]
        overrides = {k: spec.get(k) for k in ("cuda_graphs", "compile", "backends")}
        overrides["generation"] = generation_kwargs(spec.get("generation")) or None
        if spec.get("hf"):
            name = spec.get("name") or f"hf-{spec['hf']}"
            methods.append(Method(name=name, hf=spec["hf"], drafter=drafter, generation=overrides["generation"]))
            continue
        rule = _rule_spec(spec.get("verifier"))
        label, verifier = rule if rule is not None else ("", None)
        base = spec.get("name") or label or (drafter_spec["kind"] if drafter_spec else "ar")
        if label and spec.get("name") and label not in base:
            base = f"{base}+{label}"
        trees = _tree_specs(spec.get("tree")) if drafter is not None else [("", None)]
        for suffix, tree in trees:
            if not suffix or (spec.get("name") and len(trees) == 1):
                name = base
            elif suffix.startswith(base):  # {name: ddtree} over budgets: "ddtree-b8-k4", not "ddtree/ddtree-b8-k4"
                name = suffix
            else:
                name = f"{base}/{suffix}"
            methods.append(Method(name=name, drafter=drafter, tree=tree, verifier=verifier, series=_series(base, tree),
                                  **overrides))  # fmt: skip
    return methods


def _build(kwargs: dict, target, tokenizer, factories: Mapping, dflash: str | None) -> object:
    kind = kwargs.pop("kind")
    if kind in factories:
        return factories[kind](target, tokenizer, **kwargs)
    if kind == "ngram":
        return specdec.NGramDrafter(**{k: int(v) for k, v in kwargs.items()})
    if kind == "model":
        depth = int(kwargs.get("tree_depth", 8))
        if kwargs.get("path"):
            param = next(target.parameters())
            path = resolve_model_path(_resolve_path(kwargs["path"]))
            small = load_target(path, device=param.device, dtype=param.dtype)
            return specdec.ModelDrafter(small, tree_depth=depth)
        return specdec.ModelDrafter.from_target_layers(target, int(kwargs.get("truncate_layers", 2)), tree_depth=depth)
    if kind == "dflash":
        if kwargs.pop("init", None) == "random":
            from specdec.bench.synthetic import random_dflash

            return random_dflash(target, **kwargs)
        path = kwargs.get("path") or dflash
        if not path:
            raise ValueError("A {kind: dflash} method has no path: give drafter.path or the bench setting dflash=.")
        path = resolve_model_path(_resolve_path(path), what="DFlash checkpoint folder")
        return specdec.DFlashDrafter.from_pretrained(path, target=target, strict=bool(kwargs.get("strict", False)))
    if kind == "eagle3":
        depth = int(kwargs.get("tree_depth", 8))
        if kwargs.get("init") == "random":  # a random head of the target's shape (timing only)
            vocab = kwargs.get("draft_vocab_size")
            return specdec.Eagle3Drafter.for_target(target, seed=int(kwargs.get("seed", 0)), tree_depth=depth,
                                                    draft_vocab_size=int(vocab) if vocab else None)  # fmt: skip
        if not kwargs.get("path"):
            raise ValueError("A {kind: eagle3} method has no path: give drafter.path=<EAGLE-3 checkpoint folder>.")
        path = resolve_model_path(_resolve_path(kwargs["path"]), what="EAGLE-3 checkpoint folder")
        return specdec.Eagle3Drafter.from_pretrained(path, target=target, tree_depth=depth)
    if kind == "mtp":  # the target checkpoint's own head (path: default the target's), or a random one
        from specdec.loading import build_drafter

        path = kwargs.pop("path", None) or getattr(target, "name_or_path", None)
        return build_drafter("mtp", target, path=path, **kwargs)
    raise ValueError(f"Unknown drafter {kind!r}; choose none, ngram, model, dflash, eagle3 or mtp.")


def default_out_dir() -> Path:
    """``outputs/bench/<date>/<time>`` under the working directory (the folder hydra gives the bench's runs)."""
    return Path("outputs") / "bench" / time.strftime("%Y-%m-%d") / time.strftime("%H-%M-%S")


def _short(path: str) -> str:
    """A checkpoint path as the report names it: the folder name of a local path, a hub id unchanged."""
    return Path(path).name if Path(path).exists() else path


def main_bench(
    cfg: BenchConfig | Mapping, *, drafter_factories: Mapping[str, DrafterFactory] | None = None
) -> list[dict]:
    """Load the target, tokenizer, prompts and methods named in ``cfg``, run the benchmark, write the report and
    print the summary table and the output folder.

    Args:
        cfg (BenchConfig | Mapping): the settings, or a plain dict of ``BenchConfig`` fields (plus ``threads``,
            an int >= 1 or "auto", applied with ``torch.set_num_threads``).
        drafter_factories (Mapping[str, Callable] | None): extra drafter kinds, called as
            ``factory(target, tokenizer, **kwargs)``.

    Returns:
        list[dict]: the rows; ``cfg.out_dir`` (default ``default_out_dir()``) receives results.jsonl, results.md,
        plot.png and meta.json (and profile.md with ``profile``).
    """
    from transformers import AutoTokenizer

    if not isinstance(cfg, BenchConfig):
        cfg = dict(cfg)
        threads = cfg.pop("threads", None)  # bench.yaml's torch CPU threads: an int >= 1 or "auto"
        if threads is not None:
            from specdec.cli import resolve_threads

            torch.set_num_threads(resolve_threads(threads))
        unknown = set(cfg) - {f.name for f in fields(BenchConfig)}
        if unknown:
            raise ValueError(f"Unknown bench settings {sorted(unknown)}; see specdec.bench.BenchConfig.")
        cfg = BenchConfig(**cfg)
    if cfg.inductor_cache_dir:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(Path(cfg.inductor_cache_dir).expanduser().resolve())
    device, dtype = resolve_device(cfg.device, cfg.dtype)  # refuses a device this process cannot use
    out_dir = Path(cfg.out_dir) if cfg.out_dir else default_out_dir()
    if cfg.tp_plan is not None and cfg.random_target is not None:
        raise ValueError("tp_plan shards a loaded checkpoint; random_target builds one model per process: use one.")
    lead = rank() == 0
    if not lead:
        out_dir = out_dir / f"rank{rank()}"  # every rank decodes; rank 0's files are the run's
    if cfg.random_target is not None:
        from specdec.bench.synthetic import describe_random_target, random_prompts, random_target

        model = random_target(cfg.random_target, device=device, dtype=dtype, seed=cfg.seed)
        tokenizer = None
        prompt_tokens = int(cfg.random_target.get("prompt_tokens") or 512)
        prompts = random_prompts(model, num_prompts=cfg.num_prompts or 1, prompt_tokens=prompt_tokens, seed=cfg.seed)
        target_path = target_name = describe_random_target(cfg.random_target, model)
    else:
        target_path = _resolve_path(cfg.target)
        model = load_target(target_path, device=device, dtype=dtype, attn_implementation=cfg.attn_implementation,
                            tp_plan=cfg.tp_plan)  # fmt: skip
        tokenizer = AutoTokenizer.from_pretrained(_resolve_path(cfg.tokenizer or target_path))
        prompts = load_prompts(cfg.prompts, limit=cfg.num_prompts, text=cfg.prompt_text)
        target_name = _short(target_path)
    methods = methods_from_specs(
        cfg.methods, target=model, tokenizer=tokenizer, drafter_factories=drafter_factories, dflash=cfg.dflash
    )

    def run(prompts, out_dir, extra_meta=None):
        return run_bench(
            model,
            tokenizer,
            prompts,
            methods,
            max_new_tokens=cfg.max_new_tokens,
            temperatures=[float(t) for t in cfg.temperatures],
            batch_sizes=list(cfg.batch_sizes),
            warmup=cfg.warmup,
            repeat=cfg.repeat,
            interleave=cfg.interleave,
            out_dir=out_dir,
            seed=cfg.seed,
            max_prompt_tokens=cfg.max_prompt_tokens,
            ignore_eos=cfg.ignore_eos,
            top_k=cfg.top_k,
            top_p=cfg.top_p,
            hf_baseline=cfg.hf_baseline,
            hybrid_mode=cfg.hybrid_mode,
            cuda_graphs=cfg.cuda_graphs,
            compile=cfg.compile,
            backends=cfg.backends,
            graph_floor=cfg.graph_floor,
            eager_compare=list(cfg.eager_compare) if not isinstance(cfg.eager_compare, bool) else cfg.eager_compare,
            tau_reference=cfg.tau_reference,
            memory_rounds=cfg.memory_rounds,
            profile=cfg.profile,
            compare_to=cfg.compare_to,
            compare_against=cfg.compare_against,
            progress=cfg.progress,
            meta={"config": asdict(cfg), "target": target_path, "target_name": target_name, "title": cfg.title,
                  **(extra_meta or {})},  # fmt: skip
        )

    if cfg.multi_turn:
        from specdec.bench.multiturn import run_multi_turn

        settings = dict(cfg.multi_turn)
        unknown = set(settings) - {"turns", "turn_tokens"}
        if unknown:
            raise ValueError(f"multi_turn has unknown keys {sorted(unknown)}; it takes turns and turn_tokens.")
        rows = run_multi_turn(model, tokenizer, prompts, methods, turns=int(settings.get("turns", 4)),
                              turn_tokens=int(settings.get("turn_tokens", 64)), max_new_tokens=cfg.max_new_tokens,
                              warmup=cfg.warmup, out_dir=out_dir if lead else None)  # fmt: skip
        if lead:
            print((out_dir / "multi_turn.md").read_text())
            print(f"results in {out_dir}/ (multi_turn.md, multi_turn.jsonl)")
        return rows
    if cfg.contexts:
        if cfg.random_target is None:
            raise ValueError("contexts= needs random_target (the prompts are random tokens of each length).")
        from specdec.bench.contexts import context_table

        results = []
        for n in cfg.contexts:
            prompts = random_prompts(model, num_prompts=cfg.num_prompts or 1, prompt_tokens=int(n), seed=cfg.seed)
            rows = run(prompts, out_dir / f"context-{n}", {"context": int(n)})
            results.append((int(n), rows))
        print(context_table(model, results, max_new_tokens=cfg.max_new_tokens, compiled=bool(cfg.compile),
                            out_dir=out_dir))  # fmt: skip
        return [row for _, rows in results for row in rows]
    rows = run(prompts, out_dir)
    if lead:
        print_summary(rows, out_dir, title=cfg.title)
    return rows


def print_summary(rows: Sequence[dict], out_dir: str | os.PathLike, *, title: str | None = None) -> None:
    """The bench's closing output: the summary table, then the output folder and its files."""
    from rich.console import Console

    from specdec.bench.report import aggregate, summary_table

    console = Console()
    if not console.is_terminal:  # a log file or a pipe: as wide as the table needs, no cut cells
        console = Console(width=240)
    console.print(summary_table(aggregate(rows), title=f"specdec bench: {title}" if title else "specdec bench"))
    files = [
        name for name in ("results.md", "plot.png", "results.jsonl", "profile.md") if (Path(out_dir) / name).exists()
    ]
    console.print(f"results in {Path(out_dir).resolve()}/ ({', '.join(files)})", markup=False, highlight=False)
