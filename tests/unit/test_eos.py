"""EOS stops exactly as HF ``generate(do_sample=False, eos_token_id=...)`` stops, wherever the EOS falls.

For every drafter (n-gram, small model, DFlash) with a chain and a tree, a free run records which tokens each
round committed (through a streamer); EOS ids are then picked from the target's own greedy output so that each
situation really happens: EOS as the first generated token, as an accepted draft inside a path (the rest of
that round must be dropped), as the bonus of a round that accepted drafts, and as one entry of a list of stop
ids. The n-gram and DFlash cases run on the zoo dense target (real text, so the n-gram drafter finds matches;
the trained DFlash drafter accepts long paths); the model drafter on a tiny random target.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from models import perturbed_copy, tiny_model
from transformers import AutoModelForCausalLM, AutoTokenizer

import specdec
from specdec.drafters.dflash import DFlashDrafter

ASSETS = Path(__file__).resolve().parents[2] / "assets" / "drafters"
FREE_TOKENS = 24
TREES = {"chain": specdec.Chain(k=4), "tree": specdec.DDTree(budget=8, topk=4)}


class Chunks:
    """Streamer that keeps what each step committed: the prompt, the first token, then one chunk per round."""

    def __init__(self) -> None:
        self.chunks: list[list[int]] = []

    def put(self, value: torch.Tensor) -> None:
        self.chunks.append(value.view(-1).tolist())

    def end(self) -> None:
        pass


_SETUPS: dict[str, tuple] = {}
_FREE: dict[tuple[str, str], list[list[int]]] = {}


def setup(kind: str, zoo: Path):
    """``(target, prompt ids, drafter)`` of a drafter kind (built once per module)."""
    if kind not in _SETUPS:
        if kind == "model":
            target = tiny_model("qwen3", scale=2.0)
            motif = torch.randint(3, 128, (5,), generator=torch.Generator().manual_seed(1))
            ids = torch.cat([motif, motif]).unsqueeze(0)
            drafter = specdec.ModelDrafter(perturbed_copy(target, noise=0.05))
        else:
            target = zoo_dense(zoo)
            tok = AutoTokenizer.from_pretrained(zoo / "tokenizer")
            row = json.loads((zoo / "prompts_dev.jsonl").read_text().splitlines()[1])
            ids = tok(row["prompt"], return_tensors="pt").input_ids[:, -128:]
            if kind == "ngram":
                drafter = specdec.NGramDrafter()
            else:
                drafter = DFlashDrafter.from_pretrained(ASSETS / "zoo-dense", target=target)
        _SETUPS[kind] = (target, ids, drafter)
    return _SETUPS[kind]


_ZOO_DENSE: list = []


def zoo_dense(zoo: Path):
    if not _ZOO_DENSE:
        _ZOO_DENSE.append(AutoModelForCausalLM.from_pretrained(zoo / "target-dense", dtype=torch.float32).eval())
    return _ZOO_DENSE[0]


def free_run(kind: str, tree: str, zoo: Path) -> list[list[int]]:
    """Per-step chunks (first token, then each round's accepted drafts + bonus) of a run without EOS."""
    if (kind, tree) not in _FREE:
        target, ids, drafter = setup(kind, zoo)
        streamer = Chunks()
        specdec.generate(
            target, ids, drafter=drafter, tree=TREES[tree], max_new_tokens=FREE_TOKENS, eos_token_id=[],
            streamer=streamer,
        )  # fmt: skip
        _FREE[(kind, tree)] = streamer.chunks[1:]
    return _FREE[(kind, tree)]


def candidates(chunks: list[list[int]]) -> dict[str, list[int]]:
    """Positions j (in the generated tokens) whose token first occurs at j, by situation.

    ``inside``: an accepted draft followed by more tokens of the same round; ``bonus``: the last token of a
    round that accepted at least one draft. The last round is skipped (``max_new_tokens`` may cut it).
    """
    tokens = [t for chunk in chunks for t in chunk]
    first = {}
    for j, t in enumerate(tokens):
        first.setdefault(t, j)
    found: dict[str, list[int]] = {"inside": [], "bonus": []}
    start = len(chunks[0])
    for chunk in chunks[1:-1]:
        for i, t in enumerate(chunk):
            if first[t] == start + i:
                if i < len(chunk) - 1:
                    found["inside"].append(start + i)
                elif len(chunk) >= 2:
                    found["bonus"].append(start + i)
        start += len(chunk)
    return found


def chunk_of(chunks: list[list[int]], j: int) -> tuple[int, list[int]]:
    """``(index of position j inside its chunk, the chunk)``."""
    start = 0
    for chunk in chunks:
        if j < start + len(chunk):
            return j - start, chunk
        start += len(chunk)
    raise IndexError(j)


@pytest.mark.parametrize("situation", ["first", "inside", "bonus", "list"])
@pytest.mark.parametrize("tree", list(TREES))
@pytest.mark.parametrize("kind", ["ngram", "model", "dflash"])
def test_generate_stops_at_eos_like_hf(zoo, kind, tree, situation):
    target, ids, drafter = setup(kind, zoo)
    chunks = free_run(kind, tree, zoo)
    tokens = [t for chunk in chunks for t in chunk]
    found = candidates(chunks)
    if situation == "first":
        j, eos = 0, tokens[0]
    else:
        where = found["bonus" if situation == "bonus" else "inside"]
        assert where, f"{kind}/{tree}: no round with an accepted draft to put EOS in ({chunks})"
        j = where[0]
        eos = tokens[j]
        if situation == "list":  # a stop id that occurs later, listed first: the earliest hit must win
            later = next(t for t in tokens[j + 1 :] if t not in tokens[: j + 1])
            eos = [later, tokens[j]]
    ref = target.generate(
        ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=FREE_TOKENS, eos_token_id=eos,
        pad_token_id=0,
    )  # fmt: skip
    streamer = Chunks()
    out = specdec.generate(
        target, ids, drafter=drafter, tree=TREES[tree], max_new_tokens=FREE_TOKENS, eos_token_id=eos,
        streamer=streamer,
    )  # fmt: skip
    assert torch.equal(out.sequences, ref)
    assert out.sequences.shape[1] == ids.shape[1] + j + 1  # stopped at the chosen EOS
    # the situation really happened: compare the round that hit EOS with the same round of the free run
    last = streamer.chunks[-1]
    i, free_chunk = chunk_of(chunks, j)
    assert last == free_chunk[: i + 1]
    if situation == "first":
        assert out.stats.rounds == 0
    elif situation == "bonus":
        assert i == len(free_chunk) - 1 and i >= 1  # bonus of a round that accepted >= 1 draft
    else:
        assert i < len(free_chunk) - 1  # an accepted draft; the round's later tokens were dropped
