"""``python -m specdec``: hydra entry points (generate, bench, train). The only module that knows hydra.

python -m specdec target=dense drafter=ngram tree=chain tree.k=6 sampling=greedy
python -m specdec -m drafter=dflash tree=ddtree tree.budget=8,16,32      # multirun sweep
python -m specdec bench target=hybrid num_prompts=5   |   python -m specdec train corpus=src/

Every command composes the same config groups (``target``, ``prompts``; ``generate`` also ``drafter``, ``tree``,
``sampling``); a key that the chosen group option does not define is an error, never silently ignored.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Mapping
from pathlib import Path

import torch

logger = logging.getLogger("specdec")

_COMMANDS = {"generate": "config", "bench": "bench", "train": "train"}
_GROUPS = ("target", "drafter", "tree", "sampling", "prompts")
_CONF = Path(__file__).resolve().parent / "conf"
_PROJECT = Path(__file__).resolve().parents[1]


def _register_resolvers() -> None:
    from omegaconf import OmegaConf

    from specdec.loading import zoo_dir

    OmegaConf.register_new_resolver("zoo", lambda name: str(zoo_dir() / name), replace=True)
    OmegaConf.register_new_resolver("asset", lambda name: str(_PROJECT / "assets" / name), replace=True)


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
    allowed = (set(primary) - {"defaults", "hydra"}) | {g for g in _GROUPS if g in cfg}
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
    from rich.console import Console
    from transformers import AutoTokenizer

    import specdec
    from specdec.loading import build_drafter, build_tree, load_prompts, load_target, resolve_device

    _check_limit(c["prompts"]["limit"])
    torch.set_num_threads(resolve_threads(c["threads"]))
    device, dtype = resolve_device(c["device"], c["dtype"])
    target = c["target"]
    model = load_target(target["path"], device=device, dtype=dtype, attn_implementation=target["attn_implementation"])
    tok = AutoTokenizer.from_pretrained(target["tokenizer"])
    drafter_cfg, tree_cfg = dict(c["drafter"]), dict(c["tree"])
    drafter = build_drafter(drafter_cfg.pop("name"), model, **drafter_cfg)
    tree = build_tree(tree_cfg.pop("name"), **tree_cfg)
    spec = specdec.SpeculativeModel(model, drafter=drafter, tree=tree, hybrid_mode=c["hybrid_mode"])
    prompts = load_prompts(c["prompts"]["path"], limit=c["prompts"]["limit"], text=c["prompts"]["text"])
    gen = torch.Generator(device=device).manual_seed(int(c["seed"]))
    console, records = Console(), []
    for row in prompts:
        ids = tok(row["prompt"], return_tensors="pt").input_ids.to(device)
        out = spec.generate(
            ids,
            max_new_tokens=c["max_new_tokens"],
            generator=gen,
            return_dict_in_generate=True,
            **c["sampling"],
            **_fast_path_kwargs(c),
        )
        new = out.sequences[0, ids.shape[1] :].tolist()
        records.append(
            {
                "id": row["id"],
                "prompt": row["prompt"],
                "completion": tok.decode(new),
                "tokens": new,
                "stats": _stats_record(out.stats),
            }
        )
        if c["show_text"]:
            console.rule(str(row["id"]))
            console.print(row["prompt"], style="dim", end="", markup=False, highlight=False)
            console.print(records[-1]["completion"], style="bold", markup=False, highlight=False)
    console.print(_table(records, f"specdec: {type(drafter).__name__ if drafter else 'AR'} / {tree}"))
    if output_dir is not None:
        _write_jsonl(Path(output_dir) / "generations.jsonl", [{k: r[k] for k in r if k != "stats"} for r in records])
        _write_jsonl(Path(output_dir) / "stats.jsonl", [{"id": r["id"], **r["stats"]} for r in records])
    return records


def _stats_record(stats) -> dict:
    record = stats.as_dict()
    decode_s = sum(v for k, v in stats.phase_ms.items() if k not in ("prefill", "build")) / 1e3
    record["decode_tok_s"] = max(stats.new_tokens - 1, 0) / decode_s if decode_s > 0 else None
    for name, default in (("capture_ms", 0.0), ("compile_ms", 0.0), ("path", None)):
        record[name] = getattr(stats, name, default)
    return record


def _table(records: list[dict], title: str):
    from rich.table import Table

    table = Table(title=title)
    for col in ("prompt", "new", "rounds", "tau", "draft ms", "verify ms", "tok/s"):
        table.add_column(col, justify="right")
    for r in records:
        s = r["stats"]
        tok_s = "–" if s["decode_tok_s"] is None else f"{s['decode_tok_s']:.1f}"
        table.add_row(
            str(r["id"]),
            str(s["new_tokens"]),
            str(s["rounds"]),
            f"{s['tau']:.2f}",
            f"{s['phase_ms'].get('draft', 0):.0f}",
            f"{s['phase_ms'].get('verify', 0):.0f}",
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
    skip = {"target", "prompts", "num_prompts", "threads"}
    settings = {k: v for k, v in c.items() if k not in skip}
    settings.update(
        target=c["target"]["path"],
        tokenizer=c["target"]["tokenizer"],
        attn_implementation=c["target"]["attn_implementation"],
        dflash=c["target"].get("dflash"),
        prompts=c["prompts"]["path"],
        prompt_text=c["prompts"]["text"],
        num_prompts=c["prompts"]["limit"],
    )
    return settings


def train_settings(c: Mapping) -> dict:
    """The ``TrainConfig`` fields of a resolved ``train.yaml`` config; null keys take the defaults."""
    if c["prompts"]["text"] is not None:
        raise ValueError("train evaluates on a prompts file: use prompts=dev or prompts.path=<file.jsonl>.")
    _check_limit(c["prompts"]["limit"])
    corpus = c["corpus"]
    if corpus is None and c["corpus_cache"] is None:
        raise ValueError(
            "corpus is required: `python -m specdec train corpus=<file, folder or glob>` "
            "(a list [a,b] for several), or corpus_cache=<tokens.pt>."
        )
    raw = {k: v for k, v in c.items() if k not in ("target", "prompts", "threads")}
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
    torch.set_num_threads(resolve_threads(c["threads"]))
    if command == "bench":
        from specdec.bench import main_bench

        return main_bench(bench_settings(c))
    from specdec.train import TrainConfig, train_dflash

    return train_dflash(TrainConfig(**train_settings(c)))


def main() -> None:
    import hydra
    from hydra.core.hydra_config import HydraConfig

    command = "generate"
    if len(sys.argv) > 1 and sys.argv[1] in _COMMANDS:
        command = sys.argv.pop(1)
    _register_resolvers()

    def task(cfg) -> None:
        runtime = HydraConfig.get().runtime
        run_command(command, cfg, dict(runtime.choices), runtime.output_dir)

    hydra.main(version_base="1.3", config_path="conf", config_name=_COMMANDS[command])(task)()


if __name__ == "__main__":
    main()
