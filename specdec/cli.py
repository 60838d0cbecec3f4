"""``python -m specdec``: hydra entry points (generate, bench, train). The only module that knows hydra.

python -m specdec target=dense drafter=ngram tree=chain tree.k=6 sampling=greedy
python -m specdec -m tree=ddtree tree.budget=8,16,32          # multirun sweep
python -m specdec bench ...   |   python -m specdec train ...
"""

from __future__ import annotations

import logging
import sys

import torch

logger = logging.getLogger("specdec")

_COMMANDS = {"generate": "config", "bench": "bench", "train": "train"}


def _run_generate(cfg) -> None:
    from omegaconf import OmegaConf
    from rich.console import Console
    from rich.table import Table
    from transformers import AutoTokenizer

    import specdec
    from specdec.loading import build_drafter, build_tree, load_prompts, load_target, resolve_device

    c = OmegaConf.to_container(cfg, resolve=True)
    device, dtype = resolve_device(c["device"], c["dtype"])
    target = load_target(
        c["target"]["path"], device=device, dtype=dtype, attn_implementation=c["target"]["attn_implementation"]
    )
    tok = AutoTokenizer.from_pretrained(c["target"]["tokenizer"])
    drafter = build_drafter(c["drafter"].pop("name"), target, **c["drafter"])
    tree = build_tree(c["tree"].pop("name"), **c["tree"])
    prompts = load_prompts(c["prompts"]["path"], limit=c["prompts"]["limit"], text=c["prompts"]["text"])
    gen = torch.Generator(device=device).manual_seed(int(c["seed"]))
    console = Console()
    table = Table(title=f"specdec: {type(drafter).__name__ if drafter else 'AR'} / {tree}")
    for col in ("prompt", "new", "rounds", "tau", "draft ms", "verify ms", "tok/s"):
        table.add_column(col, justify="right")
    for row in prompts:
        ids = tok(row["prompt"], return_tensors="pt").input_ids.to(device)
        out = specdec.generate(
            target, ids, drafter=drafter, tree=tree, max_new_tokens=c["max_new_tokens"], generator=gen, **c["sampling"]
        )
        s = out.stats
        if c["show_text"]:
            console.rule(str(row["id"]))
            console.print(row["prompt"], style="dim", end="")
            console.print(tok.decode(out.sequences[0, ids.shape[1] :]), style="bold", markup=False, highlight=False)
        total_s = sum(v for k, v in s.phase_ms.items() if k != "prefill" and k != "build") / 1e3
        table.add_row(
            str(row["id"]),
            str(s.new_tokens),
            str(s.rounds),
            f"{s.tau:.2f}",
            f"{s.phase_ms.get('draft', 0):.0f}",
            f"{s.phase_ms.get('verify', 0):.0f}",
            f"{s.new_tokens / max(total_s, 1e-9):.1f}",
        )
    console.print(table)


def _run_bench(cfg) -> None:
    from omegaconf import OmegaConf

    from specdec.bench import main_bench

    main_bench(OmegaConf.to_container(cfg, resolve=True))


def _run_train(cfg) -> None:
    from omegaconf import OmegaConf

    from specdec.train import TrainConfig, train_dflash

    raw = {k: v for k, v in OmegaConf.to_container(cfg, resolve=True).items() if v is not None}
    raw = {k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()}
    train_dflash(TrainConfig(**raw))


def main() -> None:
    import hydra

    command = "generate"
    if len(sys.argv) > 1 and sys.argv[1] in _COMMANDS:
        command = sys.argv.pop(1)
    runner = {"generate": _run_generate, "bench": _run_bench, "train": _run_train}[command]
    hydra.main(version_base="1.3", config_path="conf", config_name=_COMMANDS[command])(runner)()


if __name__ == "__main__":
    main()
