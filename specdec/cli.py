"""``python -m specdec``: hydra entry points (generate, bench, train). The only module that knows hydra.

python -m specdec target=dense drafter=ngram tree=chain tree.k=6 sampling=greedy
python -m specdec -m drafter=dflash tree=ddtree tree.budget=8,16,32      # multirun sweep
python -m specdec bench target=hybrid num_prompts=5   |   python -m specdec train corpus=src/

Every command composes the same config groups (``target``, ``prompts``; ``generate`` also ``drafter``, ``tree``,
``sampling``, ``verifier``); a key that the chosen group option does not define is an error, never silently ignored.

A user error (a bad key or value, a missing file) prints one ``error: ...`` line that names the key, the value given
and what to use instead, and exits with status 2; ``SPECDEC_DEBUG=1`` (or hydra's ``HYDRA_FULL_ERROR=1``) shows the
traceback instead. The values are checked (:func:`check_values`) before any model loads. torch and transformers
load only when a command runs, so ``--help`` stays fast.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path

logger = logging.getLogger("specdec")

_COMMANDS = {"generate": "config", "bench": "bench", "train": "train"}
_GROUPS = ("target", "drafter", "tree", "sampling", "verifier", "prompts")
_COMMAND_GROUPS = {"generate": _GROUPS, "bench": ("target", "prompts"), "train": ("target", "prompts", "drafter")}
_INSTEAD = {  # what to use instead of a group that a command does not take
    ("bench", "drafter"): "bench takes drafters and trees per method, e.g. "
    "'methods=[{drafter: dflash, tree: {kind: ddtree, budget: [32]}}]'",
    ("bench", "tree"): "bench takes trees per method, e.g. 'methods=[{drafter: dflash, tree: {kind: chain, k: 8}}]'",
    ("bench", "sampling"): "bench samples at its temperatures=[...] (with top_k= and top_p=)",
    ("bench", "verifier"): "bench verifies with the library's default rule",
    ("train", "verifier"): "train does not decode; verification rules are settings of `python -m specdec` (generate)",
    ("train", "tree"): "train does not decode; trees are settings of `python -m specdec` (generate) and bench methods",
    ("train", "sampling"): "train does not decode; it evaluates with greedy target continuations",
}
_CONF = Path(__file__).resolve().parent / "conf"
_PROJECT = Path(__file__).resolve().parents[1]


def _register_resolvers() -> None:
    from omegaconf import OmegaConf

    from specdec.paths import asset_roots, shipped_zoo, zoo_dir

    def zoo(name: str) -> str:  # the zoo's item, else the shipped copy of it
        found = [base / name for base in (zoo_dir(), shipped_zoo()) if base is not None and (base / name).exists()]
        return str(found[0] if found else zoo_dir() / name)

    def asset(name: str) -> str:  # the checkout's assets/ or an installed package's specdec/assets
        found = [root / name for root in asset_roots() if (root / name).exists()]
        return str(found[0] if found else _PROJECT / "assets" / name)

    OmegaConf.register_new_resolver("zoo", zoo, replace=True)
    OmegaConf.register_new_resolver("asset", asset, replace=True)


def resolve_threads(threads: int | str) -> int:
    """The torch CPU thread count for ``threads``: an int >= 1, or ``"auto"`` = half the usable cores (1 to 8).

    Half the cores, because OpenMP worker threads spin while they wait: when any other process shares the
    cores, a thread per core stalls every op (see ``docs/cli.md`` for measurements)."""
    if threads == "auto":
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        return max(1, min(8, cores // 2))
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads={threads!r}: give an int >= 1 or auto.")
    return threads


def check_keys(cfg: Mapping, choices: Mapping[str, str | None], command: str) -> None:
    """Refuse keys that the command's config and the chosen group options do not define.

    Hydra already refuses ``key=value`` for an unknown key; this catches ``+key=value`` (e.g. ``+tree.budget=8``
    with ``tree=chain``), which would otherwise be ignored. Group options from a user's own config folder (no
    file in ``specdec/conf``) are not checked.

    Args:
        cfg (Mapping): the composed config (without the ``hydra`` node).
        choices (Mapping[str, str | None]): group -> chosen option (``HydraConfig.get().runtime.choices``).
        command (str): ``generate``, ``bench`` or ``train``.

    Raises:
        ValueError: names the unknown key and the keys that the option accepts.
    """
    from omegaconf import OmegaConf

    experiment = choices.get("experiment")
    if experiment is not None and command != "bench":
        this = "python -m specdec" + ("" if command == "generate" else f" {command}")
        raise ValueError(
            f"experiment={experiment} is an experiment of bench, not of `{this}`: run `python -m specdec bench "
            f"+experiment={experiment}`."
        )
    for group in _GROUPS:
        if group in cfg and group not in _COMMAND_GROUPS[command]:
            option = choices.get(group)
            raise ValueError(
                f"`python -m specdec {command}` has no {group} group (its groups: "
                f"{', '.join(_COMMAND_GROUPS[command])}): drop +{group}{'=' + option if option else ''}; "
                f"{_INSTEAD[command, group]}."
            )
    for group in _GROUPS:
        option = choices.get(group)
        if group not in cfg or option is None or not (_CONF / group / f"{option}.yaml").is_file():
            continue
        allowed = set(OmegaConf.load(_CONF / group / f"{option}.yaml"))
        extra = sorted(set(cfg[group]) - allowed)
        if extra:
            raise ValueError(
                f"{group}.{extra[0]} is not a setting of {group}={option} (its settings: {', '.join(sorted(allowed))})"
                f"; pick the option that defines it{_hint(group, extra[0])} or drop the key."
            )
    primary = OmegaConf.load(_CONF / f"{_COMMANDS[command]}.yaml")
    allowed = (set(primary) - {"defaults", "hydra"}) | {g for g in _COMMAND_GROUPS[command] if g in cfg}
    extra = sorted(set(cfg) - allowed - {"hydra"})
    if extra:
        raise ValueError(
            f"Unknown key {extra[0]!r} for `python -m specdec {command}`; see `python -m specdec "
            f"{'' if command == 'generate' else command + ' '}--help` for its keys."
        )


def _hint(group: str, key: str) -> str:
    """`` (tree=ddtree)`` when exactly the other options of ``group`` define ``key``."""
    from omegaconf import OmegaConf

    owners = [p.stem for p in sorted((_CONF / group).glob("*.yaml")) if key in OmegaConf.load(p)]
    return f" ({' or '.join(f'{group}={o}' for o in owners)})" if owners else ""


def _check_limit(limit) -> None:
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"prompts.limit / num_prompts = {limit!r}: give an int >= 1, or null for all prompts.")


def _check_batch_size(batch_size) -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"prompts.batch_size = {batch_size!r}: give an int >= 1 (prompts per generate call).")


_NO_TOKENIZER = object()  # stands for the tokenizer generate gets (sampling.stop_strings needs one)


def check_values(c: Mapping, choices: Mapping[str, str | None], command: str) -> None:
    """Refuse bad values of a composed config before anything heavy loads.

    The library's own checks give the messages (``specdec.generate``'s arguments, the tree policies, the drafters,
    the verification rules, ``BenchConfig``, ``resolve_device``); this step runs them before any model loads and
    names each value by its config key (``tree.budget=0: ...`` for ``DDTree(budget=0): ...``). What only the CLI
    has (``seed``, ``show_text``, ``prompts.text``, ``SPECDEC_ZOO``, ...) is checked here.

    Args:
        c (Mapping): the resolved config (without the ``hydra`` node), as plain containers.
        choices (Mapping[str, str | None]): group -> chosen option.
        command (str): ``generate``, ``bench`` or ``train``.

    Raises:
        ValueError: one message naming the key, the value given and what to use instead.
        FileNotFoundError: a path that does not exist (``target.path``, ``prompts.path``, ``drafter.path``, ...),
            naming the key and the paths tried.
    """
    from specdec.loading import check_device, check_dtype, load_prompts, resolve_device, resolve_model_path

    zoo = os.environ.get("SPECDEC_ZOO")
    if zoo and not Path(zoo).expanduser().is_dir():
        raise ValueError(
            f"SPECDEC_ZOO={zoo} is not a folder: export SPECDEC_ZOO=<the zoo folder> (it holds target-hybrid, "
            "tokenizer, prompts_dev.jsonl), or unset it (then ../shared/zoo beside the project, else the shipped "
            "assets/zoo)."
        )
    resolve_threads(c["threads"])
    prompts, target = c["prompts"], c["target"]
    _check_limit(prompts["limit"])
    if command == "generate":
        _check_batch_size(prompts.get("batch_size", 1))
    text = prompts.get("text")
    if text is not None and (not isinstance(text, str) or not text):
        raise ValueError(
            f"prompts.text={text!r}: give the prompt as a non-empty string, e.g. \"prompts.text='def f(x):'\"."
        )
    if text is None:
        load_prompts(prompts["path"], limit=1)  # the file exists and its lines have a prompt
    if target.get("tp_plan") not in (None, "auto") and not isinstance(target.get("tp_plan"), Mapping):
        raise ValueError(f"target.tp_plan={target['tp_plan']!r}: use auto (HF's tensor-parallel plan, under torchrun) "
                         "or null (one full copy per process).")  # fmt: skip
    if command in ("generate", "bench"):
        _check_attn_implementation(target.get("attn_implementation"))
    if command != "bench" or c.get("random_target") is None:  # a random target loads no checkpoint
        resolve_model_path(target["path"], what="target model folder (target.path)")
        resolve_model_path(target["tokenizer"], what="tokenizer folder (target.tokenizer)")
    if command == "generate":
        _check_int("seed", c["seed"], "the run's torch.Generator is seeded with it")
        _check_bool("show_text", c["show_text"])
        resolve_device(c["device"], c["dtype"])
        _check_generate(c, choices)
    elif command == "bench":
        from specdec.bench.config import BenchConfig, check_method_specs

        settings = bench_settings(c)
        BenchConfig(**{k: v for k, v in settings.items() if k != "threads"})
        resolve_device(settings["device"], settings["dtype"])
        check_method_specs(settings["methods"], custom_drafters=())  # no drafter kinds beyond the built-in ones
        for i, spec in enumerate(settings["methods"]):  # the checkpoints the methods load
            drafter = spec.get("drafter")
            drafter = {"kind": drafter} if isinstance(drafter, str) else drafter or {}
            if drafter.get("init") == "random" or drafter.get("kind") not in ("model", "dflash", "eagle3"):
                continue  # an mtp head's default checkpoint is the target's own
            if drafter.get("path"):
                resolve_model_path(drafter["path"], what=f"checkpoint folder (methods[{i}].drafter.path)")
            elif drafter["kind"] == "dflash" and settings.get("dflash"):
                resolve_model_path(settings["dflash"], what="DFlash checkpoint folder (target.dflash)")
    else:
        _check_int("seed", c["seed"], "the training run is seeded with it")
        if c["device"] is not None:
            check_device(c["device"])
        for key in ("target_dtype", "autocast_dtype", "save_dtype"):
            if c[key] is not None:
                check_dtype(c[key], key, unset="null")
        _train_config(c)


def _check_attn_implementation(value) -> None:
    """``target.attn_implementation``: one that takes the round's tree mask, refused before the model loads (HF would
    load it first, and an uninstalled kernel package is an ImportError there)."""
    from specdec.target import _TREE_ATTN

    if value is not None and value not in _TREE_ATTN:
        raise ValueError(
            f"target.attn_implementation={value!r}: the round verifies draft trees through an additive float mask, "
            f"which only {' and '.join(_TREE_ATTN)} take; use target.attn_implementation=sdpa (the default) or eager."
        )


def _train_config(c: Mapping):
    """The training config of a resolved ``train.yaml`` config, built (its own checks run); a message about a key of
    the ``eagle3`` / ``mtp`` node names it so (``eagle3.lr='abc': ...``)."""
    from specdec.train import Eagle3TrainConfig, MTPTrainConfig, TrainConfig

    settings = train_settings(c)
    kind = train_kind(c)
    cls = {"eagle3": Eagle3TrainConfig, "mtp": MTPTrainConfig}.get(kind, TrainConfig)
    try:
        return cls(**settings)
    except ValueError as err:
        found = re.match(r"(\w+)=", str(err))
        if kind in _HEADS and found and (c.get(kind) or {}).get(found[1]) is not None:
            raise ValueError(f"{kind}.{err}") from err
        raise


def _check_generate(c: Mapping, choices: Mapping[str, str | None]) -> None:
    """The values of generate's groups and its keys that ``specdec.generate`` takes, by the library's checks."""
    from specdec.loading import build_tree, check_drafter
    from specdec.runtime import check_compile
    from specdec.state.hybrid import check_hybrid_mode

    check_hybrid_mode(c["hybrid_mode"])
    if c.get("cuda_graphs") is not None:
        _check_bool("cuda_graphs", c["cuda_graphs"], "or null (the library's default)")
    _named(lambda: check_compile(c.get("compile")), None, {"compile": c.get("compile")})
    drafter = {k: v for k, v in c["drafter"].items() if k != "name"}
    _named(lambda: check_drafter(c["drafter"]["name"], **drafter), "drafter", c["drafter"], choices.get("drafter"))
    tree_cfg = {k: v for k, v in c["tree"].items() if k != "name"}
    tree = _named(lambda: build_tree(c["tree"]["name"], **tree_cfg), "tree", c["tree"], choices.get("tree"))
    sampling = _check_sampling(c["sampling"], c["max_new_tokens"], choices.get("sampling"))
    verifier = c["verifier"]
    rule = _named(lambda: build_rule(**verifier), "verifier", verifier, choices.get("verifier"))
    if rule is not None:  # the rule exact for the sampling settings and the tree (generate's own check)
        fixed = tree.largest if getattr(tree, "auto", False) else tree  # as generate checks budget=auto
        drafted = fixed if c["drafter"]["name"] != "none" else None
        _named(lambda: rule.check(sampling, drafted), "verifier", verifier, choices.get("verifier"))


def _check_sampling(sampling: Mapping, max_new_tokens, option: str | None):
    """``max_new_tokens`` and the sampling group by ``specdec.generate``'s own argument checks (each key alone
    first, so that the message can name it), then HF's warpers; returns the resolved ``SamplingParams``."""
    import torch
    from omegaconf import OmegaConf

    from specdec.hf_args import resolve_generation_args
    from specdec.types import SamplingParams
    from specdec.verify.processing import process_logits

    do_sample = sampling.get("do_sample")
    _check_bool("sampling.do_sample", do_sample)
    base = {"do_sample": do_sample, "max_new_tokens": max_new_tokens, "tokenizer": _NO_TOKENIZER}
    resolve_generation_args(None, 1, **base)  # max_new_tokens, by its own message
    path = _CONF / "sampling" / f"{option}.yaml"
    defaults = OmegaConf.to_container(OmegaConf.load(path)) if option and path.is_file() else {}
    sampling_only = {f.name for f in dataclasses.fields(SamplingParams)} - {"do_sample"}
    for key, value in sampling.items():
        if key == "do_sample" or value is None:
            continue
        if not do_sample and key in sampling_only and value != defaults.get(key):
            raise ValueError(
                f"sampling.{key}={value!r} is a sampling setting, but sampling.do_sample=false decodes greedily and "
                "never reads it: add sampling=sample to sample with it, or drop it."
            )

        def one(key=key, value=value):
            args = resolve_generation_args(None, 1, **base, **{key: value})
            if do_sample:
                process_logits(torch.zeros(1, 4), args.sampling)  # HF's warpers check their values

        _named(one, "sampling", {key: value})
    rest = {k: v for k, v in sampling.items() if k != "do_sample"}
    return _named(lambda: resolve_generation_args(None, 1, **base, **rest).sampling, "sampling", rest, option)


def _named(fn, group: str | None, values: Mapping, option: str | None = None):
    """``fn()``, its ``ValueError`` / ``TypeError`` re-raised as a ``ValueError`` whose message names the config key
    (see :func:`_qualify`)."""
    try:
        return fn()
    except (ValueError, TypeError) as err:
        if isinstance(err, FileNotFoundError):
            raise
        raise ValueError(_qualify(str(err), group, values, option)) from err


def _qualify(message: str, group: str | None, values: Mapping, option: str | None = None) -> str:
    """A library message with its value named by the config key: ``DDTree(budget=0): ...`` -> ``tree.budget=0:
    ...``, ``NGramDrafter: max_ngram=...`` -> ``drafter.max_ngram=...``, ``top_k=...`` -> ``sampling.top_k=...``,
    HF's ``min_p has to be ...`` -> ``sampling.min_p=5: min_p has to be ...``; a message that names no key of
    ``values`` is prefixed with ``group=option`` (or the one key of ``values``)."""
    prefix = f"{group}." if group else ""
    if group and message.startswith((f"{group}.", f"{group}=")):
        return message
    found = re.match(r"\w+\((\w+)=(.*?)\): ", message)  # Class(key=value): ...
    if found and found[1] in values:
        return f"{prefix}{found[1]}={found[2]}: {message[found.end() :]}"
    found = re.match(r"(?:\w+: )?(\w+)=", message)  # key=value ... or Class: key=value ...
    if found and found[1] in values:
        return prefix + message[found.start(1) :]
    found = re.match(r"`?(\w+)\b`?", message)  # `key` has to be ... / key needs ...
    key = found[1] if found and found[1] in values else next(iter(values)) if len(values) == 1 else None
    if key is not None:
        return f"{prefix}{key}={values[key]!r}: {message}"
    return f"{group}={option}: {message}" if option else message


def _check_int(key: str, value, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{key}={value!r}: give an int ({what}), e.g. {key}=0.")


def _check_bool(key: str, value, also: str = "") -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{key}={value!r}: give true or false{' ' + also if also else ''}.")


def left_pad(tokenizer) -> None:
    """Make ``tokenizer`` pad batches on the left (as ``generate`` takes them); a tokenizer without a pad token pads
    with its EOS token, as HF does."""
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError("prompts.batch_size > 1 pads prompts: the tokenizer has neither a pad nor an EOS token.")
        tokenizer.pad_token = tokenizer.eos_token


def _fast_path_kwargs(c: Mapping) -> dict:
    """``cuda_graphs`` / ``compile`` for ``generate``, only where the config sets them."""
    return {k: c[k] for k in ("cuda_graphs", "compile") if c.get(k) is not None}


def run_generate(c: dict, output_dir: str | os.PathLike | None = None) -> list[dict]:
    """Decode the configured prompts; print a table; write ``generations.jsonl`` and ``stats.jsonl``.

    Args:
        c (dict): the resolved generate config (``config.yaml`` plus its groups) as plain containers, its values
            checked (:func:`run_command` runs :func:`check_values` first).
        output_dir (str | PathLike | None): where the JSONL files go (the hydra run folder); None writes none.

    Returns:
        list[dict]: one record per prompt: ``id``, ``prompt``, ``completion``, ``tokens`` and ``stats``.
    """
    import torch
    from rich.console import Console
    from transformers import AutoTokenizer

    import specdec
    from specdec.distributed import rank
    from specdec.loading import build_drafter, build_tree, load_prompts, load_target, resolve_device, resolve_model_path

    torch.set_num_threads(resolve_threads(c["threads"]))
    device, dtype = resolve_device(c["device"], c["dtype"])
    target = c["target"]
    model = _loading("target.path", target["path"], lambda: load_target(
        target["path"], device=device, dtype=dtype, attn_implementation=target["attn_implementation"],
        tp_plan=target.get("tp_plan")))  # fmt: skip
    device = model.get_input_embeddings().weight.device  # a sharded target sits on its rank's device
    lead = rank() == 0  # under torchrun every rank decodes; the first one reports and writes
    path = resolve_model_path(target["tokenizer"], what="tokenizer folder (target.tokenizer)")
    tok = _loading("target.tokenizer", target["tokenizer"], lambda: AutoTokenizer.from_pretrained(path))
    drafter_cfg, tree_cfg = dict(c["drafter"]), dict(c["tree"])
    name = drafter_cfg.pop("name")
    drafter = _loading("drafter.path", drafter_cfg.get("path"), lambda: build_drafter(name, model, **drafter_cfg))
    tree = build_tree(tree_cfg.pop("name"), **tree_cfg)
    verifier = build_rule(**c["verifier"])
    spec = specdec.SpeculativeModel(model, drafter=drafter, tree=tree, verifier=verifier, hybrid_mode=c["hybrid_mode"])
    prompts = load_prompts(c["prompts"]["path"], limit=c["prompts"]["limit"], text=c["prompts"]["text"])
    batch_size = c["prompts"].get("batch_size", 1)
    if batch_size > 1:
        left_pad(tok)
    gen = torch.Generator(device=device).manual_seed(int(c["seed"]))
    console, records = Console(), []
    for start in range(0, len(prompts), batch_size):
        batch = prompts[start : start + batch_size]
        enc = tok([row["prompt"] for row in batch], return_tensors="pt", padding=len(batch) > 1)
        ids = enc.input_ids.to(device)
        mask = enc.attention_mask.to(device) if len(batch) > 1 else None
        out = spec.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=c["max_new_tokens"],
            generator=gen,
            return_dict_in_generate=True,
            tokenizer=tok,  # for sampling.stop_strings
            **c["sampling"],
            **_fast_path_kwargs(c),
        )
        row_stats = out.stats.rows or [out.stats]
        for b, row in enumerate(batch):
            new = out.sequences[b, ids.shape[1] :][: row_stats[b].new_tokens].tolist()
            stats = _stats_record(out.stats) if len(batch) == 1 else _row_record(out.stats, b)
            if batch_size > 1:
                stats.update(batch=start // batch_size, batch_size=len(batch))
            records.append(
                {"id": row["id"], "prompt": row["prompt"], "completion": tok.decode(new), "tokens": new, "stats": stats}
            )
            if c["show_text"] and lead:
                console.rule(str(row["id"]))
                console.print(row["prompt"], style="dim", end="", markup=False, highlight=False)
                console.print(records[-1]["completion"], style="bold", markup=False, highlight=False)
    title = f"specdec: {type(drafter).__name__ if drafter else 'AR'} / {tree}"
    if batch_size > 1:
        title += f", {batch_size} prompts per call (prefill ms, rounds ms and tok/s are the call's)"
    if lead:
        console.print(_table(records, title, batched=batch_size > 1))
    if output_dir is not None and lead:
        _write_jsonl(Path(output_dir) / "generations.jsonl", [{k: r[k] for k in r if k != "stats"} for r in records])
        _write_jsonl(Path(output_dir) / "stats.jsonl", [{"id": r["id"], **r["stats"]} for r in records])
    return records


def _loading(key: str, value, load):
    """``load()``; an ``OSError`` of the hub (an id it cannot reach or does not have) or of the files names ``key``."""
    try:
        return load()
    except OSError as err:
        if isinstance(err, FileNotFoundError) and key.split(".")[0] in str(err):  # resolve_model_path named it
            raise
        first = " ".join(str(err).split())
        raise ValueError(f"{key}={value!r} could not be loaded: {first} Give a local folder, or a hub id that this "
                         "machine can download (or has in its cache).") from err  # fmt: skip


def build_rule(name: str | None = None, **settings):
    """The ``verifier`` group's rule: None (the library's default) or ``specdec.verify.RULES[name](**settings)``."""
    if name is None:
        return None
    from specdec.verify import RULES

    if name not in RULES:
        raise ValueError(f"Unknown verifier {name!r}; choose one of {', '.join(sorted(RULES))}.")
    return RULES[name](**settings)


def _stats_record(stats) -> dict:
    record = stats.as_dict()
    decode_s = sum(v for k, v in stats.phase_ms.items() if k not in ("prefill", "build")) / 1e3
    record["decode_tok_s"] = max(stats.new_tokens - 1, 0) / decode_s if decode_s > 0 else None
    for name, default in (("capture_ms", 0.0), ("compile_ms", 0.0), ("path", None)):
        record[name] = getattr(stats, name, default)
    return record


def _row_record(stats, b: int) -> dict:
    """Row ``b`` of a batch call: its own counts (``rounds``, ``tau``, ``accept_*``, ``new_tokens``,
    ``target_forwards``, ``tree_nodes``); the timings, the path and ``decode_tok_s`` (all rows' tokens) are the
    call's, shared by its rows; ``batch_tau`` is the call's τ over every (row, round) pair."""
    record = {k: v for k, v in stats.rows[b].as_dict().items() if k != "rows"}
    call = _stats_record(stats)
    decode_s = sum(v for k, v in stats.phase_ms.items() if k not in ("prefill", "build")) / 1e3
    decode_tokens = sum(max(row.new_tokens - 1, 0) for row in stats.rows)
    record.update({k: call[k] for k in ("phase_ms", "path", "capture_ms", "compile_ms", "compile_fallbacks",
                                         "capture_fallbacks")})
    record.update(
        decode_tok_s=decode_tokens / decode_s if decode_s > 0 else None,
        batch_tau=stats.tau,
        batch_target_forwards=stats.target_forwards,
        draft_forwards=stats.draft_forwards,
    )
    return record


def _table(records: list[dict], title: str, batched: bool = False):
    from rich.table import Table

    table = Table(title=title)
    columns = ("prompt", "new", "rounds", "tau", "prefill ms", "rounds ms", "tok/s")
    for col in columns[:1] + (("batch",) if batched else ()) + columns[1:]:
        table.add_column(col, justify="right")
    for r in records:
        s = r["stats"]
        tok_s = "–" if s["decode_tok_s"] is None else f"{s['decode_tok_s']:.1f}"
        table.add_row(
            str(r["id"]),
            *([str(s["batch"])] if batched else []),
            str(s["new_tokens"]),
            str(s["rounds"]),
            f"{s['tau']:.2f}",
            f"{s['phase_ms'].get('prefill', 0):.0f}",
            f"{s['phase_ms'].get('round', 0):.0f}",
            tok_s,
        )
    return table


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        f.writelines(json.dumps(r, default=str) + "\n" for r in rows)
    logger.info("wrote %s", path)


def bench_settings(c: Mapping) -> dict:
    """The ``BenchConfig`` fields of a resolved ``bench.yaml`` config (groups mapped to plain paths)."""
    _check_limit(c["prompts"]["limit"])
    if c["prompts"].get("batch_size", 1) != 1:
        raise ValueError("bench decodes at its batch_sizes=[...] (e.g. 'batch_sizes=[1,8]'), not prompts.batch_size.")
    skip = {"target", "prompts", "num_prompts", "threads"}
    settings = {k: v for k, v in c.items() if k not in skip}
    settings.update(
        target=c["target"]["path"],
        tokenizer=c["target"]["tokenizer"],
        attn_implementation=c["target"]["attn_implementation"],
        tp_plan=c["target"].get("tp_plan"),
        dflash=c["target"].get("dflash"),
        prompts=c["prompts"]["path"],
        prompt_text=c["prompts"]["text"],
        num_prompts=c["prompts"]["limit"],
    )
    return settings


_TRAINED = ("dflash", "eagle3", "mtp")
_HEADS = ("eagle3", "mtp")  # trained drafters whose own settings live in a train.yaml node of their name
# top-level train.yaml keys that only DFlash reads (with drafter=eagle3 or mtp that node holds the head's own values
# of the names they share, such as seq_len, lr and out_dir)
_DFLASH_ONLY = ("num_layers", "num_attention_heads", "num_key_value_heads", "num_taps", "block_size",
                "mask_token_id", "num_anchors", "gamma")  # fmt: skip


def train_kind(c: Mapping) -> str:
    """The drafter a resolved ``train.yaml`` config trains (``dflash``, ``eagle3`` or ``mtp``), its other keys
    checked.

    The drafter group's own keys are decoding settings: they must keep their defaults (``drafter.path`` is the
    drafter generate would load, not a starting point: that is ``init_from``)."""
    from omegaconf import OmegaConf

    drafter = c.get("drafter") or {"name": "dflash"}
    kind = drafter.get("name")
    if kind not in _TRAINED:
        raise ValueError(
            f"train trains drafter=dflash, drafter=eagle3 or drafter=mtp, not drafter={kind}; pick one of them "
            "(other drafters need no training or are trained elsewhere)."
        )
    defaults = OmegaConf.load(_CONF / "drafter" / f"{kind}.yaml")
    for key, value in drafter.items():
        if key == "path" and kind in ("dflash", "mtp"):  # defaults that name the target's own files
            default = c["target"].get("dflash") if kind == "dflash" else c["target"]["path"]
        else:
            default = defaults.get(key)
        if value != default:
            hint = "start from a checkpoint with init_from=<folder>" if key == "path" else "drop it"
            raise ValueError(
                f"drafter.{key}={value!r} is a decoding setting of drafter={kind}, not one of train: {hint}; "
                f"train writes the new drafter to {kind + '.' if kind in _HEADS else ''}out_dir."
            )
    primary = OmegaConf.load(_CONF / "train.yaml")
    for node in _HEADS:
        unknown = sorted(set(c.get(node) or {}) - set(primary[node]))
        if unknown:
            raise ValueError(f"{node}.{unknown[0]} is not a setting of train ({node}.*: {', '.join(primary[node])}).")
        if node != kind:
            changed = [k for k, v in (c.get(node) or {}).items() if v != primary[node][k]]
            if changed:
                raise ValueError(f"{node}.{changed[0]} applies to drafter={node}: add drafter={node} or drop it.")
    if kind == "dflash":
        return kind
    what = "EAGLE-3 heads" if kind == "eagle3" else "MTP heads"
    # an MTP head's layer is the target's own: DFlash's taps and MLP width are not its settings either
    extra = ("target_layer_ids", "intermediate_size") if kind == "mtp" else ()
    for key in (*_DFLASH_ONLY, *extra, *primary[kind]):
        if key in c and c[key] != primary.get(key):
            where = f"set {kind}.{key}" if key in primary[kind] else f"drop it ({what} have one layer)"
            raise ValueError(f"{key} is a setting of drafter=dflash; for drafter={kind} {where}.")
    return kind


def train_settings(c: Mapping) -> dict:
    """The ``TrainConfig`` fields of a resolved ``train.yaml`` config (``Eagle3TrainConfig`` fields with
    ``drafter=eagle3``, ``MTPTrainConfig`` fields with ``drafter=mtp``); null keys take the defaults."""
    if c["prompts"]["text"] is not None:
        raise ValueError("train evaluates on a prompts file: use prompts=dev or prompts.path=<file.jsonl>.")
    _check_limit(c["prompts"]["limit"])
    if c["prompts"].get("batch_size", 1) != 1:
        raise ValueError("train evaluates prompt by prompt: drop prompts.batch_size.")
    if c["target"].get("tp_plan") is not None:
        raise ValueError("target.tp_plan shards the target of generate and bench, not train's: drop it.")
    corpus = c["corpus"]
    if corpus is None and c["corpus_cache"] is None:
        raise ValueError(
            "corpus is required: `python -m specdec train corpus=<file, folder or glob>` "
            "(a list [a,b] for several), or corpus_cache=<tokens.pt>."
        )
    kind = train_kind(c)
    skip = ("target", "prompts", "threads", "drafter", *_HEADS)
    raw = {k: v for k, v in c.items() if k not in skip}
    if kind in _HEADS:
        raw = {k: v for k, v in raw.items() if k not in _DFLASH_ONLY}
        if kind == "mtp":  # DFlash's taps and width (checked unchanged by train_kind)
            raw = {k: v for k, v in raw.items() if k not in ("target_layer_ids", "intermediate_size")}
        raw.update(c[kind])
    raw["corpus"] = [corpus] if isinstance(corpus, str) else corpus  # a string is one path, not its characters
    raw.update(
        target=c["target"]["path"],
        tokenizer=c["target"]["tokenizer"],
        eval_prompts=c["prompts"]["path"],
        eval_num_prompts=c["prompts"]["limit"],
    )
    return {k: tuple(v) if isinstance(v, list) else v for k, v in raw.items() if v is not None}


def run_command(command: str, cfg, choices: Mapping[str, str | None], output_dir: str | None = None):
    """Check the keys and values of a composed config (:func:`check_keys`, :func:`check_values`) and run
    ``command`` on it (the body of every hydra entry point)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        c = OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as err:  # e.g. seed=${nope}: an interpolation that does not resolve
        key = getattr(err, "full_key", None) or "a value"
        what = str(getattr(err, "msg", None) or err).splitlines()[0]  # without omegaconf's full_key / object_type
        raise ValueError(f"{key}: {what}; give a plain value or an interpolation that resolves.") from err
    c.pop("hydra", None)
    check_keys(c, choices, command)
    check_values(c, choices, command)
    if command == "generate":
        return run_generate(c, output_dir)
    import torch

    torch.set_num_threads(resolve_threads(c["threads"]))
    if command == "bench":
        from specdec.bench import main_bench

        settings = bench_settings(c)
        if settings.get("out_dir") is None:  # out_dir: null = the run's own folder (outputs/bench/<date>/<time>)
            settings["out_dir"] = output_dir
        return main_bench(settings)
    from specdec.train import train_dflash, train_eagle3, train_mtp

    kind = train_kind(c)
    return {"eagle3": train_eagle3, "mtp": train_mtp}.get(kind, train_dflash)(_train_config(c))


class _UserError(BaseException):
    """Carries a user error of a command out of hydra, which would print its traceback (a BaseException passes
    hydra's handlers untouched)."""

    def __init__(self, error: Exception) -> None:
        super().__init__(error)
        self.error = error


def _debug() -> bool:
    return os.environ.get("SPECDEC_DEBUG") == "1" or os.environ.get("HYDRA_FULL_ERROR") == "1"


def _one_line(error: BaseException) -> str:
    """The message of ``error`` on one line (hydra's list of options kept, its config search path dropped)."""
    lines = [ln.strip() for ln in str(error).split("Config search path:")[0].splitlines() if ln.strip()]
    text, listing = "", False
    for line in lines:
        if not text:
            text = line
        elif text.endswith(":"):
            text, listing = f"{text} {line}", True
        elif listing:
            text += f", {line}"
        else:
            text += f" {line}" if text.endswith((".", ";")) else f"; {line}"
    return text or type(error).__name__


def main() -> None:
    """``python -m specdec [COMMAND] [key=value ...]``; a user error exits with status 2 and one ``error:`` line."""
    import hydra
    from hydra.core.hydra_config import HydraConfig
    from hydra.errors import ConfigCompositionException, OverrideParseException

    command = "generate"
    if len(sys.argv) > 1 and sys.argv[1] in _COMMANDS:
        command = sys.argv.pop(1)
    _register_resolvers()
    # bad values; missing, unreadable or unreachable files and hub ids; checkpoint variants the drafters refuse
    user_errors = (ValueError, OSError, NotImplementedError)
    debug = _debug()

    def task(cfg) -> None:
        runtime = HydraConfig.get().runtime
        try:
            run_command(command, cfg, dict(runtime.choices), runtime.output_dir)
        except user_errors as err:
            if debug:
                raise
            raise _UserError(err) from err

    app = hydra.main(version_base="1.3", config_path="conf", config_name=_COMMANDS[command])(task)
    full_error = os.environ.get("HYDRA_FULL_ERROR")
    os.environ["HYDRA_FULL_ERROR"] = "1"  # hydra raises its own errors (composition, overrides) instead of printing
    try:
        app()
    except _UserError as failed:
        error = failed.error
    except (ConfigCompositionException, OverrideParseException) as err:
        if debug:
            raise
        error = err
    else:
        return
    finally:
        if full_error is None:
            os.environ.pop("HYDRA_FULL_ERROR", None)
        else:
            os.environ["HYDRA_FULL_ERROR"] = full_error
    sys.stderr.write(f"error: {_one_line(error)}\n")
    sys.exit(2)


if __name__ == "__main__":
    main()
