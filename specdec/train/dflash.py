"""Training a DFlash drafter for a frozen target (the block-diffusion objective of ``docs/dflash.md``).

Each packed row is run once through the frozen target to tap ``target_layer_ids``; random anchors open blocks
``[token at anchor, MASK x (B-1)]`` that see only the context strictly before their anchor plus their own block;
slot k predicts the token at ``anchor + k`` with weight ``exp(-(k-1)/gamma)``.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from specdec.drafters.dflash import DFlashDrafter, DFlashDraftModel
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
    "TrainConfig",
    "block_hidden",
    "dflash_loss",
    "eval_acceptance",
    "sample_anchors",
    "target_features",
    "train_dflash",
]

logger = logging.getLogger(__name__)


# int fields and the least value each takes (None stays the default where the field is optional): a drafter of 0
# layers or a block that predicts nothing would otherwise train without error and draft nothing
_RANGES = (
    ("num_layers", 1, "drafter layers"),
    ("num_taps", 1, "target layers tapped"),
    ("intermediate_size", 1, "the MLP's width"),
    ("num_attention_heads", 1, "attention heads"),
    ("num_key_value_heads", 1, "K/V heads"),
    ("block_size", 2, "the block: its first token and the ones it predicts"),
    ("seq_len", 2, "tokens per packed row"),
    ("num_anchors", 1, "blocks per row"),
    ("batch_size", 1, "rows per step"),
    ("log_every", 1, "steps between log lines"),
    ("eval_every", 0, "steps between evaluations, 0 = only at the end"),
    ("save_every", 0, "steps between checkpoints, 0 = only at the end"),
    ("eval_num_prompts", 1, "held-out prompts evaluated"),
    ("eval_prompt_tokens", 1, "prompt tokens kept"),
    ("eval_new_tokens", 1, "tokens generated per prompt"),
)


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Everything a DFlash training run needs.

    Args:
        target (str): HF folder (or hub id) of the frozen target.
        corpus (tuple[str, ...] | str): text/JSONL files, folders of source files, or globs; a string is one path.
            Required unless ``corpus_cache`` exists.
        out_dir (str): where checkpoints (z-lab layout), ``train_log.jsonl`` and ``train_summary.json`` go; written
            only when the run succeeds (a failed run leaves it as it was).
        tokenizer (str | None): tokenizer folder; default the target folder, else ``$SPECDEC_ZOO/tokenizer``.
        corpus_exclude (tuple[str, ...]): path components or globs to skip (e.g. held-out packages).
        corpus_suffixes (tuple[str, ...]): file endings collected from folders. Default ``(".py",)``.
        max_corpus_tokens (int | None): stop tokenizing after this many tokens.
        corpus_cache (str | None): a ``.pt`` token stream; loaded if it exists (then ``corpus`` is not read),
            else written after tokenizing (``python -m specdec.train.data`` builds one ahead).
        eval_prompts (str | None): JSONL of held-out prompts (``prompt`` field); default: the last rows of the
            corpus are held out instead.
        init_from (str | None): start from this DFlash checkpoint instead of random weights.
        num_layers, intermediate_size, num_attention_heads, num_key_value_heads: drafter shape (None = target's).
        target_layer_ids (tuple[int, ...] | None): taps; None = z-lab rule with ``num_taps`` (default num_layers).
        block_size (int): B. Default 16.
        mask_token_id (int | None): default the tokenizer's mask token.
        seq_len (int): packed row length. Default 1024.
        num_anchors (int): blocks per row. Default 64.
        gamma (float): slot-weight decay. Default 7.
        batch_size (int): rows per step. Default 16.
        lr, min_lr_ratio, warmup_ratio, weight_decay, beta1, beta2, grad_clip: AdamW + linear warmup + cosine.
        max_steps (int): optimizer steps. Default 1000.
        max_time_s (float | None): wall-clock budget; the schedule follows whichever of steps/time runs out first.
        eval_every (int): steps between acceptance evaluations (0 = only at the end). Default 200.
        eval_num_prompts (int): held-out prompts evaluated. Default 16.
        eval_prompt_tokens (int): prompt tokens kept (the last ones). Default 256.
        eval_new_tokens (int): greedy target tokens generated per prompt. Default 128.
        save_every (int): steps between checkpoints (0 = only at the end). Default 500.
        save_dtype (str): checkpoint dtype. Default "bfloat16".
        log_every (int): steps between log lines. Default 10.
        device (str | None): default the current accelerator, else CPU.
        autocast_dtype (str | None): autocast dtype on accelerators ("bfloat16"); None disables. Ignored on CPU.
        target_dtype (str | None): dtype to load the target in; default bfloat16 on accelerators, float32 on CPU.
        seed (int): Default 0.
        progress (bool): rich progress bar. Default True.
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
    num_layers: int = 3
    intermediate_size: int | None = None
    num_attention_heads: int | None = None
    num_key_value_heads: int | None = None
    target_layer_ids: tuple[int, ...] | None = None
    num_taps: int | None = None
    block_size: int = 16
    mask_token_id: int | None = None
    seq_len: int = 1024
    num_anchors: int = 64
    gamma: float = 7.0
    batch_size: int = 16
    lr: float = 6e-4
    min_lr_ratio: float = 0.1
    warmup_ratio: float = 0.04
    weight_decay: float = 0.01
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    max_steps: int = 1000
    max_time_s: float | None = None
    eval_every: int = 200
    eval_num_prompts: int = 16
    eval_prompt_tokens: int = 256
    eval_new_tokens: int = 128
    save_every: int = 500
    save_dtype: str = "bfloat16"
    log_every: int = 10
    device: str | None = None
    autocast_dtype: str | None = "bfloat16"
    target_dtype: str | None = None
    seed: int = 0
    progress: bool = True

    def __post_init__(self) -> None:
        check_field_types(self, skip=("max_steps",))  # checked below, with its range
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
            raise ValueError("out_dir is required: the folder the drafter checkpoint is written to.")
        if isinstance(self.max_steps, bool) or not isinstance(self.max_steps, int) or self.max_steps < 1:
            raise ValueError(
                f"max_steps={self.max_steps!r} is not a step count: give an int >= 1 (optimizer steps), "
                f"e.g. max_steps=500."
            )
        for name, least, what in _RANGES:
            value = getattr(self, name)
            if value is not None and value < least:
                default = self.__dataclass_fields__[name].default
                fix = f"e.g. {name}={default}" if default is not None else "or null (the default)"
                raise ValueError(f"{name}={value!r}: give an int >= {least} ({what}), {fix}.")
        if self.seq_len < self.block_size + 1:
            raise ValueError(f"seq_len={self.seq_len} must exceed block_size={self.block_size} (anchors need room).")
        if self.num_anchors > self.seq_len - self.block_size:
            raise ValueError(
                f"num_anchors={self.num_anchors} exceeds the {self.seq_len - self.block_size} anchor positions of a "
                f"row (seq_len - block_size); lower num_anchors or raise seq_len."
            )




# -- the objective ------------------------------------------------------------------------------------------
@torch.no_grad()
def target_features(target, input_ids: torch.Tensor, layer_ids: tuple[int, ...]) -> torch.Tensor:
    """Concatenated outputs of ``layer_ids`` (``hidden_states[i + 1]``, as the decode loop taps them).

    Args:
        target: HF causal LM.
        input_ids (torch.Tensor): ``[N, S]``.

    Returns:
        torch.Tensor: ``[N, S, K*H]``.
    """
    base = target.get_decoder() if hasattr(target, "get_decoder") else target.model
    out = base(input_ids=input_ids, output_hidden_states=True, use_cache=False)
    return torch.cat([out.hidden_states[i + 1] for i in layer_ids], dim=-1)


def sample_anchors(
    num_rows: int, seq_len: int, *, block_size: int, num_anchors: int, generator, device
) -> torch.Tensor:
    """``[N, n]`` sorted distinct anchors per row in ``[1, seq_len - block_size]`` (room for a whole block)."""
    scores = torch.rand(num_rows, seq_len - block_size, generator=generator)
    return (scores.argsort(dim=1)[:, :num_anchors] + 1).sort(dim=1).values.to(device)


def block_hidden(
    model: DFlashDraftModel, embed, input_ids: torch.Tensor, features: torch.Tensor, anchors: torch.Tensor
) -> torch.Tensor:
    """Drafter outputs of every anchor's block, all blocks of a row in one forward.

    Keys are ``[context S | block_0 | ... | block_{n-1}]``; block i sees context positions < anchor_i and its own
    block (bidirectionally), nothing else. This equals the inference forward with the context cache holding
    exactly the tokens before the anchor.

    Args:
        model (DFlashDraftModel): the drafter weights.
        embed: the target's input embedding.
        input_ids (torch.Tensor): ``[N, S]`` token rows.
        features (torch.Tensor): ``[N, S, K*H]`` target taps of those rows.
        anchors (torch.Tensor): ``[N, n]`` block roots, each ``<= S - B``.

    Returns:
        torch.Tensor: ``[N, n, B, H]`` final-normed hidden states.
    """
    cfg = model.config
    rows, seq = input_ids.shape
    n, size, device = anchors.shape[1], cfg.block_size, input_ids.device
    ctx_pos = torch.arange(seq, device=device).expand(rows, seq)
    context = model.project_context(features, ctx_pos)
    positions = (anchors[:, :, None] + torch.arange(size, device=device)).view(rows, n * size)
    block = torch.full((rows, n, size), cfg.mask_token_id, dtype=torch.long, device=device)
    block[:, :, 0] = input_ids.gather(1, anchors)
    block_of = torch.arange(n, device=device).repeat_interleave(size)  # [n*B]
    sees_ctx = ctx_pos[:, None, :] < anchors.repeat_interleave(size, dim=1)[:, :, None]  # [N, nB, S]
    sees_block = (block_of[:, None] == block_of[None, :]).expand(rows, -1, -1)  # [N, nB, nB]
    allowed = torch.cat([sees_ctx, sees_block], dim=-1)
    hidden = model(embed(block.view(rows, n * size)), positions, context, ctx_pos, allowed)
    return hidden.view(rows, n, size, -1)


def dflash_loss(
    hidden: torch.Tensor, lm_head, input_ids: torch.Tensor, anchors: torch.Tensor, *, gamma: float
) -> tuple[torch.Tensor, dict[str, float]]:
    """Weighted cross-entropy of slots 1..B-1 against the tokens at ``anchor + k``.

    Args:
        hidden (torch.Tensor): ``[N, n, B, H]`` from :func:`block_hidden`.
        lm_head: the target's LM head.
        input_ids (torch.Tensor): ``[N, S]``.
        anchors (torch.Tensor): ``[N, n]``.
        gamma (float): slot k has weight ``exp(-(k-1)/gamma)``; weights are normalised to sum to one.

    Returns:
        (loss, metrics): scalar loss; ``acc1`` (slot-1 accuracy) and ``accept`` (mean leading run of
        correct argmax slots, the teacher-forced chain acceptance).
    """
    rows, n, size, _ = hidden.shape
    offsets = torch.arange(1, size, device=hidden.device)
    labels = input_ids.gather(1, (anchors[:, :, None] + offsets).view(rows, -1)).view(rows, n, size - 1).long()
    logits = lm_head(hidden[:, :, 1:]).float()  # [N, n, B-1, V]
    ce = F.cross_entropy(logits.flatten(0, 2), labels.flatten(), reduction="none").view(rows, n, size - 1)
    weights = torch.exp(-(offsets.float() - 1) / gamma)
    loss = (ce * (weights / weights.sum())).sum(-1).mean()
    with torch.no_grad():
        hit = logits.argmax(-1) == labels
        metrics = {"acc1": hit[..., 0].float().mean().item(), "accept": hit.cumprod(-1).sum(-1).float().mean().item()}
    return loss, metrics


@torch.no_grad()
def eval_acceptance(
    model: DFlashDraftModel, target, sequences: list[tuple[torch.Tensor, int]], *, max_anchors: int = 512
) -> dict[str, float]:
    """Teacher-forced chain acceptance on greedy target continuations.

    Each sequence is a prompt followed by the target's own greedy continuation, so for every anchor a in the
    continuation the target's greedy choice at a+k-1 is exactly token a+k: the leading run of drafter argmax
    slots equal to those tokens is the number of drafts a greedy DFlash round rooted at a would accept.

    Args:
        model (DFlashDraftModel): drafter weights.
        target: HF causal LM.
        sequences: ``(tokens [L] on the target device, prompt_len)`` pairs.
        max_anchors (int): anchors per sequence (evenly spaced when more are available).

    Returns:
        dict: ``tau`` (1 + mean accepted drafts, chain of B-1), ``acc1``, ``n_anchors``.
    """
    size = model.config.block_size
    accepted, first, count = 0.0, 0.0, 0
    for tokens, prompt_len in sequences:
        lo, hi = max(prompt_len - 1, 1), tokens.numel() - size
        if hi < lo:
            continue
        anchors = torch.arange(lo, hi + 1, device=tokens.device)
        if anchors.numel() > max_anchors:
            anchors = anchors[torch.linspace(0, anchors.numel() - 1, max_anchors).round().long().to(tokens.device)]
        ids = tokens[None]
        feats = target_features(target, ids, model.config.target_layer_ids)
        hidden = block_hidden(model, target.get_input_embeddings(), ids, feats, anchors[None])
        logits = target.get_output_embeddings()(hidden[0, :, 1:].to(target.dtype))
        labels = tokens[anchors[:, None] + torch.arange(1, size, device=tokens.device)]
        hit = logits.argmax(-1) == labels
        accepted += hit.cumprod(-1).sum().item()
        first += hit[:, 0].sum().item()
        count += anchors.numel()
    count = max(count, 1)
    return {"tau": 1.0 + accepted / count, "acc1": first / count, "n_anchors": count}


@torch.no_grad()
def greedy_continuations(
    target, tokenizer, prompts: list[str], *, prompt_tokens: int, new_tokens: int
) -> list[tuple[torch.Tensor, int]]:
    """``(prompt + greedy continuation [L], prompt_len)`` per prompt, generated by the target's own ``generate``."""
    device = target.get_input_embeddings().weight.device
    out = []
    for text in prompts:
        ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"][:, -prompt_tokens:]
        ids = ids.to(device)
        seq = target.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id,
        )
        out.append((seq[0], ids.shape[1]))
    return out


# -- the run ------------------------------------------------------------------------------------------------


def train_dflash(cfg: TrainConfig) -> dict:
    """Train a DFlash drafter for ``cfg.target`` and save it (z-lab layout) to ``cfg.out_dir``.

    Returns:
        dict: the run summary (also written to ``out_dir/train_summary.json``): config, loss curve points,
        evaluations (teacher-forced chain acceptance ``tau``), throughput.

    Examples:
        >>> train_dflash(TrainConfig(target="zoo/target-dense", corpus="src/", out_dir="runs/d", max_steps=50))
    """
    if not (cfg.corpus_cache and Path(cfg.corpus_cache).is_file()):
        if not cfg.corpus:
            raise ValueError(f"corpus is required: corpus_cache {cfg.corpus_cache} does not exist yet.")
        check_sources(cfg.corpus)
    with StagedOutput(cfg.out_dir) as output:
        summary = _train(cfg, output)
    logger.info(
        "saved the drafter (config.json, model.safetensors), train_log.jsonl and train_summary.json to %s",
        output.out_dir.resolve(),
    )
    return summary


def _train(cfg: TrainConfig, output: StagedOutput) -> dict:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(cfg.seed)
    device = pick_device(cfg.device)
    on_cpu = device.type == "cpu"
    target_dtype = (
        getattr(torch, cfg.target_dtype) if cfg.target_dtype else (torch.float32 if on_cpu else torch.bfloat16)
    )
    amp = None if on_cpu or cfg.autocast_dtype is None else getattr(torch, cfg.autocast_dtype)
    out_dir = output.path
    log_path = out_dir / "train_log.jsonl"
    log_path.write_text("")

    t0 = time.perf_counter()
    tokenizer = load_tokenizer(cfg.tokenizer, cfg.target)
    target = AutoModelForCausalLM.from_pretrained(resolve_local(cfg.target), dtype=target_dtype).to(device).eval()
    target.requires_grad_(False)
    mask_id = cfg.mask_token_id if cfg.mask_token_id is not None else tokenizer.mask_token_id
    if mask_id is None:
        raise ValueError("the tokenizer has no mask token: pass mask_token_id=<an unused id of the vocabulary>.")
    eos_id = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else target.config.eos_token_id

    if cfg.corpus_cache and Path(cfg.corpus_cache).is_file():
        stream = torch.load(cfg.corpus_cache)[: cfg.max_corpus_tokens]
    else:
        docs = iter_documents(cfg.corpus, exclude=cfg.corpus_exclude, suffixes=cfg.corpus_suffixes)
        stream = tokenize_documents(docs, tokenizer, eos_token_id=eos_id, max_tokens=cfg.max_corpus_tokens)
        if cfg.corpus_cache:
            torch.save(stream, cfg.corpus_cache)
    rows = pack_tokens(stream, cfg.seq_len)
    if cfg.eval_prompts:
        prompts = load_eval_prompts(cfg.eval_prompts, limit=cfg.eval_num_prompts)
    else:  # hold out the last rows of the corpus and use their first halves as prompts
        held = max(1, min(cfg.eval_num_prompts, rows.shape[0] // 10))
        prompts = [tokenizer.decode(r[: cfg.seq_len // 2].tolist()) for r in rows[-held:]]
        rows = rows[:-held]
    t_data = time.perf_counter() - t0
    logger.info("corpus: %d tokens -> %d rows of %d (%.1fs)", stream.numel(), rows.shape[0], cfg.seq_len, t_data)

    if cfg.init_from:
        drafter = DFlashDrafter.from_pretrained(cfg.init_from, target=target, dtype=torch.float32)
    else:
        drafter = DFlashDrafter.for_target(
            target,
            mask_token_id=mask_id,
            num_layers=cfg.num_layers,
            block_size=cfg.block_size,
            target_layer_ids=cfg.target_layer_ids,
            num_taps=cfg.num_taps,
            intermediate_size=cfg.intermediate_size,
            num_attention_heads=cfg.num_attention_heads,
            num_key_value_heads=cfg.num_key_value_heads,
            seed=cfg.seed,
            dtype=torch.float32,
            device=device,
        )
    model = drafter.model.train()
    embed, lm_head = target.get_input_embeddings(), target.get_output_embeddings()
    n_params = sum(p.numel() for p in model.parameters())
    logger.info("drafter: %d params, taps %s, %s", n_params, drafter.config.target_layer_ids, drafter.config)

    t1 = time.perf_counter()
    eval_set = greedy_continuations(
        target, tokenizer, prompts, prompt_tokens=cfg.eval_prompt_tokens, new_tokens=cfg.eval_new_tokens
    )
    t_gen = time.perf_counter() - t1

    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr,
        betas=(cfg.beta1, cfg.beta2),
        fused=not on_cpu,
    )
    gen = torch.Generator().manual_seed(cfg.seed)
    order = torch.randperm(rows.shape[0], generator=gen)
    cursor, step, losses, evals = 0, 0, [], []
    summary = {
        "config": asdict(cfg),
        "device": str(device),
        "params": n_params,
        "corpus_tokens": stream.numel(),
        "train_rows": rows.shape[0],
        "data_s": t_data,
        "eval_gen_s": t_gen,
    }

    def evaluate() -> None:
        model.eval()
        with torch.autocast(device.type, dtype=amp, enabled=amp is not None):
            res = eval_acceptance(model, target, eval_set)
        model.train()
        res = {"step": step, **res}
        evals.append(res)
        append_jsonl(log_path, {"eval": res})
        logger.info("eval step %d: tau %.3f acc1 %.3f", step, res["tau"], res["acc1"])

    def save() -> None:
        output.save(drafter, dtype=getattr(torch, cfg.save_dtype), step=step)

    evaluate()
    t_start = time.perf_counter()
    with Progress(cfg.progress, cfg.max_steps) as bar:
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
            batch = rows[order[cursor : cursor + cfg.batch_size]].to(device, dtype=torch.long, non_blocking=True)
            cursor += cfg.batch_size
            anchors = sample_anchors(
                batch.shape[0],
                cfg.seq_len,
                block_size=cfg.block_size,
                num_anchors=cfg.num_anchors,
                generator=gen,
                device=device,
            )
            with torch.autocast(device.type, dtype=amp, enabled=amp is not None):
                feats = target_features(target, batch, drafter.config.target_layer_ids)
                hidden = block_hidden(model, embed, batch, feats, anchors)
                loss, metrics = dflash_loss(hidden, lm_head, batch, anchors, gamma=cfg.gamma)
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
                info = f"loss {rec['loss']:.3f} acc1 {metrics['acc1']:.2f} accept {metrics['accept']:.2f}"
                logger.debug("step %d loss %.4f", step, rec["loss"])
            bar.update(step, info)  # every step, so the bar (and its final line off a terminal) ends at the last
            if cfg.eval_every and step % cfg.eval_every == 0:
                evaluate()
            if cfg.save_every and step % cfg.save_every == 0:
                save()
    train_s = time.perf_counter() - t_start
    if not evals or evals[-1]["step"] != step:
        evaluate()
    save()
    summary.update(
        steps=step,
        train_s=train_s,
        tokens_seen=step * cfg.batch_size * cfg.seq_len,
        steps_per_s=step / max(train_s, 1e-9),
        losses=losses,
        evals=evals,
    )
    (out_dir / "train_summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary
