"""Training an MTP head (the ``mtp.*`` layer of Qwen3-Next / Qwen3.5 checkpoints) for a frozen target (``docs/mtp.md``).

Data: corpus prompts continued greedily by the target itself (the EAGLE-3 trainer's data path, ``regenerate``).
Each batch runs once through the frozen target (no grad) for its last hidden state (after the final norm, the
state ``MTPDrafter`` taps) and its logits; the head is then unrolled ``mtp_steps`` times, as ``MTPDrafter`` drafts.
Step 0 row t combines the target's hidden state at t with the embedding of the token at t + 1; step k row t
combines the head's own normalised output of row t at step k - 1 with the token at t + k + 1. Row t of step k sits
at rotary position t + k and attends to the step-0 rows 0..t plus its own rows of steps 1..k: what a greedy chain
draft from position t sees in the head's K/V (the committed rows before it, then one row per step). It predicts
the token at t + k + 2: the loss is ``sum_k step_decay**k * CE_k``, ``CE_k`` the soft cross-entropy against the
target's own distribution of that token (its logits at t + k + 1, over the whole vocabulary), averaged over the
rows of step k. The head shares the target's embedding and LM head (frozen); only the ``mtp.*`` weights train.

Initialisation (``init="last_layer"``): the head's decoder layer is a copy of the target's last full-attention
layer (the same class and shapes) and its final norm a copy of the target's; ``fc`` is drawn at random (N(0,
``initializer_range``)) and the two input norms start at their identity. ``init="random"`` draws every matrix
(``MTPDrafter.random``). The
output is ``model-mtp.safetensors`` with the ``mtp.*`` tensors only (the published names):
``specdec.drafters.mtp.with_mtp_head`` writes a copy of the target checkpoint with them in its index.
"""

from __future__ import annotations

import logging
from dataclasses import MISSING, dataclass, fields
from pathlib import Path

import torch
from transformers import DynamicCache

from specdec.drafters.mtp import MTPDrafter, write_mtp_head
from specdec.drafters.mtp_model import MTPModule, attention_layer_ids, text_model
from specdec.train.data import check_sources
from specdec.train.eagle3 import prepare_training, train_head
from specdec.train.plumbing import (
    StagedOutput,
    check_field_types,
    path_tuple,
)

__all__ = ["MTPTrainConfig", "init_from_last_layer", "mtp_loss", "mtp_step_logits", "target_last_hidden", "train_mtp"]

logger = logging.getLogger(__name__)

_WHOLE = ("max_steps", "mtp_steps", "prompt_tokens", "batch_size", "gen_batch_size", "eval_chain")  # ints >= 1

_INITS = ("last_layer", "random")


@dataclass(frozen=True, kw_only=True)
class MTPTrainConfig:
    """Everything an MTP training run needs.

    Args:
        target (str): HF folder (or hub id) of the frozen target (a model with a full-attention decoder layer, e.g.
            Qwen3.5 / Qwen3-Next).
        out_dir (str): where ``model-mtp.safetensors`` (the ``mtp.*`` tensors), ``train_log.jsonl``,
            ``train_summary.json`` and ``TRAINING.md`` go; written only when the run succeeds.
        corpus, tokenizer, corpus_exclude, corpus_suffixes, max_corpus_tokens, corpus_cache, eval_prompts: as in
            ``Eagle3TrainConfig``.
        init (str): ``last_layer`` (copy the target's last full-attention layer and final norm; module docstring)
            or ``random`` (``MTPDrafter.random``). Default ``last_layer``.
        init_from (str | None): start from the ``mtp.*`` tensors in this folder (a head or a checkpoint) instead.
        mtp_steps (int): unrolled steps (the chain depth trained for). Default 3.
        step_decay (float): step k's loss weight is ``step_decay ** k``. Default 0.8.
        prompt_tokens, seq_len, num_sequences, gen_batch_size, batch_size: as in ``Eagle3TrainConfig``.
        lr, min_lr_ratio, warmup_ratio, weight_decay, beta1, beta2, grad_clip: AdamW + linear warmup + cosine.
        max_steps (int): optimizer steps. Default 1000.
        max_time_s (float | None): wall-clock budget of the optimisation; the schedule follows whichever runs out.
        eval_every (int): steps between acceptance evaluations (0 = only at the start and the end). Default 200.
        eval_num_prompts, eval_prompt_tokens, eval_new_tokens: held-out prompts decoded with ``specdec.generate``
            and ``Chain(eval_chain)``; their mean accepted length is logged. Defaults 8, 256, 64.
        eval_chain (int): drafts per round of the evaluation chain. Default 3.
        save_every (int): steps between checkpoints (0 = only at the end). Default 500.
        save_dtype (str): dtype of the saved tensors. Default "bfloat16".
        log_every (int): steps between log lines. Default 10.
        device, autocast_dtype, target_dtype, seed, progress: as in ``TrainConfig``.
    """

    target: str
    out_dir: str
    corpus: tuple[str, ...] = ()
    tokenizer: str | None = None
    corpus_exclude: tuple[str, ...] = ()
    corpus_suffixes: tuple[str, ...] = (".py",)
    max_corpus_tokens: int | None = None
    corpus_cache: str | None = None
    eval_prompts: str | None = None
    init: str = "last_layer"
    init_from: str | None = None
    mtp_steps: int = 3
    step_decay: float = 0.8
    prompt_tokens: int = 64
    seq_len: int = 256
    num_sequences: int | None = None
    gen_batch_size: int = 64
    batch_size: int = 16
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup_ratio: float = 0.04
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 0.5
    max_steps: int = 1000
    max_time_s: float | None = None
    eval_every: int = 200
    eval_num_prompts: int = 8
    eval_prompt_tokens: int = 256
    eval_new_tokens: int = 64
    eval_chain: int = 3
    save_every: int = 500
    save_dtype: str = "bfloat16"
    log_every: int = 10
    device: str | None = None
    autocast_dtype: str | None = "bfloat16"
    target_dtype: str | None = None
    seed: int = 0
    progress: bool = True

    def __post_init__(self) -> None:
        check_field_types(self, skip=_WHOLE)  # checked below, with their ranges
        for name in ("corpus", "corpus_exclude", "corpus_suffixes"):
            object.__setattr__(self, name, path_tuple(getattr(self, name)))
        if not self.corpus and not self.corpus_cache:
            raise ValueError(
                "corpus is required: pass corpus=<file, folder or glob> (a string is one path; a list several), "
                "or corpus_cache=<tokens.pt>."
            )
        if not str(self.out_dir):
            raise ValueError("out_dir is required: the folder the mtp.* tensors are written to.")
        if self.init not in _INITS:
            raise ValueError(f"init={self.init!r}: give one of {_INITS} (or init_from=<folder with mtp.* tensors>).")
        for name in _WHOLE:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r}: give an int >= 1.")
        if self.seq_len <= self.prompt_tokens:
            raise ValueError(
                f"seq_len={self.seq_len} leaves no room for the target's continuation after prompt_tokens="
                f"{self.prompt_tokens}: raise seq_len or lower prompt_tokens."
            )
        if self.seq_len < self.mtp_steps + 1:
            raise ValueError(
                f"seq_len={self.seq_len} must exceed mtp_steps={self.mtp_steps} (step k needs k + 2 tokens)."
            )


# -- the head's start -----------------------------------------------------------------------------------------
@torch.no_grad()
def init_from_last_layer(drafter: MTPDrafter, target) -> MTPDrafter:
    """Start ``drafter``'s head from ``target``: its decoder layer a copy of the target's last full-attention
    layer, its final norm a copy of the target's, the input norms at their identity; ``fc`` keeps its random
    start (``MTPDrafter.random``: a small projection, so the copied layer first sees a faint mix of both inputs)."""
    stack = text_model(target)
    module = drafter.model
    ids = attention_layer_ids(stack, stack.config)
    if not ids:
        raise ValueError(
            f"{type(target).__name__} has no full-attention decoder layer to start the MTP layer from: use init=random."
        )
    last = stack.layers[ids[-1]]
    module.layers[0].load_state_dict(last.state_dict())
    module.norm.load_state_dict(stack.norm.state_dict())
    width = module.fc.weight.shape[0]
    for norm in (module.pre_fc_norm_embedding, module.pre_fc_norm_hidden):
        fresh = type(norm)(width, eps=getattr(norm, "eps", getattr(norm, "variance_epsilon", 1e-6)))
        norm.load_state_dict(fresh.state_dict())
    return drafter


# -- the objective ------------------------------------------------------------------------------------------
@torch.no_grad()
def target_last_hidden(target, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One frozen target forward: ``(hidden [B, S, H], logits [B, S, V])``, ``hidden`` the last layer's output
    after the final norm (``hidden_states[num_layers]``, what ``MTPDrafter`` taps)."""
    out = target(input_ids=input_ids, output_hidden_states=True, use_cache=False)
    return out.hidden_states[-1], out.logits


def mtp_step_logits(drafter: MTPDrafter, input_ids: torch.Tensor, hidden: torch.Tensor, steps: int):
    """Logits of the unrolled head: entry k is ``[B, S - 1 - k, V]`` (row t predicts the token at t + k + 2).

    Row t of step k combines the token at ``t + k + 1`` with the target's ``hidden`` at t (k = 0) or the head's
    own normalised output of row t at step k - 1, sits at rotary position ``t + k`` and attends to the step-0 rows
    ``0..t`` and to row t of steps ``1..k`` (every step's keys/values appended to one cache; an additive mask
    picks them).

    Args:
        drafter (MTPDrafter): the head, bound to the target (its embedding, rotary embedding and LM head).
        input_ids (torch.Tensor): ``[B, S]``.
        hidden (torch.Tensor): ``[B, S, H]`` from :func:`target_last_hidden`.
        steps (int): unrolled steps, at most ``S - 1``.
    """
    module = drafter.model
    batch, seq = input_ids.shape
    device = input_ids.device
    mrope = getattr(drafter._rotary, "mrope_section", None) is not None
    cache = DynamicCache()
    prev = hidden[:, : seq - 1].to(module.fc.weight.dtype)
    sizes: list[int] = []
    out = []
    for k in range(steps):
        n = seq - 1 - k
        rows = torch.arange(n, device=device)
        positions = (rows + k)[None].expand(batch, -1)
        embeds = drafter._embed(input_ids[:, k + 1 : k + 1 + n]).to(prev.dtype)
        rotary = drafter._rotary(embeds, positions[None].expand(3, -1, -1) if mrope else positions)
        cols = [torch.arange(size, device=device)[None] for size in [*sizes, n]]  # every step's rows so far
        blocks = [cols[0] <= rows[:, None]] + [c == rows[:, None] for c in cols[1:]]  # step 0 causal, then own rows
        seen = torch.cat(blocks, dim=1)  # [n, sum(sizes) + n]
        mask = torch.zeros(seen.shape, dtype=prev.dtype, device=device).masked_fill_(~seen, torch.finfo(prev.dtype).min)
        prev = module(embeds, prev[:, :n], rotary, mask[None, None], positions, cache)
        sizes.append(n)
        out.append(drafter._lm_head(prev))
    return out


def mtp_loss(
    step_logits: list[torch.Tensor], target_logits: torch.Tensor, *, decay: float
) -> tuple[torch.Tensor, dict[str, float]]:
    """``sum_k decay**k * CE_k`` over the steps of :func:`mtp_step_logits`.

    ``CE_k``: at each row t, ``-sum_v p(v) log q_k(v)`` with p the softmax of the target logits at ``t + k + 1``
    (the target's distribution of the token at ``t + k + 2``), averaged over the ``B * (S - 1 - k)`` rows of step k.

    Returns:
        (loss, metrics): ``acc{k}`` (share of rows where the head's argmax is the target's, for k = 0 and the
        last step) and ``accept`` (teacher-forced chain: mean leading run of correct steps).
    """
    top = target_logits.argmax(-1)  # [B, S]
    logp = target_logits.float().log_softmax(-1)
    loss = target_logits.new_zeros((), dtype=torch.float32)
    hits = []
    for k, logits in enumerate(step_logits):
        n = logits.shape[1]
        logq = logits.float().log_softmax(-1)
        ce = -(logp[:, k + 1 : k + 1 + n].exp() * logq).sum(-1)  # [B, n]
        loss = loss + decay**k * ce.mean()
        with torch.no_grad():
            hits.append(logq.argmax(-1) == top[:, k + 1 : k + 1 + n])
    with torch.no_grad():
        rows = hits[-1].shape[1]
        run = torch.stack([h[:, :rows] for h in hits], -1).long().cumprod(-1).sum(-1).float()
        metrics = {"acc0": hits[0].float().mean().item(), f"acc{len(hits) - 1}": hits[-1].float().mean().item()}
        metrics["accept"] = run.mean().item()
    return loss, metrics


# -- the run ------------------------------------------------------------------------------------------------
class _HeadFiles:
    """What ``StagedOutput.save`` writes: the head's ``mtp.*`` tensors only."""

    def __init__(self, drafter: MTPDrafter) -> None:
        self.drafter = drafter

    def save_pretrained(self, path, *, dtype=None) -> None:
        write_mtp_head(self.drafter, path, dtype=dtype)


def train_mtp(cfg: MTPTrainConfig) -> dict:
    """Train an MTP head for ``cfg.target`` and save its ``mtp.*`` tensors to ``cfg.out_dir``.

    Returns:
        dict: the run summary (also ``out_dir/train_summary.json``): config, loss curve points, evaluations (mean
        accepted length ``tau`` with ``Chain(eval_chain)``), timings.

    Examples:
        >>> train_mtp(MTPTrainConfig(target="zoo/target-hybrid", corpus="src/", out_dir="runs/m", max_steps=50))
    """
    if not (cfg.corpus_cache and Path(cfg.corpus_cache).is_file()):
        if not cfg.corpus:
            raise ValueError(f"corpus is required: corpus_cache {cfg.corpus_cache} does not exist yet.")
        check_sources(cfg.corpus)
    with StagedOutput(cfg.out_dir) as output:
        summary = _train(cfg, output)
    logger.info(
        "saved the MTP head (model-mtp.safetensors), train_log.jsonl, train_summary.json and TRAINING.md to %s",
        output.out_dir.resolve(),
    )
    return summary


def _train(cfg: MTPTrainConfig, output: StagedOutput) -> dict:

    data = prepare_training(cfg, output)
    target = data["target"]

    if cfg.init_from:
        drafter = MTPDrafter.from_pretrained(cfg.init_from, target=target, dtype=torch.float32)
    else:
        drafter = MTPDrafter.random(target, seed=cfg.seed, dtype=torch.float32)
        if cfg.init == "last_layer":
            init_from_last_layer(drafter, target)
    model: MTPModule = drafter.model
    n_params = sum(p.numel() for p in model.parameters())
    logger.info("head: %d params (init %s)", n_params, cfg.init_from or cfg.init)

    def batch_loss(batch: torch.Tensor):
        hidden, logits = target_last_hidden(target, batch)
        step_logits = mtp_step_logits(drafter, batch, hidden, cfg.mtp_steps)
        return mtp_loss(step_logits, logits, decay=cfg.step_decay)

    summary = train_head(cfg, output, data, drafter, label="mtp", batch_loss=batch_loss, saved=_HeadFiles(drafter),
                         extra={}, log_steps=True)  # fmt: skip
    (output.path / "TRAINING.md").write_text(training_card(summary))
    return summary


_DEFAULTS = {f.name: f.default for f in fields(MTPTrainConfig) if f.default is not MISSING}  # asdict keeps tuples


def training_card(summary: dict) -> str:
    """``TRAINING.md`` of a run: what was trained, on what, and how the loss and acceptance went."""
    cfg = summary["config"]
    last = f"acc{cfg['mtp_steps'] - 1}"
    lines = [
        "# MTP head",
        "",
        f"Target `{cfg['target']}`; trained with `specdec.train.mtp` ({cfg['mtp_steps']} unrolled steps, step "
        f"weights {cfg['step_decay']}^k, soft targets from the target's logits; init "
        f"`{cfg['init_from'] or cfg['init']}`; see `docs/mtp.md`).",
        "",
        f"- {summary['params']:,} parameters (`mtp.*` tensors in `model-mtp.safetensors`).",
        f"- Data: {summary['train_sequences']} corpus prompts of {cfg['prompt_tokens']} tokens, continued greedily "
        f"by the target to {cfg['seq_len']} tokens ({summary['regenerate_s']:.0f} s).",
        f"- {summary['steps']} steps of {cfg['batch_size']} sequences in {summary['train_s']:.0f} s on "
        f"{summary['device']}; AdamW lr {cfg['lr']}, warm-up {cfg['warmup_ratio']}, cosine to "
        f"{cfg['min_lr_ratio']}.",
        "",
        "Settings other than the `MTPTrainConfig` defaults: "
        + ", ".join(f"`{k}={v}`" for k, v in cfg.items() if k not in _DEFAULTS or _DEFAULTS[k] != v)
        + ".",
        "",
        f"| step | loss | acc0 | {last} | accept (teacher-forced) |",
        "|---|---|---|---|---|",
    ]
    points = summary["losses"]
    stride = max(1, len(points) // 10)
    for rec in points[::stride] + ([points[-1]] if points and (len(points) - 1) % stride else []):
        cells = [f"{rec[key]:.3f}" for key in ("loss", "acc0")] + [f"{rec.get(last, 0.0):.3f}", f"{rec['accept']:.2f}"]
        lines.append(f"| {rec['step']} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"Mean accepted length per round (`specdec.generate`, `Chain({cfg['eval_chain']})`, "
        f"{cfg['eval_new_tokens']} new tokens per held-out prompt):",
        "",
        "| step | tau | rounds |",
        "|---|---|---|",
    ]
    lines += [f"| {e['step']} | {e['tau']:.3f} | {e['rounds']} |" for e in summary["evals"]]
    return "\n".join(lines) + "\n"
