"""Training an EAGLE-3 head for a frozen target: the training-time test (TTT) objective (``docs/eagle3.md``).

Data: corpus prompts continued greedily by the target itself, so the head learns the target's own text. The draft
vocabulary is the ``draft_vocab_size`` most frequent tokens of those sequences (``d2t`` / ``t2d``). Each batch
runs once through the frozen target (no grad) for the fused states of the head's layers and the logits; the head
is then unrolled ``ttt_steps`` times. Step 0 reads the target's fused states; step k reads the head's own output
of step k - 1 at the same row, paired with the true token one further on. Row t of step k sits at rotary position
t + k and attends to the step-0 rows 0..t plus its own rows of steps 1..k: exactly what a greedy chain draft from
position t sees. The loss is ``sum_k decay**k * CE_k``, ``CE_k`` the soft cross-entropy against the target's
distribution restricted to the draft vocabulary (renormalised), over the rows whose target argmax is in the draft
vocabulary (others count zero), averaged over the rows of step k.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import MISSING, asdict, dataclass, fields
from pathlib import Path

import torch
from transformers import DynamicCache
from transformers.models.llama.modeling_llama import repeat_kv

from specdec.drafters.eagle3 import Eagle3Drafter, Eagle3Model
from specdec.state import cache_kwarg
from specdec.train.data import check_sources, iter_documents, load_eval_prompts, pack_tokens, tokenize_documents
from specdec.train.plumbing import (
    Progress,
    StagedOutput,
    append_jsonl,
    check_field_types,
    cosine_lr_factor,
    load_tokenizer,
    path_tuple,
    pick_device,
    resolve_local,
)

__all__ = [
    "Eagle3TrainConfig",
    "draft_vocabulary",
    "eagle3_loss",
    "regenerate",
    "target_states",
    "train_eagle3",
    "ttt_logits",
]

logger = logging.getLogger(__name__)

_WHOLE = ("max_steps", "ttt_steps", "draft_vocab_size", "prompt_tokens", "batch_size", "gen_batch_size")  # ints >= 1


@dataclass(frozen=True, kw_only=True)
class Eagle3TrainConfig:
    """Everything an EAGLE-3 training run needs.

    Args:
        target (str): HF folder (or hub id) of the frozen target.
        out_dir (str): where the head (official layout), ``train_log.jsonl``, ``train_summary.json`` and
            ``TRAINING.md`` go; written only when the run succeeds.
        corpus (tuple[str, ...] | str): text/JSONL files, folders of source files, or globs (prompt sources).
        tokenizer (str | None): tokenizer folder; default the target folder, else ``$SPECDEC_ZOO/tokenizer``.
        corpus_exclude, corpus_suffixes, max_corpus_tokens, corpus_cache: as in ``TrainConfig``.
        eval_prompts (str | None): JSONL of held-out prompts; default the last corpus prompts are held out.
        init_from (str | None): start from this EAGLE-3 checkpoint (its draft vocabulary is kept).
        intermediate_size (int | None): the head's MLP width; default the target's.
        target_layer_ids (tuple[int, ...] | None): fused layers as the config declares them (``fused_layers``);
            None = ``[2, N // 2, N - 3]``.
        draft_vocab_size (int): tokens of the draft vocabulary (capped at the target's). Default 32000.
        ttt_steps (int): unrolled steps. Default 7.
        step_decay (float): step k's loss weight is ``step_decay ** k``. Default 0.8.
        prompt_tokens (int): corpus tokens per prompt. Default 64.
        seq_len (int): prompt plus greedy target continuation per training sequence. Default 256.
        num_sequences (int | None): sequences generated (the training set); default every corpus prompt.
        gen_batch_size (int): prompts continued at once. Default 64.
        batch_size (int): sequences per step. Default 16.
        lr, min_lr_ratio, warmup_ratio, weight_decay, beta1, beta2, grad_clip: AdamW + linear warmup + cosine.
        max_steps (int): optimizer steps. Default 1000.
        max_time_s (float | None): wall-clock budget of the optimisation; the schedule follows whichever runs out.
        eval_every (int): steps between acceptance evaluations (0 = only at the start and the end). Default 200.
        eval_num_prompts, eval_prompt_tokens, eval_new_tokens: held-out prompts decoded with ``specdec.generate``
            and ``Chain(eval_chain)``; their mean accepted length is logged. Defaults 8, 256, 64.
        eval_chain (int): drafts per round of the evaluation chain. Default 4.
        save_every (int): steps between checkpoints (0 = only at the end). Default 500.
        save_dtype (str): checkpoint dtype. Default "bfloat16".
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
    init_from: str | None = None
    intermediate_size: int | None = None
    target_layer_ids: tuple[int, ...] | None = None
    draft_vocab_size: int = 32000
    ttt_steps: int = 7
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
    eval_chain: int = 4
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
        if self.target_layer_ids is not None:
            object.__setattr__(self, "target_layer_ids", tuple(int(i) for i in self.target_layer_ids))
        if not self.corpus and not self.corpus_cache:
            raise ValueError(
                "corpus is required: pass corpus=<file, folder or glob> (a string is one path; a list several), "
                "or corpus_cache=<tokens.pt>."
            )
        if not str(self.out_dir):
            raise ValueError("out_dir is required: the folder the EAGLE-3 head is written to.")
        for name in _WHOLE:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r}: give an int >= 1.")
        if self.seq_len <= self.prompt_tokens:
            raise ValueError(
                f"seq_len={self.seq_len} leaves no room for the target's continuation after prompt_tokens="
                f"{self.prompt_tokens}: raise seq_len or lower prompt_tokens."
            )
        if self.seq_len < self.ttt_steps + 1:
            raise ValueError(
                f"seq_len={self.seq_len} must exceed ttt_steps={self.ttt_steps} (step k needs k+2 tokens)."
            )


# -- data ---------------------------------------------------------------------------------------------------
@torch.no_grad()
def regenerate(target, prompts: torch.Tensor, *, new_tokens: int, batch_size: int = 64) -> torch.Tensor:
    """``[N, P + new_tokens]``: each prompt row followed by the target's greedy continuation (argmax at every step,
    no stopping at end-of-text: every row has the same length).

    Args:
        target: HF causal LM.
        prompts (torch.Tensor): ``[N, P]`` token rows (no padding).
        new_tokens (int): tokens generated per row.
        batch_size (int): rows continued at once.
    """
    device = target.get_input_embeddings().weight.device
    out = []
    for start in range(0, prompts.shape[0], batch_size):
        seq = prompts[start : start + batch_size].to(device, dtype=torch.long)
        step, past = seq, DynamicCache(config=target.config)
        for _ in range(new_tokens):  # the cache fills in place (its keyword differs across transformers versions)
            res = target(input_ids=step, use_cache=True, **{cache_kwarg(target): past})
            step = res.logits[:, -1].argmax(-1, keepdim=True)
            seq = torch.cat([seq, step], dim=1)
        out.append(seq.cpu())
    return torch.cat(out)


def draft_vocabulary(rows: torch.Tensor, size: int, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(d2t [size], t2d [vocab_size])`` of the ``size`` most frequent ids of ``rows`` (ties: the smaller id).

    Draft id d is the d-th smallest chosen target id; ``d2t[d] = target_id - d`` and ``t2d`` marks the chosen ids.
    """
    if not 0 < size <= vocab_size:
        raise ValueError(f"draft_vocab_size={size} must be in [1, vocab_size={vocab_size}].")
    counts = torch.bincount(rows.reshape(-1).long(), minlength=vocab_size)[:vocab_size]
    order = torch.sort(-counts, stable=True).indices  # equal counts keep id order
    used = order[:size].sort().values
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[used] = True
    return used - torch.arange(size), t2d


# -- the objective ------------------------------------------------------------------------------------------
@torch.no_grad()
def target_states(target, input_ids: torch.Tensor, hidden_state_ids: tuple[int, ...]):
    """One frozen target forward: ``(features [B, S, K*H], logits [B, S, V])``; features are the concatenated
    ``hidden_states[i]`` (HF indices, :func:`specdec.drafters.eagle3_model.fused_layers`)."""
    out = target(input_ids=input_ids, output_hidden_states=True, use_cache=False)
    return torch.cat([out.hidden_states[i] for i in hidden_state_ids], dim=-1), out.logits


def ttt_logits(
    model: Eagle3Model, embed, input_ids: torch.Tensor, features: torch.Tensor, steps: int
) -> list[torch.Tensor]:
    """Draft logits of the unrolled head: entry k is ``[B, S - 1 - k, Vd]``.

    Row t of step k pairs the token at ``t + k + 1`` with the fused target state of position t (k = 0) or the
    head's own output of row t at step k - 1, sits at rotary position ``t + k``, attends to the step-0 rows
    ``0..t`` and to row t of steps ``1..k``, and predicts the token at ``t + k + 2``.

    Args:
        model (Eagle3Model): the head.
        embed: the target's input embedding (or the head's own).
        input_ids (torch.Tensor): ``[B, S]``.
        features (torch.Tensor): ``[B, S, K*H_t]`` from :func:`target_states`.
        steps (int): unrolled steps, at most ``S - 1``.
    """
    batch, seq = input_ids.shape
    rep = model.midlayer.num_heads // model.midlayer.num_kv_heads
    hidden = model.fuse(features[:, : seq - 1])
    positions = torch.arange(seq, device=input_ids.device)
    keys, values, out = [], [], []
    for k in range(steps):
        n = seq - 1 - k
        hidden = hidden[:, :n]
        residual, x = model.layer_input(embed(input_ids[:, k + 1 : k + 1 + n]), hidden)
        cos, sin = model.rope(positions[k : k + n][None].expand(batch, -1), x.dtype)
        q, key, value = model.qkv(x, cos, sin)
        keys.append(repeat_kv(key, rep))
        values.append(repeat_kv(value, rep))
        scale = q.shape[-1] ** -0.5
        causal = (q @ keys[0][:, :, :n].transpose(-1, -2)) * scale  # [B, h, n, n]: the step-0 rows
        allowed = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        causal = causal.masked_fill(~allowed, float("-inf"))
        own = [(q * keys[j][:, :, :n]).sum(-1, keepdim=True) * scale for j in range(1, k + 1)]  # [B, h, n, 1]
        probs = torch.cat([causal, *own], dim=-1).softmax(-1, dtype=torch.float32).to(q.dtype)
        attn = probs[..., :n] @ values[0][:, :, :n]
        for j in range(1, k + 1):
            attn = attn + probs[..., n + j - 1 : n + j] * values[j][:, :, :n]
        logits, hidden = model.head(model.finish(residual, attn.transpose(1, 2).reshape(batch, n, -1)))
        out.append(logits)
    return out


def eagle3_loss(
    step_logits: list[torch.Tensor], target_logits: torch.Tensor, target_ids: torch.Tensor, *, decay: float
) -> tuple[torch.Tensor, dict[str, float]]:
    """``sum_k decay**k * CE_k`` over the steps of :func:`ttt_logits`.

    ``CE_k``: at each row t, ``-sum_d p(d) log q_k(d)`` with p the softmax of the target logits at ``t + k + 1``
    over the draft vocabulary (``target_ids [Vd]``, the target id of each draft id), summed over the rows whose
    target argmax is in the draft vocabulary, divided by all ``B * (S - 1 - k)`` rows of the step.

    Returns:
        (loss, metrics): ``acc{k}`` (share of rows where the head's argmax is the target's, for k = 0 and the
        last step) and ``accept`` (teacher-forced chain: mean leading run of correct steps).
    """
    batch, seq, vocab = target_logits.shape
    top = target_logits.argmax(-1)  # [B, S]
    in_draft = torch.zeros(vocab, dtype=torch.bool, device=top.device).index_fill_(0, target_ids, True)[top]
    p = target_logits.float().index_select(-1, target_ids).softmax(-1)  # [B, S, Vd]
    loss = target_logits.new_zeros((), dtype=torch.float32)
    hits = []
    for k, logits in enumerate(step_logits):
        n = logits.shape[1]
        logq = logits.float().log_softmax(-1)
        ce = -(p[:, k + 1 : k + 1 + n] * logq).sum(-1)  # [B, n]
        loss = loss + decay**k * (ce * in_draft[:, k + 1 : k + 1 + n]).sum() / (batch * n)
        with torch.no_grad():
            hits.append(target_ids[logq.argmax(-1)] == top[:, k + 1 : k + 1 + n])
    with torch.no_grad():
        rows = hits[-1].shape[1]
        run = torch.stack([h[:, :rows] for h in hits], -1).long().cumprod(-1).sum(-1).float()
        metrics = {"acc0": hits[0].float().mean().item(), f"acc{len(hits) - 1}": hits[-1].float().mean().item()}
        metrics["accept"] = run.mean().item()
    return loss, metrics


@torch.no_grad()
def eval_acceptance(drafter: Eagle3Drafter, target, prompts: list[torch.Tensor], *, new_tokens: int, k: int) -> dict:
    """Mean accepted length per round (drafts plus the target's token) of ``specdec.generate`` with ``Chain(k)``."""
    import specdec

    lengths = []
    for ids in prompts:
        out = specdec.generate(
            target, ids[None], drafter=drafter, tree=specdec.Chain(k=k), max_new_tokens=new_tokens, do_sample=False
        )
        lengths += list(out.stats.accept_lengths)
    return {"tau": sum(lengths) / max(1, len(lengths)), "rounds": len(lengths)}


# -- the run ------------------------------------------------------------------------------------------------


def train_eagle3(cfg: Eagle3TrainConfig) -> dict:
    """Train an EAGLE-3 head for ``cfg.target`` and save it (official layout) to ``cfg.out_dir``.

    Returns:
        dict: the run summary (also ``out_dir/train_summary.json``): config, draft vocabulary coverage, loss
        curve points, evaluations (mean accepted length ``tau`` with ``Chain(eval_chain)``), timings.

    Examples:
        >>> train_eagle3(Eagle3TrainConfig(target="zoo/target-dense", corpus="src/", out_dir="runs/e", max_steps=50))
    """
    if not (cfg.corpus_cache and Path(cfg.corpus_cache).is_file()):
        if not cfg.corpus:
            raise ValueError(f"corpus is required: corpus_cache {cfg.corpus_cache} does not exist yet.")
        check_sources(cfg.corpus)
    with StagedOutput(cfg.out_dir) as output:
        summary = _train(cfg, output)
    logger.info(
        "saved the EAGLE-3 head (config.json, model.safetensors), train_log.jsonl, train_summary.json and "
        "TRAINING.md to %s",
        output.out_dir.resolve(),
    )
    return summary


def prepare_training(cfg, output: StagedOutput) -> dict:
    """What a head's trainer starts from (the EAGLE-3 and MTP trainers share it): the seed set, the device and
    dtypes, an empty ``train_log.jsonl``, the target (frozen) and its tokenizer, the corpus packed into prompts
    (or read from ``corpus_cache``), the evaluation prompts, and the training rows: the prompts continued by the
    target to ``seq_len`` tokens. Returns those values by name."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(cfg.seed)
    device = pick_device(cfg.device)
    on_cpu = device.type == "cpu"
    target_dtype = (
        getattr(torch, cfg.target_dtype) if cfg.target_dtype else (torch.float32 if on_cpu else torch.bfloat16)
    )
    amp = None if on_cpu or cfg.autocast_dtype is None else getattr(torch, cfg.autocast_dtype)
    log_path = output.path / "train_log.jsonl"
    log_path.write_text("")

    t0 = time.perf_counter()
    tokenizer = load_tokenizer(cfg.tokenizer, cfg.target)
    target = AutoModelForCausalLM.from_pretrained(resolve_local(cfg.target), dtype=target_dtype).to(device).eval()
    target.requires_grad_(False)
    eos_id = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else target.config.eos_token_id
    if cfg.corpus_cache and Path(cfg.corpus_cache).is_file():
        stream = torch.load(cfg.corpus_cache)[: cfg.max_corpus_tokens]
    else:
        docs = iter_documents(cfg.corpus, exclude=cfg.corpus_exclude, suffixes=cfg.corpus_suffixes)
        stream = tokenize_documents(docs, tokenizer, eos_token_id=eos_id, max_tokens=cfg.max_corpus_tokens)
        if cfg.corpus_cache:
            torch.save(stream, cfg.corpus_cache)
    prompts = pack_tokens(stream, cfg.prompt_tokens)
    if cfg.eval_prompts:
        eval_texts = load_eval_prompts(cfg.eval_prompts, limit=cfg.eval_num_prompts)
        eval_ids = [
            tokenizer(t, add_special_tokens=False, return_tensors="pt")["input_ids"][0, -cfg.eval_prompt_tokens :]
            for t in eval_texts
        ]
    else:  # hold out the last corpus prompts
        held = max(1, min(cfg.eval_num_prompts, prompts.shape[0] // 10))
        eval_ids = [r.long() for r in prompts[-held:]]
        prompts = prompts[:-held]
    eval_ids = [ids.to(device) for ids in eval_ids]
    gen = torch.Generator().manual_seed(cfg.seed)
    prompts = prompts[torch.randperm(prompts.shape[0], generator=gen)[: cfg.num_sequences]]
    t_data = time.perf_counter() - t0

    t1 = time.perf_counter()
    with torch.autocast(device.type, dtype=amp, enabled=amp is not None):
        rows = regenerate(target, prompts, new_tokens=cfg.seq_len - cfg.prompt_tokens, batch_size=cfg.gen_batch_size)
    t_gen = time.perf_counter() - t1
    logger.info(
        "data: %d corpus tokens -> %d prompts of %d, continued by the target to %d tokens (%.1fs + %.1fs)",
        stream.numel(), rows.shape[0], cfg.prompt_tokens, cfg.seq_len, t_data, t_gen,
    )  # fmt: skip
    return {"device": device, "on_cpu": on_cpu, "amp": amp, "log_path": log_path, "tokenizer": tokenizer,
            "target": target, "eos_id": eos_id, "stream": stream, "eval_ids": eval_ids, "gen": gen, "rows": rows,
            "t_data": t_data, "t_gen": t_gen}  # fmt: skip


def train_head(
    cfg,
    output: StagedOutput,
    data: dict,
    drafter,
    *,
    label: str,
    batch_loss,
    saved,
    extra: dict,
    log_steps: bool = False,
) -> dict:
    """The training loop the EAGLE-3 and MTP trainers share, over what :func:`prepare_training` returned: AdamW
    (no weight decay on vectors, fused off the CPU), warm-up then cosine learning rate by step or by
    ``max_time_s``, batches of ``data["rows"]`` drawn without replacement per pass, ``batch_loss(batch) -> (loss,
    metrics)`` under autocast, gradient clipping, the log (``train_log.jsonl``), the acceptance of
    ``Chain(eval_chain)`` at the start, every ``eval_every`` steps and at the end, and saves of ``saved``. Returns
    the run summary (``extra`` among its facts), also written to ``train_summary.json``."""
    model = drafter.model
    device, on_cpu, amp, log_path = data["device"], data["on_cpu"], data["amp"], data["log_path"]
    target, stream, eval_ids, gen, rows = data["target"], data["stream"], data["eval_ids"], data["gen"], data["rows"]
    t_data, t_gen = data["t_data"], data["t_gen"]
    n_params = sum(p.numel() for p in model.parameters())
    decay_params = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay_params, "weight_decay": cfg.weight_decay}, {"params": other, "weight_decay": 0.0}],
        lr=cfg.lr,
        betas=(cfg.beta1, cfg.beta2),
        fused=not on_cpu,
    )
    order = torch.randperm(rows.shape[0], generator=gen)
    cursor, step, losses, evals = 0, 0, [], []
    summary = {
        "config": asdict(cfg),
        "device": str(device),
        "params": n_params,
        "corpus_tokens": stream.numel(),
        "train_sequences": rows.shape[0],
        **extra,
        "data_s": t_data,
        "regenerate_s": t_gen,
    }

    def evaluate() -> None:
        model.eval()  # decoded as a user would: the head in its own dtype, no autocast (its round is captured)
        res = eval_acceptance(drafter, target, eval_ids, new_tokens=cfg.eval_new_tokens, k=cfg.eval_chain)
        model.train()
        res = {"step": step, **res}
        evals.append(res)
        append_jsonl(log_path, {"eval": res})
        logger.info("eval step %d: tau %.3f (Chain(%d), %d rounds)", step, res["tau"], cfg.eval_chain, res["rounds"])

    evaluate()
    model.train()
    t_start = time.perf_counter()
    with Progress(cfg.progress, cfg.max_steps, label=label) as bar:
        while step < cfg.max_steps:
            elapsed = time.perf_counter() - t_start
            progress = step / cfg.max_steps
            if cfg.max_time_s:
                progress = max(progress, elapsed / cfg.max_time_s)
            if progress >= 1.0:
                break
            for group in opt.param_groups:
                group["lr"] = cfg.lr * cosine_lr_factor(progress, cfg.warmup_ratio, cfg.min_lr_ratio)
            if cursor + cfg.batch_size > rows.shape[0]:
                order, cursor = torch.randperm(rows.shape[0], generator=gen), 0
            batch = rows[order[cursor : cursor + cfg.batch_size]].to(device, dtype=torch.long)
            cursor += cfg.batch_size
            with torch.autocast(device.type, dtype=amp, enabled=amp is not None):
                loss, metrics = batch_loss(batch)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            opt.step()
            step += 1
            info = None
            if step % cfg.log_every == 0 or step == 1:
                rec = {
                    "step": step,
                    "loss": loss.item(),
                    "grad_norm": grad_norm.item(),
                    "lr": opt.param_groups[0]["lr"],
                    "elapsed_s": time.perf_counter() - t_start,
                    **metrics,
                }
                losses.append(rec)
                append_jsonl(log_path, rec)
                info = f"loss {rec['loss']:.3f} acc0 {metrics['acc0']:.2f} accept {metrics['accept']:.2f}"
                if log_steps:
                    logger.info("step %d: loss %.4f acc0 %.3f accept %.2f", step, rec["loss"], metrics["acc0"],
                                metrics["accept"])  # fmt: skip
            bar.update(step, info)
            if cfg.eval_every and step % cfg.eval_every == 0:
                evaluate()
            if cfg.save_every and step % cfg.save_every == 0:
                output.save(saved, dtype=getattr(torch, cfg.save_dtype), step=step)
    train_s = time.perf_counter() - t_start
    if evals[-1]["step"] != step:
        evaluate()
    model.eval()
    output.save(saved, dtype=getattr(torch, cfg.save_dtype), step=step)
    summary.update(
        steps=step,
        train_s=train_s,
        steps_per_s=step / max(train_s, 1e-9),
        sequences_seen=step * cfg.batch_size,
        losses=losses,
        evals=evals,
    )
    (output.path / "train_summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def _train(cfg: Eagle3TrainConfig, output: StagedOutput) -> dict:

    data = prepare_training(cfg, output)
    target, rows = data["target"], data["rows"]

    vocab = target.get_input_embeddings().weight.shape[0]
    if cfg.init_from:
        drafter = Eagle3Drafter.from_pretrained(cfg.init_from, target=target, dtype=torch.float32)
    else:
        size = min(cfg.draft_vocab_size, vocab)
        drafter = Eagle3Drafter.for_target(
            target,
            layer_ids=cfg.target_layer_ids,
            draft_vocab_size=size,
            intermediate_size=cfg.intermediate_size,
            seed=cfg.seed,
            dtype=torch.float32,
        )
        d2t, t2d = draft_vocabulary(rows, size, vocab)
        drafter.model.d2t.copy_(d2t)
        drafter.model.t2d.copy_(t2d)
    model = drafter.model
    target_ids = model.target_ids()
    coverage = torch.isin(rows, target_ids.cpu()).float().mean().item()
    n_params = sum(p.numel() for p in model.parameters())
    logger.info(
        "head: %d params, fused hidden_states %s, draft vocabulary %d (covers %.1f%% of the training tokens)",
        n_params, drafter.hidden_state_ids, drafter.config.draft_vocab_size, 100 * coverage,
    )  # fmt: skip

    embed = drafter._embed

    def batch_loss(batch: torch.Tensor):
        feats, logits = target_states(target, batch, drafter.hidden_state_ids)
        step_logits = ttt_logits(model, embed, batch, feats, cfg.ttt_steps)
        return eagle3_loss(step_logits, logits, target_ids, decay=cfg.step_decay)

    summary = train_head(cfg, output, data, drafter, label="eagle3", batch_loss=batch_loss, saved=drafter,
                         extra={"draft_vocab_size": drafter.config.draft_vocab_size,
                                "draft_vocab_coverage": coverage})  # fmt: skip
    (output.path / "TRAINING.md").write_text(training_card(summary))
    return summary


_DEFAULTS = {
    f.name: list(f.default) if isinstance(f.default, tuple) else f.default
    for f in fields(Eagle3TrainConfig)
    if f.default is not MISSING
}


def training_card(summary: dict) -> str:
    """``TRAINING.md`` of a run: what was trained, on what, and how the loss and acceptance went."""
    cfg = summary["config"]
    lines = [
        "# EAGLE-3 head",
        "",
        f"Target `{cfg['target']}`; trained with `specdec.train.eagle3` (training-time test, {cfg['ttt_steps']} "
        f"steps, step weights {cfg['step_decay']}^k, soft targets from the target's logits over the draft "
        "vocabulary; see `docs/eagle3.md`).",
        "",
        f"- {summary['params']:,} parameters, draft vocabulary {summary['draft_vocab_size']} (the most frequent "
        f"tokens of the training sequences; they cover {100 * summary['draft_vocab_coverage']:.1f}% of them).",
        f"- Data: {summary['train_sequences']} corpus prompts of {cfg['prompt_tokens']} tokens, continued greedily "
        f"by the target to {cfg['seq_len']} tokens ({summary['regenerate_s']:.0f} s).",
        f"- {summary['steps']} steps of {cfg['batch_size']} sequences in {summary['train_s']:.0f} s on "
        f"{summary['device']}; AdamW lr {cfg['lr']}, warm-up {cfg['warmup_ratio']}, cosine to "
        f"{cfg['min_lr_ratio']}.",
        "",
        "Settings other than the `Eagle3TrainConfig` defaults: "
        + ", ".join(f"`{k}={v}`" for k, v in cfg.items() if k not in _DEFAULTS or _DEFAULTS[k] != v)
        + ".",
        "",
        "| step | loss | acc0 | accept (teacher-forced) |",
        "|---|---|---|---|",
    ]
    points = summary["losses"]
    stride = max(1, len(points) // 10)
    for rec in points[::stride] + ([points[-1]] if points and (len(points) - 1) % stride else []):
        lines.append(f"| {rec['step']} | {rec['loss']:.3f} | {rec['acc0']:.3f} | {rec['accept']:.2f} |")
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
