"""Local paths independent of the working directory: the project's assets, the zoo, hub ids vs folders.

A relative path is looked up in the working directory, then in the repository (``assets/...``), then in the zoo
(``$SPECDEC_ZOO``, else ``../shared/zoo`` beside the repository). A path that cannot be a hub repo id (``owner/name``)
is never sent to the hub: a missing one is an error listing the places tried.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["is_local_path", "repo_root", "resolve_path", "zoo_dir"]


def repo_root() -> Path:
    """The folder holding the ``specdec`` package (the repository root of a source checkout)."""
    return Path(__file__).resolve().parents[1]


def zoo_dir() -> Path:
    """The zoo of trained fixtures: ``$SPECDEC_ZOO``, else ``../shared/zoo`` relative to the repository root."""
    env = os.environ.get("SPECDEC_ZOO")
    return Path(env).expanduser().resolve() if env else repo_root().parent / "shared" / "zoo"


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
        path: absolute, or relative to the working directory, the repository root or the zoo (tried in order).
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
        bases = (Path.cwd(), repo_root(), zoo_dir())
        candidates = list(dict.fromkeys(Path(os.path.normpath(base / given)) for base in bases))
    for candidate in candidates:
        if candidate.exists():
            return candidate
    tried = ", ".join(str(c) for c in candidates)
    raise FileNotFoundError(
        f"No {what} at {os.fspath(path)!r} (tried {tried}). Give an existing path; the zoo is found through "
        "SPECDEC_ZOO or ../shared/zoo beside the repository."
    )
