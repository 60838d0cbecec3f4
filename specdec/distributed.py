"""Targets sharded by HF's tensor-parallel plan (``tp_plan="auto"`` under ``torchrun``): what specdec needs of them.

HF shards a model's linear layers over a ``DeviceMesh`` (torch ``DTensor`` parameters): each rank holds its share of
the attention and MLP heads, and the layers' own collectives (all-reduce after row-sharded products, a gather of
the LM head's columns) make every rank's hidden states and logits the whole ones. specdec runs the same round on
every rank of such a model, unchanged: the static K/V storage is sized by a probe forward, so each rank holds the
K/V heads of its own shard; the recurrent states of a hybrid likewise; acceptance is computed on every rank from
the same (all-reduced) logits and the same noise (one seed on every rank), so no rank diverges, and each does its
one host read per round. What a drafter borrows from the target (the DFlash drafter's input embedding and LM
head) is replicated: :func:`replicated` gives a plain copy of a sharded module for it. See ``docs/distributed.md``.
"""

from __future__ import annotations

import copy
import logging
import os
import weakref

import torch
from torch import nn

__all__ = [
    "RankAgreement",
    "RanksDiverged",
    "check_tp_plan",
    "full_tensor",
    "is_dtensor",
    "is_sharded",
    "rank",
    "replicated",
    "sharded_kwargs",
    "world_size",
]

logger = logging.getLogger(__name__)

_REPLICAS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # sharded module -> (its weights' ids, copy)


def world_size() -> int:
    """The process group's size (1 without ``torch.distributed`` initialised; ``WORLD_SIZE`` before it is)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size()
    return int(os.environ.get("WORLD_SIZE", "1"))


def rank() -> int:
    """This process's rank (0 without ``torch.distributed``)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    return int(os.environ.get("RANK", "0"))


def is_dtensor(t) -> bool:
    """Whether ``t`` is a ``DTensor`` (a shard of a tensor-parallel model's parameter)."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # a torch built without distributed
        return False
    return isinstance(t, DTensor)


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a plain tensor holding all of it: a ``DTensor``'s ``full_tensor()`` (a collective: every rank must
    call it), anything else as is."""
    return t.full_tensor() if is_dtensor(t) else t


def is_sharded(model: nn.Module) -> bool:
    """Whether any parameter of ``model`` is a ``DTensor`` (a model loaded with a tensor-parallel plan)."""
    return any(is_dtensor(p) for p in model.parameters())


def replicated(module: nn.Module | None) -> nn.Module | None:
    """A module computing what ``module`` computes with plain, whole weights: ``module`` itself when none of its
    parameters is a ``DTensor``, else a copy (made once per set of weights, a collective on first use) whose
    parameters are the full tensors — e.g. a sharded model's embedding or LM head for a drafter replicated on every
    rank. The copy drops the module's hooks (HF's tensor-parallel hooks expect sharded weights)."""
    if module is None or not any(is_dtensor(p) for p in module.parameters()):
        return module
    key = tuple(id(p) for p in module.parameters())
    cached = _REPLICAS.get(module)
    if cached is not None and cached[0] == key:
        return cached[1]
    clone = copy.copy(module)
    clone._parameters = {
        name: None if p is None else nn.Parameter(full_tensor(p.detach()), requires_grad=False)
        for name, p in module._parameters.items()
    }
    clone._forward_hooks, clone._forward_pre_hooks = {}, {}
    clone.__dict__.pop("forward", None)
    _REPLICAS[module] = (key, clone)
    return clone


class RanksDiverged(RuntimeError):
    """The ranks of a sharded target committed different tokens (see :class:`RankAgreement`)."""


class RankAgreement:
    """The ranks of a sharded target agree after every host read of a decoding call: on the tokens each committed
    and the rows it ended (a 62-bit hash of them, compared through one all-reduce of ``[h, -h, ms, flag]`` with
    ``MAX``), on the round's device time (the slowest rank's, so that an adaptive policy chooses the same next
    budget everywhere: its choice sets the next round's shapes, hence its collectives) and on whether ``max_time``
    has passed (on any rank's clock: every rank stops at the same round). Ranks that drew other noise (another seed)
    commit other tokens; without this check their next forwards mix two sequences, and a rank whose sequence ended
    first leaves the others waiting in a collective forever. With it, every rank raises :class:`RanksDiverged` at
    the first read where they differ. Cost: one all-reduce of four integers per round, on the
    host (through a gloo group of the same ranks when the default one is NCCL), so it never waits for the device:
    the round launched ahead of the read keeps running."""

    def __init__(self, device: torch.device):
        self.group = _host_group()
        # on the CPU through gloo; else (no gloo in this build) on the target's device, where reading the result
        # waits for the round launched ahead of this read
        self.device = torch.device("cpu") if self.group is not False else device
        self.reads = 0

    @classmethod
    def for_model(cls, model: nn.Module, device: torch.device) -> RankAgreement | None:
        """The check for ``model`` when it is sharded over several ranks, else None (free: one world-size query)."""
        if world_size() < 2 or not torch.distributed.is_initialized() or not is_sharded(model):
            return None
        return cls(device)

    def agree(self, tokens: list[list[int]], done: list[bool], ms: float | None = None,
              flag: bool = False) -> tuple[float | None, bool]:  # fmt: skip
        """Compare this read's ``tokens`` (per row, in order) and ``done`` flags across ranks. Returns the largest
        ``ms`` of the ranks (None when any rank's is None) and whether ``flag`` is set on any rank (``max_time``
        passed on some rank's clock: every rank stops). Raises :class:`RanksDiverged` when any rank's tokens or
        flags differ."""
        state = (tuple(map(tuple, tokens)), tuple(done))
        digest = hash(state) & ((1 << 62) - 1)  # hashes of ints, bools and their tuples do not vary per process
        time_us = -1 if ms is None else max(0, int(ms * 1000))
        both = torch.tensor([digest, -digest, time_us, int(flag)], dtype=torch.long).to(self.device)
        group = self.group if self.group is not False else None
        torch.distributed.all_reduce(both, op=torch.distributed.ReduceOp.MAX, group=group)
        high, low, slowest, any_flag = both.tolist()
        self.reads += 1
        if high != digest or -low != digest:
            raise RanksDiverged(
                f"tensor-parallel ranks diverged at read {self.reads} of this call: rank {rank()} committed other "
                f"tokens, or ended other rows, than another rank (here: {[t[:8] for t in tokens[:2]]}, done "
                f"{list(done[:4])}). Every rank must draw the same noise: seed one generator alike on every rank "
                "(generator=torch.Generator(device).manual_seed(s), or torch.manual_seed(s) before the call on every "
                "rank), pass every rank the same inputs, and give it no stopping criteria that depend on the rank or "
                "its clock (max_time is agreed on by the ranks; a custom time-based criterion is not)."
            )
        return (None if ms is None or slowest < 0 else slowest / 1000), bool(any_flag)


_HOST_GROUPS: dict[int, object] = {}  # id of the default group -> its gloo twin (None: it is gloo itself)


def _host_group():
    """A process group of the same ranks that communicates on the host (gloo), so that the agreement's all-reduce
    and its read never touch the device's stream: the default group itself when it is gloo (None), a gloo group
    made once beside an NCCL one (every rank makes it at its first agreement, at the same point of the same call),
    False where this build has no gloo."""
    key = id(torch.distributed.group.WORLD)
    if key not in _HOST_GROUPS:
        if torch.distributed.get_backend() == "gloo":
            _HOST_GROUPS[key] = None
        elif torch.distributed.is_gloo_available():
            _HOST_GROUPS[key] = torch.distributed.new_group(backend="gloo")
        else:
            _HOST_GROUPS[key] = False
    return _HOST_GROUPS[key]


def check_tp_plan(config, world: int) -> None:
    """Raise ``ValueError`` naming the fix when a model of ``config`` cannot be sharded over ``world`` ranks: no
    tensor-parallel plan in its config, or attention / key-value heads that ``world`` does not divide."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    plan = getattr(text, "base_model_tp_plan", None) or getattr(config, "base_model_tp_plan", None)
    if not plan:
        raise ValueError(
            f"{type(config).__name__} ({getattr(text, 'model_type', '?')}) has no tensor-parallel plan "
            "(base_model_tp_plan): load it without tp_plan, one full copy per process, or pick a model whose "
            "transformers class defines one."
        )
    for key in ("num_attention_heads", "num_key_value_heads", "linear_num_value_heads", "linear_num_key_heads"):
        heads = getattr(text, key, None)
        if isinstance(heads, int) and heads % world:
            raise ValueError(
                f"{key}={heads} does not divide by the {world} ranks: launch torchrun with --nproc_per_node a "
                f"divisor of {heads}."
            )


def sharded_kwargs(tp_plan: str | dict | None) -> dict:
    """The ``from_pretrained`` keyword arguments that load a model with HF's tensor-parallel plan ``tp_plan``
    (``"auto"``: the model's own plan) over the ranks of ``torchrun``: ``{}`` for None."""
    if tp_plan is None:
        return {}
    from transformers import DistributedConfig

    return {"distributed_config": DistributedConfig(tp_plan=tp_plan)}
