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
from collections.abc import Mapping
from pathlib import Path

import torch

from specdec.paths import asset_roots, is_local_path, repo_root, resolve_path, shipped_zoo, zoo_dir
from specdec.trees import Chain, DDTree
from specdec.trees import TreePolicy as TreeSpec

__all__ = [
    "asset_path",
    "build_drafter",
    "build_tree",
    "check_device",
    "check_drafter",
    "check_drafter_settings",
    "check_dtype",
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


DTYPES = ("float32", "bfloat16", "float16", "float64")
"""The dtype names a model loads in (``dtype=``); ``auto`` picks bfloat16 on an accelerator, float32 on CPU."""


def check_dtype(dtype, key: str = "dtype", unset: str = "auto") -> torch.dtype:
    """The torch dtype ``dtype`` names (one of ``DTYPES``, or its alias such as ``half``); ``key`` and ``unset`` (the
    value that picks the default) word the error.

    Raises:
        ValueError: naming ``key``, the value given and the names to use.
    """
    found = getattr(torch, dtype, None) if isinstance(dtype, str) else dtype
    if isinstance(found, torch.dtype) and found in {getattr(torch, name) for name in DTYPES}:
        return found
    what = "a floating-point dtype for the weights" if isinstance(found, torch.dtype) else "a torch dtype name"
    raise ValueError(f"{key}={dtype!r} is not {what}: use {unset} or one of {', '.join(DTYPES)}.")


def check_device(device) -> torch.device:
    """The torch device ``device`` names, refused unless this process can place a model there: ``cpu``, or the
    current accelerator (``cuda``, ``cuda:N``, ...; ``torch.accelerator``) with index below its device count.

    Raises:
        ValueError: naming ``device``, the value given and the devices to use.
    """
    fix = "use device=auto (the current accelerator, else cpu) or device=cpu"
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device={device!r} is not a torch device: {fix} (or cuda:N).") from None
    if dev.type == "cpu":
        return dev
    if dev.type == "meta":
        raise ValueError(f"device={device!r} holds shapes without data (nothing can be decoded there): {fix}.")
    accelerator = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    if accelerator is None or accelerator.type != dev.type:
        sees = f"a {accelerator.type} device" if accelerator is not None else "no accelerator"
        raise ValueError(f"device={device!r} but torch sees {sees} (torch {torch.__version__}): {fix}.")
    count = torch.accelerator.device_count()
    if dev.index is not None and dev.index >= count:
        raise ValueError(f"device={device!r} but torch sees {count} {dev.type} device(s) ({dev.type}:0 to "
                         f"{dev.type}:{count - 1}): pick one of them, or {fix}.")  # fmt: skip
    return dev


def resolve_device(device: str | None = "auto", dtype: str | None = "auto") -> tuple[torch.device, torch.dtype]:
    """``"auto"`` (or ``None``) = the current accelerator if there is one, else CPU; ``"auto"`` (or ``None``)
    dtype = bf16 on an accelerator, fp32 on CPU.

    Raises:
        ValueError: a device this process cannot use (:func:`check_device`) or a dtype name that is not one of
            ``DTYPES`` (:func:`check_dtype`), naming ``device=`` / ``dtype=`` and what to use instead.
    """
    if device in (None, "auto"):
        accelerator = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
        device = accelerator if accelerator is not None else "cpu"
    dev = check_device(device)
    if dtype in (None, "auto"):
        return dev, torch.float32 if dev.type == "cpu" else torch.bfloat16
    return dev, check_dtype(dtype)


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
    what = "prompts file (prompts.path)"
    path = zoo_path("prompts_dev.jsonl") if path is None else _resolve_local(path, what=what)
    if not Path(path).is_file():
        raise FileNotFoundError(f"No prompts file at {path}: give prompts.path=<a JSONL file with a 'prompt' field>.")
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
                      candidates=kw.get("candidates", False), clock=kw.get("clock", "device"),
                      lookahead=kw.get("lookahead", False))  # fmt: skip
    from specdec.trees import TREES

    if name in TREES:  # a registered policy takes its settings as keyword arguments
        return TREES[name](**kw)
    raise ValueError(f"Unknown tree {name!r}; choose one of {', '.join(sorted(TREES))}.")


DRAFTERS = ("none", "ngram", "model", "dflash", "eagle3", "mtp")
_DRAFTER_INTS = {"truncate_layers": 1, "tree_depth": 1, "seed": 0}  # NGramDrafter checks its own settings
_CHECKPOINTS = {"model": "draft model folder", "dflash": "DFlash checkpoint folder",
                "eagle3": "EAGLE-3 checkpoint folder", "mtp": "checkpoint folder with mtp.* tensors"}  # fmt: skip
_NEEDS_PATH = {
    "dflash": "drafter=dflash needs a checkpoint: drafter.path=<folder or hub id owner/name>.",
    "eagle3": "drafter=eagle3 needs a checkpoint: drafter.path=<folder or hub id owner/name>.",
    "mtp": "drafter=mtp needs the checkpoint holding mtp.* tensors: drafter.path=<folder or hub id>.",
}


def check_drafter_settings(name: str, settings: Mapping) -> None:
    """Refuse an unknown drafter or a setting of the wrong type or range, without loading or reading anything.

    Raises:
        ValueError: naming ``drafter.<key>``, the value given and what to use instead.
    """
    if name not in DRAFTERS:
        raise ValueError(f"Unknown drafter {name!r}; choose {', '.join(DRAFTERS[:-1])} or {DRAFTERS[-1]}.")
    if name == "ngram":  # NGramDrafter checks its own settings
        from specdec.drafters.ngram import NGramDrafter

        NGramDrafter(**{k: v for k, v in settings.items() if k in ("max_ngram", "min_ngram", "max_matches")})
        return
    for key, low in _DRAFTER_INTS.items():
        value = settings.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
            raise ValueError(f"drafter.{key}={value!r}: give an int >= {low}.")
    if settings.get("init") not in (None, "random"):
        raise ValueError(f"drafter.init={settings['init']!r}: use null (the checkpoint's head) or random.")
    path = settings.get("path")
    if path is not None and not isinstance(path, str | os.PathLike):
        raise ValueError(f"drafter.path={path!r}: give a folder or a hub id owner/name.")


def check_drafter(name: str, **kw) -> str | None:
    """Check a drafter's settings (:func:`check_drafter_settings`) and find its checkpoint, without loading it
    (what :func:`build_drafter` does first).

    Returns:
        str | None: the resolved checkpoint the drafter loads (see :func:`resolve_model_path`), None when it loads
        none (``none``, ``ngram``, ``model`` without ``path``, ``mtp`` with ``init: random``).

    Raises:
        ValueError: an unknown drafter, a bad setting, or a drafter that needs ``drafter.path`` without one.
        FileNotFoundError: a local-looking ``path`` that does not exist, naming the paths tried.
    """
    check_drafter_settings(name, kw)
    if name in ("none", "ngram") or (name == "mtp" and kw.get("init") == "random"):
        return None
    if not kw.get("path"):
        if name == "model":
            return None
        raise ValueError(_NEEDS_PATH[name])
    path = resolve_model_path(kw["path"], what=f"{_CHECKPOINTS[name]} (drafter.path)")
    if name == "model":
        _refuse_drafter_checkpoint(path)
    return path


def _refuse_drafter_checkpoint(path) -> None:
    """``drafter=model`` loads a causal LM: a local DFlash or EAGLE-3 checkpoint would load as one with its LM head and
    embedding missing (randomly initialised) and draft noise; name the drafter that reads it instead."""
    config = Path(path) / "config.json"
    if not config.is_file():
        return
    raw = json.loads(config.read_text())
    arch = (raw.get("architectures") or [""])[0]
    if "dflash_config" in raw or arch == "DFlashDraftModel":
        kind = "dflash"
    elif "draft_vocab_size" in raw or "eagle_config" in raw or raw.get("speculators_model_type") == "eagle3":
        kind = "eagle3"
    else:
        return
    what = "a DFlash drafter" if kind == "dflash" else "an EAGLE-3 head"
    raise ValueError(
        f"drafter.path={str(path)!r} is {what} checkpoint, not a causal LM that drafter=model can load: use "
        f"drafter={kind} drafter.path={path}."
    )


def build_drafter(name: str, target, **kw):
    """A drafter by name: ``none``, ``ngram``, ``model`` (``path`` or ``truncate_layers``), ``dflash`` (``path``,
    ``strict``), ``eagle3`` (``path``, ``tree_depth``) or ``mtp`` (``path``: the checkpoint holding the ``mtp.*``
    tensors, ``tree_depth``; ``init: random`` for a random head). Paths resolve as in :func:`resolve_model_path`
    (``assets/drafters/zoo-dense`` from any folder); the settings are checked first (:func:`check_drafter`)."""
    path = check_drafter(name, **kw)
    if name == "none":
        return None
    if name == "ngram":
        from specdec.drafters.ngram import NGramDrafter

        return NGramDrafter(**{k: v for k, v in kw.items() if k in ("max_ngram", "min_ngram", "max_matches")})
    depth = kw.get("tree_depth", 8)
    if name == "model":
        from specdec.drafters.model import ModelDrafter

        if path is not None:
            draft = load_target(path, device=target.device, dtype=target.dtype, attn_implementation="sdpa")
            return ModelDrafter(draft, tree_depth=depth)
        layers = kw.get("truncate_layers", 2)
        try:
            return ModelDrafter.from_target_layers(target, layers, tree_depth=depth)
        except ValueError as err:  # the layer count the target has: known only now
            raise ValueError(f"drafter.truncate_layers={layers!r}: {err}") from err
    if name == "dflash":
        from specdec.drafters.dflash import DFlashDrafter

        return DFlashDrafter.from_pretrained(path, target=target, strict=bool(kw.get("strict", False)))
    if name == "eagle3":
        from specdec.drafters.eagle3 import Eagle3Drafter

        return Eagle3Drafter.from_pretrained(path, target=target, tree_depth=depth)
    from specdec.drafters.mtp import MTPDrafter

    if kw.get("init") == "random":
        return MTPDrafter.random(target, seed=kw.get("seed", 0), tree_depth=depth)
    return MTPDrafter.from_pretrained(path, target=target, tree_depth=depth)
