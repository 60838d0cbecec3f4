"""Local paths independent of the working directory: the project's assets, the zoo, hub ids vs folders.

A relative path is looked up in the working directory, then in the repository (``assets/...``), then in the zoo
(``$SPECDEC_ZOO``, else ``../shared/zoo`` beside the repository). A path that cannot be a hub repo id (``owner/name``)
is never sent to the hub: a missing one is an error listing the places tried.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["asset_roots", "is_local_path", "repo_root", "resolve_path", "shipped_zoo", "zoo_dir"]


def repo_root() -> Path:
    """The folder holding the ``specdec`` package (the repository root of a source checkout)."""
    return Path(__file__).resolve().parents[1]


def asset_roots() -> list[Path]:
    """Where the shipped assets can be: inside the installed package (a wheel), then the checkout's ``assets/``."""
    return [Path(__file__).resolve().parent / "assets", repo_root() / "assets"]


def shipped_zoo() -> Path | None:
    """The part of the zoo the project ships (``assets/zoo``), or None."""
    found = [root / "zoo" for root in asset_roots() if (root / "zoo").is_dir()]
    return found[0] if found else None


def zoo_dir() -> Path:
    """The zoo of trained fixtures: ``$SPECDEC_ZOO`` when set; else ``../shared/zoo`` beside the project when it
    exists; else the part of the zoo the project ships (``assets/zoo``: the dense target, the tokenizer and the
    dev prompts)."""
    env = os.environ.get("SPECDEC_ZOO")
    if env:
        return Path(env).expanduser().resolve()
    beside = repo_root().parent / "shared" / "zoo"
    if beside.is_dir():
        return beside
    return shipped_zoo() or beside


def is_local_path(path: str | os.PathLike) -> bool:
    """True when ``path`` cannot be a hub repo id ``owner/name``.

    That is: it starts with ``.``, ``/`` or ``~``, holds a backslash, has not exactly one ``/`` (or ends with
    one), or its first component is an existing folder (in the working directory or the repository).
    """
    text = os.fspath(path)
    if text.startswith((".", "/", "~")) or "\\" in text or text.count("/") != 1 or text.endswith("/"):
        return True
    owner = text.split("/")[0]
    return Path(owner).is_dir() or (repo_root() / owner).is_dir()


def resolve_path(path: str | os.PathLike, *, what: str = "file or folder") -> Path:
    """The existing local path ``path`` names, wherever the working directory is.

    Args:
        path: absolute, or relative to the working directory, the repository root, the zoo, the shipped zoo, or
            (``assets/...``) the shipped assets of an installed package (tried in order).
        what (str): what is looked for, for the error message.

    Returns:
        Path: the first candidate that exists.

    Raises:
        FileNotFoundError: naming every path tried.
    """
    given = Path(path).expanduser()
    if given.is_absolute():
        candidates = [given]
    else:
        bases = [Path.cwd(), repo_root(), zoo_dir(), *filter(None, [shipped_zoo()])]
        candidates = [Path(os.path.normpath(base / given)) for base in bases]
        if given.parts and given.parts[0] == "assets":
            candidates += [root.joinpath(*given.parts[1:]) for root in asset_roots()]
        candidates = list(dict.fromkeys(candidates))
    for candidate in candidates:
        if candidate.exists():
            return candidate
    tried = ", ".join(str(c) for c in candidates)
    raise FileNotFoundError(
        f"No {what} at {os.fspath(path)!r} (tried {tried}). Give an existing path; the zoo is found through "
        "SPECDEC_ZOO (export SPECDEC_ZOO=/path/to/zoo), else ../shared/zoo beside the repository, else the shipped "
        "assets/zoo."
    )
