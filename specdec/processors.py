"""HF's logits processors at every tree node, each with that node's own history.

``model.generate`` runs its processors (``repetition_penalty``, ``no_repeat_ngram_size``, ``bad_words_ids``, ...)
once per step over ``input_ids``, the sequence so far. In a round every tree node is a possible next step, and the
sequence it would continue is the committed prefix followed by *its own* ancestors, not the round's root alone.
:class:`NodeHistory` describes those sequences for a whole round (tensors, no host read) and every processor here
is a tensor op over it, so a round that applies them is captured like any other and its greedy tokens equal
``model.generate``'s with the same options (``docs/api.md``, "Logits processors under trees").

The order is HF's (``GenerationMixin._get_logits_processor``): sequence bias, the prompt's repetition penalty
(HF's ``encoder_repetition_penalty``: a causal LM's "encoder input" is its prompt), repetition penalty, n-gram ban,
the prompt's n-gram ban (``encoder_no_repeat_ngram_size``), bad words, minimum length, forced EOS, length penalty,
suppressed tokens, tokens suppressed at the first step, then the call's own ``logits_processor`` list; the sampling
warpers (temperature, top-k, ...) come after, inside the verification rules (``specdec.verify.processing``).

A processor of the call's ``logits_processor`` list runs per node with that node's ``input_ids`` (HF's
``(input_ids, scores)`` protocol), which needs the tree on the host: such a round is not captured. A processor that
sets ``tree_aware = True`` and defines ``process_tree(scores, nodes)`` (``scores [B, S, V]`` float32, ``nodes`` a
:class:`NodeHistory`, returns the processed scores) runs inside the captured round instead.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch

from specdec.types import DeviceTree

logger = logging.getLogger(__name__)

__all__ = [
    "BeginSuppressTokens",
    "EncoderNGramBan",
    "EncoderRepetitionPenalty",
    "ExponentialDecayLength",
    "ForcedBOS",
    "ForcedEOS",
    "MinNewTokens",
    "NGramBan",
    "NodeHistory",
    "PerNode",
    "Processors",
    "RemoveInvalid",
    "RepetitionPenalty",
    "SequenceBias",
    "SuppressTokens",
    "build_processors",
    "chain_nodes",
    "node_history",
    "tree_paths",
]


class NodeHistory(NamedTuple):
    """The sequences a round's tree nodes continue (batch first; ``S`` tree slots, ``P`` = deepest node + 1).

    Node ``i`` of row ``b`` continues ``history[b, :length[b]]`` followed by ``paths[b, i, :depth[b, i] + 1]`` (the
    tokens from the root, index 0, down to the node itself): that is HF's ``input_ids`` at the step that chooses
    the token after the node.

    Args:
        history (torch.Tensor): ``[B, C]`` int64 committed tokens of each row (its prompt, then generated tokens);
            only the first ``length[b]`` are read.
        length (torch.Tensor): ``[B]`` int64 committed tokens before the root.
        paths (torch.Tensor): ``[B, S, P]`` int64 root-to-node tokens; ``-1`` past the node.
        depth (torch.Tensor): ``[B, S]`` int64 node depths (0 = the root).
        generated (torch.Tensor): ``[B, S]`` int64 tokens generated before the node's choice (HF's ``cur_len`` minus
            the prompt length): the node chooses new token ``generated + 1``.
        pad (tuple | None): the caller's left padding, for processors that see HF's ``input_ids`` as it is (a user's
            processor, ``PerNode``): ``(tokens [B, W], count [B])``, row ``b``'s padding being ``tokens[b,
            :count[b]]`` (the pad tokens as the caller's ``input_ids`` held them); None when no row is padded.
    """

    history: torch.Tensor
    length: torch.Tensor
    paths: torch.Tensor
    depth: torch.Tensor
    generated: torch.Tensor
    pad: tuple[torch.Tensor, torch.Tensor] | None = None

    def tail(self, k: int) -> torch.Tensor:
        """``[B, S, k]`` the last ``k`` tokens of each node's sequence (the node's own token last); ``-1`` where the
        sequence is shorter than ``k``."""
        return self.extended(k).gather(2, self.depth[..., None] + 1 + torch.arange(k, device=self.depth.device))

    def extended(self, k: int) -> torch.Tensor:
        """``[B, S, k + P]``: the ``k`` committed tokens before the root (``-1`` before position 0), then ``paths``."""
        before = self.length[:, None] - k + torch.arange(k, device=self.length.device)  # [B, k]
        tokens = self.history.gather(1, before.clamp(min=0)).masked_fill(before < 0, -1)
        return torch.cat([tokens[:, None].expand(-1, self.paths.shape[1], -1), self.paths], 2)

    @property
    def seq_len(self) -> torch.Tensor:
        """``[B, S]`` each node's sequence length (HF's ``input_ids.shape[-1]`` at that step, without padding)."""
        return self.length[:, None] + self.depth + 1


def node_history(history: torch.Tensor, length: torch.Tensor, tree: DeviceTree, generated: torch.Tensor,
                 path_len: int, pad: tuple[torch.Tensor, torch.Tensor] | None = None) -> NodeHistory:  # fmt: skip
    """The :class:`NodeHistory` of a round's trees.

    Args:
        history (torch.Tensor): ``[B, C]`` committed tokens.
        length (torch.Tensor): ``[B]`` committed tokens before each root.
        tree (DeviceTree): the round's trees (``parents[i] < i``; padding slots have depth 0).
        generated (torch.Tensor): ``[B]`` tokens generated before each root's choice.
        path_len (int): ``P``, one more than the deepest node the trees may hold.
        pad (tuple | None): the caller's left padding (:class:`NodeHistory`).
    """
    return NodeHistory(history, length, tree_paths(tree, path_len), tree.depth, generated[:, None] + tree.depth, pad)


def tree_paths(tree: DeviceTree, path_len: int) -> torch.Tensor:
    """``[B, S, P]`` each node's root-to-node tokens (``-1`` past the node), in a fixed number of batched products:
    the ancestor relation is the reflexive-transitive closure of "is the parent of", reached by squaring the
    one-step relation ``ceil(log2(P - 1))`` times (every token id is exact in float32); the ancestor at depth d then
    contributes its token to column d."""
    tokens, depth = tree.tokens, tree.depth
    slots, device = tokens.shape[1], tokens.device
    index = torch.arange(slots, device=device)
    reach = ((tree.parents[..., None] == index) | (index[:, None] == index)).float()  # [B, S, S]: parent or self
    for _ in range(max(path_len - 2, 0).bit_length()):
        reach = (reach @ reach).clamp(max=1.0)
    columns = torch.arange(path_len, device=device)
    at_depth = (depth.clamp(max=path_len - 1)[..., None] == columns) * tokens[..., None].float()  # [B, S, P]
    paths = (reach @ at_depth).round().long()
    return torch.where(columns <= depth[..., None], paths, -1)


def chain_nodes(history: torch.Tensor, length: int, tokens: Sequence[int], generated: int,
                pad: torch.Tensor | None = None) -> NodeHistory:  # fmt: skip
    """The :class:`NodeHistory` of one chain: a batch of one, the committed ``history[:length]`` then ``tokens``
    (node ``j`` is ``tokens[j]``, ``generated + j`` tokens generated before its choice), after the row's left
    padding ``pad`` (``[W]``, None: none). For the first token and for the scores returned with ``output_scores``."""
    n = len(tokens)
    device = history.device
    ids = torch.tensor(list(tokens), dtype=torch.long, device=device)
    depth = torch.arange(n, device=device)
    paths = torch.where(depth[None] <= depth[:, None], ids[None], -1)  # [n, n]: node j's path is tokens[: j + 1]
    padding = None
    if pad is not None and pad.numel():
        padding = (pad.reshape(1, -1), torch.tensor([pad.numel()], device=device))
    return NodeHistory(history.reshape(1, -1), torch.tensor([length], device=device), paths[None], depth[None],
                       generated + depth[None], padding)  # fmt: skip


def _token_mask(ids: torch.Tensor, valid: torch.Tensor | None, vocab: int) -> torch.Tensor:
    """``[..., V]`` bool: True at the tokens ``ids [..., N]`` (where ``valid``, when given)."""
    index = ids if valid is None else torch.where(valid, ids, vocab)
    mask = torch.zeros(*ids.shape[:-1], vocab + 1, dtype=torch.bool, device=ids.device)
    return mask.scatter_(-1, index, True)[..., :vocab]


def _constant(owner, name: str, device: torch.device, make):
    """``make(device)``, made once per processor and device: a captured round must not copy from the host, so the
    constants a processor needs are built by its first (uncaptured, warm-up) run and reused."""
    cache = owner.__dict__.setdefault("_constants", {})
    key = (name, device)
    if key not in cache:
        cache[key] = make(device)
    return cache[key]


def _ids_mask(owner, ids: Sequence[int], vocab: int, device: torch.device) -> torch.Tensor:
    """``[V]`` bool, True at ``ids`` (cached per device)."""
    def make(d: torch.device) -> torch.Tensor:
        return _token_mask(torch.tensor(list(ids), dtype=torch.long, device=d), None, vocab)

    return _constant(owner, f"mask{vocab}", device, make)


def _vocab_ids(ids: Sequence[int], vocab: int, name: str) -> tuple[int, ...]:
    bad = [i for i in ids if not 0 <= i < vocab]
    if bad:
        raise ValueError(f"{name}: token ids {bad} are outside the target's vocabulary of {vocab}; pass ids < {vocab}.")
    return tuple(ids)


@dataclass(frozen=True)
class SequenceBias:
    """HF's ``sequence_bias`` (and ``bad_words_ids``, a bias of ``-inf``): a sequence's bias goes to its last token
    at every node whose sequence ends with the rest of it.

    Args:
        biases (tuple[tuple[tuple[int, ...], float], ...]): (token sequence, bias), in HF's order.
        vocab (int): the target's vocabulary size.
    """

    biases: tuple[tuple[tuple[int, ...], float], ...]
    vocab: int
    needs_history = True

    def __post_init__(self) -> None:
        for seq, _ in self.biases:
            _vocab_ids(seq, self.vocab, "sequence_bias / bad_words_ids")

    def hf(self):
        """HF's own processor of these biases (``Processors.padded``; a bad word is a bias of ``-inf``)."""
        from transformers.generation import logits_process as hf

        return hf.SequenceBiasLogitsProcessor(sequence_bias=[[list(seq), bias] for seq, bias in self.biases])

    def _tensors(self, device: torch.device):
        """The bias of one-token sequences ``[V]`` and, per prefix length k, (prefixes ``[G, k]``, last tokens
        ``[G]``, biases ``[G]``): HF's grouping (``SequenceBiasLogitsProcessor._prepare_bias_variables``)."""
        single = torch.zeros(self.vocab, dtype=torch.float)
        ones = [(seq[0], bias) for seq, bias in self.biases if len(seq) == 1]
        if ones:
            single[[t for t, _ in ones]] = torch.tensor([b for _, b in ones])
        groups: dict[int, list] = {}
        for seq, b in self.biases:
            if len(seq) > 1:
                groups.setdefault(len(seq) - 1, []).append((seq, b))
        multi = [
            (torch.tensor([seq[:-1] for seq, _ in group], device=device),
             torch.tensor([seq[-1] for seq, _ in group], device=device),
             torch.tensor([b for _, b in group], dtype=torch.float, device=device))
            for group in groups.values()
        ]  # fmt: skip
        return single.to(device), multi

    def process_tree(self, scores: torch.Tensor, nodes: NodeHistory) -> torch.Tensor:
        single, multi = _constant(self, "bias", scores.device, self._tensors)
        bias = torch.zeros_like(scores) + single
        for prefixes, last, values in multi:
            matching = (nodes.tail(prefixes.shape[1])[:, :, None] == prefixes).all(-1)  # [B, S, G]
            bias.index_add_(2, last, torch.where(matching, values, 0.0).to(bias.dtype))
        return scores + bias


@dataclass(frozen=True)
class RepetitionPenalty:
    """HF's ``repetition_penalty``: every token of the node's sequence has its score divided by ``penalty`` where
    positive, multiplied where negative."""

    penalty: float
    needs_history = True

    def hf(self):
        """HF's own processor of this setting where HF counts a padded row's pad tokens (``Processors.padded``);
        None where HF's generate leaves the padding out (releases whose generate passes each row's padding as the
        processor's ``prompt_ignore_length``): this processor reads no padding either."""
        from transformers.generation import logits_process as hf

        if _hf_penalty_skips_padding():
            return None
        return hf.RepetitionPenaltyLogitsProcessor(self.penalty)

    def process_tree(self, scores: torch.Tensor, nodes: NodeHistory) -> torch.Tensor:
        vocab = scores.shape[-1]
        positions = torch.arange(nodes.history.shape[1], device=scores.device)
        committed = _token_mask(nodes.history, positions < nodes.length[:, None], vocab)  # [B, V]
        path = _token_mask(nodes.paths, nodes.paths >= 0, vocab)  # [B, S, V]
        seen = committed[:, None] | path
        penalized = torch.where(scores < 0, scores * self.penalty, scores / self.penalty)
        return torch.where(seen, penalized, scores)


@dataclass(frozen=True)
class NGramBan:
    """HF's ``no_repeat_ngram_size``: a token that would complete an n-gram already in the node's sequence gets
    ``-inf``; the n-grams counted are the committed ones and those running into the node's own ancestors."""

    n: int
    needs_history = True

    def hf(self):
        """HF's own processor of this setting (``Processors.padded``)."""
        from transformers.generation import logits_process as hf

        return hf.NoRepeatNGramLogitsProcessor(self.n)

    def process_tree(self, scores: torch.Tensor, nodes: NodeHistory) -> torch.Tensor:
        n, vocab = self.n, scores.shape[-1]
        key = nodes.tail(n - 1)  # [B, S, n-1]
        banned = torch.zeros(*scores.shape[:-1], vocab + 1, dtype=torch.bool, device=scores.device)
        history = nodes.history
        if history.shape[1] >= n:  # n-grams inside the committed tokens
            windows = history.unfold(1, n, 1)  # [B, W, n]
            ends = torch.arange(n - 1, history.shape[1], device=scores.device)
            real = ends < nodes.length[:, None]  # [B, W]
            match = (windows[:, None, :, :-1] == key[:, :, None]).all(-1) & real[:, None]  # [B, S, W]
            banned.scatter_(2, torch.where(match, windows[:, None, :, -1], vocab), True)
        # n-grams ending at one of the node's ancestors (or the node): windows of the committed tail + the path
        ext = nodes.extended(n - 1).unfold(2, n, 1)  # [B, S, P, n]: window j ends at path index j
        steps = torch.arange(ext.shape[2], device=scores.device)
        real = (steps <= nodes.depth[..., None]) & (ext >= 0).all(-1)
        match = (ext[..., :-1] == key[:, :, None]).all(-1) & real
        banned.scatter_(2, torch.where(match, ext[..., -1], vocab), True)
        banned &= (nodes.seq_len >= n)[..., None]  # HF bans nothing before the first full n-gram
        return scores.masked_fill(banned[..., :vocab], -math.inf)


def _padded_prompt(nodes: NodeHistory) -> tuple[torch.Tensor, torch.Tensor]:
    """HF's ``encoder_input_ids`` of a causal LM, per row: the prompt as the caller passed it (its left padding, then
    its tokens) in ``[B, W + C]`` and where it holds a token (``[B, W + C]`` bool). The prompt is the first
    ``length + 1 - generated`` committed tokens (``generated`` counts from the root's choice)."""
    history = nodes.history
    prompt_len = nodes.length + 1 - nodes.generated[:, 0]  # [B]
    positions = torch.arange(history.shape[1], device=history.device)
    if nodes.pad is None:
        return history, positions < prompt_len[:, None]
    tokens, count = nodes.pad  # [B, W], [B]
    j = torch.arange(tokens.shape[1] + history.shape[1], device=history.device)
    from_pad = tokens.gather(1, j.clamp(max=tokens.shape[1] - 1).expand(tokens.shape[0], -1))
    from_history = history.gather(1, (j - count[:, None]).clamp(0, history.shape[1] - 1))
    padded = torch.where(j < count[:, None], from_pad, from_history)
    return padded, j < (count + prompt_len)[:, None]


class _PromptProcessor:
    """What the prompt's processors share: they read the committed tokens, and in a padded call (``uncaptured``,
    set by ``Processors.padded``) the round runs uncaptured and hands them each row's padding."""

    needs_history = True
    reads_padding = True

    @property
    def capturable(self) -> bool:
        return not self.uncaptured


@dataclass(frozen=True)
class EncoderRepetitionPenalty(_PromptProcessor):
    """HF's ``encoder_repetition_penalty`` on a causal LM (where HF's "encoder input" is the prompt as passed, left
    padding included): every token of the prompt has its score multiplied by the penalty where positive, divided
    where negative (``inverse`` = 1 / penalty, as HF stores it), at every node alike.

    Args:
        inverse (float): 1 / ``encoder_repetition_penalty``.
        uncaptured (bool): set for a padded call (``Processors.padded``): the round then hands it each row's padding.
    """

    inverse: float
    uncaptured: bool = False

    def process_tree(self, scores: torch.Tensor, nodes: NodeHistory) -> torch.Tensor:
        prompt, real = _padded_prompt(nodes)
        seen = _token_mask(prompt, real, scores.shape[-1])  # [B, V]
        penalized = torch.where(scores < 0, scores * self.inverse, scores / self.inverse)
        return torch.where(seen[:, None], penalized, scores)


@dataclass(frozen=True)
class EncoderNGramBan(_PromptProcessor):
    """HF's ``encoder_no_repeat_ngram_size`` on a causal LM: a token that would complete an n-gram of the prompt (as
    passed, left padding included) after the node's last ``n - 1`` tokens gets ``-inf``.

    Args:
        n (int): the n-gram size.
        uncaptured (bool): as :class:`EncoderRepetitionPenalty`.
    """

    n: int
    uncaptured: bool = False

    def process_tree(self, scores: torch.Tensor, nodes: NodeHistory) -> torch.Tensor:
        n, vocab = self.n, scores.shape[-1]
        prompt, real = _padded_prompt(nodes)
        key = nodes.tail(n - 1)  # [B, S, n-1], -1 before the row's first token
        if nodes.pad is not None and n > 1:  # HF's input_ids hold the padding before the first token
            tokens, count = nodes.pad
            at = count[:, None, None] + nodes.seq_len[..., None] - (n - 1) + torch.arange(n - 1, device=key.device)
            padding = tokens.gather(1, at.clamp(0, tokens.shape[1] - 1).flatten(1)).view_as(key)
            key = torch.where((key < 0) & (at >= 0), padding, key)
        if prompt.shape[1] < n:
            return scores
        windows = prompt.unfold(1, n, 1)  # [B, W, n]
        whole = real[:, n - 1 :]  # [B, W]: the window ends inside the prompt
        match = (windows[:, None, :, :-1] == key[:, :, None]).all(-1) & whole[:, None]  # [B, S, W]
        banned = torch.zeros(*scores.shape[:-1], vocab + 1, dtype=torch.bool, device=scores.device)
        banned.scatter_(2, torch.where(match, windows[:, None, :, -1], vocab), True)
        return scores.masked_fill(banned[..., :vocab], -math.inf)


@dataclass(frozen=True)
class MinNewTokens:
    """HF's ``min_length`` / ``min_new_tokens``: EOS gets ``-inf`` at nodes that would end the output early."""

    min_new: int
    eos: tuple[int, ...]
    needs_history = False

    def process_tree(self, scores: torch.Tensor, nodes: NodeHistory) -> torch.Tensor:
        rows = nodes.generated < self.min_new  # [B, S]
        cols = _ids_mask(self, self.eos, scores.shape[-1], scores.device)
        return scores.masked_fill(rows[..., None] & cols, -math.inf)


@dataclass(frozen=True)
class ForcedEOS:
    """HF's ``forced_eos_token_id``: the node that chooses the last allowed token gets ``-inf`` everywhere but the
    EOS ids (0 there)."""

    at_generated: int  # tokens generated before the last allowed choice (``max_new_tokens - 1``)
    eos: tuple[int, ...]
    needs_history = False

    def process_tree(self, scores: torch.Tensor, nodes: NodeHistory) -> torch.Tensor:
        forced = _ids_mask(self, self.eos, scores.shape[-1], scores.device).float().log()  # 0 at EOS, -inf elsewhere
        return torch.where((nodes.generated == self.at_generated)[..., None], forced, scores)


@dataclass(frozen=True)
class ForcedBOS(ForcedEOS):
    """HF's ``forced_bos_token_id``: HF forces it where its ``input_ids`` are one token wide, so a one-token prompt's
    first new token is this id (``-inf`` everywhere else, 0 there); a wider prompt (padding included) is never
    forced, and the processor is not built for it."""


@dataclass(frozen=True)
class RemoveInvalid:
    """HF's ``remove_invalid_values``: NaN becomes 0, +-inf the largest / smallest finite float."""

    needs_history = False

    def process_tree(self, scores: torch.Tensor, nodes: NodeHistory) -> torch.Tensor:
        info = torch.finfo(scores.dtype)
        out = torch.where(scores != scores, 0.0, scores)
        out = torch.where(scores == math.inf, info.max, out)
        return torch.where(scores == -math.inf, info.min, out)


@dataclass(frozen=True)
class ExponentialDecayLength:
    """HF's ``exponential_decay_length_penalty=(start, factor)``: past ``start`` generated tokens, the EOS scores
    grow by ``|score| * (factor ** k - 1)`` at the k-th token beyond it."""

    start: int
    factor: float
    eos: tuple[int, ...]
    needs_history = False

    def process_tree(self, scores: torch.Tensor, nodes: NodeHistory) -> torch.Tensor:
        k = nodes.generated - self.start  # HF: cur_len - (start + prompt length)
        growth = (torch.full_like(k, 1, dtype=torch.float64) * self.factor).pow(k.double()) - 1  # HF: pow in float64
        eos = _ids_mask(self, self.eos, scores.shape[-1], scores.device)
        if _hf_decay_skips_infinite():  # an EOS score already -inf (min_new_tokens) stays -inf, not NaN
            eos = eos & scores.isfinite()
        penalties = torch.where(eos, scores.abs() * growth.float()[..., None], 0.0)
        return torch.where((k > 0)[..., None], scores + penalties, scores)


@dataclass(frozen=True)
class SuppressTokens:
    """HF's ``suppress_tokens``: these tokens get ``-inf`` at every node."""

    tokens: tuple[int, ...]
    needs_history = False

    def process_tree(self, scores: torch.Tensor, nodes: NodeHistory) -> torch.Tensor:
        return scores.masked_fill(_ids_mask(self, self.tokens, scores.shape[-1], scores.device), -math.inf)


@dataclass(frozen=True)
class BeginSuppressTokens:
    """HF's ``begin_suppress_tokens``: these tokens get ``-inf`` at the choice of the first new token (the second
    where ``forced_bos_token_id`` forces the first: ``at=1``, as HF's ``begin_index``)."""

    tokens: tuple[int, ...]
    at: int = 0
    needs_history = False

    def process_tree(self, scores: torch.Tensor, nodes: NodeHistory) -> torch.Tensor:
        cols = _ids_mask(self, self.tokens, scores.shape[-1], scores.device)
        return scores.masked_fill((nodes.generated == self.at)[..., None] & cols, -math.inf)


class PerNode:
    """A processor of the call's ``logits_processor`` list (HF's ``(input_ids, scores)`` protocol), called for each
    row and depth with the ``input_ids`` of that row's nodes at that depth (``[n, length + depth + 1]``) and their
    scores ``[n, V]``. It reads the tree on the host, so the round that runs it is not captured."""

    needs_history = True
    capturable = False

    def __init__(self, processor) -> None:
        self.processor = processor

    def __eq__(self, other) -> bool:
        return isinstance(other, PerNode) and other.processor is self.processor

    def __hash__(self) -> int:
        return hash((PerNode, id(self.processor)))

    def __repr__(self) -> str:
        return f"PerNode({self.processor!r})"

    def process_tree(self, scores: torch.Tensor, nodes: NodeHistory) -> torch.Tensor:
        out = scores.clone()
        # the round's one host read here: each row's committed length, its left padding and its nodes' depths
        pad = nodes.pad
        count = pad[1][:, None] if pad is not None else torch.zeros_like(nodes.length)[:, None]
        rows = torch.cat([nodes.length[:, None], count, nodes.depth], 1).tolist()
        for b, (length, padded, *depths) in enumerate(rows):
            by_depth: dict[int, list[int]] = {}
            for i, d in enumerate(depths):
                by_depth.setdefault(d, []).append(i)
            # HF's input_ids of that row: its left padding as the caller gave it, then its tokens
            before = nodes.history[b, :length]
            if padded:
                before = torch.cat([pad[0][b, :padded], before])
            for d, slots in by_depth.items():
                index = torch.tensor(slots, device=scores.device)
                path = nodes.paths[b, index, : d + 1]
                ids = torch.cat([before.expand(len(slots), -1), path], 1)
                processed = self.processor(ids, scores[b, index])
                if not isinstance(processed, torch.Tensor) or processed.shape != (len(slots), scores.shape[-1]):
                    shape = tuple(processed.shape) if isinstance(processed, torch.Tensor) else type(processed).__name__
                    raise ValueError(
                        f"logits_processor {self.processor!r} returned {shape} for scores of shape "
                        f"{(len(slots), scores.shape[-1])}: a processor returns the scores it was given, processed "
                        "(HF's protocol: processor(input_ids, scores) -> scores of the same shape)."
                    )
                out[b, index] = processed
        return out


@functools.cache
def _hf_penalty_skips_padding() -> bool:
    """Whether this transformers' ``generate`` leaves a row's left padding out of its repetition penalty (newer
    releases pass the padding as ``prompt_ignore_length``; 5.17 counts the pad tokens). Read once per process."""
    from transformers.generation.utils import GenerationMixin

    try:
        return "prompt_ignore_length=" in inspect.getsource(GenerationMixin._get_logits_processor)
    except (OSError, TypeError):  # no source to read: the newer rule
        return True


@functools.cache
def _hf_decay_skips_infinite() -> bool:
    """Whether this transformers' ``exponential_decay_length_penalty`` leaves a non-finite EOS score as it is (newer
    releases); 5.17 adds ``inf * growth`` to it, so an EOS that ``min_new_tokens`` set to -inf becomes NaN there, and
    greedy decoding then picks it (``argmax`` takes NaN as the largest). Read once per process."""
    from transformers.generation.logits_process import ExponentialDecayLengthPenalty

    try:
        return "isfinite" in inspect.getsource(ExponentialDecayLengthPenalty.__call__)
    except (OSError, TypeError):  # no source to read: the newer rule
        return True


_TWINS: dict = {}  # built-in processor -> its ``PerNode`` over HF's class, one per setting (a stable round key)


def _per_node_twin(processor) -> PerNode | None:
    """``PerNode`` over HF's class of ``processor`` (None where HF reads no padding there either)."""
    if processor not in _TWINS:
        made = processor.hf()
        _TWINS[processor] = None if made is None else PerNode(made)
    return _TWINS[processor]


class Processors:
    """The processors of one ``generate`` call, in HF's order (hashable: part of a round's key).

    Args:
        items (Sequence): objects with ``process_tree(scores [B, S, V], nodes: NodeHistory)``.
    """

    def __init__(self, items: Sequence = ()) -> None:
        self.items = tuple(items)

    def __bool__(self) -> bool:
        return bool(self.items)

    def __eq__(self, other) -> bool:
        return isinstance(other, Processors) and other.items == self.items

    def __hash__(self) -> int:
        return hash(self.items)

    def __repr__(self) -> str:
        return f"Processors{self.items!r}"

    @property
    def needs_history(self) -> bool:
        """Whether any processor reads the committed tokens (the round then records them)."""
        return any(getattr(p, "needs_history", True) for p in self.items)

    @property
    def capturable(self) -> bool:
        """Whether every processor runs inside a captured round (no host reads)."""
        return all(getattr(p, "capturable", True) for p in self.items)

    def padded(self) -> Processors:
        """For a call whose prompts hold left padding: the processors that read the committed tokens as HF's
        ``input_ids`` (n-gram ban, sequence bias and bad words, whose HF classes count the pad tokens as tokens of
        the row, and the repetition penalty where this transformers counts them too) as HF's own classes, run per
        node with the row's padding (``PerNode``); those of HF's "encoder input" (the prompt as passed) read the
        padding themselves, uncaptured; the others as they are. Exact as HF, uncaptured."""
        return Processors([dataclasses.replace(p, uncaptured=True) if getattr(p, "reads_padding", False)
                           else _per_node_twin(p) or p if hasattr(p, "hf") else p for p in self.items])  # fmt: skip

    def captured(self) -> Processors:
        """The processors that run inside a captured round (all but the per-node ones of a ``logits_processor``)."""
        return Processors([p for p in self.items if getattr(p, "capturable", True)])

    def steer(self, logq: torch.Tensor, history: torch.Tensor, length: torch.Tensor, root: torch.Tensor,
              generated: torch.Tensor) -> torch.Tensor:  # fmt: skip
        """A drafter's per-depth log-probabilities ``logq [B, D, V]`` processed with the root's history, renormalised
        (float32): the draft then avoids what the processors forbid. Row ``d`` is processed as the choice of new
        token ``generated + d + 1`` after the committed tokens and the root (the draft tokens between are unknown
        here, so only depth 1 sees its exact history). It changes which drafts are proposed, never which tokens are
        output: the target's processed distribution decides, and rules that weigh q read this q, the one drawn from.
        """
        batch, depth = logq.shape[:2]
        rows = torch.arange(depth, device=logq.device)
        nodes = NodeHistory(history, length, root[:, None, None].expand(batch, depth, 1),
                            torch.zeros(batch, depth, dtype=torch.long, device=logq.device),
                            generated[:, None] + rows)  # fmt: skip
        steered = self(logq, nodes)
        # a NaN score (HF's length penalty on an EOS already at -inf, in releases that make it NaN) drafts nothing;
        # a row the processors forbid entirely keeps its unsteered q
        steered = torch.where(steered.isnan(), -math.inf, steered)
        steered = torch.where((steered == -math.inf).all(-1, keepdim=True), logq.float(), steered)
        return torch.log_softmax(steered, -1)

    def __call__(self, scores: torch.Tensor, nodes: NodeHistory) -> torch.Tensor:
        """``scores [B, S, V]`` (the target's logits) processed at every node, float32 as HF processes them."""
        scores = scores.float()
        for p in self.items:
            scores = p.process_tree(scores, nodes)
        return scores


_NO_IDS = torch.zeros(1, 1, dtype=torch.long)  # HF's encoder processors check their setting when given some ids


def _off(value, neutral=None) -> bool:
    return value is None or value is False or value == neutral or (isinstance(value, list | tuple) and not value)


def build_processors(
    options: dict,
    logits_processor=None,
    *,
    vocab_size: int | None,
    eos_token_ids: Sequence[int],
    max_new_tokens: int,
    min_new_tokens: int,
    prompt_width: int | None = None,
) -> Processors:
    """The processors of a call, in HF's order, from its resolved ``GenerationConfig`` fields.

    Args:
        options (dict): ``sequence_bias``, ``encoder_repetition_penalty``, ``repetition_penalty``,
            ``no_repeat_ngram_size``, ``encoder_no_repeat_ngram_size``, ``bad_words_ids``,
            ``forced_eos_token_id``, ``remove_invalid_values``, ``exponential_decay_length_penalty``,
            ``suppress_tokens``, ``begin_suppress_tokens``, ``forced_bos_token_id`` (None or HF's neutral value =
            off). Values are checked by HF's own processor classes, so bad ones raise HF's errors.
        logits_processor: the call's own list (HF's ``(input_ids, scores)`` protocol), or None.
        vocab_size (int | None): the target's logits width (token ids must be below it).
        eos_token_ids (Sequence[int]): the resolved stop tokens.
        max_new_tokens (int): the call's limit (``forced_eos_token_id`` acts at its last token).
        min_new_tokens (int): EOS is suppressed until this many tokens are generated (0 = never).
        prompt_width (int | None): the width of the call's ``input_ids``, padding included (``forced_bos_token_id``
            acts only at a width of 1, as in HF).
    """
    from transformers.generation import logits_process as hf

    vocab = vocab_size or 2**62
    eos = tuple(eos_token_ids)
    # HF's list in HF's order: (the HF class HF builds there, or None where it builds none; specdec's item or None)
    slots: list[tuple[type | None, object]] = []

    def add(built: bool, cls: type, item=None) -> None:
        slots.append((cls if built else None, item))

    def bias_items(processor) -> tuple:
        return tuple((tuple(int(t) for t in seq), float(b)) for seq, b in processor.sequence_bias.items())

    value = options.get("sequence_bias")
    add(value is not None, hf.SequenceBiasLogitsProcessor, None if _off(value) else SequenceBias(
        bias_items(hf.SequenceBiasLogitsProcessor(sequence_bias=value)), vocab))  # fmt: skip
    value = options.get("encoder_repetition_penalty")
    encoder_penalty = not _off(value, 1.0)
    add(encoder_penalty, hf.EncoderRepetitionPenaltyLogitsProcessor, EncoderRepetitionPenalty(
        hf.EncoderRepetitionPenaltyLogitsProcessor(value, _NO_IDS).penalty) if encoder_penalty else None)  # fmt: skip
    value = options.get("repetition_penalty")
    penalty = not _off(value, 1.0)
    add(penalty, hf.RepetitionPenaltyLogitsProcessor,
        RepetitionPenalty(hf.RepetitionPenaltyLogitsProcessor(value).penalty) if penalty else None)  # fmt: skip
    value = options.get("no_repeat_ngram_size")
    # HF builds the ban only for a size > 0 (0 or a negative size is off); other values reach HF's class and its error
    ngram = not _off(value, 0) and not (isinstance(value, int | float) and not isinstance(value, bool) and value <= 0)
    add(ngram, hf.NoRepeatNGramLogitsProcessor,
        NGramBan(hf.NoRepeatNGramLogitsProcessor(value).ngram_size) if ngram else None)  # fmt: skip
    value = options.get("encoder_no_repeat_ngram_size")
    encoder_ngram = not _off(value, 0) and not (isinstance(value, int | float) and not isinstance(value, bool)
                                                and value <= 0)  # fmt: skip
    add(encoder_ngram, hf.EncoderNoRepeatNGramLogitsProcessor,
        EncoderNGramBan(hf.EncoderNoRepeatNGramLogitsProcessor(value, _NO_IDS).ngram_size) if encoder_ngram else None)
    value = options.get("bad_words_ids")
    if isinstance(value, list | tuple) and not value:  # HF builds its processor for any value but None: it refuses []
        raise ValueError(
            f"bad_words_ids={value!r} bans nothing, and HF's generate refuses it (it has to be a non-empty list): for "
            "no banned words leave bad_words_ids out or pass None; else give token-id lists, e.g. "
            "bad_words_ids=[[id], [id1, id2]]."
        )
    bad = () if value is None else bias_items(hf.NoBadWordsLogitsProcessor(value, list(eos) or None))
    add(value is not None, hf.NoBadWordsLogitsProcessor, SequenceBias(bad, vocab) if bad else None)
    # HF's two minimum-length processors (``min_length`` counts the prompt; ``min_new_tokens`` sets it): one item here
    minimum = MinNewTokens(min_new_tokens, eos) if min_new_tokens and eos else None
    given_new, given_total = options.get("min_new_tokens"), options.get("min_length")
    total = given_new + (prompt_width or 0) if given_new is not None else given_total or 0
    add(bool(eos) and total > 0, hf.MinLengthLogitsProcessor, minimum)
    add(bool(eos) and (given_new or 0) > 0, hf.MinNewTokensLengthLogitsProcessor, minimum)
    value = options.get("forced_bos_token_id")
    forced_bos = not _off(value) and prompt_width == 1  # HF: only while input_ids are one token wide
    if forced_bos:
        bos = hf.ForcedBOSTokenLogitsProcessor(value).bos_token_id
        forced_bos = ForcedBOS(0, _vocab_ids([int(bos)], vocab, "forced_bos_token_id"))
    add(value is not None, hf.ForcedBOSTokenLogitsProcessor, forced_bos or None)
    value = options.get("forced_eos_token_id")
    if not _off(value):
        forced = hf.ForcedEOSTokenLogitsProcessor(max_new_tokens, value).eos_token_id
        forced = ForcedEOS(max_new_tokens - 1, _vocab_ids(forced.tolist(), vocab, "forced_eos_token_id"))
    add(value is not None, hf.ForcedEOSTokenLogitsProcessor, None if _off(value) else forced)
    remove = options.get("remove_invalid_values") is True
    add(remove, hf.InfNanRemoveLogitsProcessor, RemoveInvalid() if remove else None)
    value = options.get("exponential_decay_length_penalty")
    decay = None
    if not _off(value):
        if not eos:
            raise ValueError(
                f"exponential_decay_length_penalty={value!r} raises the EOS scores, but the call has no eos_token_id: "
                "pass eos_token_id, or drop exponential_decay_length_penalty."
            )
        hf_penalty = hf.ExponentialDecayLengthPenalty(tuple(value), list(eos), 0)
        decay = ExponentialDecayLength(int(hf_penalty.regulation_start), float(hf_penalty.regulation_factor),
                                       _vocab_ids(eos, vocab, "eos_token_id"))  # fmt: skip
    add(value is not None, hf.ExponentialDecayLengthPenalty, decay)
    value = options.get("suppress_tokens")
    add(value is not None, hf.SuppressTokensLogitsProcessor,
        None if _off(value) else SuppressTokens(_vocab_ids([int(t) for t in value], vocab, "suppress_tokens")))
    value = options.get("begin_suppress_tokens")
    begin = None
    if not _off(value):  # HF's begin_index: one later where forced_bos_token_id forces the first token
        begin = BeginSuppressTokens(_vocab_ids([int(t) for t in value], vocab, "begin_suppress_tokens"),
                                    1 if forced_bos else 0)  # fmt: skip
    add(value is not None, hf.SuppressTokensAtBeginLogitsProcessor, begin)

    if logits_processor is not None and not isinstance(logits_processor, list | tuple):
        raise TypeError(
            f"logits_processor must be a list of LogitsProcessor (e.g. LogitsProcessorList([...])), got "
            f"{type(logits_processor).__name__}: wrap it, logits_processor=LogitsProcessorList([processor])."
        )
    custom = list(logits_processor or ())
    for processor in custom:
        if not callable(processor) and not callable(getattr(processor, "process_tree", None)):
            raise TypeError(
                f"logits_processor holds {processor!r}, which is not callable: pass HF LogitsProcessor objects "
                "(called as processor(input_ids, scores)) or tree-aware ones (tree_aware = True, process_tree)."
            )

    def wrap(processor):
        tree_aware = getattr(processor, "tree_aware", False) and callable(getattr(processor, "process_tree", None))
        return processor if tree_aware else PerNode(processor)

    # HF's merge (``_merge_criteria_processor_list``): a custom processor of the class HF builds at a place takes
    # that place instead of HF's own; the other custom processors follow HF's list
    items: list = []
    used: list = []
    for cls, item in slots:
        if cls is None:  # HF builds nothing here
            continue
        same = next((p for p in custom if type(p) is cls), None)
        if same is not None:
            logger.warning(
                f"A custom logits processor of type {type(same)} has been passed to `.generate()`, but it was also "
                f"created in `.generate()`, given its parameterization. The custom {type(same)} will take "
                f"precedence. Please check the docstring of {type(same)} to see related `.generate()` flags."
            )
            used.append(same)
            items.append(wrap(same))
        elif item is not None and not any(item is i for i in items):  # the minimum-length item fills two places
            items.append(item)
    items += [wrap(p) for p in custom if not any(p is u for u in used)]
    return Processors(items)
