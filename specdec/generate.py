"""The speculative decoding loop (one loop for every drafter, tree and verifier) and ``SpeculativeModel``.

Each round: the drafter proposes a tree rooted at the last committed token, the target verifies all nodes in
one forward, the verifier walks the tree, the state manager commits the accepted path. With no drafter the
same loop runs plain autoregressive decoding. See ``docs/api.md``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

from specdec.drafters.base import Drafter
from specdec.fast.engine import FastEngine, bucket_size, fast_path_reason
from specdec.target import TargetModel
from specdec.timing import PhaseTimer
from specdec.trees import prune_depth, root_tree
from specdec.types import Chain, DecodeContext, GenerateOutput, SamplingParams, SpecStats, TreeSpec
from specdec.verify import sample_tokens, verify

__all__ = ["SpeculativeModel", "generate"]

logger = logging.getLogger(__name__)


def _eos_set(eos_token_id, target: TargetModel) -> set[int]:
    if eos_token_id is None:
        eos_token_id = getattr(getattr(target.model, "generation_config", None), "eos_token_id", None)
    if eos_token_id is None:
        return set()
    if isinstance(eos_token_id, torch.Tensor):
        eos_token_id = eos_token_id.tolist()
    return {int(eos_token_id)} if isinstance(eos_token_id, int) else {int(e) for e in eos_token_id}


# HF's fallbacks for generation arguments that neither the call nor the model's generation_config sets.
_HF_DEFAULTS = {"do_sample": False, "temperature": 1.0, "top_k": 50, "top_p": 1.0}


def _sampling(target: TargetModel, do_sample, temperature, top_k, top_p) -> SamplingParams:
    """HF semantics: unset values come from the target's ``generation_config``, then HF's defaults."""
    gen = getattr(target.model, "generation_config", None)

    def pick(value, name):
        if value is None and gen is not None:
            value = getattr(gen, name, None)
        return _HF_DEFAULTS[name] if value is None else value

    return SamplingParams(
        do_sample=bool(pick(do_sample, "do_sample")),
        temperature=float(pick(temperature, "temperature")),
        top_k=pick(top_k, "top_k"),
        top_p=pick(top_p, "top_p"),
    )


def _check_inputs(target: TargetModel, input_ids, attention_mask, max_new_tokens: int, tree: TreeSpec) -> None:
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
        raise ValueError(
            "input_ids must be a LongTensor of shape [batch, seq_len] (e.g. tokenizer(..., return_tensors='pt'))."
        )
    if input_ids.shape[0] != 1:
        raise ValueError(
            f"Batch size {input_ids.shape[0]} is not supported yet: specdec decodes one sequence per call. "
            "Loop over the rows of input_ids."
        )
    if input_ids.shape[1] == 0:
        raise ValueError("The prompt is empty: give at least one token (e.g. a BOS token).")
    if input_ids.device != target.device:
        raise ValueError(
            f"input_ids are on {input_ids.device} but the target is on {target.device}: move them with "
            "input_ids.to(model.device)."
        )
    if attention_mask is not None and not bool(attention_mask.bool().all()):
        raise ValueError(
            "attention_mask contains padding: specdec decodes one unpadded sequence; strip the padding tokens."
        )
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens!r} must be an int >= 1.")
    limit = target.max_length
    need = input_ids.shape[1] + max_new_tokens
    if target._sliding_window_layers():
        need += tree.budget + 1  # the verify window must fit in the sliding cache too
    if limit is not None and need > limit:
        raise ValueError(
            f"prompt ({input_ids.shape[1]}) + max_new_tokens ({max_new_tokens}) needs {need} positions but the "
            f"target handles {limit}; shorten the prompt or lower max_new_tokens."
        )


@torch.no_grad()
def generate(
    target,
    input_ids: torch.Tensor,
    *,
    drafter: Drafter | None = None,
    tree: TreeSpec | None = None,
    max_new_tokens: int | None = None,
    do_sample: bool | None = None,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_token_id: int | Sequence[int] | None = None,
    generator: torch.Generator | None = None,
    streamer=None,
    attention_mask: torch.Tensor | None = None,
    cuda_graphs: bool | None = None,
    compile: bool = False,
) -> GenerateOutput:
    """Speculative generation, lossless with respect to the target's own ``generate``.

    Args:
        target: an HF causal LM (or a ``specdec.target.TargetModel``).
        input_ids (torch.Tensor): ``[1, T]`` prompt on the target's device.
        drafter (Drafter | None): proposes trees; ``None`` runs plain autoregressive decoding in the same loop.
        tree (Chain | DDTree | None): tree shape; default the drafter's ``default_tree`` or ``Chain(k=4)``.
        max_new_tokens (int | None): default from the target's ``generation_config`` (HF semantics).
        do_sample, temperature, top_k, top_p: HF sampling arguments; unset ones come from ``generation_config``.
        eos_token_id (int | list[int] | None): stop tokens; default from ``generation_config``.
        generator (torch.Generator | None): the only source of randomness (on the target's device).
        streamer: an HF streamer (``put``/``end``); receives the prompt, then tokens as they are committed.
        attention_mask (torch.Tensor | None): accepted only without padding.
        cuda_graphs (bool | None): ``None`` (default) = the fast path (static storage, device-side round
            captured in CUDA graphs) on CUDA targets it supports, the eager path elsewhere; ``True`` = the fast
            path wherever supported (on CPU its device-side round runs without capture); ``False`` = the eager path.
            Targets or drafters the fast path does not support run eagerly, with a log line saying why.
        compile (bool): ``torch.compile`` the target and drafter forwards under the graphs (fast path only;
            compile time is reported in ``stats.compile_ms``). Default False.

    Returns:
        GenerateOutput: ``sequences`` ``[1, T + n_new]`` and ``stats`` (``SpecStats``).

    Examples:
        >>> out = specdec.generate(model, ids, drafter=specdec.NGramDrafter(), tree=specdec.Chain(k=4),
        ...                        max_new_tokens=64)
        >>> out.stats.tau
    """
    tgt = TargetModel.wrap(target)
    if tree is None:
        tree = getattr(drafter, "default_tree", None) or Chain(k=4)
    if max_new_tokens is None:
        gen = getattr(tgt.model, "generation_config", None)
        max_new_tokens = getattr(gen, "max_new_tokens", None) or (
            (getattr(gen, "max_length", None) or 20) - input_ids.shape[-1]
        )
    _check_inputs(tgt, input_ids, attention_mask, max_new_tokens, tree)
    sampling = _sampling(tgt, do_sample, temperature, top_k, top_p)
    eos = _eos_set(eos_token_id, tgt)
    if drafter is not None:
        drafter.validate(tgt, tree)
        drafter.reset()
    draft_forwards_before = drafter.num_forwards if drafter is not None else 0
    taps = drafter.target_layer_ids if drafter is not None else None
    stats, timer = SpecStats(), PhaseTimer(tgt.device)
    engine = _fast_engine(tgt, drafter, tree, input_ids.shape[1] + max_new_tokens, cuda_graphs, compile)
    if streamer is not None:
        streamer.put(input_ids.cpu())

    with timer("prefill"):
        if engine is not None:
            logits, hidden = engine.prefill(input_ids, drafter)
        else:
            logits, hidden = tgt.prefill(input_ids, taps)
        first = sample_tokens(logits[None], sampling, generator)
    new_tokens = [int(first)]
    ctx = DecodeContext(
        input_ids=torch.cat([input_ids, first.view(1, 1)], dim=1),
        target_hidden=hidden,
        generator=generator,
        timer=timer,
    )
    done = new_tokens[0] in eos or max_new_tokens == 1
    if streamer is not None:
        streamer.put(first.view(1).cpu())
    if engine is not None:
        engine.set_root(first)
        fast_round = engine.round_for(drafter, tree, sampling, graph=engine.device.type == "cuda", compile=compile)
        stats.path = "fast"
    elif drafter is not None and not done:
        with timer("draft"):
            drafter.prefill(ctx)

    while not done:
        remaining = max_new_tokens - len(new_tokens)
        if engine is not None:
            with timer("round"):
                accepted, num_nodes = fast_round(generator)
            num_accepted = len(accepted) - 1
        else:
            draft, result, hidden = _eager_round(tgt, drafter, tree, ctx, new_tokens[-1], remaining, taps, sampling, timer)
            accepted, num_accepted, num_nodes = list(result.tokens), result.num_accepted, draft.num_nodes
        for i, tok in enumerate(accepted):
            if tok in eos:
                accepted, done = accepted[: i + 1], True
                break
        accepted = accepted[:remaining]
        new_tokens += accepted
        done = done or len(new_tokens) >= max_new_tokens
        stats.record(min(num_accepted, remaining - 1))  # drafts past max_new_tokens are not counted
        stats.tree_nodes += num_nodes
        if streamer is not None:
            streamer.put(torch.tensor(accepted, dtype=torch.long))
        if engine is None and not done:
            with timer("commit"):
                new = torch.tensor(accepted, dtype=torch.long, device=input_ids.device)
                ctx.input_ids = torch.cat([ctx.input_ids, new.view(1, -1)], dim=1)
                path = torch.as_tensor(result.path, device=hidden.device) if hidden is not None else None
                ctx.target_hidden = hidden.index_select(1, path) if hidden is not None else None
                if drafter is not None:
                    drafter.commit(ctx, result)

    if streamer is not None:
        streamer.end()
    stats.new_tokens = len(new_tokens)
    stats.target_forwards = stats.rounds + 1
    stats.draft_forwards = drafter.num_forwards - draft_forwards_before if drafter is not None else 0
    stats.phase_ms = timer.totals_ms()
    if engine is not None:
        stats.compile_ms, stats.capture_ms = fast_round.take_setup_ms()
    sequences = torch.cat([input_ids, torch.tensor([new_tokens], dtype=torch.long, device=input_ids.device)], 1)
    return GenerateOutput(sequences=sequences, stats=stats)


def _eager_round(tgt, drafter, tree, ctx, root_token, remaining, taps, sampling, timer):
    """One round on the eager path: propose, verify, walk, commit the target. Returns (tree, result, taps)."""
    with timer("draft"):
        if drafter is None:
            draft = root_tree(root_token, tgt.device)
        else:
            draft = prune_depth(drafter.propose(ctx, tree), remaining - 1)
    with timer("verify"):
        logits, hidden = tgt.verify(draft, taps)
    with timer("accept"):
        result = verify(draft, logits, sampling, ctx.generator)
    with timer("commit"):
        tgt.commit(result.path)
    return draft, result, hidden


def _fast_engine(tgt: TargetModel, drafter, tree: TreeSpec, length: int, cuda_graphs, compile: bool):
    """The fast-path engine for this call, or None for the eager path (with a log line saying why)."""
    if cuda_graphs is False:
        return None
    if cuda_graphs is None and tgt.device.type != "cuda":
        return None  # CPU default: the eager path (cuda_graphs=True runs the device-side round without capture)
    reason = fast_path_reason(tgt, drafter)
    if reason is not None:
        log = logger.warning if cuda_graphs else logger.info
        log("specdec: eager path (%s)", reason)
        return None
    slots = 1 if drafter is None else max(bucket_size(tree.budget + 1), drafter.config.block_size)
    engine = FastEngine.for_target(tgt, capacity=length + slots + 1)
    logger.info("specdec: fast path (%s)", "CUDA graphs" if tgt.device.type == "cuda" else "device round, no capture")
    return engine


class SpeculativeModel:
    """Drop-in wrapper: ``SpeculativeModel(target, drafter=..., tree=...).generate(**hf_kwargs)``.

    ``generate`` returns the ``sequences`` tensor like HF (or the ``GenerateOutput`` with
    ``return_dict_in_generate=True``); the last call's stats are kept in ``last_stats``.

    Examples:
        >>> model = specdec.SpeculativeModel(target, drafter=specdec.NGramDrafter(), tree=specdec.Chain(k=4))
        >>> ids = model.generate(input_ids=ids, max_new_tokens=64, do_sample=False)
    """

    def __init__(
        self, target, *, drafter: Drafter | None = None, tree: TreeSpec | None = None, hybrid_mode: str = "exact"
    ) -> None:
        self.target = TargetModel.wrap(target, hybrid_mode=hybrid_mode)
        self.drafter = drafter
        self.tree = tree
        self.last_stats: SpecStats | None = None

    @property
    def device(self) -> torch.device:
        return self.target.device

    def generate(self, input_ids: torch.Tensor | None = None, *, return_dict_in_generate: bool = False, **kwargs):
        kwargs.setdefault("drafter", self.drafter)
        kwargs.setdefault("tree", self.tree)
        if input_ids is None:
            raise ValueError("SpeculativeModel.generate needs input_ids (a [1, T] LongTensor).")
        out = generate(self.target, input_ids, **kwargs)
        self.last_stats = out.stats
        return out if return_dict_in_generate else out.sequences
