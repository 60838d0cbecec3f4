"""Which implementation each kernel-backed piece of the round uses: one setting, ``Backends``.

Every field has a default that picks per device (``"auto"``: the Triton kernel on CUDA where it applies, tensor
ops elsewhere). Pass ``generate(..., backends=Backends(...))`` (or a dict of fields) to choose for one call; rounds
are built and captured per setting. An environment variable ``SPECDEC_<FIELD>`` (upper case, e.g.
``SPECDEC_LINEAR_KERNEL=triton``) overrides a field's default for the whole process; this is the only place
specdec reads them. What each choice measured: ``docs/kernels.md``.

| field | values | what it picks |
|---|---|---|
| ``ddtree`` | auto, torch, triton | the DDTree selection (``specdec.kernels.ddtree_build``) |
| ``ddtree_topk`` | auto, torch, triton | the per-depth top-k of the DDTree selection |
| ``dflash_norm`` | auto, torch, triton | the DFlash drafter's RMSNorms (``specdec.kernels.rms_norm``) |
| ``grouped_attention`` | auto, 1, 0 | grouped-query attention without K/V expansion (``specdec.attention``) |
| ``attention_kernel`` | auto, triton, sdpa | the grouped case's kernel (``specdec.kernels.tree_attention``) |
| ``linear_kernel`` | torch, triton | skinny linear layers (``specdec.kernels.skinny_linear``) |
| ``target_norm`` | auto, torch, triton | the target's RMSNorms, uncompiled (``specdec.kernels.rms_norm.routing``) |
| ``target_rotary`` | auto, torch, triton | the target's and DFlash's rotary embedding, uncompiled (``rotary``) |
| ``gdn_gates`` | auto, torch, triton | a Gated DeltaNet layer's q / k norms, beta and g (``gdn_gates``) |
| ``gated_norm`` | auto, torch, triton | a Gated DeltaNet layer's gated output norm (``gated_rms_norm``) |
| ``tree_conv`` | auto, torch, triton | a recurrent layer's conv over each node's path (``tree_conv``) |
| ``kv_write`` | auto, torch, triton | new K/V into the storage, the commit's row moves (``kv_write``, ``kv_commit``) |
| ``round_tail`` | auto, torch, triton | the round's output row, next roots and lengths (``round_tail``) |
| ``silu_mul`` | auto, torch, triton | a gated MLP's activation and product, the target's and drafters' (``silu_mul``) |
| ``grouped_linear`` | auto, torch, triton | a layer's q / k / v, gate / up and activation: one launch each |
| ``tree_gdn_precision`` | auto, ieee, tf32x3, tf32 | the Gated DeltaNet tree scan's matrix products |
| ``tree_gdn_walk`` | auto, paths, chunk | the Gated DeltaNet tree scan's schedule |
| ``tree_mamba2`` | auto, torch | the Mamba2 tree scan (``torch`` = tensor ops, not capturable) |
| ``tree_rejection`` | auto, torch, triton | recursive rejection's sibling ranks (``specdec.kernels.tree_rejection``) |
| ``tree_traversal`` | auto, torch, triton | traversal verification's walk (``specdec.kernels.tree_traversal``) |
| ``path_trie`` | auto, torch, triton | merged sampled paths' trie (``SampledTrees``; ``specdec.kernels.path_trie``) |
| ``categorical_draws`` | auto, torch, triton | ``SampledTrees``' draws (``specdec.kernels.categorical_draws``) |
| ``row_gather`` | auto, torch, triton | embedding lookups, rotary tables by position (``specdec.kernels.row_gather``) |
| ``compile_graph`` | split, whole | under ``torch.compile``: kernels outside (split) or inside the compiled graph |
| ``hybrid_prefill`` | auto, scan, model | hybrid prompts: the tree scan over a chain, or the model's own forward |
"""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields, replace

__all__ = ["Backends", "current", "env_default", "use"]

# field -> (allowed values, default, module, attribute that holds the current value)
_FIELDS: dict[str, tuple[tuple[str, ...], str, str, str]] = {
    "ddtree": (("auto", "torch", "triton"), "auto", "specdec.trees.policies", "_DDTREE_IMPL"),
    "ddtree_topk": (("auto", "torch", "triton"), "auto", "specdec.trees.policies", "_DDTREE_TOPK"),
    "dflash_norm": (("auto", "torch", "triton"), "auto", "specdec.drafters.dflash_static", "_NORM_IMPL"),
    "grouped_attention": (("auto", "1", "0"), "auto", "specdec.attention", "MODE"),
    "attention_kernel": (("auto", "triton", "sdpa"), "auto", "specdec.attention", "KERNEL"),
    "linear_kernel": (("torch", "triton"), "torch", "specdec.kernels.skinny_linear.routing", "KERNEL"),
    "target_norm": (("auto", "torch", "triton"), "auto", "specdec.kernels.rms_norm.routing", "KERNEL"),
    "target_rotary": (("auto", "torch", "triton"), "auto", "specdec.kernels.rotary.routing", "KERNEL"),
    "gdn_gates": (("auto", "torch", "triton"), "auto", "specdec.kernels.gdn_gates", "IMPL"),
    "gated_norm": (("auto", "torch", "triton"), "auto", "specdec.kernels.gated_rms_norm", "IMPL"),
    "tree_conv": (("auto", "torch", "triton"), "auto", "specdec.kernels.tree_conv", "IMPL"),
    "kv_write": (("auto", "torch", "triton"), "auto", "specdec.kernels.kv_write", "IMPL"),
    "round_tail": (("auto", "torch", "triton"), "auto", "specdec.kernels.round_tail", "IMPL"),
    "silu_mul": (("auto", "torch", "triton"), "auto", "specdec.kernels.silu_mul", "IMPL"),
    "grouped_linear": (("auto", "torch", "triton"), "auto", "specdec.kernels.grouped_linear", "IMPL"),
    "tree_gdn_precision": (
        ("auto", "ieee", "tf32x3", "tf32"),
        "auto",
        "specdec.kernels.tree_gdn.triton",
        "TREE_PRECISION",
    ),
    "tree_gdn_walk": (("auto", "paths", "chunk"), "auto", "specdec.kernels.tree_gdn.triton", "TREE_WALK"),
    "tree_mamba2": (("auto", "torch"), "auto", "specdec.kernels.tree_mamba2", "IMPL"),
    "tree_rejection": (("auto", "torch", "triton"), "auto", "specdec.verify.multidraft", "_REJECTION_IMPL"),
    "tree_traversal": (("auto", "torch", "triton"), "auto", "specdec.verify.traversal", "_TRAVERSAL_IMPL"),
    "path_trie": (("auto", "torch", "triton"), "auto", "specdec.trees.sampled", "_TRIE_IMPL"),
    "categorical_draws": (("auto", "torch", "triton"), "auto", "specdec.trees.sampled", "_DRAWS_IMPL"),
    "row_gather": (("auto", "torch", "triton"), "auto", "specdec.kernels.row_gather", "IMPL"),
    "compile_graph": (("split", "whole"), "split", "specdec.kernels._triton", "COMPILE_GRAPH"),
    "hybrid_prefill": (("auto", "scan", "model"), "auto", "specdec.state.hybrid", "PREFILL"),
}


def env_default(name: str) -> str:
    """The process-wide default of field ``name``: ``$SPECDEC_<NAME>`` if set (checked), else the built-in one."""
    allowed, default, _, _ = _FIELDS[name]
    value = os.environ.get(f"SPECDEC_{name.upper()}", default)
    if name == "hybrid_prefill" and value == "graph":  # an older name of "scan"
        value = "scan"
    if value not in allowed:
        raise ValueError(f"SPECDEC_{name.upper()}={value!r}: use one of {', '.join(allowed)}.")
    return value


@dataclass(frozen=True)
class Backends:
    """One choice per kernel-backed piece of the round (fields and values: the table in this module's docstring).
    ``Backends()`` takes every default; ``Backends(linear_kernel="triton")`` changes one."""

    ddtree: str = "auto"
    ddtree_topk: str = "auto"
    dflash_norm: str = "auto"
    grouped_attention: str = "auto"
    attention_kernel: str = "auto"
    linear_kernel: str = "torch"
    target_norm: str = "auto"
    target_rotary: str = "auto"
    gdn_gates: str = "auto"
    gated_norm: str = "auto"
    tree_conv: str = "auto"
    kv_write: str = "auto"
    round_tail: str = "auto"
    silu_mul: str = "auto"
    grouped_linear: str = "auto"
    tree_gdn_precision: str = "auto"
    tree_gdn_walk: str = "auto"
    tree_mamba2: str = "auto"
    tree_rejection: str = "auto"
    tree_traversal: str = "auto"
    path_trie: str = "auto"
    categorical_draws: str = "auto"
    row_gather: str = "auto"
    compile_graph: str = "split"
    hybrid_prefill: str = "auto"

    def __post_init__(self) -> None:
        for f in fields(self):
            allowed = _FIELDS[f.name][0]
            if getattr(self, f.name) not in allowed:
                raise ValueError(f"Backends({f.name}={getattr(self, f.name)!r}): use one of {', '.join(allowed)}.")

    @classmethod
    def from_env(cls) -> Backends:
        """The process defaults: built-in values, overridden by ``SPECDEC_<FIELD>`` variables."""
        return cls(**{name: env_default(name) for name in _FIELDS})


def _holder(name: str):
    """The module holding field ``name``, or None where it cannot be imported (a Triton module without Triton)."""
    try:
        return importlib.import_module(_FIELDS[name][2])
    except ImportError:
        return None


def current() -> Backends:
    """The setting in force now (what the modules hold)."""
    held = {name: getattr(_holder(name), _FIELDS[name][3], None) for name in _FIELDS}
    return Backends(**{name: value for name, value in held.items() if value is not None})


@contextlib.contextmanager
def use(backends: Backends | Mapping | None) -> Iterator[Backends]:
    """Run a block under ``backends`` (a ``Backends``, a dict of fields to change, or None = as is); restores the
    previous setting on exit. Yields the setting in force."""
    before = current()
    if backends is None:
        yield before
        return
    if isinstance(backends, Mapping):
        unknown = sorted(set(backends) - set(_FIELDS))
        if unknown:
            raise ValueError(f"backends: unknown fields {unknown}; fields: {', '.join(_FIELDS)}.")
        backends = replace(before, **backends)
    elif not isinstance(backends, Backends):
        raise TypeError(f"backends={backends!r}: pass specdec.Backends(...) or a dict of its fields.")
    try:
        _set(backends)
        yield backends
    finally:
        _set(before)


def _set(backends: Backends) -> None:
    for name in _FIELDS:
        module = _holder(name)
        if module is not None:
            setattr(module, _FIELDS[name][3], getattr(backends, name))
