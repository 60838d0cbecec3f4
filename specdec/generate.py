"""The speculative decoding loop (one loop for every drafter, tree and verifier) and ``SpeculativeModel``.

Each round: the drafter proposes a tree rooted at the last committed token, the target verifies all nodes in
one forward, the verifier walks the tree, the state manager commits the accepted path. With no drafter the
same loop runs plain autoregressive decoding. See ``docs/api.md``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import torch
from transformers import GenerationConfig

from specdec.drafters.base import Drafter
from specdec.engine import FastEngine, fast_path_reason, round_depth, tree_slots
from specdec.runtime import check_compile
from specdec.hf_args import check_drafter_and_tree, check_input_ids, generation_value, resolve_generation_args
from specdec.target import TargetModel
from specdec.timing import PhaseTimer
from specdec.trees import prune_depth, root_tree
from specdec.types import Chain, DecodeContext, GenerateOutput, SpecStats, TreeSpec
from specdec.verify import sample_tokens, verify

__all__ = ["SpeculativeModel", "generate"]

logger = logging.getLogger(__name__)


def _check_length(target: TargetModel, input_ids: torch.Tensor, max_new_tokens: int, tree: TreeSpec) -> None:
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
    generation_config: GenerationConfig | None = None,
    max_length: int | None = None,
    min_new_tokens: int | None = None,
    min_length: int | None = None,
    pad_token_id: int | None = None,
    use_cache: bool | None = None,
    cuda_graphs: bool | None = None,
    compile: bool | str | Mapping = False,
    **kwargs,
) -> GenerateOutput:
    """Speculative generation, lossless with respect to the target's own ``generate``.

    Generation arguments take HF's names and semantics (call > ``generation_config`` > the target's
    ``generation_config`` > HF defaults); options specdec cannot honour exactly raise ``ValueError`` naming
    them (table in ``docs/api.md``).

    Args:
        target: an HF causal LM (or a ``specdec.target.TargetModel``).
        input_ids (torch.Tensor): ``[1, T]`` integer prompt on the target's device.
        drafter (Drafter | None): a drafter instance (e.g. ``NGramDrafter()``); ``None`` runs plain autoregressive
            decoding in the same loop.
        tree (Chain | DDTree | None): tree shape; default the drafter's ``default_tree`` or ``Chain(4)``.
        max_new_tokens (int | None): tokens to generate at most; wins over ``max_length``.
        do_sample, temperature, top_k, top_p: HF sampling arguments.
        eos_token_id (int | list[int] | None): stop tokens (numpy ints and nested lists accepted, as in HF).
        generator (torch.Generator | None): the only source of randomness (on the target's device).
        streamer: an HF streamer (``put``/``end``); receives the prompt, then tokens as they are committed.
        attention_mask (torch.Tensor | None): ``[1, T]``, accepted only without padding (a tokenizer's mask).
        generation_config (GenerationConfig | None): merged as HF merges it.
        max_length (int | None): total length, prompt included (HF semantics).
        min_new_tokens, min_length (int | None): EOS is suppressed until reached, exactly as HF's processors do.
        pad_token_id (int | None): accepted for drop-in use (one unpadded sequence needs no padding).
        use_cache (bool | None): accepted for drop-in use; specdec always decodes with caches (same tokens).
        **kwargs: other HF ``generate`` options; unsupported or unknown ones raise ``ValueError``.
        cuda_graphs (bool | None): ``None`` (default) = the fast path (static storage, device-side round
            captured in CUDA graphs) on CUDA targets it supports, the eager path elsewhere; ``True`` = the fast
            path wherever supported (on CPU its device-side round runs without capture); ``False`` = the eager path.
            Targets or drafters the fast path does not support run eagerly, with a log line saying why.
        compile (bool | str | Mapping): ``torch.compile`` the target and drafter forwards under the graphs (fast
            path only; compile time is reported in ``stats.compile_ms``): True (inductor's default mode), a mode
            (``"max-autotune-no-cudagraphs"``) or a dict of inductor options (``torch.compile(options=...)``).
            Default False.

    Returns:
        GenerateOutput: ``sequences`` ``[1, T + n_new]`` and ``stats`` (``SpecStats``).

    Examples:
        >>> out = specdec.generate(model, ids, drafter=specdec.NGramDrafter(), tree=specdec.Chain(4),
        ...                        max_new_tokens=64)
        >>> out.stats.tau, out.stats.accept_lengths
    """
    tgt = TargetModel.wrap(target)
    check_drafter_and_tree(drafter, tree)
    check_compile(compile)
    input_ids = check_input_ids(input_ids, attention_mask, tgt.device)
    if tree is None:
        tree = getattr(drafter, "default_tree", None) or Chain(k=4)
    args = resolve_generation_args(
        tgt.model,
        input_ids.shape[-1],
        generation_config=generation_config,
        max_new_tokens=max_new_tokens,
        do_sample=do_sample,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        eos_token_id=eos_token_id,
        max_length=max_length,
        min_new_tokens=min_new_tokens,
        min_length=min_length,
        pad_token_id=pad_token_id,
        use_cache=use_cache,
        **kwargs,
    )
    max_new_tokens, sampling, eos = args.max_new_tokens, args.sampling, set(args.eos_token_ids)
    _check_length(tgt, input_ids, max_new_tokens, tree)
    if drafter is not None:
        drafter.validate(tgt, tree)
        drafter.reset()
    draft_forwards_before = drafter.num_forwards if drafter is not None else 0
    taps = drafter.target_layer_ids if drafter is not None else None
    stats, timer = SpecStats(), PhaseTimer(tgt.device)
    engine = _fast_engine(tgt, drafter, tree, input_ids.shape[1] + max_new_tokens, cuda_graphs, compile, args)
    if streamer is not None:
        streamer.put(input_ids.cpu())

    with timer("prefill"):
        if engine is not None:
            logits, hidden = engine.prefill(input_ids, drafter, graph=engine.device.type == "cuda")
        else:
            logits, hidden = tgt.prefill(input_ids, taps)
        first = sample_tokens(args.suppress_eos(logits[None], None, 0), sampling, generator)
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
        stats.path = "fast"
        path_len = round_depth(drafter, tree) + 1
        extent = tree_slots(drafter, tree)  # slots a round writes and attends to past its root
        used: dict = {}  # the rounds (one per span bucket) this call launched

        def launch(in_flight: int):
            """Launch a round whose span holds it: its prefix is at most the committed length plus ``path_len``
            per round launched and not read yet."""
            need = input_ids.shape[1] + len(new_tokens) - 1 + in_flight * path_len + extent
            rnd = engine.round_for(drafter, tree, sampling, graph=engine.device.type == "cuda", compile=compile,
                                   span=engine.span_for(need))  # fmt: skip
            used[id(rnd)] = rnd
            return rnd, rnd.launch(generator)

    elif drafter is not None and not done:
        with timer("draft"):
            drafter.prefill(ctx)

    pending = None  # fast path: a launched round not read yet
    while not done:
        remaining = max_new_tokens - len(new_tokens)
        if engine is not None:
            with timer("round"):
                if pending is None:
                    pending = launch(0)
                # Launch the next round before reading this one (the host's work overlaps the device's) unless
                # this one may finish the call; a next round that an EOS makes unneeded is dropped.
                ahead = launch(1) if remaining > path_len else None
                accepted, num_nodes = pending[0].read(pending[1])
                pending = ahead
            num_accepted = len(accepted) - 1
        else:
            draft, result, hidden = _eager_round(tgt, drafter, tree, ctx, new_tokens, remaining, taps, args, timer)
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
        setup = [rnd.take_setup_ms() for rnd in used.values()]
        stats.compile_ms, stats.capture_ms = sum(c for c, _ in setup), sum(c for _, c in setup)
        stats.compile_fallbacks = sum(rnd.captured.compile_failed is not None for rnd in used.values())
    sequences = torch.cat([input_ids, torch.tensor([new_tokens], dtype=torch.long, device=input_ids.device)], 1)
    return GenerateOutput(sequences=sequences, stats=stats)


def _eager_round(tgt, drafter, tree, ctx, new_tokens, remaining, taps, args, timer):
    """One round on the eager path: propose, verify, walk, commit the target. Returns (tree, result, taps)."""
    with timer("draft"):
        if drafter is None:
            draft = root_tree(new_tokens[-1], tgt.device)
        else:
            draft = prune_depth(drafter.propose(ctx, tree), remaining - 1)
    with timer("verify"):
        logits, hidden = tgt.verify(draft, taps)
    with timer("accept"):
        result = verify(draft, args.suppress_eos(logits, draft.depth, len(new_tokens)), args.sampling, ctx.generator)
    with timer("commit"):
        tgt.commit(result.path)
    return draft, result, hidden


def _fast_engine(tgt: TargetModel, drafter, tree: TreeSpec, length: int, cuda_graphs, compile, args):
    """The fast-path engine for this call, or None for the eager path (with a log line saying why)."""
    if cuda_graphs is False:
        return None
    if cuda_graphs is None and tgt.device.type != "cuda":
        return None  # CPU default: the eager path (cuda_graphs=True runs the device-side round without capture)
    reason = fast_path_reason(tgt, drafter)
    if reason is None and args.min_new_tokens:
        reason = "min_new_tokens is applied on the eager path only"
    if reason is not None:
        log = logger.warning if cuda_graphs else logger.info
        log("specdec: eager path (%s)", reason)
        return None
    engine = FastEngine.for_target(tgt, capacity=length + tree_slots(drafter, tree) + 1)
    logger.info("specdec: fast path (%s)", "CUDA graphs" if tgt.device.type == "cuda" else "device round, no capture")
    return engine


class SpeculativeModel:
    """A drop-in for an HF causal LM's ``generate``: the same call, the same tokens, fewer target forwards.

    ``generate`` takes HF's arguments (``**tokenizer(text, return_tensors="pt")``, ``max_new_tokens``,
    ``generation_config``, ...) and returns the ``sequences`` tensor as HF does, or the ``GenerateOutput`` (with
    ``.stats``) when ``return_dict_in_generate=True``. The last call's stats are kept in ``last_stats``.
    ``config``, ``generation_config`` and ``device`` are the target's.

    Args:
        target: an HF causal LM (or a ``specdec.target.TargetModel``).
        drafter (Drafter | None): a drafter instance; None = plain autoregressive decoding.
        tree (Chain | DDTree | None): tree shape; default the drafter's ``default_tree`` or ``Chain(4)``.
        hybrid_mode (str): how recurrent layers are verified, "exact" (default) or "snapshot" (``docs/hybrid.md``).

    Examples:
        >>> model = specdec.SpeculativeModel(target, drafter=specdec.NGramDrafter(), tree=specdec.Chain(4))
        >>> ids = model.generate(**tokenizer(text, return_tensors="pt"), max_new_tokens=64, do_sample=False)
    """

    def __init__(
        self, target, *, drafter: Drafter | None = None, tree: TreeSpec | None = None, hybrid_mode: str = "exact"
    ) -> None:
        check_drafter_and_tree(drafter, tree)
        self.target = TargetModel.wrap(target, hybrid_mode=hybrid_mode)
        self.drafter = drafter
        self.tree = tree
        self.hybrid_mode = hybrid_mode
        self.last_stats: SpecStats | None = None

    @property
    def device(self) -> torch.device:
        return self.target.device

    @property
    def config(self):
        """The target's ``config``."""
        return self.target.model.config

    @property
    def generation_config(self) -> GenerationConfig | None:
        """The target's ``generation_config`` (the defaults of every ``generate`` call)."""
        return getattr(self.target.model, "generation_config", None)

    def __repr__(self) -> str:
        model = self.target.model
        layers = getattr(getattr(model, "config", None), "num_hidden_layers", "?")
        target = f"{type(model).__name__}({layers} layers, {self.device}, {getattr(model, 'dtype', '?')})"
        drafter = "None (autoregressive)" if self.drafter is None else type(self.drafter).__name__
        tree = self.tree if self.tree is not None else getattr(self.drafter, "default_tree", None) or Chain(k=4)
        return f"SpeculativeModel(target={target}, drafter={drafter}, tree={tree!r}, hybrid_mode={self.hybrid_mode!r})"

    def generate(
        self,
        input_ids: torch.Tensor | None = None,
        generation_config: GenerationConfig | None = None,
        *,
        inputs: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        return_dict_in_generate: bool | None = None,
        **kwargs,
    ) -> torch.Tensor | GenerateOutput:
        """``model.generate`` with speculative decoding; arguments as :func:`specdec.generate`.

        Args:
            input_ids (torch.Tensor): ``[1, T]`` prompt (``inputs=`` is HF's other name for it).
            generation_config (GenerationConfig | None): merged as HF merges it.
            attention_mask (torch.Tensor | None): a tokenizer's mask (no padding).
            return_dict_in_generate (bool | None): return the ``GenerateOutput`` instead of ``sequences``.
            **kwargs: HF generation arguments, plus ``drafter``/``tree`` to override the wrapper's for one call.

        Returns:
            torch.Tensor | GenerateOutput: ``[1, T + n_new]`` sequences, or the output with ``.stats``.
        """
        if input_ids is not None and inputs is not None:
            raise ValueError("Pass the prompt once: input_ids or inputs, not both.")
        input_ids = inputs if input_ids is None else input_ids
        if input_ids is None:
            raise ValueError("SpeculativeModel.generate needs input_ids (a [1, T] LongTensor).")
        kwargs.setdefault("drafter", self.drafter)
        kwargs.setdefault("tree", self.tree)
        as_dict, _ = generation_value(
            "return_dict_in_generate", return_dict_in_generate, generation_config, self.target.model
        )
        out = generate(
            self.target, input_ids, attention_mask=attention_mask, generation_config=generation_config, **kwargs
        )
        self.last_stats = out.stats
        return out if as_dict else out.sequences
