"""Fused kernels. Each op lives in ``specdec/kernels/<op>/``: ``reference.py`` (PyTorch, the specification and
CPU path), ``triton.py`` and the public ``<op>(..., impl="auto")`` in its ``__init__``."""

from specdec.kernels.tree_gdn import gdn_path_replay, tree_gdn
from specdec.kernels.tree_mamba2 import tree_mamba2

__all__ = ["gdn_path_replay", "tree_gdn", "tree_mamba2"]
