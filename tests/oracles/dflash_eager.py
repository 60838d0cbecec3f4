"""The DFlash drafter decoded eagerly over growing dynamic caches: the oracle of ``specdec.drafters.dflash_static``.

``EagerDFlash`` wraps a bound :class:`~specdec.drafters.dflash.DFlashDrafter` and keeps the projected context
keys/values of the committed tokens in per-layer tensors that grow as rows arrive; each draft runs the drafter
model's own forward (``DFlashDraftModel.forward``) on ``[root, MASK x (B-1)]`` over that context, and trees come
from the host builders (``oracles.ddtree_heap``). It shares nothing with the static round code but the weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from oracles.ddtree_heap import build_ddtree, chain_from_logq
from specdec.trees import Chain
from specdec.types import DraftTree

__all__ = ["DecodeContext", "EagerDFlash"]


@dataclass
class DecodeContext:
    """What a decoding loop shows the drafter.

    Args:
        input_ids (torch.Tensor): ``[1, T]`` committed tokens; the last one is the root of the next draft.
        target_hidden (torch.Tensor | None): ``[1, R, L*H]`` concatenated taps of the drafter's target layers for
            the R committed tokens at positions ``T-1-R .. T-2`` (the prompt after prefill; the accepted path
            after a round).
    """

    input_ids: torch.Tensor
    target_hidden: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return self.input_ids.shape[-1]


class EagerDFlash:
    """Eager decode of ``drafter`` (bound to its target: ``validate`` or ``bind`` was called)."""

    def __init__(self, drafter) -> None:
        self.drafter = drafter
        self.config = drafter.config
        self.num_forwards = 0
        self.reset()

    def reset(self) -> None:
        self._keys: list[torch.Tensor] = []
        self._values: list[torch.Tensor] = []
        self._len = 0

    @torch.no_grad()
    def prefill(self, ctx: DecodeContext) -> None:
        """Start a sequence: project the prompt's target features into the context cache."""
        self.reset()
        self._ingest(ctx)

    @torch.no_grad()
    def commit(self, ctx: DecodeContext) -> None:
        """Append the accepted path's target features (``ctx.target_hidden``) to the context cache."""
        self._ingest(ctx)

    @torch.no_grad()
    def propose(self, ctx: DecodeContext, tree) -> DraftTree:
        """One drafter forward on ``[root, MASK x (B-1)]``, then the chain or DDTree of its log-probs."""
        depth = min(tree.k, self.config.block_size - 1) if isinstance(tree, Chain) else self.config.block_size - 1
        logq = self.draft_logq(ctx, depth=depth)
        root_token = int(ctx.input_ids[0, -1])
        if isinstance(tree, Chain):
            return chain_from_logq(logq, root_token, k=tree.k)
        return build_ddtree(logq, root_token, budget=tree.budget, topk=tree.topk)

    @torch.no_grad()
    def draft_logq(self, ctx: DecodeContext, *, depth: int | None = None) -> torch.Tensor:
        """Per-depth draft log-probabilities ``[depth, V]`` (fp32) of the block rooted at ``ctx.input_ids[0, -1]``
        (new ``ctx.target_hidden`` rows are cached first); ``depth`` defaults to B-1."""
        if ctx.input_ids.shape[0] != 1:
            raise ValueError(f"one sequence at a time, got input_ids {tuple(ctx.input_ids.shape)}.")
        self._ingest(ctx)
        drafter, cfg = self.drafter, self.config
        start = ctx.length - 1
        if self._len != start:
            raise RuntimeError(
                f"the context cache holds {self._len} tokens but {start} are committed: pass the target hidden "
                "states of every committed token (prefill(ctx) after the prompt, commit(ctx) each round)."
            )
        if drafter._embed is None or drafter._lm_head is None:
            raise RuntimeError("the drafter has no embedding/LM head: call drafter.bind(target) or validate().")
        size = cfg.block_size
        depth = size - 1 if depth is None else depth
        device = drafter.model.fc.weight.device
        block = torch.full((1, size), cfg.mask_token_id, dtype=torch.long, device=device)
        block[0, 0] = ctx.input_ids[0, -1]
        positions = torch.arange(start, start + size, device=device)[None]
        context = [(k[:, :, :start], v[:, :, :start]) for k, v in zip(self._keys, self._values, strict=True)]
        if not context:  # empty prompt context: zero-length keys
            context = [(None, None)] * cfg.num_hidden_layers
        hidden = drafter.model(drafter._embed(block), positions, context, torch.arange(start, device=device)[None])
        self.num_forwards += 1
        return drafter.block_logq(hidden, depth)[0]

    def _ingest(self, ctx: DecodeContext) -> None:
        """Project the rows of ``ctx.target_hidden`` not yet cached (positions ``T-1-R .. T-2``)."""
        hidden = ctx.target_hidden
        if hidden is None:
            return
        if hidden.dim() != 3 or hidden.shape[0] != 1:
            raise ValueError(f"ctx.target_hidden must be [1, R, L*H], got {tuple(hidden.shape)}.")
        rows = hidden.shape[1]
        first = ctx.length - 1 - rows
        if first + rows <= self._len:
            return  # already cached (a loop may show the same rows to commit and propose)
        if first != self._len:
            raise RuntimeError(
                f"ctx.target_hidden covers positions {first}..{first + rows - 1} but the context cache holds "
                f"{self._len} tokens: the rows must continue the cache exactly."
            )
        device = self.drafter.model.fc.weight.device
        positions = torch.arange(first, first + rows, device=device)[None]
        new = self.drafter.model.project_context(hidden.to(device), positions)
        if not self._keys:
            self._keys = [k.new_empty(*k.shape[:2], 0, k.shape[3]) for k, _ in new]
            self._values = [v.new_empty(*v.shape[:2], 0, v.shape[3]) for _, v in new]
        for i, (k, v) in enumerate(new):
            self._keys[i] = _append(self._keys[i], k, self._len)
            self._values[i] = _append(self._values[i], v, self._len)
        self._len += rows


def _append(buf: torch.Tensor, new: torch.Tensor, length: int) -> torch.Tensor:
    """Write ``new [1, H, R, D]`` at ``length`` along dim 2 of ``buf``, doubling its capacity when full."""
    need = length + new.shape[2]
    if need > buf.shape[2]:
        grown = buf.new_empty(*buf.shape[:2], max(need, 2 * buf.shape[2], 64), buf.shape[3])
        grown[:, :, :length] = buf[:, :, :length]
        buf = grown
    buf[:, :, length:need] = new
    return buf


@torch.no_grad()
def eager_decode(target, drafter, input_ids: torch.Tensor, tree, max_new_tokens: int) -> tuple[list[int], list[int]]:
    """Greedy speculative decoding written eagerly from the oracles: ``EagerTarget`` (dynamic cache, host trees),
    ``EagerDFlash`` (growing context caches, heap DDTree / argmax chain) and the host walk ``verify_greedy``.

    Args:
        target: the HF causal LM (attention layers).
        drafter (DFlashDrafter): bound to ``target``.
        input_ids (torch.Tensor): ``[1, T]`` prompt.
        tree: ``Chain`` or ``DDTree``.
        max_new_tokens (int): tokens to generate (no EOS).

    Returns:
        (the new tokens, each round's accepted length with its bonus, as ``SpecStats.accept_lengths``).
    """
    from oracles.eager_target import EagerTarget
    from oracles.walk import verify_greedy

    tgt, eager, taps = EagerTarget(target), EagerDFlash(drafter), drafter.target_layer_ids
    logits, hidden = tgt.prefill(input_ids, taps)
    tokens = [*input_ids[0].tolist(), int(logits.argmax())]
    eager.prefill(DecodeContext(torch.tensor([tokens]), hidden))
    lengths: list[int] = []
    start = input_ids.shape[1]
    while len(tokens) - start < max_new_tokens:
        draft = eager.propose(DecodeContext(torch.tensor([tokens])), tree)
        logits, hidden = tgt.verify(draft, taps)
        result = verify_greedy(draft, logits)
        tgt.commit(result.path)
        tokens += result.tokens
        eager.commit(DecodeContext(torch.tensor([tokens]), hidden[:, list(result.path)]))
        lengths.append(len(result.tokens))
    return tokens[start : start + max_new_tokens], lengths
