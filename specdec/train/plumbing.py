"""The plumbing of a training run: finding the target, tokenizer and device; where the run writes.

Local paths resolve independently of the working directory (``specdec.paths``). A run writes into a hidden
folder beside ``out_dir``; its files move into ``out_dir`` only when it succeeds, so a failed run leaves no
half-written checkpoint there. Checkpoints in the staging folder are replaced file by file, so an interrupted
save never corrupts the previous one. Folders and files get the permissions of the process umask (0755 / 0644
under 022), like any file the run writes, not the private ones of temporary files.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import shutil
import tempfile
from pathlib import Path

import torch

from specdec.paths import is_local_path, resolve_path, zoo_dir

__all__ = [
    "Progress",
    "StagedOutput",
    "append_jsonl",
    "check_field_types",
    "cosine_lr_factor",
    "load_tokenizer",
    "path_tuple",
    "pick_device",
    "resolve_local",
]

logger = logging.getLogger(__name__)


def path_tuple(value) -> tuple[str, ...]:
    """A config's path list as a tuple of strings: None or "" -> (), one path -> (path,)."""
    if value is None:
        return ()
    if isinstance(value, str | os.PathLike):
        return (os.fspath(value),) if os.fspath(value) else ()
    return tuple(os.fspath(v) for v in value)


_SCALARS = {"int": ("an int", int), "float": ("a number", int | float), "bool": ("true or false", bool)}


def check_field_types(config, skip: tuple[str, ...] = ()) -> None:
    """Refuse a value of the wrong type in a training config's int, float and bool fields (``lr='abc'``), before
    anything runs: ``ValueError`` naming the field, the value given and the kind of value to give. ``skip``: the
    fields the config checks itself (with their ranges)."""
    for f in dataclasses.fields(config):
        if f.name in skip:
            continue
        text = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
        kind, _, optional = text.partition(" | ")
        if kind not in _SCALARS or optional not in ("", "None"):
            continue
        value = getattr(config, f.name)
        what, types = _SCALARS[kind]
        if value is None and optional:
            continue
        if not isinstance(value, types) or (isinstance(value, bool) and kind != "bool"):
            example = f", e.g. {f.name}={f.default!r}" if isinstance(f.default, types) else ""
            null = " or null (the default)" if optional else ""
            raise ValueError(f"{f.name}={value!r}: give {what}{null}{example}.")


def cosine_lr_factor(progress: float, warmup: float, min_ratio: float) -> float:
    """The learning-rate multiplier at ``progress`` in [0, 1]: linear warm-up over ``warmup``, then a cosine decay
    to ``min_ratio``."""
    if progress < warmup:
        return progress / warmup
    t = min(1.0, (progress - warmup) / max(1e-8, 1.0 - warmup))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * t))


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _share(path: Path) -> None:
    """Give ``path`` the permissions a plain ``open`` / ``mkdir`` would (temporary files are private)."""
    os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~_umask())


def resolve_local(path: str) -> str:
    """A local folder found wherever the working directory is, or a hub id ``owner/name`` unchanged."""
    return str(resolve_path(path, what="folder")) if is_local_path(path) or Path(path).exists() else path


def pick_device(name: str | None) -> torch.device:
    """``name``, else the current accelerator, else CPU."""
    if name is not None:
        return torch.device(name)
    accel = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    return accel if accel is not None else torch.device("cpu")


def load_tokenizer(tokenizer: str | None, target: str):
    """The tokenizer folder given, else the target's folder, else the zoo's tokenizer."""
    from transformers import AutoTokenizer

    candidates = [tokenizer] if tokenizer else [target, str(zoo_dir() / "tokenizer")]
    errors = []
    for name in candidates:
        try:
            loaded = AutoTokenizer.from_pretrained(resolve_local(name))
            loaded.model_max_length = 1 << 62  # whole files are tokenized, then packed
            return loaded
        except (OSError, ValueError) as err:
            errors.append(f"{name}: {err}")
    raise FileNotFoundError("no tokenizer found; pass tokenizer=<folder>. Tried: " + "; ".join(errors))


class StagedOutput:
    """Context manager: ``path`` is the staging folder; on a clean exit its files move into ``out_dir``.

    On an exception the staging folder is deleted, unless a checkpoint was saved in it (``save``); then it is
    kept and its path logged. ``out_dir`` is left as it was in both cases.

    Args:
        out_dir: the run's output folder (created on success; files of the same name are replaced).
    """

    def __init__(self, out_dir: str | os.PathLike) -> None:
        self.out_dir = Path(out_dir)
        if self.out_dir.exists() and not self.out_dir.is_dir():
            raise FileExistsError(f"out_dir {self.out_dir} is a file; give a folder for the checkpoint.")
        self.path: Path | None = None
        self.saved_step: int | None = None

    def __enter__(self) -> StagedOutput:
        parent = self.out_dir.resolve().parent
        parent.mkdir(parents=True, exist_ok=True)
        self.path = Path(tempfile.mkdtemp(prefix=f".{self.out_dir.resolve().name}.partial-", dir=parent))
        _share(self.path)  # it becomes out_dir when out_dir does not exist yet
        return self

    def save(self, drafter, *, dtype, step: int) -> None:
        """Save ``drafter`` (z-lab layout) into the staging folder, replacing the previous checkpoint atomically."""
        scratch = Path(tempfile.mkdtemp(prefix=".save-", dir=self.path))
        drafter.save_pretrained(scratch, dtype=dtype)
        for item in scratch.iterdir():
            _share(item)
            os.replace(item, self.path / item.name)
        scratch.rmdir()
        self.saved_step = step

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is None:
            self._publish()
        elif self.saved_step is None:
            shutil.rmtree(self.path, ignore_errors=True)
        else:
            logger.warning(
                "training failed (%s); %s is unchanged, the checkpoint of step %d is kept in %s",
                exc_type.__name__,
                self.out_dir,
                self.saved_step,
                self.path,
            )
        return False

    def _publish(self) -> None:
        if not self.out_dir.exists():
            os.replace(self.path, self.out_dir)
            return
        for item in self.path.iterdir():
            target = self.out_dir / item.name
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            os.replace(item, target)
        self.path.rmdir()


def append_jsonl(path: Path, record: dict) -> None:
    with path.open("a") as f:
        f.write(json.dumps(record) + "\n")


class Progress:
    """A rich progress bar when available and wanted, else nothing (log lines still go to ``logging``)."""

    def __init__(self, enabled: bool, total: int, *, label: str = "dflash") -> None:
        self.bar = None
        if enabled:
            try:
                from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
            except ImportError:
                return
            self.bar = Progress(
                TextColumn(label),
                BarColumn(),
                MofNCompleteColumn(),
                TimeRemainingColumn(),
                TextColumn("{task.fields[info]}"),
            )
            self.task = self.bar.add_task("train", total=total, info="")

    def __enter__(self):
        if self.bar is not None:
            self.bar.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.__exit__(*exc)

    def update(self, step: int, info: str | None = None) -> None:
        """Show ``step`` steps done; ``info`` replaces the text after the bar (None keeps the last one)."""
        if self.bar is not None:
            fields = {} if info is None else {"info": info}
            self.bar.update(self.task, completed=step, **fields)
