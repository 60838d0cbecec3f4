"""Building the pieces of a run from plain settings: target, tokenizer, drafter, tree, prompts.

Shared by the CLI and the benchmark harness; takes plain values (no hydra here). Local paths resolve
independently of the working directory (``specdec.paths``); only an ``owner/name`` id reaches the hub.

Where models come from: the project ships the zoo's dense target, its tokenizer and the dev prompts
(``assets/zoo``) and the DFlash drafters (``assets/drafters``); :func:`asset_path` finds them in a source
checkout and in an installed wheel (``specdec/assets``). The rest of the zoo (the hybrid target) comes from
``$SPECDEC_ZOO`` (:func:`zoo_dir`); any model folder or hub id works as well.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import torch

from specdec.paths import asset_roots, is_local_path, repo_root, resolve_path, shipped_zoo, zoo_dir
from specdec.trees import Chain, DDTree
from specdec.trees import TreePolicy as TreeSpec

__all__ = [
    "asset_path",
    "build_drafter",
    "build_tree",
    "load_prompts",
    "load_target",
    "load_tokenizer",
    "resolve_device",
    "resolve_model_path",
    "zoo_dir",
    "zoo_path",
]

logger = logging.getLogger(__name__)

ZOO_ENV = "SPECDEC_ZOO"


def asset_path(name: str | os.PathLike = "") -> Path:
    """A file or folder that ships with the project: ``assets/<name>`` of a source checkout, or
    ``specdec/assets/<name>`` of an installed wheel (``pip install .``), whatever the working directory.

    Args:
        name: relative to ``assets/``, e.g. ``"drafters/zoo-dense"`` or ``"zoo/target-dense"``.

    Raises:
        FileNotFoundError: naming the places tried.
    """
    tried = [root / name for root in asset_roots()]
    for candidate in tried:
        if candidate.exists():
            return candidate
    raise FileNotFoundError(
        f"No project asset {os.fspath(name)!r} (tried {', '.join(map(str, tried))}). The assets ship with a clone "
        "of the project and with a wheel built from one (pip install <clone>); reinstall from a full clone."
    )


def _shipped_zoo() -> Path | None:
    return shipped_zoo()


def _missing_from_zoo(name: str, zoo: Path) -> str:
    shipped = _shipped_zoo()
    ships = ", ".join(sorted(p.name for p in shipped.iterdir() if p.name != "README.md")) if shipped else "nothing"
    return (
        f"{name!r} is not in the zoo at {zoo} and does not ship with the project (assets/zoo holds {ships}). "
        f"Fix: set {ZOO_ENV} to a zoo folder that holds {name} (export {ZOO_ENV}=/path/to/zoo), or give a model "
        "folder or a hub id instead (e.g. target.path=Qwen/Qwen3-8B)."
    )


def zoo_path(name: str) -> Path:
    """``name`` (``target-dense``, ``target-hybrid``, ``tokenizer``, ``prompts_dev.jsonl``) in :func:`zoo_dir`, else
    in the shipped ``assets/zoo``.

    Raises:
        FileNotFoundError: naming ``SPECDEC_ZOO`` and the fix, when neither holds it.
    """
    zoo, shipped = zoo_dir(), _shipped_zoo()
    for base in (zoo, shipped):
        if base is not None and (base / name).exists():
            return base / name
    raise FileNotFoundError(_missing_from_zoo(name, zoo))


def _zoo_item(path: Path) -> str | None:
    """The zoo item a missing path asks for: a bare name, or a child of the zoo folder (``${zoo:...}``)."""
    if not path.is_absolute():
        return str(path) if len(path.parts) == 1 else None
    parents = {zoo_dir(), repo_root().parent / "shared" / "zoo", *filter(None, [_shipped_zoo()])}
    return path.name if path.parent in parents else None


def _resolve_local(path: str | os.PathLike, *, what: str) -> Path:
    """:func:`specdec.paths.resolve_path`, then the shipped assets: ``assets/...`` (also the checkout's absolute
    ``<project>/assets/...`` when the package is installed elsewhere) and zoo items (:func:`zoo_path`)."""
    try:
        return resolve_path(path, what=what)
    except FileNotFoundError as err:
        given = Path(path).expanduser()
        checkout_assets = repo_root() / "assets"
        if given.parts[:1] == ("assets",) or given.is_relative_to(checkout_assets):
            rest = given.relative_to("assets" if not given.is_absolute() else checkout_assets)
            try:
                return asset_path(rest)
            except FileNotFoundError:
                pass  # maybe a zoo item the shipped part lacks: named below
        item = _zoo_item(given)
        if item is None:
            raise err from None
        try:
            return zoo_path(item)
        except FileNotFoundError as missing:
            raise FileNotFoundError(f"{err} {missing}") from None


def resolve_model_path(path: str | Path, *, what: str = "model folder") -> str:
    """A local folder (resolved wherever the working directory is) or a hub id ``owner/name``, as a string.

    A local-looking path (``./x``, ``/x``, ``x/y/z``, an existing parent folder, ...) that does not exist raises
    ``FileNotFoundError`` naming the paths tried; it is never sent to the hub. ``assets/...`` and the zoo's items
    (``target-dense``, ``tokenizer``, ...) fall back to what ships with the project; a zoo item that does not ship
    (``target-hybrid``) is an error naming ``SPECDEC_ZOO`` and the fix.
    """
    if is_local_path(path) or Path(path).exists():
        return str(_resolve_local(path, what=what))
    return str(path)


def resolve_device(device: str | None = "auto", dtype: str | None = "auto") -> tuple[torch.device, torch.dtype]:
    """``"auto"`` (or ``None``) = the current accelerator if there is one, else CPU; ``"auto"`` (or ``None``)
    dtype = bf16 on an accelerator, fp32 on CPU."""
    if device in (None, "auto"):
        accelerator = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
        device = accelerator if accelerator is not None else "cpu"
    dev = torch.device(device)
    if dtype in (None, "auto"):
        return dev, torch.float32 if dev.type == "cpu" else torch.bfloat16
    return dev, getattr(torch, dtype)


def load_target(
    path: str | Path,
    *,
    device: torch.device,
    dtype: torch.dtype,
    attn_implementation: str = "sdpa",
    tp_plan: str | dict | None = None,
):
    """An HF causal LM from a local folder (see :func:`resolve_model_path`) or a hub id, in eval mode.

    ``tp_plan`` (e.g. ``"auto"``): shard it with HF's tensor-parallel plan over the ranks of ``torchrun``
    (``docs/distributed.md``); HF places each rank's shard (``device`` is then not used). A model without a plan,
    or whose heads the ranks do not divide, is refused with the fix."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from specdec.distributed import check_tp_plan, sharded_kwargs, world_size

    path = resolve_model_path(path, what="model folder")
    if Path(path).exists() and not Path(path).is_dir():
        raise FileNotFoundError(f"{path} is a file; target.path must be a model folder (config.json + weights).")
    if tp_plan is not None:
        check_tp_plan(AutoConfig.from_pretrained(path), world_size())
    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=dtype, attn_implementation=attn_implementation, **sharded_kwargs(tp_plan)
    )
    return (model if tp_plan is not None else model.to(device)).eval()


def load_tokenizer(path: str | Path):
    """An HF tokenizer from a local folder (see :func:`resolve_model_path`) or a hub id."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_model_path(path, what="tokenizer folder"))


def load_prompts(path: str | Path | None = None, *, limit: int | None = None, text: str | None = None) -> list[dict]:
    """Prompts as ``{"id", "prompt", ...}`` dicts from a JSONL file (default the zoo's dev prompts), or one
    literal ``text``; ``limit`` keeps the first prompts."""
    if text is not None:
        return [{"id": "text", "prompt": text}]
    path = zoo_path("prompts_dev.jsonl") if path is None else _resolve_local(path, what="prompts file")
    if not Path(path).is_file():
        raise FileNotFoundError(f"No prompts file at {path}; give prompts.path (JSONL with a 'prompt' field).")
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    for i, row in enumerate(rows):
        row.setdefault("id", str(i))
        if "prompt" not in row:
            raise ValueError(f"{path}: line {i + 1} has no 'prompt' field.")
    return rows[:limit] if limit else rows


def _whole(value, key: str, hint: str = ""):
    """``value`` as an int when it is one (a whole float or digits included), else ``ValueError`` naming
    ``tree.<key>``."""
    if isinstance(value, bool):
        ok = False
    elif isinstance(value, int):
        return value
    else:
        ok = isinstance(value, float) and value.is_integer() or isinstance(value, str) and value.strip().isdigit()
    if not ok:
        raise ValueError(f"tree.{key}={value!r}: pass a whole number >= 1{hint} (e.g. tree.{key}=15).")
    return int(value)


def build_tree(name: str, **kw) -> TreeSpec:
    if name == "chain":
        return Chain(k=_whole(kw.get("k", 4), "k"))
    if name == "ddtree":
        topk, budget = kw.get("topk"), kw.get("budget", 15)
        sizes = tuple(_whole(s, "sizes") for s in kw.get("sizes", DDTree.sizes))
        budget = budget if budget == "auto" else _whole(budget, "budget", " or auto")
        return DDTree(budget=budget, topk=None if topk is None else _whole(topk, "topk"), sizes=sizes,
                      candidates=bool(kw.get("candidates", False)))  # fmt: skip
    from specdec.trees import TREES

    if name in TREES:  # a registered policy takes its settings as keyword arguments
        return TREES[name](**kw)
    raise ValueError(f"Unknown tree {name!r}; choose one of {', '.join(sorted(TREES))}.")


def build_drafter(name: str, target, **kw):
    """A drafter by name: ``none``, ``ngram``, ``model`` (``path`` or ``truncate_layers``), ``dflash`` (``path``,
    ``strict``), ``eagle3`` (``path``, ``tree_depth``) or ``mtp`` (``path``: the checkpoint holding the ``mtp.*``
    tensors, ``tree_depth``; ``init: random`` for a random head). Paths resolve as in :func:`resolve_model_path`
    (``assets/drafters/zoo-dense`` from any folder)."""
    if name == "none":
        return None
    if name == "ngram":
        from specdec.drafters.ngram import NGramDrafter

        return NGramDrafter(**{k: int(v) for k, v in kw.items() if k in ("max_ngram", "min_ngram", "max_matches")})
    if name == "model":
        from specdec.drafters.model import ModelDrafter

        depth = int(kw.get("tree_depth", 8))
        if kw.get("path"):
            device, dtype = target.device, target.dtype
            draft = load_target(kw["path"], device=device, dtype=dtype, attn_implementation="sdpa")
            return ModelDrafter(draft, tree_depth=depth)
        return ModelDrafter.from_target_layers(target, int(kw.get("truncate_layers", 2)), tree_depth=depth)
    if name == "dflash":
        from specdec.drafters.dflash import DFlashDrafter

        if not kw.get("path"):
            raise ValueError("drafter=dflash needs a checkpoint: drafter.path=<folder or hub id owner/name>.")
        path = resolve_model_path(kw["path"], what="DFlash checkpoint folder")
        return DFlashDrafter.from_pretrained(path, target=target, strict=bool(kw.get("strict", False)))
    if name == "eagle3":
        from specdec.drafters.eagle3 import Eagle3Drafter

        if not kw.get("path"):
            raise ValueError("drafter=eagle3 needs a checkpoint: drafter.path=<folder or hub id owner/name>.")
        path = resolve_model_path(kw["path"], what="EAGLE-3 checkpoint folder")
        return Eagle3Drafter.from_pretrained(path, target=target, tree_depth=int(kw.get("tree_depth", 8)))
    if name == "mtp":
        from specdec.drafters.mtp import MTPDrafter

        depth = int(kw.get("tree_depth", 8))
        if kw.get("init") == "random":
            return MTPDrafter.random(target, seed=int(kw.get("seed", 0)), tree_depth=depth)
        if kw.get("init") is not None:
            raise ValueError(f"drafter.init={kw['init']!r}: use null (the checkpoint's head) or random.")
        if not kw.get("path"):
            raise ValueError("drafter=mtp needs the checkpoint holding mtp.* tensors: drafter.path=<folder or hub id>.")
        path = resolve_model_path(kw["path"], what="checkpoint folder with mtp.* tensors")
        return MTPDrafter.from_pretrained(path, target=target, tree_depth=depth)
    raise ValueError(f"Unknown drafter {name!r}; choose none, ngram, model, dflash, eagle3 or mtp.")
