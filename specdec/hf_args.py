"""HF ``generate`` arguments for specdec: the same merging, lengths and stop tokens as ``model.generate``.

Values resolve as HF resolves them: call arguments, then a ``generation_config`` passed in, then the target's
``generation_config``, then HF's global defaults. An option whose non-default value would change the output (or
the returned object) and that specdec cannot honour exactly is refused by name. Table: ``docs/api.md``.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import numbers
import warnings
from dataclasses import dataclass, field

import torch
from transformers import GenerationConfig

from specdec.processors import Processors, build_processors
from specdec.stopping import check_stopping
from specdec.trees import TreePolicy
from specdec.types import SamplingParams

__all__ = [
    "UNSET",
    "GenerationArgs",
    "check_drafter_and_tree",
    "check_hashable",
    "check_input_ids",
    "check_token_range",
    "generation_value",
    "infer_attention_mask",
    "normalize_eos_token_id",
    "resolve_generation_args",
    "token_bounds",
]

logger = logging.getLogger(__name__)


class _Unset:
    """The default of ``generate``'s generation arguments: not passed. HF tells the two apart: an argument passed as
    None overrides a ``generation_config``'s (or the target's) value with None (off), one not passed takes it."""

    def __repr__(self) -> str:
        return "UNSET"

    def __reduce__(self):
        return "UNSET"


UNSET = _Unset()
# What a generation field passed as None means where None itself cannot be used downstream (HF skips the step).
_NONE_MEANS = {"temperature": 1.0}

# HF's global defaults (``GenerationConfig._get_default_generation_params``) of the fields specdec reads.
_DEFAULTS = {
    "max_length": 20,
    "min_length": 0,
    "do_sample": False,
    "temperature": 1.0,
    "top_k": 50,
    "top_p": 1.0,
    "use_cache": True,
    "return_dict_in_generate": False,
}
SUPPORTED = (
    "bad_words_ids",
    "begin_suppress_tokens",
    "do_sample",
    "encoder_no_repeat_ngram_size",
    "encoder_repetition_penalty",
    "eos_token_id",
    "epsilon_cutoff",
    "eta_cutoff",
    "exponential_decay_length_penalty",
    "forced_bos_token_id",
    "forced_eos_token_id",
    "logits_processor",
    "max_length",
    "max_new_tokens",
    "max_time",
    "min_length",
    "min_new_tokens",
    "min_p",
    "no_repeat_ngram_size",
    "num_return_sequences",
    "output_logits",
    "output_scores",
    "pad_token_id",
    "remove_invalid_values",
    "renormalize_logits",
    "repetition_penalty",
    "return_dict_in_generate",
    "sequence_bias",
    "stop_strings",
    "suppress_tokens",
    "temperature",
    "top_h",
    "top_k",
    "top_p",
    "typical_p",
    "use_cache",
)
# HF's sampling warpers beyond temperature / top-k / top-p (``SamplingParams``), read when sampling.
_WARPERS = ("min_p", "typical_p", "epsilon_cutoff", "eta_cutoff", "top_h")
# HF's logits processors (``specdec.processors``), applied at every tree node with the node's own history.
_PROCESSOR_FIELDS = (
    "sequence_bias",
    "encoder_repetition_penalty",
    "repetition_penalty",
    "no_repeat_ngram_size",
    "encoder_no_repeat_ngram_size",
    "bad_words_ids",
    "forced_bos_token_id",
    "forced_eos_token_id",
    "remove_invalid_values",
    "exponential_decay_length_penalty",
    "suppress_tokens",
    "begin_suppress_tokens",
)
# Fields that change the tokens or the returned object unless unset (None) or at this neutral value.
REFUSED = {
    "assistant_early_exit": None,
    "assistant_ensemble_weight": None,
    "constraints": None,
    "diversity_penalty": 0.0,
    "dola_layers": None,
    "force_words_ids": None,
    "guidance_scale": 1.0,
    "num_beam_groups": 1,
    "num_beams": 1,
    "output_attentions": False,
    "output_hidden_states": False,
    "penalty_alpha": 0.0,
    "prompt_lookup_num_tokens": None,
    "speculation_type": None,
    "token_healing": False,
    "use_mtp": False,
    "watermarking_config": None,
}
_BEAMS = "beam search keeps several hypotheses per step; specdec decodes one sequence per row (greedy or sampling)"
_SPECULATION = "it is HF's own speculation; pass a drafter= to specdec instead"
# Why each refused option cannot be honoured (named in the error).
REFUSED_WHY = {
    "num_beams": _BEAMS,
    "num_beam_groups": _BEAMS,
    "diversity_penalty": _BEAMS,
    "constraints": "constrained beam search: " + _BEAMS,
    "force_words_ids": "constrained beam search: " + _BEAMS,
    "penalty_alpha": "contrastive search ranks candidates by the target's hidden states, a decoding mode of its own",
    "dola_layers": "DoLa contrasts the final layer with early exits, a decoding mode of its own",
    "guidance_scale": "classifier-free guidance runs a second, unconditional forward at every step",
    "token_healing": "token healing rewrites the prompt's last tokens before decoding",
    "watermarking_config": "the watermark is applied after the sampling warpers, which specdec's rules apply inside "
    "verification",
    "output_attentions": "the round returns no per-step attention weights",
    "output_hidden_states": "the round returns no per-step hidden states",
    "prompt_lookup_num_tokens": _SPECULATION,
    "assistant_early_exit": _SPECULATION,
    "assistant_ensemble_weight": _SPECULATION,
    "use_mtp": _SPECULATION,
    "speculation_type": _SPECULATION,
}
# Sampling warpers specdec does not apply with do_sample=True (greedy decoding never reads them): none left.
REFUSED_WHEN_SAMPLING: dict = {}
# Fields that cannot change specdec's output: cache and compile settings (specdec owns the caches), beam-search
# and assistant tuning knobs, and metadata.
IGNORED = frozenset(
    {
        "_commit_hash",
        "_from_model_config",
        "assistant_confidence_threshold",
        "assistant_lookbehind",
        "bos_token_id",
        "cache_config",
        "cache_implementation",
        "compile_config",
        "continuous_batching_config",
        "decoder_start_token_id",
        "disable_compile",
        "early_stopping",
        "is_assistant",
        "length_penalty",
        "low_memory",
        "max_cache_len",
        "max_matching_ngram_size",
        "num_assistant_tokens",
        "num_assistant_tokens_schedule",
        "prefill_chunk_size",
        "target_lookbehind",
        "transformers_version",
    }
)
# ``model.generate`` arguments outside ``GenerationConfig``: refused unless None/empty, or without effect here.
_REFUSED_CALL_ARGS = (
    "assistant_model",
    "assistant_tokenizer",
    "custom_generate",
    "negative_prompt_attention_mask",
    "negative_prompt_ids",
    "prefix_allowed_tokens_fn",
    "synced_gpus",
)
_IGNORED_CALL_ARGS = frozenset({"compile", "cuda_graphs", "tokenizer", "trust_remote_code"})
_MODEL_INPUTS = frozenset(
    {"cache_position", "inputs_embeds", "logits_to_keep", "position_ids", "token_type_ids"}
)


@dataclass(frozen=True)
class GenerationArgs:
    """The resolved arguments of one ``generate`` call.

    Args:
        max_new_tokens (int): tokens to generate at most (``max_length`` already turned into new tokens).
        min_new_tokens (int): EOS is suppressed until this many tokens are generated (0 = never).
        sampling (SamplingParams): greedy or the HF sampling warpers.
        eos_token_ids (tuple[int, ...]): stop tokens (may be empty).
        pad_token_id (int | None): fills a batch row after its EOS (HF's rule: None = the first EOS id).
        return_dict_in_generate (bool): for ``SpeculativeModel.generate``.
        stop_strings (tuple[str, ...]): HF stop strings (matched with the call's tokenizer, ``specdec.stopping``).
        max_time (float | None): HF's wall-clock limit in seconds.
        output_scores, output_logits (bool): return the processed scores / raw logits of every generated position
            (with ``return_dict_in_generate``, as HF).
        renormalize_logits (bool): the returned scores are log-softmaxed after every processor and warper (HF's
            ``LogitNormalization``); the tokens do not change.
        num_return_sequences (int): independent samples per prompt (sampling only, as in HF).
        eos_stops (bool): a row ends at an EOS id (False where a custom ``EosTokenCriteria`` replaces HF's own).
        processors (Processors): HF's logits processors of the call (``specdec.processors``), applied at every tree
            node with the node's own history, in HF's order; the sampling warpers live in ``sampling``.
    """

    max_new_tokens: int
    min_new_tokens: int
    sampling: SamplingParams
    eos_token_ids: tuple[int, ...]
    pad_token_id: int | None = None
    return_dict_in_generate: bool = False
    stop_strings: tuple[str, ...] = ()
    max_time: float | None = None
    output_scores: bool = False
    output_logits: bool = False
    renormalize_logits: bool = False
    num_return_sequences: int = 1
    eos_stops: bool = True
    processors: Processors = field(default_factory=Processors)


def _drafter_members() -> tuple[list[str], list[str]]:
    """(methods, attributes) of the ``Drafter`` protocol (``specdec/drafters/base.py``), read from it."""
    from specdec.drafters.base import Drafter

    methods = [name for name, value in vars(Drafter).items() if callable(value) and not name.startswith("_")]
    return methods, list(Drafter.__annotations__)


def check_drafter_and_tree(drafter, tree) -> None:
    """``TypeError`` naming what to pass when ``drafter`` or ``tree`` is a class, a name or another object."""
    if isinstance(drafter, type):
        raise TypeError(
            f"drafter={drafter.__name__} is a class: pass an instance, e.g. drafter=specdec.NGramDrafter() or "
            "DFlashDrafter.from_pretrained(path, target=model)."
        )
    if isinstance(drafter, str):
        raise TypeError(
            f"drafter={drafter!r} is a string: pass a drafter instance, e.g. drafter=specdec.NGramDrafter() "
            "(names such as 'ngram' are settings of the command line: python -m specdec drafter=ngram)."
        )
    if drafter is not None and not callable(getattr(drafter, "attach", None)):
        raise TypeError(
            f"drafter must implement the Drafter protocol (specdec/drafters/base.py), got {type(drafter).__name__}; "
            "pass e.g. specdec.NGramDrafter()."
        )
    if drafter is not None:
        methods, attributes = _drafter_members()
        missing = [name for name in methods if not callable(getattr(drafter, name, None))]
        missing += [name for name in attributes if not hasattr(drafter, name)]
        if missing:
            raise TypeError(
                f"drafter {type(drafter).__module__}.{type(drafter).__qualname__} lacks {missing} of the Drafter "
                "protocol (docs/extending.md, specdec/drafters/base.py): add them (num_forwards = 0, reset() doing "
                "nothing and target_layer_ids = None where it keeps no count, no state outside attach() and taps "
                "no target layer)."
            )
    if isinstance(tree, type):
        raise TypeError(
            f"tree={tree.__name__} is a class: pass an instance, e.g. specdec.DDTree(15) or specdec.Chain(4)."
        )
    if tree is not None and not isinstance(tree, TreePolicy):
        raise TypeError(
            f"tree must implement the TreePolicy protocol (budget, max_depth, reads, branching, build), got {tree!r}; "
            "pass e.g. specdec.DDTree(budget) or specdec.Chain(k)."
        )
    if tree is not None:
        check_hashable("tree policy", tree)
    if tree is not None and not type(tree).__module__.startswith("specdec."):
        budget, depth = getattr(tree, "budget", None), getattr(tree, "max_depth", None)
        for name, value in (("budget", budget), ("max_depth", depth)):
            if name == "budget" and value == "auto":  # an adaptive policy: each round's tree is checked instead
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(
                    f"tree policy {type(tree).__name__}: {name}={value!r} must be an int >= 1 ({name} of the trees "
                    "it builds); for plain decoding pass no drafter and no tree."
                )


def check_hashable(kind: str, obj) -> None:
    """``TypeError`` naming the fix when a tree policy or verification rule cannot be hashed: the round built for
    it is cached by its value, so it must be a value (a frozen dataclass of hashable fields, as the built-in ones)."""
    try:
        hash(obj)
    except TypeError as err:
        raise TypeError(
            f"{kind} {type(obj).__module__}.{type(obj).__qualname__} is not hashable ({err}): the round built for it "
            "is cached by its value; make it a frozen dataclass (@dataclass(frozen=True)) whose fields are hashable "
            "(tuples, not lists), and pass a new object to change a setting."
        ) from None


def check_input_ids(
    input_ids, attention_mask, device: torch.device, *, pad_token_id: int | None = None
) -> tuple[torch.Tensor, list[int]]:
    """Check the prompts as a drop-in ``generate`` receives them; return them as int64 with each row's length.

    Args:
        input_ids: ``[B, T]`` integer token ids; rows shorter than ``T`` are left-padded (as a tokenizer called
            with ``padding=True, padding_side="left"`` returns them).
        attention_mask: None (no padding), or ``[B, T]`` with 1 on tokens and 0 on the left padding.
        device (torch.device): the target's device.
        pad_token_id (int | None): the pad id ``attention_mask`` was inferred from (``infer_attention_mask``), named
            in the errors; None = the caller's own mask.

    Returns:
        tuple[torch.Tensor, list[int]]: ``input_ids`` as int64, and the number of real tokens of each row (its last
        ones).
    """
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
        fix = ""
        if isinstance(input_ids, torch.Tensor):
            given = f"a tensor of shape {tuple(input_ids.shape)}"
            if input_ids.dim() == 1:
                fix = "; one prompt of shape [seq_len] is input_ids[None]"
        else:
            given = f"a {type(input_ids).__name__}"
            if isinstance(input_ids, list | tuple):
                fix = "; token ids in a list are torch.tensor([ids])"
        raise ValueError(
            f"input_ids is {given}: it must be a LongTensor of shape [batch, seq_len] (e.g. "
            f"tokenizer(..., return_tensors='pt').input_ids){fix}."
        )
    if input_ids.is_floating_point() or input_ids.is_complex() or input_ids.dtype == torch.bool:
        raise ValueError(
            f"input_ids has dtype {input_ids.dtype}: token ids must be integers (torch.long), e.g. "
            "tokenizer(text, return_tensors='pt').input_ids; embeddings are not accepted."
        )
    if input_ids.shape[0] == 0:
        raise ValueError("input_ids holds no rows: pass at least one prompt ([batch >= 1, seq_len]).")
    if input_ids.shape[1] == 0:
        raise ValueError("The prompt is empty: give at least one token (e.g. a BOS token).")
    if input_ids.device != device:
        raise ValueError(
            f"input_ids are on {input_ids.device} but the target is on {device}: move them with "
            "input_ids.to(model.device)."
        )
    batch, width = input_ids.shape
    if attention_mask is None:
        return input_ids.long(), [width] * batch
    if not isinstance(attention_mask, torch.Tensor) or attention_mask.shape != input_ids.shape:
        shape = tuple(attention_mask.shape) if isinstance(attention_mask, torch.Tensor) else type(attention_mask)
        raise ValueError(
            f"attention_mask {shape} must be a tensor of the shape of input_ids {tuple(input_ids.shape)}: pass "
            "the mask of the same tokenizer call, or none."
        )
    mask = attention_mask.detach().to("cpu").bool()
    lengths = mask.sum(-1).tolist()
    # a mask inferred from pad_token_id (``infer_attention_mask``) names the pad tokens of input_ids instead
    where = "attention_mask" if pad_token_id is None else "input_ids"
    padding = "padding" if pad_token_id is None else f"pad_token_id={pad_token_id}"
    inferred = (
        ""
        if pad_token_id is None
        else ", or pass attention_mask (no attention_mask: the mask is inferred from pad_token_id, as HF's generate "
        "infers it; torch.ones_like(input_ids) where those tokens are text)"
    )
    for b, n in enumerate(lengths):
        if n == 0:
            only = "" if pad_token_id is None else f" ({padding} only)"
            raise ValueError(
                f"Row {b} of {where} is all padding{only}: every prompt needs at least one token{inferred}."
            )
        if not bool(mask[b, width - n :].all()):
            raise ValueError(
                f"Row {b} of {where} is not left-padded ({padding} after a token): tokenize with padding_side='left' "
                f"(tokenizer.padding_side = 'left'), as decoder-only generation needs{inferred}."
            )
    return input_ids.long(), lengths


# HF's warnings where a batch comes without attention_mask (``GenerationMixin._prepare_special_tokens``), verbatim.
NO_MASK_NO_PAD_WARNING = (
    "The attention mask and the pad token id were not set, with a batched input. As a consequence, you may "
    "observe unexpected behavior. Please pass your input's `attention_mask` to obtain reliable results."
)
PAD_IS_EOS_WARNING = (
    "The attention mask is not set with a batched input, and cannot be inferred from input because pad token "
    "is same as eos token. As a consequence, you may observe unexpected behavior. Please pass your input's "
    "`attention_mask` to obtain reliable results."
)
_warned_once: set[str] = set()  # HF logs PAD_IS_EOS_WARNING once per process (``logger.warning_once``)


def infer_attention_mask(
    input_ids: torch.Tensor, pad_token_id: int | None, eos_token_ids: tuple[int, ...], token_rows: int | None = None
) -> tuple[torch.Tensor | None, int | None]:
    """The mask HF's ``generate`` infers for prompts passed without ``attention_mask``, and the pad id it used.

    HF's rule (``GenerationMixin._prepare_special_tokens`` and ``_prepare_attention_mask_for_generation``): the pad
    id is the resolved ``pad_token_id`` (call, ``generation_config``, the target's ``generation_config``), else the
    first EOS id. Where that id occurs in ``input_ids`` and is none of the EOS ids, the mask is ``input_ids != pad``;
    else every token counts. A batch (``B > 1``) logs HF's warnings, as HF's logger does: the pad id taken from the
    EOS id, and (once per process) a mask that cannot be inferred because the pad id is an EOS id.

    Args:
        input_ids (torch.Tensor): ``[B, T]`` integer prompts.
        pad_token_id (int | None): the resolved pad id (None: unset everywhere).
        eos_token_ids (tuple[int, ...]): the resolved stop tokens, in HF's order.
        token_rows (int | None): the target's input embedding rows: where the prompt is read here, its other ids are
            checked against them in the same read (``check_token_range``).

    Returns:
        tuple: (``[B, T]`` bool mask, or None where every token counts; the pad id, or None where there is none).
    """
    batched = input_ids.shape[0] > 1
    pad = pad_token_id
    if pad is None and eos_token_ids:
        if batched:
            logger.warning(NO_MASK_NO_PAD_WARNING)
        pad = eos_token_ids[0]
    if pad is None:
        return None, None
    if pad in eos_token_ids:
        if batched and PAD_IS_EOS_WARNING not in _warned_once:
            _warned_once.add(PAD_IS_EOS_WARNING)
            logger.warning(PAD_IS_EOS_WARNING)
        return None, pad
    mask = input_ids != pad  # [B, T]
    width = input_ids.shape[1]
    # the call's one read of the prompt: its pad tokens per row, and the range of its other ids (``check_token_range``)
    *counts, low, high = torch.cat([mask.sum(-1), token_bounds(input_ids, mask)]).tolist()
    if token_rows is not None:
        check_token_range(low, high, token_rows)
    if all(n == width for n in counts):  # no pad token anywhere
        return None, pad
    return mask, pad


def token_bounds(input_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[2]``: the smallest and largest id of ``input_ids`` where ``mask`` (elsewhere read as 0). On the device."""
    ids = input_ids.masked_fill(~mask, 0)
    return torch.stack([ids.min(), ids.max()]).to(input_ids.dtype)


def check_token_range(low: int, high: int, rows: int) -> None:
    """``ValueError`` naming an id outside the target's input embedding (``rows`` ids): inside the embedding it
    would be an ``IndexError``, on CUDA a device assert that ends the process."""
    if low < 0 or high >= rows:
        bad = low if low < 0 else high
        raise ValueError(f"input_ids holds token id {bad}, outside the target's embedding of {rows} rows: encode the "
                         f"prompts with the target's own tokenizer (ids 0 .. {rows - 1}).")  # fmt: skip


def normalize_eos_token_id(value) -> tuple[int, ...]:
    """Stop tokens as HF accepts them: an int (numpy ints too), a nested list/tuple or an integer tensor.

    Returns:
        tuple[int, ...]: distinct ids in order of appearance. Strings, floats and bools raise ``TypeError``.
    """
    if value is None:
        return ()
    if isinstance(value, torch.Tensor):
        if value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
            raise TypeError(f"eos_token_id tensor has dtype {value.dtype}: token ids are integers.")
        value = value.flatten().tolist()
    elif hasattr(value, "tolist") and not isinstance(value, numbers.Integral):  # numpy arrays
        value = value.tolist()
    flat: list[int] = []
    _flatten_ids(value, flat)
    if any(i < 0 for i in flat):
        raise ValueError(f"eos_token_id={value!r}: token ids must be >= 0.")
    return tuple(dict.fromkeys(flat))


def _flatten_ids(value, out: list[int]) -> None:
    if isinstance(value, str | bytes):
        raise TypeError(
            f"eos_token_id={value!r} is a string: pass token ids, e.g. eos_token_id=tokenizer.eos_token_id or "
            "tokenizer.convert_tokens_to_ids(...)."
        )
    if isinstance(value, bool) or not isinstance(value, numbers.Integral | list | tuple | set | frozenset):
        raise TypeError(f"eos_token_id must be an int or a list of ints, got {value!r} ({type(value).__name__}).")
    if isinstance(value, numbers.Integral):
        out.append(int(value))
        return
    for item in value:
        _flatten_ids(item, out)


def generation_value(name: str, value, generation_config, model) -> tuple[object, str]:
    """One generation setting as HF resolves it, and where it came from (for error messages).

    Args:
        name (str): a ``GenerationConfig`` field.
        value: the call's argument (None = unset).
        generation_config (GenerationConfig | None): the one passed to the call.
        model: the HF model (its ``generation_config`` is the next fallback).

    Returns:
        tuple: ``(value, source)``; source is "argument", "generation_config", "the target's generation_config"
        or "default".
    """
    if value is not None:
        return value, "argument"
    sources = ((generation_config, "generation_config"), (_model_config(model), "the target's generation_config"))
    for config, source in sources:
        found = getattr(config, name, None) if config is not None else None
        if found is not None:
            return found, source
    return _DEFAULTS.get(name), "default"


def _model_config(model) -> GenerationConfig | None:
    return getattr(model, "generation_config", None)


def _is_neutral(value, neutral) -> bool:
    if value is None or (isinstance(value, list | tuple | dict | set) and not value):
        return True
    try:
        return bool(value == neutral)
    except (TypeError, ValueError, RuntimeError):
        return False


def _check_call_args(kwargs: dict) -> None:
    for name, value in kwargs.items():
        if name in _IGNORED_CALL_ARGS or name in SUPPORTED or name in IGNORED:
            continue
        if name in REFUSED or name in REFUSED_WHEN_SAMPLING:
            continue  # checked on the merged values
        if name in _REFUSED_CALL_ARGS:
            if value is None or value is False or (isinstance(value, list) and not value):
                continue
            raise ValueError(
                f"{name} is not supported by specdec (it cannot keep its output exact with it); drop it, or use "
                "model.generate for this call."
            )
        if name in _MODEL_INPUTS:
            hint = " (tokenizer(..., return_token_type_ids=False))" if name == "token_type_ids" else ""
            raise ValueError(
                f"{name} is a model input specdec does not pass to the target (it builds positions and caches "
                f"itself); drop it{hint}."
            )
        raise ValueError(
            f"unknown argument {name!r} for specdec.generate; supported generation options: {', '.join(SUPPORTED)} "
            "(see docs/api.md)."
        )


def _check_refused(kwargs: dict, generation_config, model, do_sample: bool) -> None:
    refused = {**REFUSED, **(REFUSED_WHEN_SAMPLING if do_sample else {})}
    for name, neutral in refused.items():
        if name in kwargs:  # passed, None included: it overrides the generation_configs, as in HF
            value, source = kwargs[name], "argument"
        else:
            value, source = generation_value(name, None, generation_config, model)
        if _is_neutral(value, neutral):
            continue
        fix = f"pass {name}={neutral!r} to override it" if source != "argument" else "drop it"
        why = REFUSED_WHY.get(name, "specdec cannot apply it exactly")
        raise ValueError(
            f"{name}={value!r} (set by {source}) is unsupported: {why}. {fix[0].upper()}{fix[1:]}, or use "
            "model.generate for this call."
        )


def _int_arg(name: str, value, minimum: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name}={value!r} must be an int >= {minimum}.")
    return int(value)


def resolve_generation_args(
    model, prompt_length: int, *, generation_config=None, vocab_size: int | None = None, **kwargs
) -> GenerationArgs:
    """Resolve HF ``generate`` keyword arguments against ``model.generation_config``, as HF does.

    Args:
        model: the HF causal LM (its ``generation_config`` and ``config.max_position_embeddings`` are read).
        prompt_length (int): T, the prompt's length (``max_length`` and ``min_length`` count it).
        generation_config (GenerationConfig | None): merged under the call's arguments, over the model's.
        vocab_size (int | None): the target's logits width (token ids of the processors are checked against it);
            None = the model config's ``vocab_size``.
        **kwargs: the call's generation arguments (None = unset; ``logits_processor``: the call's own list).

    Returns:
        GenerationArgs: resolved lengths, sampling, stop tokens.
    """
    if generation_config is not None and not isinstance(generation_config, GenerationConfig):
        raise TypeError(
            f"generation_config must be a transformers.GenerationConfig, got {type(generation_config).__name__}; "
            "pass GenerationConfig(**settings) or the settings as keyword arguments."
        )
    _check_call_args(kwargs)
    if vocab_size is None:
        config = getattr(model, "config", None)
        config = config.get_text_config() if hasattr(config, "get_text_config") else config
        vocab_size = int(getattr(config, "vocab_size", 0) or 0) or None

    kwargs = {name: value for name, value in kwargs.items() if value is not UNSET}

    def get(name):
        if name in kwargs:  # passed, None included: HF's call arguments override both generation_configs
            value = kwargs[name]
            return _NONE_MEANS.get(name) if value is None else value
        return generation_value(name, None, generation_config, model)[0]

    _log_hf_config_warnings(model, generation_config, kwargs)
    do_sample = bool(get("do_sample"))
    _check_refused(kwargs, generation_config, model, do_sample)
    sampling = SamplingParams(
        do_sample=do_sample,
        temperature=get("temperature"),  # a number: SamplingParams checks and converts it
        top_k=get("top_k"),
        top_p=get("top_p"),
        **({name: get(name) for name in _WARPERS} if do_sample else {}),
    )
    _, stop_strings, max_time = check_stopping(None, get("stop_strings"), kwargs.get("tokenizer"), get("max_time"))
    max_new = _int_arg("max_new_tokens", get("max_new_tokens"), 1)
    if max_new is None:
        max_new = _max_new_from_length(model, prompt_length, get("max_length"), kwargs, generation_config)
    min_new = _int_arg("min_new_tokens", get("min_new_tokens"), 0)
    if min_new is None:
        min_new = max((_int_arg("min_length", get("min_length"), 0) or 0) - prompt_length, 0)
    _log_length_warnings(model, generation_config, kwargs, get, prompt_length, max_new)
    eos = normalize_eos_token_id(get("eos_token_id"))
    processors = build_processors(
        {**{name: get(name) for name in _PROCESSOR_FIELDS}, "min_length": get("min_length"),
         "min_new_tokens": get("min_new_tokens")},  # fmt: skip
        kwargs.get("logits_processor"),
        vocab_size=vocab_size,
        eos_token_ids=eos,
        max_new_tokens=max_new,
        min_new_tokens=min_new,
        prompt_width=prompt_length,
    )
    return GenerationArgs(
        processors=processors,
        max_new_tokens=max_new,
        min_new_tokens=min_new,
        sampling=sampling,
        eos_token_ids=eos,
        pad_token_id=_pad_token_id(get("pad_token_id")),
        return_dict_in_generate=bool(get("return_dict_in_generate")),
        stop_strings=stop_strings,
        max_time=max_time,
        output_scores=bool(get("output_scores")),
        output_logits=bool(get("output_logits")),
        renormalize_logits=bool(get("renormalize_logits")),
        num_return_sequences=_num_return_sequences(get("num_return_sequences"), do_sample),
    )


def _log_hf_config_warnings(model, generation_config, kwargs: dict) -> None:
    """HF's own warnings about the call's settings (e.g. a sampling flag with ``do_sample=False``: "The following
    generation flags are not valid and may be ignored"), logged by HF's ``GenerationConfig`` as ``model.generate``
    logs them: HF's merge (a ``generation_config`` over the target's and HF's defaults, then the call's arguments),
    whose steps validate what each sets. ``specdec.generate`` returns its output object (``output_scores`` is not
    ignored) unless ``return_dict_in_generate=False`` is passed (``SpeculativeModel.generate`` passes its own).
    Errors are left to specdec's own checks, which name the fix."""
    config = copy.deepcopy(generation_config) if generation_config is not None else GenerationConfig()
    own = _model_config(model)
    try:
        if own is not None:
            config.update(**own.to_dict(), defaults_only=True, allow_custom_entries=True)
            defaults = getattr(own, "_get_default_generation_params", None)
            if callable(defaults):
                config.update(**defaults(), defaults_only=True)
        config.update(**{"return_dict_in_generate": True, **kwargs})  # specdec.generate returns the output object
    except (TypeError, ValueError, RuntimeError, AttributeError):  # a value HF's checks reject: specdec's name it
        pass


def _log_length_warnings(model, generation_config, kwargs: dict, get, prompt_length: int, max_new: int) -> None:
    """HF's warnings about the lengths, verbatim: ``max_new_tokens`` / ``min_new_tokens`` winning over a
    ``max_length`` / ``min_length`` that was set (``_prepare_generated_length``, HF's logger), HF's default length
    used, and minimum lengths past the maximum (``_validate_generated_length``, ``UserWarning``)."""
    configs = (generation_config, _model_config(model))
    default = {}
    for new, total in (("max_new_tokens", "max_length"), ("min_new_tokens", "min_length")):
        default[total] = kwargs.get(total) is None and all(getattr(c, total, None) is None for c in configs)
        if get(new) is not None and not default[total] and get(total) is not None:
            logger.warning(
                f"Both `{new}` (={get(new)}) and `{total}`(={get(total)}) seem to have been set. `{new}` will take "
                "precedence. Please refer to the documentation for more information. "
                "(https://huggingface.co/docs/transformers/main/en/main_classes/text_generation)"
            )
    max_length = prompt_length + max_new  # HF's generation_config.max_length once prepared
    min_new = get("min_new_tokens")
    min_length = min_new + prompt_length if min_new is not None else get("min_length")
    if default["max_length"] and get("max_new_tokens") is None:
        warnings.warn(
            f"Using the model-agnostic default `max_length` (={max_length}) to control the generation length. We "
            "recommend setting `max_new_tokens` to control the maximum length of the generation.",
            UserWarning,
            stacklevel=4,
        )
    suffix = (" Generation will stop at the defined maximum length. You should decrease the minimum length and/or "
              "increase the maximum length.")  # fmt: skip
    if default["max_length"]:
        suffix += f" Note that `max_length` is set to {max_length}, its default value."
    if min_length is not None and min_length > max_length:
        warnings.warn(
            f"Unfeasible length constraints: `min_length` ({min_length}) is larger than the maximum possible length "
            f"({max_length})." + suffix,
            UserWarning,
            stacklevel=4,
        )
    if min_new is not None and min_new + prompt_length > max_length:
        warnings.warn(
            f"Unfeasible length constraints: `min_new_tokens` ({min_new}), when added to the prompt length "
            f"({prompt_length}), is larger than the maximum possible length ({max_length})." + suffix,
            UserWarning,
            stacklevel=4,
        )


def _num_return_sequences(value, do_sample: bool) -> int:
    """HF's rule: any count >= 1 when sampling; greedy decoding (no beams) only 1 (HF refuses more)."""
    n = _int_arg("num_return_sequences", 1 if value is None else value, 1)
    if n > 1 and not do_sample:
        raise ValueError(
            f"num_return_sequences={n} needs do_sample=True: greedy decoding returns one sequence per prompt (HF "
            "refuses it too). Pass do_sample=True for independent samples, or num_return_sequences=1."
        )
    return n


def _pad_token_id(value) -> int | None:
    """The pad id as an int. HF also takes one id in an integer tensor or numpy array of shape () or (1,) (it
    writes that tensor after a row's EOS); other shapes and float or bool tensors fail inside HF's ``generate``."""
    if value is None:
        return None
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    if not isinstance(value, torch.Tensor) and hasattr(value, "dtype") and hasattr(value, "tolist"):  # numpy arrays
        with contextlib.suppress(TypeError, ValueError, RuntimeError):
            value = torch.as_tensor(value)
    if not isinstance(value, torch.Tensor):
        raise TypeError(
            f"pad_token_id={value!r} must be an int (e.g. tokenizer.pad_token_id), an integer tensor holding one id, "
            "or None."
        )
    if value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
        raise TypeError(
            f"pad_token_id is a tensor of dtype {value.dtype}: a token id is an integer; pass an int (e.g. "
            "tokenizer.pad_token_id) or an integer tensor (torch.tensor(pad_id))."
        )
    if value.numel() != 1 or value.dim() > 1:
        raise ValueError(
            f"pad_token_id is a tensor of shape {tuple(value.shape)}: it must hold one token id (shape () or (1,)); "
            "pass an int (e.g. tokenizer.pad_token_id) or torch.tensor(pad_id)."
        )
    return int(value.item())


def _max_new_from_length(model, prompt_length: int, max_length, kwargs: dict, generation_config) -> int:
    """HF's rule: ``max_length`` is the total length; unset everywhere, 20 new tokens capped by the positions."""
    max_length = _int_arg("max_length", max_length, 1)
    is_default = max_length is None or (
        "max_length" not in kwargs
        and all(getattr(c, "max_length", None) is None for c in (generation_config, _model_config(model)))
    )
    if max_length is None:  # passed as None: HF's default (HF itself fails on max_length=None without max_new_tokens)
        max_length = _DEFAULTS["max_length"]
    if is_default:
        max_length += prompt_length
        positions = getattr(getattr(model, "config", None), "max_position_embeddings", None)
        max_length = min(max_length, positions) if positions else max_length
    if prompt_length >= max_length:
        raise ValueError(
            f"The prompt has {prompt_length} tokens but max_length={max_length} (the total length, prompt included, "
            "as in HF): raise max_length or, better, pass max_new_tokens."
        )
    return max_length - prompt_length
