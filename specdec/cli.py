"""``python -m specdec``: hydra entry points (generate, bench, train). The only module that knows hydra.

python -m specdec target=dense drafter=ngram tree=chain tree.k=6 sampling=greedy
python -m specdec -m drafter=dflash tree=ddtree tree.budget=8,16,32      # multirun sweep
python -m specdec bench target=hybrid num_prompts=5   |   python -m specdec train corpus=src/

Every command composes the same config groups (``target``, ``prompts``; ``generate`` also ``drafter``, ``tree``,
``sampling``, ``verifier``); a key that the chosen group option does not define is an error, never silently ignored.

A user error (a bad key or value, a missing file) prints one ``error: ...`` line and exits with status 2;
``SPECDEC_DEBUG=1`` (or hydra's ``HYDRA_FULL_ERROR=1``) shows the traceback instead. torch and transformers load
only when a command runs, so ``--help`` stays fast.
"""

from __future__ import annotations

import json
import logging
import os
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
        c (dict): the resolved generate config (``config.yaml`` plus its groups) as plain containers.
        output_dir (str | PathLike | None): where the JSONL files go (the hydra run folder); None writes none.

    Returns:
        list[dict]: one record per prompt: ``id``, ``prompt``, ``completion``, ``tokens`` and ``stats``.
    """
    import torch
    from rich.console import Console
    from transformers import AutoTokenizer

    import specdec
    from specdec.distributed import rank
    from specdec.loading import build_drafter, build_tree, load_prompts, load_target, resolve_device

    _check_limit(c["prompts"]["limit"])
    _check_batch_size(c["prompts"].get("batch_size", 1))
    torch.set_num_threads(resolve_threads(c["threads"]))
    device, dtype = resolve_device(c["device"], c["dtype"])
    target = c["target"]
    model = load_target(target["path"], device=device, dtype=dtype, attn_implementation=target["attn_implementation"],
                        tp_plan=target.get("tp_plan"))  # fmt: skip
    device = model.get_input_embeddings().weight.device  # a sharded target sits on its rank's device
    lead = rank() == 0  # under torchrun every rank decodes; the first one reports and writes
    tok = AutoTokenizer.from_pretrained(target["tokenizer"])
    drafter_cfg, tree_cfg = dict(c["drafter"]), dict(c["tree"])
    drafter = build_drafter(drafter_cfg.pop("name"), model, **drafter_cfg)
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
    record.update({k: call[k] for k in ("phase_ms", "path", "capture_ms", "compile_ms", "compile_fallbacks")})
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
    """Check the keys of a composed config and run ``command`` on it (the body of every hydra entry point)."""
    from omegaconf import OmegaConf

    c = OmegaConf.to_container(cfg, resolve=True)
    c.pop("hydra", None)
    check_keys(c, choices, command)
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
    from specdec.train import Eagle3TrainConfig, MTPTrainConfig, TrainConfig, train_dflash, train_eagle3, train_mtp

    settings = train_settings(c)
    kind = train_kind(c)
    if kind == "eagle3":
        return train_eagle3(Eagle3TrainConfig(**settings))
    if kind == "mtp":
        return train_mtp(MTPTrainConfig(**settings))
    return train_dflash(TrainConfig(**settings))


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
    user_errors = (ValueError, FileNotFoundError, FileExistsError)
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
