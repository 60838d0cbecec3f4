"""The speculative decoding loop (one loop for every drafter, tree and verifier) and ``SpeculativeModel``.

Each round: the drafter proposes a tree rooted at the last committed token, the target verifies all nodes in
one forward, the verifier walks the tree, the state manager commits the accepted path. With no drafter the
same loop runs plain autoregressive decoding. See ``docs/api.md``.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import os
import threading
import time
from collections.abc import Mapping, Sequence

import torch
from transformers import GenerationConfig

from specdec.backends import Backends
from specdec.backends import use as use_backends
from specdec.budget import DETACHED
from specdec.distributed import RankAgreement
from specdec.drafters.base import Drafter
from specdec.drafters.follow import follow_target
from specdec.engine import Engine, capture_reason, round_reason, tree_slots
from specdec.hf_args import (
    UNSET,
    check_drafter_and_tree,
    check_hashable,
    check_input_ids,
    check_token_range,
    generation_value,
    infer_attention_mask,
    resolve_generation_args,
    token_bounds,
)
from specdec.processors import chain_nodes, node_history
from specdec.runtime import check_compile, copy_to_host, to_device
from specdec.stopping import Stopping, check_stopping, replaced_defaults
from specdec.target import TargetModel
from specdec.timing import PhaseTimer
from specdec.trees import Chain, TreePolicy
from specdec.trees.build import root_trees
from specdec.types import Continuation, GenerateOutput, SpecStats
from specdec.validate import ProtocolError, accept_flags, check_accept, describe_flags, trusted
from specdec.verify import VerificationRule, default_rule
from specdec.verify.processing import process_logits
from specdec.verify.rules import noise_width

__all__ = ["SpeculativeModel", "generate"]

logger = logging.getLogger(__name__)


def _check_length(target: TargetModel, prompt_len: int, max_new_tokens: int) -> None:
    limit = target.max_length
    need = prompt_len + max_new_tokens
    if limit is not None and need > limit:
        raise ValueError(
            f"prompt ({prompt_len}) + max_new_tokens ({max_new_tokens}) needs {need} positions but the "
            f"target handles {limit}; shorten the prompt or lower max_new_tokens."
        )


def round_bytes(target: TargetModel, batch: int, slots: int, span: int, noise: bool) -> int:
    """An estimate of what a round of ``slots`` tree slots over ``span`` storage slots allocates for ``batch``
    sequences: the K/V storage, the tree mask ``[B, S, span]``, the verify's logits ``[B, S, V]`` (raw and
    processed, fp32) and the rule's uniforms ``[B, S, V]`` when it draws them."""
    cfg = target.config.get_text_config() if hasattr(target.config, "get_text_config") else target.config
    itemsize = torch.finfo(target.dtype).bits // 8 if target.dtype.is_floating_point else 4
    layers = int(getattr(cfg, "num_hidden_layers", 1) or 1)
    heads = int(getattr(cfg, "num_key_value_heads", None) or getattr(cfg, "num_attention_heads", 1) or 1)
    head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // max(getattr(cfg, "num_attention_heads", 1), 1))
    kv = 2 * layers * batch * heads * span * head_dim * itemsize
    mask = batch * slots * span * itemsize
    vocab = target.vocab_size
    logits = 2 * batch * slots * vocab * 4 + (batch * slots * vocab * 4 if noise else 0)
    return kv + mask + logits


def available_bytes(device: torch.device) -> int | None:
    """Memory free for a new allocation on ``device`` (CUDA: the driver's free bytes; CPU: the available physical
    pages), None when unknown."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _warn_training(model) -> None:
    """A target left in training mode with active dropout draws a new mask at every forward: its tokens are random
    and differ from ``model.generate``'s in eval mode (and a round verifies other forwards than HF's steps)."""
    if not model.training:
        return
    config = getattr(model, "config", None)
    rates = [v for k, v in (vars(config) if config is not None else {}).items()
             if ("dropout" in k or k.endswith("pdrop")) and isinstance(v, float)]  # fmt: skip
    modules = [m.p for m in model.modules() if isinstance(m, torch.nn.Dropout)]
    if any(rate > 0 for rate in rates + modules):
        logger.warning(
            "The target is in training mode with active dropout: every forward draws new dropout masks, so the "
            "output is random and not the tokens of model.generate in eval mode. Call model.eval() before "
            "generating."
        )


LARGE_TREE_SLOTS = 1024  # a round past this many slots fits but is slow: warned about


def _check_fits(target: TargetModel, batch: int, slots: int, span: int, noise: bool, tree) -> None:
    if slots > LARGE_TREE_SLOTS:
        logger.warning(
            "%r verifies %d tree slots per round: the tree's build and verify grow with its nodes (on a CPU, a "
            "DDTree of 5000 nodes takes minutes for a dozen tokens), while the accepted length grows by a token or "
            "two at most. Budgets of 15-63 are the usual range; pass a smaller one unless this is on purpose.",
            tree, slots,
        )  # fmt: skip
    need, free = round_bytes(target, batch, slots, span, noise), available_bytes(target.device)
    if free is not None and need > free:
        raise ValueError(
            f"a round of {slots} tree slots over {span} storage slots for {batch} sequence(s) needs about "
            f"{need / 2**30:.1f} GiB ({tree!r}: K/V, the [B, S, span] tree mask, [B, S, V] logits) but "
            f"{target.device} has {free / 2**30:.1f} GiB free: lower the tree's budget, max_new_tokens or the batch."
        )


BATCH_BUCKETS = (1, 2, 4, 8, 16, 32)  # captured rounds exist per bucket; a batch runs in the smallest that holds it


def batch_bucket(batch: int, graph: bool) -> int:
    """Rows the round runs for ``batch`` sequences: the smallest bucket holding them when the round is replayed
    from CUDA graphs (one graph per bucket; the extra rows decode nothing), else ``batch`` itself."""
    if not graph:
        return batch
    return next((b for b in BATCH_BUCKETS if b >= batch), batch)


def _check_rule(rule, sampling, tree) -> VerificationRule:
    if isinstance(rule, type):
        raise TypeError(f"verifier={rule.__name__}: pass an instance, e.g. verifier={rule.__name__}().")
    if isinstance(rule, str):
        from specdec.verify import RULES

        if rule in RULES:
            example = type(RULES[rule]()).__name__
            raise TypeError(
                f"verifier={rule!r} is a rule's name; pass the rule itself: verifier=specdec.RULES[{rule!r}]() "
                f"(e.g. specdec.{example}())."
            )
        raise TypeError(f"verifier={rule!r}: pass a rule object (e.g. specdec.Greedy(), specdec.SampleMatch()); "
                        f"registered names: {', '.join(sorted(RULES))}.")  # fmt: skip
    if not isinstance(rule, VerificationRule):
        raise TypeError(
            f"verifier={rule!r} does not implement specdec.verify.VerificationRule (name, check, uses_noise, accept)."
        )
    check_hashable("verification rule", rule)
    rule.check(sampling, tree)
    return rule


def _check_continuation(past, input_ids: torch.Tensor) -> None:
    """``past_key_values``: a ``Continuation`` must be a prefix of the one prompt (HF's rule: the whole sequence is
    passed again); another cache object (HF's) is accepted and not read."""
    if past is None:
        return
    if not isinstance(past, Continuation):
        from transformers.cache_utils import Cache

        if not isinstance(past, Cache | tuple | list):  # HF's caches, and the legacy tuple of (key, value) per layer
            raise TypeError(
                f"past_key_values={past!r} ({type(past).__name__}) is no cache: pass the previous output's "
                "past_key_values (with the whole sequence as input_ids), an HF cache (not read), or None."
            )
        logger.info("specdec: past_key_values=%s is not specdec's; the prompt is prefilled from scratch (same tokens)",
                    type(past).__name__)  # fmt: skip
        return
    if input_ids.shape[0] != 1:
        raise ValueError(f"past_key_values continues one sequence, but input_ids has {input_ids.shape[0]} rows: "
                         "continue each conversation in its own call.")  # fmt: skip
    n = past.length
    if input_ids.shape[1] <= n or not torch.equal(input_ids[0, :n], past.tokens.to(input_ids.device)):
        raise ValueError(
            f"past_key_values holds a sequence of {n} tokens that input_ids does not start with: pass the whole "
            "sequence so far (the previous output's sequences, then the new tokens), as HF's continuation takes it."
        )


def _check_generator(generator, device: torch.device) -> None:
    """``generator``: None or a ``torch.Generator`` on the target's device type."""
    if generator is None:
        return
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator={generator!r} ({type(generator).__name__}): pass a torch.Generator on the "
                        f"target's device, e.g. torch.Generator(device='{device.type}').manual_seed(0).")  # fmt: skip
    if generator.device.type != device.type:
        raise ValueError(f"generator is on {generator.device}, the target on {device}: pass "
                         f"torch.Generator(device='{device.type}').manual_seed(seed).")  # fmt: skip


def _graphs(tgt: TargetModel, cuda_graphs: bool | None) -> bool:
    """Whether the round is replayed from CUDA graphs (it is called otherwise; same tokens either way)."""
    if cuda_graphs is not None and not isinstance(cuda_graphs, bool):
        raise TypeError(
            f"cuda_graphs={cuda_graphs!r} ({type(cuda_graphs).__name__}): pass True, False or None (replay where the "
            "device allows)."
        )
    if cuda_graphs is False:
        return False
    reason = capture_reason(tgt)
    if reason is None:
        return True
    if cuda_graphs:
        logger.warning("specdec: cuda_graphs=True but the round is called, not replayed (%s)", reason)
    elif tgt.device.type == "cuda":
        logger.info("specdec: the round is called, not replayed (%s)", reason)
    return False


def _outside_inference_mode(fn):
    """``fn`` under ``no_grad`` and outside inference mode, whatever the caller's mode: the storage, graphs and drafter
    state a call builds are kept for later calls, and tensors made under ``torch.inference_mode()`` can never be
    updated in place outside it (a first call there made every later plain call fail)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with torch.inference_mode(False), torch.no_grad():
            return fn(*args, **kwargs)

    return wrapper


@_outside_inference_mode
def generate(
    target,
    input_ids: torch.Tensor | None = None,
    *,
    inputs: torch.Tensor | None = None,
    drafter: Drafter | None = None,
    tree: TreePolicy | None = None,
    verifier: VerificationRule | None = None,
    max_new_tokens: int | None = UNSET,
    do_sample: bool | None = UNSET,
    temperature: float | None = UNSET,
    top_k: int | None = UNSET,
    top_p: float | None = UNSET,
    eos_token_id: int | Sequence[int] | None = UNSET,
    generator: torch.Generator | None = None,
    streamer=None,
    attention_mask: torch.Tensor | None = None,
    generation_config: GenerationConfig | None = None,
    max_length: int | None = UNSET,
    min_new_tokens: int | None = UNSET,
    min_length: int | None = UNSET,
    pad_token_id: int | None = UNSET,
    use_cache: bool | None = UNSET,
    cuda_graphs: bool | None = None,
    compile: bool | str | Mapping = False,
    backends: Backends | Mapping | None = None,
    stopping_criteria=None,
    tokenizer=None,
    logits_processor=None,
    past_key_values=None,
    reuse_prefix: bool = True,
    **kwargs,
) -> GenerateOutput:
    """Speculative generation, lossless with respect to the target's own ``generate``.

    Generation arguments take HF's names and semantics (call > ``generation_config`` > the target's
    ``generation_config`` > HF defaults; an argument passed as None overrides the configs' value with None, one left
    out takes it); options specdec cannot honour exactly raise ``ValueError`` naming
    them (table in ``docs/api.md``). Every call runs the same round (``docs/round.md``); ``cuda_graphs`` and
    ``compile`` only choose how it runs.

    Args:
        target: an HF causal LM (or a ``specdec.target.TargetModel``).
        input_ids (torch.Tensor): ``[B, T]`` integer prompts on the target's device; shorter rows left-padded (with
            ``attention_mask``). Every row decodes as it would alone. ``inputs=`` is HF's other name for it.
        drafter (Drafter | None): a drafter instance (e.g. ``NGramDrafter()``); ``None`` runs plain autoregressive
            decoding in the same loop.
        tree (TreePolicy | None): tree policy (``Chain``, ``DDTree`` or your own); default the drafter's
            ``default_tree`` or ``Chain(4)``.
        verifier (VerificationRule | None): verification rule (``Greedy``, ``SampleMatch`` or your own); default
            ``Greedy()`` at ``do_sample=False``, else ``SampleMatch()``. A rule not exact for the sampling settings
            or the tree policy is refused.
        max_new_tokens (int | None): tokens to generate at most; wins over ``max_length``.
        do_sample, temperature, top_k, top_p: HF sampling arguments.
        eos_token_id (int | list[int] | None): stop tokens (numpy ints and nested lists accepted, as in HF).
        generator (torch.Generator | None): the only source of randomness (on the target's device).
        streamer: an HF streamer (``put``/``end``); receives the prompt, then tokens as they are committed (one
            sequence only, as in HF).
        attention_mask (torch.Tensor | None): ``[B, T]``: 1 on tokens, 0 on left padding (a tokenizer's mask with
            ``padding_side="left"``); right padding is refused. None: inferred from ``pad_token_id`` as HF infers it
            (``docs/api.md``, input rules).
        generation_config (GenerationConfig | None): merged as HF merges it.
        max_length (int | None): total length, prompt included (HF semantics).
        min_new_tokens, min_length (int | None): EOS is suppressed until reached, exactly as HF's processors do.
        pad_token_id (int | torch.Tensor | None): fills a row's output after its EOS while other rows go on (HF's
            rule: None = the first EOS id); a tensor holds one integer id (shape () or (1,)), as HF takes it.
        use_cache (bool | None): accepted for drop-in use; specdec always decodes with caches (same tokens).
        cuda_graphs (bool | None): replay the round from CUDA graphs: ``None`` (default) where the target's device
            allows it (CUDA, Triton tree scans for hybrids), ``False`` never (the round is called), ``True`` like
            ``None`` but with a warning where it cannot.
        compile (bool | str | Mapping): ``torch.compile`` the round (compile time is reported in
            ``stats.compile_ms``): True (inductor's default mode), a mode (``"max-autotune-no-cudagraphs"``) or a
            dict of inductor options. Default False.
        backends (Backends | Mapping | None): which kernel implementations the round uses (``specdec.Backends``,
            or a dict of its fields to change); default the process setting (``specdec.backends``).
        stopping_criteria (list | None): HF ``StoppingCriteria`` (``(input_ids, scores)`` protocol), checked after
            each accepted token of each row (``scores`` is None); a round is cut right after the token that stops.
        tokenizer: the tokenizer that ``stop_strings`` are matched with (as in HF; needed with ``stop_strings``).
        logits_processor (list | None): HF logits processors (``(input_ids, scores)`` protocol), applied after HF's
            own at every tree node with that node's ``input_ids``; the round then runs uncaptured
            (``stats.uncaptured``). A processor with ``tree_aware = True`` and ``process_tree(scores, nodes)`` runs
            inside the captured round (``specdec.processors``).
        past_key_values: the ``past_key_values`` of an earlier call's output (a ``specdec.types.Continuation``), with
            ``input_ids`` the whole sequence so far, as HF's continuation: only the new tokens are prefilled. A call
            whose prompt extends the previous call's sequence on the same model reuses it without this too; an HF
            cache is accepted and the prompt prefilled from scratch (same tokens). One sequence only.
        reuse_prefix (bool): False prefills every prompt from scratch even where the storage holds its beginning
            (to measure what reuse saves). Default True.
        **kwargs: other HF ``generate`` options; unsupported or unknown ones raise ``ValueError``.

    Returns:
        GenerateOutput: ``sequences`` ``[B, T + n_new]`` (the prompts as given, then each row's new tokens,
            ``pad_token_id`` after a row's EOS) and ``stats`` (``SpecStats``; ``stats.rows`` per row for a batch).

    Examples:
        >>> out = specdec.generate(model, ids, drafter=specdec.NGramDrafter(), tree=specdec.Chain(4),
        ...                        max_new_tokens=64)
        >>> out.stats.tau, out.stats.accept_lengths
    """
    start = time.time()  # HF's max_time counts from the start of the call
    if input_ids is not None and inputs is not None:
        raise ValueError("Pass the prompt once: input_ids or inputs, not both.")
    input_ids = inputs if input_ids is None else input_ids
    if input_ids is None:
        raise ValueError("specdec.generate needs the prompt: input_ids (or inputs=), a [B, T] LongTensor.")
    if isinstance(target, SpeculativeModel):
        raise TypeError(
            "target is a SpeculativeModel: call its own generate (model.generate(input_ids, ...), with its drafter and "
            "tree), or pass the HF model it wraps (its .target.model) to specdec.generate."
        )
    tgt = TargetModel.wrap(target)
    _warn_training(tgt.model)
    check_drafter_and_tree(drafter, tree)
    criteria, _, _ = check_stopping(stopping_criteria, None, tokenizer, None)
    check_compile(compile)
    input_ids, lengths = check_input_ids(input_ids, attention_mask, tgt.device)
    _check_continuation(past_key_values, input_ids)
    if streamer is not None and input_ids.shape[0] > 1:
        raise ValueError("A streamer takes one sequence (as in HF): pass a batch of one row, or no streamer.")
    check_streamer(streamer)
    if tree is None:
        tree = getattr(drafter, "default_tree", None) or Chain(k=4)
    args = resolve_generation_args(
        tgt.model,
        input_ids.shape[-1],
        generation_config=generation_config,
        vocab_size=tgt.vocab_size,
        logits_processor=logits_processor,
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
        tokenizer=tokenizer,
        **kwargs,
    )
    replaced = replaced_defaults(criteria, stop_strings=bool(args.stop_strings), max_time=args.max_time is not None,
                                 eos=bool(args.eos_token_ids))  # fmt: skip
    if replaced:  # HF's merge: the custom criterion of that kind is the limit, not the call's own
        limit = replaced.get("max_length")
        args = dataclasses.replace(
            args,
            max_new_tokens=args.max_new_tokens if limit is None else max(1, int(limit.max_length) - input_ids.shape[1]),
            max_time=None if "max_time" in replaced else args.max_time,
            stop_strings=() if "stop_strings" in replaced else args.stop_strings,
            eos_stops=args.eos_stops and "eos" not in replaced,
        )
    stopping = Stopping(criteria, args.stop_strings, tokenizer, args.max_time, input_ids, start)
    max_new_tokens, sampling = args.max_new_tokens, args.sampling
    rows = tgt.model.get_input_embeddings().weight.shape[0]
    checked = False
    if attention_mask is None:  # HF's rule: the mask from pad_token_id where the prompts hold it (docs/api.md)
        inferred, pad = infer_attention_mask(input_ids, args.pad_token_id, args.eos_token_ids, rows)
        checked = pad is not None and pad not in args.eos_token_ids  # that read checked the ids' range too
        if inferred is not None:
            input_ids, lengths = check_input_ids(input_ids, inferred, tgt.device, pad_token_id=pad)
    if max(input_ids.shape[1] - n for n in lengths) and args.processors.padded() != args.processors:
        # HF's processors that read input_ids count a padded row's pad tokens as its tokens: run those as HF's own
        args = dataclasses.replace(args, processors=args.processors.padded())
        logger.info("specdec: a padded batch with repetition_penalty / no_repeat_ngram_size / sequence_bias / "
                    "bad_words_ids: those run per node as HF's own processors, with each row's padding (uncaptured)")
    if not checked:  # the prompt's one read: its ids' range (an id past the embedding fails inside it)
        width = input_ids.shape[1]
        tokens = torch.arange(width, device=input_ids.device)[None] >= width - torch.tensor(lengths)[:, None].to(
            input_ids.device
        )
        check_token_range(*token_bounds(input_ids, tokens).tolist(), rows)
    copies = args.num_return_sequences
    if copies > 1:  # HF's expansion: each prompt repeated in place; every row samples independently
        if streamer is not None:
            raise ValueError(
                f"A streamer takes one sequence (as in HF) but num_return_sequences={copies}: drop the streamer or "
                "pass num_return_sequences=1."
            )
        input_ids = input_ids.repeat_interleave(copies, 0)
        lengths = [n for n in lengths for _ in range(copies)]
        stopping.input_ids = input_ids
    if callable(getattr(tree, "with_sampling", None)):  # a policy that samples from q takes the call's settings
        tree = tree.with_sampling(sampling)
    auto = bool(getattr(tree, "auto", False)) and drafter is not None
    if auto and "logq" not in drafter.provides:
        raise ValueError(
            f"DDTree(budget='auto') weighs each size by the drafter's probabilities, but {type(drafter).__name__} "
            "proposes paths; use a fixed budget (e.g. DDTree(budget=15)) with this drafter."
        )
    fixed = tree.largest if auto else tree  # the checks, storage and span of the most slots the call may use
    rule = _check_rule(default_rule(sampling) if verifier is None else verifier, sampling,
                       fixed if drafter is not None else None)  # fmt: skip
    _check_length(tgt, max(lengths), max_new_tokens)
    _check_generator(generator, tgt.device)
    slots = tree_slots(drafter, fixed) if drafter is not None else 1
    _check_fits(tgt, len(lengths), slots, max(lengths) + max_new_tokens + slots + 1, rule.uses_noise(sampling), fixed)
    reason = round_reason(tgt, drafter, fixed if drafter is not None else None)
    if reason is not None:
        raise ValueError(f"specdec cannot run this combination: {reason}.")
    if drafter is not None:
        follow_target(drafter, tgt)  # a target cast or moved since the drafter's last call takes the drafter along
        drafter.validate(tgt, fixed)
        drafter.reset()
    graph = _graphs(tgt, cuda_graphs)
    if not args.processors.capturable and (graph or compile):
        logger.info("specdec: logits_processor holds processors that read the tree on the host; the round runs "
                    "uncaptured and uncompiled (tree-aware processors run captured: docs/api.md)")  # fmt: skip
        graph, compile = False, False
    with use_backends(backends) as setting:
        return _decode(tgt, input_ids, lengths, drafter, tree, rule, args, graph, compile, setting, generator, streamer,
                       stopping, reuse_prefix)  # fmt: skip


def _decode(
    tgt, input_ids, lengths, drafter, tree, rule, args, graph, compile, setting, generator, streamer, stopping,
    reuse_prefix=True,
) -> GenerateOutput:
    """The decoding loop: prefill, then rounds until every sequence has its EOS or ``max_new_tokens`` (one host read
    per round for the whole batch). A finished sequence stays in the batch, masked: its rows still run (the round's
    shapes are fixed, so it can be replayed from one graph) but commit nothing, and its output is done."""
    max_new_tokens, sampling = args.max_new_tokens, args.sampling
    eos = set(args.eos_token_ids) if args.eos_stops else set()  # a custom EosTokenCriteria replaces them (HF)
    draft_forwards_before = drafter.num_forwards if drafter is not None else 0
    stats, timer = SpecStats(path="graph" if graph else "eager"), PhaseTimer(tgt.device)
    if not args.processors.capturable:
        stats.uncaptured = "logits_processor: per-node processors read the tree on the host"
    batch, width = input_ids.shape
    rows = batch_bucket(batch, graph)
    lengths = lengths + [lengths[0]] * (rows - batch)  # bucket rows: copies of the first prompt, never decoded
    longest = max(lengths)
    # each prompt from slot 0 (its positions from 0, as left padding gives HF), right-padded to the longest
    prompts = torch.zeros(rows, longest, dtype=torch.long, device=input_ids.device)
    for b, n in enumerate(lengths):
        prompts[b, :n] = input_ids[b if b < batch else 0, width - n :]
    # the caller's left padding, for the processors that see HF's input_ids as they are (a user's processor)
    counts = [width - n for n in lengths]
    left_pad = None
    if max(counts):
        source = torch.cat([input_ids, input_ids[:1].expand(rows - batch, -1)]) if rows > batch else input_ids
        left_pad = (source[:, : max(counts)].long(), torch.tensor(counts, device=input_ids.device))
    # an adaptive policy (``DDTree(budget="auto")``) chooses each round's budget through its own controller
    make = getattr(tree, "controller", None) if drafter is not None else None
    fixed = getattr(tree, "largest", tree) if callable(make) else tree
    path_len = (0 if drafter is None else drafter.draft_depth(fixed)) + 1
    # room for a round launched ahead of one that reaches ``max_new_tokens`` (its path may run past it)
    engine = Engine.for_target(
        tgt, capacity=longest + max_new_tokens + path_len + tree_slots(drafter, fixed), batch=rows, drafter=drafter
    )
    engine.left_pad = left_pad
    auto = engine.controller_for(drafter, tree, make) if callable(make) else None
    if streamer is not None:
        streamer.put(input_ids.cpu())

    keys_before = engine.rounds_built + engine.prefills_built  # graph keys (rounds, captured prefills) so far
    # one sequence that continues the last call's (a conversation): only the new part of the prompt is prefilled
    engine.call_weights = None  # this call's weight fingerprint, once the reuse check takes one (``keep`` reuses it)
    engine.call_modules = None  # and its module signature
    reused = engine.reusable(prompts[0, : lengths[0]], drafter, graph=graph) if rows == 1 and reuse_prefix else 0
    engine.kept = None  # the storage is rewritten from here on
    with timer("prefill"):
        if reused:
            logits = engine.extend(prompts, reused, drafter)
        else:
            logits = engine.prefill(prompts, lengths, drafter, graph=graph)
        scores = _first_scores(args.processors, logits, prompts, lengths, left_pad)
        first = _first_token(rule, sampling, scores, generator)
    stats.reused_tokens = reused
    # The first round is launched before the first token is read, so that the host's work for it overlaps the
    # prefill on the device: the token is on the device already, and until the read only each row's count of new
    # tokens (one) is used. A row the first token finishes (EOS, a stop) is masked after the read; a call it
    # finishes drops the launched round, as the loop drops a round launched ahead.
    new_tokens: list[list[int]] = [[-1] for _ in range(batch)]
    done = [False] * batch
    keep = args.output_scores or args.output_logits  # the rounds keep their logits (HF's output_scores / _logits)
    engine.start(first, lengths, [True] * batch + [False] * (rows - batch))
    extent = tree_slots(drafter, fixed)  # slots a round writes and attends to past its root
    used: dict = {}  # the rounds (one per span bucket) this call launched
    call_rounds: dict = {}  # (size, span) -> the round, for this call
    prepared: set[int] = set()  # span buckets whose every size the adaptive policy has built and captured
    per_row = [SpecStats(path=stats.path) for _ in range(batch)] if batch > 1 else [stats]

    def round_at(size, span):
        """The round of ``size`` (None: the fixed policy's) at ``span``: looked up once per call and bucket (the
        engine's key hashes the policy, rule, sampling and processors; an adaptive policy's ``tree.at`` builds one)."""
        rnd = call_rounds.get((size, span))
        if rnd is None:
            rnd = call_rounds[(size, span)] = make_round(size, span)
        return rnd

    def make_round(size, span):
        if size == DETACHED:  # plain decoding that leaves the drafter behind (to the end of the call)
            return engine.round_for(None, None, rule, sampling, graph=graph, compile=compile, span=span,
                                    processors=args.processors, backends=setting, keep_logits=keep)  # fmt: skip
        return engine.round_for(drafter, tree if size is None else tree.at(size), rule, sampling, graph=graph,
                                compile=compile, span=span, processors=args.processors, backends=setting,
                                keep_logits=keep)  # fmt: skip

    launched_ms = [0.0]  # the host time of the launches since the last round read

    def launch(in_flight: int):
        """Launch a round whose span holds it: its prefix is at most the committed length plus ``path_len`` per
        round launched and not read yet."""
        committed = max(lengths[b] + len(new_tokens[b]) for b in range(batch)) - 1
        need = committed + in_flight * path_len + extent
        size = None
        if auto is not None:  # the tokens each decoding row still needs (the batch's time to finish)
            left = {b: max_new_tokens - len(new_tokens[b]) for b in range(batch) if not done[b]}
            size = auto.next_size(left, final=max(left.values(), default=0) <= path_len)
        span = engine.span_for(need)

        if auto is not None and span not in prepared:  # the bounded set of keys: every option of a span at once
            prepared.add(span)
            for option in (0, DETACHED, *auto.sizes):
                option_round = round_at(option, span)
                option_round.prepare()
                used[id(option_round)] = option_round
        rnd = round_at(size, span)
        used[id(rnd)] = rnd
        ticket = rnd.launch(generator, timer.stream)
        launched_ms[0] += rnd.launch_ms[ticket]
        return rnd, ticket, size

    # the first token (and its logits) copied before the round is launched: reading them waits for the prefill only
    first_host = copy_to_host(first[:batch])
    first_logits = copy_to_host(logits[:batch].float()) if keep else None
    # A sharded target's ranks agree after every read on what they committed, which rows are done, whether max_time
    # has passed (any rank's clock) and the round's time: every rank then launches the same rounds.
    ranks = RankAgreement.for_model(tgt.model, tgt.device)
    # (with ranks, the first round is launched whatever the clock says: they agree on max_time after the first read)
    launch_first = max_new_tokens > 1 and (ranks is not None or not stopping.timed_out())
    pending = launch(0) if launch_first else None  # a launched round not read yet
    if rows == 1:  # the target's module attributes for ``Engine.keep``, read while the device runs the prefill
        engine.note_modules()
    first_tokens = first_host()
    new_tokens = [[tok] for tok in first_tokens.tolist()]
    kept = [[row] for row in first_logits()] if keep else None  # per row: raw logits [V] per token
    done = [row[0] in eos or max_new_tokens == 1 or stopping.first_stop(b, [], row) is not None
            for b, row in enumerate(new_tokens)]  # fmt: skip
    timed = stopping.timed_out()
    if ranks is not None:
        _, timed = ranks.agree(new_tokens, done, flag=timed)
    if timed:
        done = [True] * batch
    if streamer is not None:
        streamer.put(first_tokens[:1].clone())
    for b in range(batch):
        if done[b] and batch > 1:
            engine.finish(b)
    rounds_read = 0
    last_read = None  # the host clock at the last round's read: a round's wall time runs from the read before it
    while not all(done):
        remaining = [max_new_tokens - len(new_tokens[b]) for b in range(batch)]
        with timer("round"):
            if pending is None:
                pending = launch(0)
            # Launch the next round before reading this one (the host's work overlaps the device's) unless this
            # one may well finish the call: a next round that EOS or the last round makes unneeded is dropped,
            # and its device time is lost.
            longest_left = max(r for r, d in zip(remaining, done, strict=True) if not d)
            ahead = launch(1) if longest_left > _may_finish(path_len, new_tokens, rounds_read) else None
            rnd, ticket, size = pending
            waited = _now()
            results = rnd.read(ticket)
            pending = ahead
        # the host time since the last read, each launch's host time moved to the round it launched (on the CPU a
        # launch runs its round): not this round's usual cost where it is the call's first (the prefill ran before
        # it), or where its own launch or the launch ahead captured or replayed a graph first
        now = _now()
        clean = last_read is not None and rnd.warm[ticket] and (ahead is None or ahead[0].warm[ahead[1]])
        wall = (now - last_read) * 1e3 - launched_ms[0] + rnd.launch_ms[ticket] if clean else None
        stats.round_wall_ms.append(wall)
        stats.round_wait_ms.append((now - waited) * 1e3)
        stats.round_launch_ms.append(rnd.launch_ms[ticket])
        last_read, launched_ms[0] = now, 0.0
        stats.target_forwards += 1
        rounds_read += 1
        live = [b for b in range(batch) if not done[b]] if auto is not None else None
        # this round's tokens per row, as kept, for the ranks' agreement (a sharded target only)
        committed = [[] for _ in range(batch)] if ranks is not None else None
        for b, (accepted, num_nodes) in enumerate(results[:batch]):
            if done[b]:
                continue
            num_accepted = len(accepted) - 1
            for i, tok in enumerate(accepted):
                if tok in eos:
                    accepted, done[b] = accepted[: i + 1], True
                    break
            accepted = accepted[: remaining[b]]
            stop = stopping.first_stop(b, new_tokens[b], accepted)  # HF's criteria after each accepted token
            if stop is not None:
                accepted, done[b] = accepted[: stop + 1], True
            if kept is not None:
                kept[b] += list(rnd.logits[b, : len(accepted)])
            new_tokens[b] += accepted
            if committed is not None:
                committed[b] = accepted
            done[b] = done[b] or len(new_tokens[b]) >= max_new_tokens
            if done[b] and batch > 1:
                engine.finish(b)
            for row_stats in {id(s): s for s in (per_row[b], stats)}.values():
                row_stats.record(min(num_accepted, remaining[b] - 1))  # drafts past max_new_tokens are not counted
                row_stats.tree_nodes += num_nodes
            if streamer is not None:
                streamer.put(torch.tensor(accepted, dtype=torch.long))
        timed = stopping.timed_out()
        ms = None if auto is None else wall if getattr(auto, "clock", "device") == "wall" else rnd.elapsed(ticket)
        if ranks is not None:  # and every rank's adaptive policy sees the same (slowest) round time
            ms, timed = ranks.agree(committed, done, ms, flag=timed)
        if auto is not None:
            expected = rnd.expected  # None for plain rounds: they propose nothing
            auto.observe(size, expected and [expected[b] for b in live], [len(results[b][0]) - 1 for b in live],
                         ms, rows=live)  # fmt: skip
            stats.budgets.append(size)
            stats.budget_ms.append(ms)
        if timed:  # max_time: this round is kept whole, no other runs
            done = [True] * batch

    if streamer is not None:
        streamer.end()
    if rows == 1:  # the sequence the storage now holds, for the next call (no read: ``Engine.reusable`` reads)
        behind = auto is not None and auto.detached  # the drafter was left behind: its state cannot be reused
        engine.keep(torch.cat([prompts[0, : lengths[0]], to_device(new_tokens[0], prompts.device)]),
                    None if behind else drafter)  # fmt: skip
    stats.new_tokens = sum(len(t) for t in new_tokens)
    stats.target_forwards += 1  # the prefill
    stats.draft_forwards = drafter.num_forwards - draft_forwards_before if drafter is not None else 0
    stats.phase_ms = timer.totals_ms()
    setup = [rnd.take_setup_ms() for rnd in used.values()]
    stats.compile_ms, stats.capture_ms = sum(c for c, _ in setup), sum(c for _, c in setup)
    stats.captures = engine.rounds_built + engine.prefills_built - keys_before
    stats.compile_fallbacks = sum(rnd.captured.compile_failed is not None for rnd in used.values())
    stats.capture_fallbacks = sum(rnd.captured.capture_failed is not None for rnd in used.values())
    if auto is not None and callable(getattr(auto, "costs", None)):
        stats.budget_costs = auto.costs()
    if batch > 1:
        for row_stats, tokens in zip(per_row, new_tokens, strict=True):
            row_stats.new_tokens = len(tokens)
            row_stats.target_forwards = row_stats.rounds + 1
        stats.rows = per_row
    out_len = max(len(t) for t in new_tokens)
    pad = args.pad_token_id if args.pad_token_id is not None else next(iter(args.eos_token_ids), 0)
    new = torch.full((batch, out_len), pad, dtype=torch.long)
    for b, tokens in enumerate(new_tokens):
        new[b, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
    sequences = torch.cat([input_ids, new.to(input_ids.device)], 1)
    scores = logits = None
    if kept is not None:
        logits, scores = _step_scores(kept, new_tokens, args, out_len, prompts[:batch], lengths, left_pad)
    past = Continuation(engine.kept) if rows == 1 and engine.kept is not None else None
    return GenerateOutput(sequences=sequences, stats=stats, scores=scores if args.output_scores else None,
                          logits=logits if args.output_logits else None, past_key_values=past)  # fmt: skip


def _now() -> float:
    """The host clock a round's wall time is read from (seconds; a function so that a test can set the time)."""
    return time.perf_counter()


def _may_finish(path_len: int, new_tokens: list[list[int]], rounds: int) -> int:
    """How many tokens left (in the row with most left) a round may finish: its whole path until a few rounds were
    read, then twice the tokens per round the rows committed so far (rarely reached in one round; the rounds of a
    call's tail then overlap the host's work too)."""
    if rounds < 4:
        return path_len
    per_round = (sum(len(t) for t in new_tokens) / len(new_tokens) - 1) / rounds
    return min(path_len, math.ceil(2 * per_round))


def _step_scores(kept, new_tokens, args, steps: int, prompts: torch.Tensor, lengths: list[int],
                 left_pad: tuple | None = None) -> tuple[tuple, tuple]:  # fmt: skip
    """HF's ``logits`` and ``scores`` (one ``[B, V]`` fp32 tensor per generated position) from each row's raw
    logits per new token: the scores are the logits through the same processors (each position with its own
    history), when sampling the warpers, and with ``renormalize_logits`` a log-softmax. A row that ended before a
    step holds zeros there."""
    batch, vocab, device = len(kept), kept[0][0].shape[-1], prompts.device
    raw = torch.zeros(batch, steps, vocab, device=device)
    processed = torch.zeros(batch, steps, vocab, device=device)
    for b, rows in enumerate(kept):
        n = len(new_tokens[b])
        raw[b, :n] = torch.stack(rows[:n]).to(device)
        row = raw[b, :n]
        if args.processors:  # new token j continues the prompt and new tokens 0 .. j-1
            history = torch.cat([prompts[b, : lengths[b]], torch.tensor(new_tokens[b], device=device)])
            path = [int(prompts[b, lengths[b] - 1])] + new_tokens[b][: n - 1]
            # row b's padding: the widest row's (the pad tensor's width) less how much longer its prompt is (no read)
            pad = None if left_pad is None else left_pad[0][b, : left_pad[0].shape[1] - (lengths[b] - min(lengths))]
            row = args.processors(row[None], chain_nodes(history, lengths[b] - 1, path, 0, pad))[0]
        row = process_logits(row, args.sampling) if args.sampling.do_sample else row
        processed[b, :n] = row.log_softmax(-1) if args.renormalize_logits else row  # HF's LogitNormalization, last
    return tuple(raw.unbind(1)), tuple(processed.unbind(1))


def _first_scores(processors, logits: torch.Tensor, prompts: torch.Tensor, lengths: list[int],
                  left_pad: tuple | None = None) -> torch.Tensor:  # fmt: skip
    """The prefill's logits ``[B, V]`` through the call's processors: each row's choice continues its prompt (after
    its left padding ``left_pad``, ``NodeHistory.pad``)."""
    if not processors:
        return logits
    last = torch.tensor(lengths, device=prompts.device) - 1
    tree = root_trees(prompts.gather(1, last[:, None])[:, 0])
    nodes = node_history(prompts, last, tree, torch.zeros_like(last), 1, left_pad)
    return processors(logits[:, None], nodes)[:, 0]


def _first_token(rule, sampling, logits: torch.Tensor, generator) -> torch.Tensor:
    """Each prompt's next token ``[B]``: the rule over the root alone (a target sample, or its argmax), from the
    logits ``[B, V]``."""
    tree = root_trees(torch.zeros(logits.shape[0], dtype=torch.long, device=logits.device))
    noise = None
    if rule.uses_noise(sampling):
        width = noise_width(rule, logits.shape[-1])
        noise = torch.rand(logits.shape[0], 1, width, device=logits.device, generator=generator)
    accept = rule.accept(tree, logits[:, None], sampling, noise, 0, None)
    if not trusted(rule):  # a rule of a user's: its result checked as inside the round (one read, before the loop)
        check_accept(rule, accept, logits.shape[0], 1)
        flags = int(accept_flags(accept, tree, logits.shape[-1]).max())
        if flags:
            raise ProtocolError(describe_flags(flags, None, rule))
    return accept.tokens[:, 0]


def check_streamer(streamer) -> None:
    """Refuse a streamer that lacks HF's protocol (``put(tokens)``, ``end()``) before anything runs: the call would
    otherwise fail at its first ``put`` or, worse, at ``end`` after decoding the whole sequence."""
    if streamer is None:
        return
    if isinstance(streamer, type):
        raise TypeError(
            f"streamer={streamer.__name__} is a class: pass an instance, e.g. streamer={streamer.__name__}(tokenizer)."
        )
    missing = [name for name in ("put", "end") if not callable(getattr(streamer, name, None))]
    if missing:
        raise TypeError(
            f"streamer={type(streamer).__name__} has no {' or '.join(f'{m}()' for m in missing)}: a streamer follows "
            "HF's protocol, put(token_ids) for the prompt and each batch of new tokens, then end() (e.g. "
            "transformers.TextStreamer(tokenizer), or transformers.generation.BaseStreamer's subclasses)."
        )


class SpeculativeModel:
    """A drop-in for an HF causal LM's ``generate``: the same call, the same tokens, fewer target forwards.

    ``generate`` takes HF's arguments (``**tokenizer(text, return_tensors="pt")``, ``max_new_tokens``,
    ``generation_config``, ...) and returns the ``sequences`` tensor as HF does, or the ``GenerateOutput`` (with
    ``.stats``) when ``return_dict_in_generate=True``. The last call's stats are kept in ``last_stats``.
    ``config``, ``generation_config`` and ``device`` are the target's.

    Args:
        target: an HF causal LM (or a ``specdec.target.TargetModel``).
        drafter (Drafter | None): a drafter instance; None = plain autoregressive decoding.
        tree (TreePolicy | None): tree policy; default the drafter's ``default_tree`` or ``Chain(4)``.
        verifier (VerificationRule | None): verification rule; default as in :func:`specdec.generate`.
        hybrid_mode (str): how recurrent layers are verified: "exact" (default; the one mode the round runs,
            "snapshot" is refused by it: ``docs/hybrid.md``).

    Examples:
        >>> model = specdec.SpeculativeModel(target, drafter=specdec.NGramDrafter(), tree=specdec.Chain(4))
        >>> ids = model.generate(**tokenizer(text, return_tensors="pt"), max_new_tokens=64, do_sample=False)
    """

    def __init__(
        self,
        target,
        *,
        drafter: Drafter | None = None,
        tree: TreePolicy | None = None,
        verifier: VerificationRule | None = None,
        hybrid_mode: str = "exact",
    ) -> None:
        check_drafter_and_tree(drafter, tree)
        if isinstance(target, SpeculativeModel):
            raise TypeError(
                "target is a SpeculativeModel already: pass the HF model it wraps (its .target.model), or call that "
                "SpeculativeModel's generate with the drafter, tree and verifier you want."
            )
        self.target = TargetModel.wrap(target, hybrid_mode=hybrid_mode)
        self.drafter = drafter
        self.tree = tree
        self.verifier = verifier
        self.hybrid_mode = hybrid_mode
        self.last_stats: SpecStats | None = None
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:
        """For ``copy.deepcopy`` / ``pickle``: everything but the call lock (a copy gets its own)."""
        state = dict(self.__dict__)
        state.pop("_lock", None)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    @property
    def dtype(self) -> torch.dtype:
        """The target's dtype."""
        return self.target.dtype

    def _drafter_modules(self) -> list[torch.nn.Module]:
        """The drafter's own modules (a draft LM, a DFlash / EAGLE-3 / MTP head), as ``nn.Module.train`` reaches a
        module's children."""
        found = []
        for value in vars(self.drafter).values() if self.drafter is not None else ():
            module = value.model if isinstance(value, TargetModel) else value
            if isinstance(module, torch.nn.Module):
                found.append(module)
        return found

    def eval(self) -> SpeculativeModel:
        """Put the target and the drafter's modules (a draft LM left in training mode drafts with dropout) in eval
        mode; returns self, as ``nn.Module.eval`` does."""
        return self.train(False)

    def to(self, *args, **kwargs) -> SpeculativeModel:
        """Move the target (and the drafter, where it can move) like ``nn.Module.to``; returns self. Decoding state
        kept for the old device or dtype is dropped."""
        self.target.model.to(*args, **kwargs)
        move = getattr(self.drafter, "to", None)
        if callable(move) and not isinstance(self.drafter, torch.nn.Module):
            device = next((a for a in args if isinstance(a, str | torch.device)), kwargs.get("device"))
            dtype = next((a for a in args if isinstance(a, torch.dtype)), kwargs.get("dtype"))
            move(device=device, dtype=dtype)
        Engine.forget(self.target)
        return self

    def train(self, mode: bool = True) -> SpeculativeModel:
        """Put the target and the drafter's modules in training mode (``mode=False``: eval mode); returns self, as
        ``nn.Module.train`` does."""
        self.target.model.train(mode)
        for module in self._drafter_modules():
            module.train(mode)
        return self

    def half(self) -> SpeculativeModel:
        """``to(torch.float16)``; returns self (the wrapper, not the target)."""
        return self.to(torch.float16)

    def float(self) -> SpeculativeModel:
        """``to(torch.float32)``; returns self."""
        return self.to(torch.float32)

    def double(self) -> SpeculativeModel:
        """``to(torch.float64)``; returns self."""
        return self.to(torch.float64)

    def bfloat16(self) -> SpeculativeModel:
        """``to(torch.bfloat16)``; returns self."""
        return self.to(torch.bfloat16)

    def cpu(self) -> SpeculativeModel:
        """``to("cpu")``; returns self."""
        return self.to("cpu")

    def cuda(self, device=None) -> SpeculativeModel:
        """``to("cuda")`` (or the given CUDA device); returns self."""
        return self.to(torch.device("cuda", device) if isinstance(device, int) else device or "cuda")

    def __getattr__(self, name: str):
        """Any other attribute is the target's (``parameters()``, ``get_input_embeddings()``, ``name_or_path``, ...),
        as code written for the HF model reads it."""
        target = self.__dict__.get("target")
        if target is None or name.startswith("_"):  # unpickling, copying (no target yet); private names
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(target.model, name)

    def __call__(self, *args, **kwargs):
        """The target's forward (``model(input_ids)`` -> its ``CausalLMOutput``), as wrapped code expects."""
        return self.target.model(*args, **kwargs)

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
        return_dict_in_generate: bool | None = UNSET,
        **kwargs,
    ) -> torch.Tensor | GenerateOutput:
        """``model.generate`` with speculative decoding; arguments as :func:`specdec.generate`.

        Args:
            input_ids (torch.Tensor): ``[B, T]`` prompts, left-padded (``inputs=`` is HF's other name for it).
            generation_config (GenerationConfig | None): merged as HF merges it.
            attention_mask (torch.Tensor | None): a tokenizer's mask (0 on left padding).
            return_dict_in_generate (bool | None): return the ``GenerateOutput`` instead of ``sequences``.
            **kwargs: HF generation arguments, plus ``drafter``/``tree`` to override the wrapper's for one call.

        Returns:
            torch.Tensor | GenerateOutput: ``[B, T + n_new]`` sequences, or the output with ``.stats``.
        """
        kwargs.setdefault("drafter", self.drafter)
        kwargs.setdefault("tree", self.tree)
        kwargs.setdefault("verifier", self.verifier)
        as_dict = bool(return_dict_in_generate) if return_dict_in_generate is not UNSET else generation_value(
            "return_dict_in_generate", None, generation_config, self.target.model
        )[0]
        if not self._lock.acquire(blocking=False):
            raise RuntimeError(
                "SpeculativeModel.generate is already running in another thread: one SpeculativeModel runs one call "
                "at a time (its storage is shared). Use one SpeculativeModel per thread."
            )
        try:
            out = generate(self.target, input_ids, inputs=inputs, attention_mask=attention_mask,
                           generation_config=generation_config, return_dict_in_generate=as_dict,
                           **kwargs)  # fmt: skip
        finally:
            self._lock.release()
        self.last_stats = out.stats
        return out if as_dict else out.sequences
