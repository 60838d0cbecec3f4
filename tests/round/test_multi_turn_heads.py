"""Multi-turn calls with the drafters that keep their own keys/values of target states (EAGLE-3, MTP): a continued
prompt prefills only its new tokens in the drafter too.

References from outside the code under test: HF's ``generate`` of each whole prompt, the same calls with
``reuse_prefix=False`` (the drafts and acceptances must not change either), and the drafter's state after a fresh
prefill of the whole sequence from HF's own hidden states (its keys/values and kept target states over the
committed slots), which catches a suffix written a slot early or late.
"""

from __future__ import annotations

import pytest
import torch
from models import tiny_model
from state.hybrid_harness import tiny_hybrid

import specdec
from specdec.drafters.eagle3 import Eagle3Drafter
from specdec.drafters.eagle3_static import Eagle3Static
from specdec.drafters.mtp import MTPDrafter
from specdec.drafters.mtp_static import MTPStatic

NEW = 12
_MODELS: dict = {}


def model(kind: str):
    if kind not in _MODELS:
        dense = kind == "dense"
        _MODELS[kind] = tiny_model("qwen3", num_hidden_layers=4, scale=2.0) if dense else tiny_hybrid("qwen3_5")
    return _MODELS[kind]


def head(kind: str, name: str):
    target = model(kind)
    if name == "mtp":
        return MTPDrafter.random(target, seed=1, std=0.3)
    drafter = Eagle3Drafter.for_target(target, layer_ids=(2, 1, 3), seed=1)
    with torch.no_grad():  # sharper drafts than the 0.02 init
        for p in drafter.model.parameters():
            if p.dim() == 2:
                p.mul_(8.0)
    return drafter


def turn_tokens(seed: int, n: int = 7) -> torch.Tensor:
    return torch.randint(3, 128, (1, n), generator=torch.Generator().manual_seed(seed))


def hf(target, ids):
    return target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=NEW,
                           eos_token_id=[], pad_token_id=0)  # fmt: skip


def spy_on_proposals(monkeypatch, name: str, drafts: dict) -> None:
    """Record every round's draft log-probs in ``drafts[drafts["now"]]`` (only inside the calls being compared)."""
    cls = MTPStatic if name == "mtp" else Eagle3Static
    original = cls.propose

    def spy(self, root, prefix, depth, span):
        proposal = original(self, root, prefix, depth, span)
        if "now" in drafts:
            drafts[drafts["now"]].append(proposal.logq.clone())
        return proposal

    monkeypatch.setattr(cls, "propose", spy)


CASES = [(kind, name) for kind in ("dense", "hybrid") for name in ("eagle3", "mtp")]
TREES = {"chain": lambda: specdec.Chain(k=3), "ddtree": lambda: specdec.DDTree(budget=8, topk=3)}


@pytest.mark.parametrize("tree_name", list(TREES))
@pytest.mark.parametrize("kind, name", CASES)
def test_turns_equal_hf_and_the_same_calls_without_reuse(kind, name, tree_name, monkeypatch):
    target, drafter, tree = model(kind), head(kind, name), TREES[tree_name]()
    runs, drafts = {}, {True: [], False: []}
    spy_on_proposals(monkeypatch, name, drafts)
    for reuse in (True, False):
        drafts.pop("now", None)
        specdec.generate(target, turn_tokens(99, 30), drafter=drafter, tree=tree, max_new_tokens=4)  # another one
        drafts["now"] = reuse
        ids, previous, runs[reuse] = turn_tokens(1, 20), None, []
        for turn in range(3):
            out = specdec.generate(target, ids, drafter=drafter, tree=tree, max_new_tokens=NEW, eos_token_id=[],
                                   reuse_prefix=reuse)  # fmt: skip
            assert torch.equal(out.sequences, hf(target, ids)), (reuse, turn)
            if reuse and previous is not None:
                n = previous.sequences.shape[1]
                assert n - 1 <= out.stats.reused_tokens <= n, turn
            else:
                assert out.stats.reused_tokens == 0
            runs[reuse].append(out.stats.accept_lengths)
            previous = out
            ids = torch.cat([out.sequences, turn_tokens(10 + turn)], 1)
    assert runs[True] == runs[False]
    # the same draft distributions in every round: the resumed state drafts as a full prefill's does
    assert len(drafts[True]) == len(drafts[False]) > 0
    for a, b in zip(drafts[True], drafts[False], strict=True):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def hf_taps(target, drafter, ids: torch.Tensor) -> torch.Tensor:
    """The drafter's tapped features of ``ids`` from HF's own forward: ``hidden_states[i + 1]`` of each tapped
    layer ``i``, concatenated."""
    with torch.no_grad():
        states = target(ids, output_hidden_states=True).hidden_states
    return torch.cat([states[i + 1] for i in drafter.target_layer_ids], dim=-1)


def snapshot(state, n: int) -> dict[str, torch.Tensor]:
    """The state's keys/values and kept target states of the rows a prefill of ``n`` tokens writes."""
    if isinstance(state, MTPStatic):
        return {"kv": state.storage.kv[..., :n, :].clone(), "hidden": state.hidden[:, :n].clone()}
    return {"kv": state.kv[:, :, :, : n - 1].clone(), "fused": state.fused[:, :n].clone()}


@pytest.mark.parametrize("kind, name", CASES)
def test_state_after_resume_equals_a_full_prefill(kind, name, monkeypatch):
    """The second call's prompt extends the first call's sequence (committed by real rounds); the drafter's state
    right after its resume equals a fresh state prefilled with the whole prompt and HF's hidden states."""
    target, drafter, tree = model(kind), head(kind, name), specdec.Chain(k=3)
    cls = MTPStatic if name == "mtp" else Eagle3Static
    seen = {}
    original = cls.resume

    def spy(self, input_ids, hidden, start):
        original(self, input_ids, hidden, start)
        seen.update(start=start, state=snapshot(self, start + input_ids.shape[1]))

    monkeypatch.setattr(cls, "resume", spy)
    first = specdec.generate(target, turn_tokens(5, 20), drafter=drafter, tree=tree, max_new_tokens=NEW,
                             eos_token_id=[])  # fmt: skip
    ids = torch.cat([first.sequences, turn_tokens(6)], 1)
    out = specdec.generate(target, ids, drafter=drafter, tree=tree, max_new_tokens=4, eos_token_id=[])
    assert out.stats.reused_tokens == seen["start"] >= first.sequences.shape[1] - 1
    fresh = drafter.attach(target, capacity=ids.shape[1] + 8)
    with torch.no_grad():
        fresh.prefill(ids, hf_taps(target, drafter, ids))
    want = snapshot(fresh, ids.shape[1])
    for key, value in want.items():
        torch.testing.assert_close(seen["state"][key], value, atol=1e-4, rtol=1e-4, msg=key)


@pytest.mark.parametrize("name", ["eagle3", "mtp"])
def test_an_edited_history_resumes_from_the_edit(name):
    """Dense targets reuse the prefix before an edited token: the drafter's row before it is rewritten too."""
    target, drafter, tree = model("dense"), head("dense", name), specdec.DDTree(budget=8, topk=3)
    first = specdec.generate(target, turn_tokens(3, 20), drafter=drafter, tree=tree, max_new_tokens=NEW,
                             eos_token_id=[])  # fmt: skip
    edited = first.sequences.clone()
    edited[0, 25] = (edited[0, 25] + 1) % 128
    ids = torch.cat([edited, turn_tokens(4)], 1)
    out = specdec.generate(target, ids, drafter=drafter, tree=tree, max_new_tokens=NEW, eos_token_id=[])
    off = specdec.generate(target, ids, drafter=drafter, tree=tree, max_new_tokens=NEW, eos_token_id=[],
                           reuse_prefix=False)  # fmt: skip
    assert out.stats.reused_tokens == 25
    assert torch.equal(out.sequences, hf(target, ids))
    assert out.stats.accept_lengths == off.stats.accept_lengths
