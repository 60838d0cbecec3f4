"""Whether a kernel's Triton module imports (Triton installed and the module compiles its definitions)."""

from __future__ import annotations

import functools
import importlib

__all__ = ["importable"]


@functools.cache
def importable(module: str) -> bool:
    """True when ``module`` (e.g. ``"specdec.kernels.tree_gdn.triton"``) imports."""
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True
