"""MTP drafter: checkpoint I/O of the ``mtp.*`` tensors, the head's draft log-probs against an independent
reference forward written here (hand-written norms, fc, gated attention with partial RoPE, dense and MoE MLP), the
round's proposals inside ``generate`` against the same reference, and errors."""

from __future__ import annotations

import contextlib
import json
import math

import pytest
import torch
from models import tiny_model
from oracles import gof_pvalue, hf_probs
from safetensors import safe_open
from safetensors.torch import save_file
from state.hybrid_harness import tiny_hybrid

import specdec
from specdec.drafters.mtp import MTPDrafter
from specdec.drafters.mtp_static import MTPStatic
from specdec.trees import TREES, Chain, DDTree
from specdec.types import SamplingParams
from specdec.verify import RULES

VOCAB = 128


# -- a checkpoint with an MTP head, written from the published description ------------------------------------------
def mtp_tensors(config, *, seed: int = 0, std: float = 0.3) -> dict[str, torch.Tensor]:
    """Random ``mtp.*`` tensors in the published Qwen3-Next / Qwen3.5 layout: ``fc`` [H, 2H], three norms [H], and one
    full-attention decoder layer (q_proj twice the query width for the output gate on gated families; the dense or
    per-expert MoE MLP of the target)."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, generator=g) * std

    h, heads, kv = config.hidden_size, config.num_attention_heads, config.num_key_value_heads
    hd = getattr(config, "head_dim", None) or h // heads
    gated = config.model_type.startswith(("qwen3_next", "qwen3_5"))
    p = "mtp.layers.0."
    out = {
        "mtp.fc.weight": r(h, 2 * h),
        "mtp.pre_fc_norm_embedding.weight": r(h),
        "mtp.pre_fc_norm_hidden.weight": r(h),
        "mtp.norm.weight": r(h),
        p + "input_layernorm.weight": r(h),
        p + "post_attention_layernorm.weight": r(h),
        p + "self_attn.q_proj.weight": r((2 if gated else 1) * heads * hd, h),
        p + "self_attn.k_proj.weight": r(kv * hd, h),
        p + "self_attn.v_proj.weight": r(kv * hd, h),
        p + "self_attn.o_proj.weight": r(h, heads * hd),
        p + "self_attn.q_norm.weight": r(hd),
        p + "self_attn.k_norm.weight": r(hd),
    }
    experts = getattr(config, "num_experts", 0) or 0
    if experts:
        i, s = config.moe_intermediate_size, config.shared_expert_intermediate_size
        out[p + "mlp.gate.weight"] = r(experts, h)
        for e in range(experts):
            for name, shape in (("gate_proj", (i, h)), ("up_proj", (i, h)), ("down_proj", (h, i))):
                out[f"{p}mlp.experts.{e}.{name}.weight"] = r(*shape)
        for name, shape in (("gate_proj", (s, h)), ("up_proj", (s, h)), ("down_proj", (h, s))):
            out[f"{p}mlp.shared_expert.{name}.weight"] = r(*shape)
        out[p + "mlp.shared_expert_gate.weight"] = r(1, h)
    else:
        i = config.intermediate_size
        for name, shape in (("gate_proj", (i, h)), ("up_proj", (i, h)), ("down_proj", (h, i))):
            out[f"{p}mlp.{name}.weight"] = r(*shape)
    return out


def write_checkpoint(model, folder, *, seed: int = 0, sharded: bool = True) -> dict[str, torch.Tensor]:
    """``model.save_pretrained(folder)`` plus an MTP head: its own shard listed in a new index (``sharded``), or
    added to ``model.safetensors``."""
    model.save_pretrained(folder)
    tensors = mtp_tensors(model.config, seed=seed)
    if sharded:
        with safe_open(str(folder / "model.safetensors"), "pt") as f:
            names = list(f.keys())
        save_file(tensors, str(folder / "mtp-head.safetensors"))
        weight_map = {**dict.fromkeys(names, "model.safetensors"), **dict.fromkeys(tensors, "mtp-head.safetensors")}
        (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    else:
        from safetensors.torch import load_file

        save_file({**load_file(str(folder / "model.safetensors")), **tensors}, str(folder / "model.safetensors"))
    return tensors


# -- the reference: a plain full-sequence forward of the head, no cache -----------------------------------------------
def _norm(x, w, eps, offset):
    x = x.float()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (offset + w.float())


def _rope(x, positions, config):
    """Rotate the first ``partial_rotary_factor * head_dim`` dims of ``x [T, heads, hd]`` (rotate-half convention)."""
    params = getattr(config, "rope_parameters", None) or {}
    theta = params.get("rope_theta", getattr(config, "rope_theta", 10000.0))
    factor = params.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0))
    rot = int(x.shape[-1] * factor)
    inv = 1.0 / theta ** (torch.arange(0, rot, 2, dtype=torch.float) / rot)
    ang = positions.float()[:, None] * inv  # [T, rot/2]
    cos, sin = torch.cat((ang, ang), -1).cos()[:, None], torch.cat((ang, ang), -1).sin()[:, None]
    xr, xp = x[..., :rot], x[..., rot:]
    half = rot // 2
    rotated = xr * cos + torch.cat((-xr[..., half:], xr[..., :half]), -1) * sin
    return torch.cat((rotated, xp), -1)


def _mlp(x, t, p):
    return (torch.nn.functional.silu(x @ t[p + "gate_proj.weight"].T) * (x @ t[p + "up_proj.weight"].T)) @ t[
        p + "down_proj.weight"
    ].T


def reference_rows(t, config, embeds, hidden, positions):
    """The head over rows ``[T]`` (``embeds``, ``hidden`` ``[T, H]``) at ``positions``, causal: normalised output."""
    gated = config.model_type.startswith(("qwen3_next", "qwen3_5"))
    offset = 1.0 if gated else 0.0  # Qwen3-Next / Qwen3.5 norms scale by (1 + w)
    eps = config.rms_norm_eps
    h, heads, kv = config.hidden_size, config.num_attention_heads, config.num_key_value_heads
    hd = getattr(config, "head_dim", None) or h // heads
    p = "mtp.layers.0."
    e = _norm(embeds, t["mtp.pre_fc_norm_embedding.weight"], eps, offset)
    g = _norm(hidden, t["mtp.pre_fc_norm_hidden.weight"], eps, offset)
    x = torch.cat((e, g), -1) @ t["mtp.fc.weight"].T  # the embedding first
    n = x.shape[0]
    a = _norm(x, t[p + "input_layernorm.weight"], eps, offset)
    q = (a @ t[p + "self_attn.q_proj.weight"].T).view(n, heads, -1)
    gate = None
    if gated:  # per head: hd query features, then hd gate features
        q, gate = q[..., :hd], q[..., hd:].reshape(n, heads * hd)
    k = (a @ t[p + "self_attn.k_proj.weight"].T).view(n, kv, hd)
    v = (a @ t[p + "self_attn.v_proj.weight"].T).view(n, kv, hd)
    q = _rope(_norm(q, t[p + "self_attn.q_norm.weight"], eps, offset), positions, config)
    k = _rope(_norm(k, t[p + "self_attn.k_norm.weight"], eps, offset), positions, config)
    k, v = k.repeat_interleave(heads // kv, 1), v.repeat_interleave(heads // kv, 1)
    scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(hd)
    scores = scores.masked_fill(positions[None, None, :] > positions[None, :, None], float("-inf"))
    o = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(n, heads * hd)
    if gate is not None:
        o = o * torch.sigmoid(gate)
    x = x + o @ t[p + "self_attn.o_proj.weight"].T
    m = _norm(x, t[p + "post_attention_layernorm.weight"], eps, offset)
    if p + "mlp.gate.weight" in t:
        probs = (m @ t[p + "mlp.gate.weight"].T).softmax(-1)
        top, idx = probs.topk(config.num_experts_per_tok, dim=-1)
        if getattr(config, "norm_topk_prob", True):  # Qwen3.5-MoE always renormalises the top-k weights
            top = top / top.sum(-1, keepdim=True)
        y = torch.zeros_like(m)
        for row in range(n):
            for w, e_id in zip(top[row], idx[row], strict=True):
                y[row] += w * _mlp(m[row], t, f"{p}mlp.experts.{int(e_id)}.")
        shared = torch.sigmoid(m @ t[p + "mlp.shared_expert_gate.weight"].T) * _mlp(m, t, p + "mlp.shared_expert.")
        y = y + shared
    else:
        y = _mlp(m, t, p + "mlp.")
    return _norm(x + y, t["mtp.norm.weight"], eps, offset)


@torch.no_grad()
def reference_logq(model, t, ids: torch.Tensor, depth: int) -> torch.Tensor:
    """Greedy drafts after ``ids [n + 1]`` (the root last): ``[depth, V]`` log-probs. Row ``r`` joins the target's
    last hidden state at position ``r`` with the embedding of token ``r + 1``; each step appends a row of its own
    output and argmax token and reruns every row."""
    n = ids.shape[0] - 1
    hidden = model.model(ids[None, :n]).last_hidden_state[0].float()
    embed = model.get_input_embeddings().weight.float()
    head = model.get_output_embeddings().weight.float()
    embeds, hid, out = embed[ids[1:]], hidden, []
    for _ in range(depth):
        rows = reference_rows(t, model.config, embeds, hid, torch.arange(embeds.shape[0]))
        last = rows[-1]
        out.append(torch.log_softmax(last @ head.T, -1))
        embeds = torch.cat((embeds, embed[out[-1].argmax()][None]))
        hid = torch.cat((hid, last[None]))
    return torch.stack(out)


# -- fixtures ---------------------------------------------------------------------------------------------------------
TARGETS = {
    "qwen3_next": lambda: tiny_hybrid("qwen3_next"),
    "qwen3_5": lambda: tiny_hybrid("qwen3_5"),
    "qwen3_5_moe": lambda: tiny_hybrid("qwen3_5_moe"),
    "qwen3": lambda: tiny_model("qwen3", scale=2.0),
}


@pytest.fixture(scope="module", params=list(TARGETS))
def setup(request, tmp_path_factory):
    torch.manual_seed(0)
    model = TARGETS[request.param]()
    folder = tmp_path_factory.mktemp(request.param)
    tensors = write_checkpoint(model, folder)
    return model, folder, {k: v.float() for k, v in tensors.items()}


def prompts(batch: int, n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, VOCAB, (batch, n), generator=torch.Generator().manual_seed(seed))


# -- the head ----------------------------------------------------------------------------------------------------------
def test_last_tap_is_the_final_normed_hidden_state(setup):
    """The tap the drafter asks for is ``last_hidden_state`` (after the final norm), which the reference reads."""
    model, folder, _ = setup
    drafter = MTPDrafter.from_pretrained(folder, target=model)
    ids = prompts(1, 7)
    with torch.no_grad():
        out = model(ids, output_hidden_states=True)
        base = model.model(ids).last_hidden_state
    (layer,) = drafter.target_layer_ids
    torch.testing.assert_close(out.hidden_states[layer + 1], base, rtol=0, atol=0)


@pytest.mark.parametrize("attn", ["sdpa", "kernel"])
@pytest.mark.parametrize("batch", [1, 2])
def test_propose_matches_reference(setup, batch, attn, monkeypatch):
    """Prefill, propose D steps, commit a path, propose again: every depth's log-probs as the reference's.
    ``kernel``: in the round's attention scope the head's attention takes ``tree_attention`` (its reference here)
    with the extent each pass reads (lengths, flat prefix), as on CUDA."""
    calls = []
    scope = contextlib.nullcontext()
    if attn == "kernel":
        from specdec import attention
        from specdec.kernels import tree_attention as kernel

        monkeypatch.setattr(attention, "KERNEL", "triton")  # the kernel's path; on the CPU its reference computes
        original = kernel.tree_attention

        def spy(*args, **kwargs):
            calls.append(kwargs.get("flat") is not None and args[5] is not None)
            return original(*args, **kwargs)

        monkeypatch.setattr(kernel, "tree_attention", spy)
    model, folder, tensors = setup
    drafter = MTPDrafter.from_pretrained(folder, target=model)
    if attn == "kernel":
        scope = attention.AttentionScope(drafter.model)
    n, depth = 9, 4
    ids = prompts(batch, n + 6, seed=batch)
    with torch.no_grad():
        hidden = model.model(ids).last_hidden_state
    state = drafter.attach(model, 64, batch)
    assert isinstance(state, MTPStatic)
    with torch.no_grad(), scope:
        state.prefill(ids[:, :n], hidden[:, :n])
        prefix = torch.full((batch,), n)
        got = state.propose(ids[:, n], prefix, depth, 64).logq
        for b in range(batch):
            torch.testing.assert_close(
                got[b], reference_logq(model, tensors, ids[b, : n + 1], depth), rtol=0, atol=1e-5
            )
        # a commit: the root at slot n and accepted tokens ids[n+1 .. n+a] plus the bonus ids[n+a+1]; the tree's node
        # j holds position n + j here, so the target's hidden state of node j is hidden[:, n + j]
        accepted = [2, 0][:batch]
        num = torch.tensor([a + 1 for a in accepted])
        path = torch.stack([torch.tensor([min(j, a) for j in range(depth + 1)]) for a in accepted])
        toks = torch.stack([torch.cat((ids[b, n + 1 : n + 2 + a], torch.zeros(depth - a, dtype=torch.long)))
                            for b, a in enumerate(accepted)])  # fmt: skip
        state.commit(specdec.types.Accept(path=path, num_path=num, tokens=toks), hidden[:, n : n + depth + 1], prefix)
        prefix = prefix + num
        roots = ids[torch.arange(batch), prefix]
        got = state.propose(roots, prefix, depth, 64).logq
        for b in range(batch):
            p = int(prefix[b])
            torch.testing.assert_close(
                got[b], reference_logq(model, tensors, ids[b, : p + 1], depth), rtol=0, atol=1e-5
            )
    if attn == "kernel":  # every pass (prefill, steps, commit) read a bounded extent with a flat prefix
        assert len(calls) == 2 * depth + 2 and all(calls), calls


@pytest.mark.parametrize("tree", [Chain(k=3), DDTree(budget=5, topk=2)], ids=["chain", "ddtree"])
def test_proposals_inside_generate_match_reference(setup, monkeypatch, tree):
    """Every round's proposal inside ``generate`` (the round's taps, commits and positions), for each row of a
    left-padded batch, is the reference's greedy drafting after that row's tokens committed so far."""
    model, folder, tensors = setup
    drafter = MTPDrafter.from_pretrained(folder, target=model)
    seen = []
    original = MTPStatic.propose

    def spy(self, root, prefix, depth, span):
        proposal = original(self, root, prefix, depth, span)
        seen.append((prefix.clone(), proposal.logq.clone()))
        return proposal

    monkeypatch.setattr(MTPStatic, "propose", spy)
    ids, mask = prompts(2, 8, seed=5), torch.ones(2, 8, dtype=torch.long)
    ids[1, :3], mask[1, :3] = 0, 0  # row 1: a 5-token prompt
    out = specdec.generate(model, ids, attention_mask=mask, drafter=drafter, tree=tree, max_new_tokens=12,
                           do_sample=False)  # fmt: skip
    assert len(seen) >= 3
    rows = [out.sequences[0], out.sequences[1, 3:]]  # each row's tokens from its first prompt token
    for prefix, logq in seen[:4]:
        for b, row in enumerate(rows):
            p = int(prefix[b])
            if p + 1 <= row.shape[0]:  # (a row that has finished keeps proposing from its last root)
                want = reference_logq(model, tensors, row[: p + 1], logq.shape[1])
                torch.testing.assert_close(logq[b], want, rtol=0, atol=1e-5)


def few_tokens(model, drafter, tensors):
    """Copies whose final norms keep only features 0 and 1 (``1 + w`` = 1 there, 0 elsewhere): the target and the
    head then choose among the few tokens whose LM-head weights on those two features lie on their convex hull, so
    the head's drafts are often accepted, several in a row."""
    import copy

    model, drafter = copy.deepcopy(model), copy.deepcopy(drafter)
    drafter.bind(model)
    offset = 1.0 if model.config.model_type.startswith("qwen3_") else 0.0  # (1 + w) norms
    weight = torch.full_like(tensors["mtp.norm.weight"], -offset)
    weight[:2] = 1.0 - offset
    with torch.no_grad():
        model.model.norm.weight.copy_(weight)
        drafter.model.norm.weight.copy_(weight)
    return model, drafter, {**tensors, "mtp.norm.weight": weight}


def test_accepted_drafts_commit_the_right_rows(setup, monkeypatch):
    """With drafts the target accepts (several per round), every round's proposal still equals the reference's and
    the output equals HF's: the rows a commit writes for accepted tokens are right."""
    model, folder, tensors = setup
    model, drafter, tensors = few_tokens(model, MTPDrafter.from_pretrained(folder, target=model), tensors)
    seen = []
    original = MTPStatic.propose

    def spy(self, root, prefix, depth, span):
        proposal = original(self, root, prefix, depth, span)
        seen.append((int(prefix[0]), proposal.logq[0].clone()))
        return proposal

    monkeypatch.setattr(MTPStatic, "propose", spy)
    long_runs = 0
    for seed in (1, 2, 3, 4, 5):
        seen.clear()
        ids = prompts(1, 9, seed=seed)
        # HF's tokens past the output too: a round launched ahead of the last one drafts from there (and is dropped)
        ref = model.generate(ids, max_new_tokens=40, do_sample=False)
        out = specdec.generate(model, ids, drafter=drafter, tree=Chain(k=4), max_new_tokens=30)
        assert torch.equal(out.sequences, ref[:, : out.sequences.shape[1]])
        long_runs += sum(out.stats.accept_hist[2:])
        for prefix, logq in seen:
            want = reference_logq(model, tensors, ref[0, : prefix + 1], 4)
            torch.testing.assert_close(logq, want, rtol=1e-5, atol=1e-5)  # (log-probs down to -1e3: relative too)
    assert long_runs >= 1  # some round accepted two or more drafts


@pytest.mark.parametrize("tree", [Chain(k=4), DDTree(budget=6, topk=2)], ids=["chain", "ddtree"])
def test_accepted_drafts_lossless_in_a_batch(setup, tree):
    """Drafts the target accepts, a left-padded batch of two: the output equals HF's and rounds accept drafts."""
    model, folder, tensors = setup
    model, drafter, _ = few_tokens(model, MTPDrafter.from_pretrained(folder, target=model), tensors)
    ids, mask = prompts(2, 9, seed=2), torch.ones(2, 9, dtype=torch.long)
    ids[0, :2], mask[0, :2] = 0, 0
    ref = model.generate(ids, attention_mask=mask, max_new_tokens=30, do_sample=False, pad_token_id=0)
    out = specdec.generate(model, ids, attention_mask=mask, drafter=drafter, tree=tree, max_new_tokens=30)
    assert torch.equal(out.sequences, ref)
    assert out.stats.tau > 1.0


# -- checkpoint I/O and errors -----------------------------------------------------------------------------------------
def test_save_pretrained_round_trip(setup, tmp_path):
    """The head written into a copy of a plain checkpoint loads back bit for bit, under the published names."""
    model, folder, tensors = setup
    drafter = MTPDrafter.from_pretrained(folder, target=model)
    plain = tmp_path / "plain"
    model.save_pretrained(plain)  # transformers writes no mtp.* tensors
    copy = tmp_path / "copy"
    drafter.save_pretrained(copy, checkpoint=plain)
    with safe_open(str(copy / "model.safetensors"), "pt") as f:
        names = {k for k in f.keys() if k.startswith("mtp.")}  # noqa: SIM118
    assert names == set(tensors)
    again = MTPDrafter.from_pretrained(copy, target=model)
    for (k, a), (k2, b) in zip(drafter.model.state_dict().items(), again.model.state_dict().items(), strict=True):
        assert k == k2 and torch.equal(a, b)
    key = "num_nextn_predict_layers" if model.config.model_type == "qwen3_next" else "mtp_num_hidden_layers"
    assert json.loads((copy / "config.json").read_text())[key] == 1
    # a sharded checkpoint: the head in its own shard, the index pointing there; HF still loads the model
    with torch.no_grad():
        drafter.model.fc.weight.mul_(2.0)
    sharded = tmp_path / "sharded"
    drafter.save_pretrained(sharded, checkpoint=folder)
    index = json.loads((sharded / "model.safetensors.index.json").read_text())["weight_map"]
    assert {k for k, v in index.items() if v == "model-mtp.safetensors"} == set(tensors)
    again = MTPDrafter.from_pretrained(sharded, target=model)
    assert torch.equal(again.model.fc.weight, 2.0 * tensors["mtp.fc.weight"])
    reloaded = type(model).from_pretrained(sharded)
    for a, b in zip(model.state_dict().values(), reloaded.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_single_file_checkpoint_loads(tmp_path):
    model = tiny_hybrid("qwen3_5")
    tensors = write_checkpoint(model, tmp_path, sharded=False)
    drafter = MTPDrafter.from_pretrained(tmp_path, target=model)
    assert torch.equal(drafter.model.fc.weight, tensors["mtp.fc.weight"])


def test_errors_name_problem_and_fix(tmp_path):
    model = tiny_hybrid("qwen3_5")
    model.save_pretrained(tmp_path / "plain")
    with pytest.raises(ValueError, match=r"no mtp\.\* tensors.*save_pretrained"):
        MTPDrafter.from_pretrained(tmp_path / "plain", target=model)
    other = tiny_hybrid("qwen3_next")
    write_checkpoint(other, tmp_path / "next")
    with pytest.raises(ValueError, match="target's own"):
        MTPDrafter.from_pretrained(tmp_path / "next", target=model)
    drafter = MTPDrafter.from_pretrained(tmp_path / "next", target=other)
    with pytest.raises(ValueError, match="built for a Qwen3NextForCausalLM.*from_pretrained"):
        specdec.generate(model, prompts(1, 5), drafter=drafter, tree=Chain(k=2), max_new_tokens=4)
    with pytest.raises(TypeError, match="tree_depth"):
        MTPDrafter(drafter.model, other, tree_depth=2.0)
    # another instance of the same model (a reload): the head binds it
    twin = tiny_hybrid("qwen3_next")
    ids = prompts(1, 6)
    out = specdec.generate(twin, ids, drafter=drafter, tree=Chain(k=2), max_new_tokens=6)
    assert torch.equal(out.sequences, twin.generate(ids, max_new_tokens=6, do_sample=False))
    assert drafter._embed is twin.get_input_embeddings()


@pytest.mark.parametrize("tree", [Chain(k=3), DDTree(budget=6, topk=3)], ids=["chain", "ddtree"])
@pytest.mark.parametrize("batch", [1, 2])
def test_generate_greedy_is_lossless(setup, tree, batch):
    """Token identity with ``model.generate(do_sample=False)``, one row and a left-padded batch of two."""
    model, folder, _ = setup
    drafter = MTPDrafter.from_pretrained(folder, target=model)
    ids = prompts(batch, 9, seed=11)
    mask = torch.ones_like(ids)
    if batch == 2:
        ids[1, :3], mask[1, :3] = 0, 0  # left padding
    ref = model.generate(ids, attention_mask=mask, max_new_tokens=16, do_sample=False, pad_token_id=0)
    out = specdec.generate(model, ids, attention_mask=mask, drafter=drafter, tree=tree, max_new_tokens=16,
                           do_sample=False)  # fmt: skip
    assert torch.equal(out.sequences, ref)


# -- every policy and rule; sampling; the bench's method specs ---------------------------------------------------------
@pytest.fixture(scope="module")
def dense():
    target = tiny_model("qwen3", scale=2.0)
    return target, MTPDrafter.random(target, seed=3, std=0.3)


@pytest.mark.parametrize("rule_name", sorted(RULES))
@pytest.mark.parametrize("policy_name", sorted(TREES))
def test_every_policy_and_rule_greedy(dense, policy_name, rule_name):
    """Every registered policy that reads per-depth log-probs x every rule exact for greedy settings: a left-padded
    batch decodes row by row as HF."""
    policy, rule = TREES[policy_name](), RULES[rule_name]()
    if "logq" not in policy.reads:
        pytest.skip(f"{policy_name} reads no per-depth log-probs")
    try:
        rule.check(SamplingParams(), policy)
    except ValueError:
        pytest.skip(f"{rule_name} is not exact for {policy_name}")
    target, drafter = dense
    ids, mask = prompts(3, 10, seed=4), torch.ones(3, 10, dtype=torch.long)
    ids[1, :4], mask[1, :4] = 0, 0
    ids[2, :2], mask[2, :2] = 0, 0
    ref = target.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=0)
    out = specdec.generate(target, ids, attention_mask=mask, drafter=drafter, tree=policy, verifier=rule,
                           max_new_tokens=12)  # fmt: skip
    assert torch.equal(out.sequences, ref)


@pytest.mark.parametrize(
    "policy,rule",
    [
        (DDTree(budget=6, topk=2), None),
        pytest.param(TREES["sampled-chain"](k=3), RULES["speculative-sampling"](), marks=pytest.mark.slow),
    ],
    ids=["ddtree-sample-match", "sampled-chain-speculative"],
)
def test_sampling_first_two_tokens_follow_hf(policy, rule):
    """Sampling with MTP drafts: the first two new tokens over many rows follow HF's joint distribution under its own
    warpers (and not the distribution at a wrong temperature: the test has the power to see it)."""
    target = tiny_model("qwen3", scale=2.5)
    drafter = MTPDrafter.random(target, seed=3, std=0.3)
    row = prompts(1, 7, seed=6)[0]
    ids = row[None].expand(100, -1).contiguous()
    gen, counts = torch.Generator().manual_seed(0), {}
    for _ in range(20):
        out = specdec.generate(target, ids, drafter=drafter, tree=policy, verifier=rule, max_new_tokens=2,
                               do_sample=True, temperature=0.5, top_k=4, generator=gen)  # fmt: skip
        for b in range(ids.shape[0]):
            key = tuple(out.sequences[b, -2:].tolist())
            counts[key] = counts.get(key, 0) + 1

    def joint(temperature):
        def probs(seq):
            with torch.no_grad():
                return hf_probs(target(seq[None]).logits[0, -1], temperature, top_k=4)

        p1, out = probs(row), {}
        for t1 in p1.nonzero().flatten().tolist():
            p2 = probs(torch.cat([row, torch.tensor([t1])]))
            for t2 in p2.nonzero().flatten().tolist():
                out[(t1, t2)] = float(p1[t1] * p2[t2])
        return out

    right, wrong = joint(0.5), joint(0.8)
    keys = sorted(right)
    assert set(counts) <= set(keys)
    observed = torch.tensor([counts.get(k, 0) for k in keys])
    assert gof_pvalue(observed, torch.tensor([right[k] for k in keys])) > 1e-3
    assert gof_pvalue(observed, torch.tensor([wrong[k] for k in keys])) < 1e-3


def test_bench_methods_build_the_head(setup):
    """``{kind: mtp}`` in a bench method loads the target checkpoint's own head; ``init: random`` a random one."""
    from specdec.bench.config import methods_from_specs

    model, folder, tensors = setup
    loaded = type(model).from_pretrained(folder).eval()
    chain = {"kind": "chain", "k": 3}
    specs = [{"name": "mtp", "drafter": {"kind": "mtp"}, "tree": chain},
             {"name": "rand", "drafter": {"kind": "mtp", "init": "random"}, "tree": chain}]  # fmt: skip
    own, rand = methods_from_specs(specs, target=loaded, tokenizer=None)
    assert isinstance(own.drafter, MTPDrafter) and isinstance(rand.drafter, MTPDrafter)
    assert torch.equal(own.drafter.model.fc.weight, tensors["mtp.fc.weight"])
    assert not torch.equal(rand.drafter.model.fc.weight, tensors["mtp.fc.weight"])


def test_targets_without_an_mtp_layer_class_are_refused():
    """A target whose attention layers also hold a recurrent mixer (FalconH1), or that has no decoder stack (GPT-2),
    has no class to build the MTP layer from: refused by name."""
    with pytest.raises(ValueError, match="no full-attention decoder layer"):
        MTPDrafter.random(tiny_hybrid("falcon_h1"))
    with pytest.raises(TypeError, match="decoder stack"):
        MTPDrafter.random(tiny_model("gpt2"))


def test_speculative_model_drop_in(setup):
    """``SpeculativeModel`` with the checkpoint's head: ``.generate(**inputs)`` as the target's own, for a batch."""
    model, folder, _ = setup
    spec = specdec.SpeculativeModel(model, drafter=MTPDrafter.from_pretrained(folder, target=model), tree=Chain(k=3))
    ids, mask = prompts(2, 8, seed=9), torch.ones(2, 8, dtype=torch.long)
    ids[0, :3], mask[0, :3] = 0, 0
    ref = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=10, do_sample=False, pad_token_id=0)
    out = spec.generate(input_ids=ids, attention_mask=mask, max_new_tokens=10, do_sample=False)
    assert torch.equal(out, ref)


@pytest.mark.parametrize("tree", [Chain(3), DDTree(budget=6, topk=2)], ids=["chain", "ddtree"])
def test_the_heads_norms_run_in_the_rounds_scope(setup, monkeypatch, tree):
    """The head's forwards run in the round's attention scope, as the target's do: with the target's norms routed
    (``Backends(target_norm="triton")``: ``rms_norm``'s reference on the CPU) the head's own RMSNorms go through
    ``rms_norm`` too (its two norms before ``fc`` through one ``rms_norm_cat``), its proposals are those of its
    modules' own forwards (within float32 rounding: the routed reference may round a row's mean in another order),
    and the tokens are HF's."""
    import specdec.kernels.rms_norm as norms
    from specdec.kernels.rms_norm import routing

    model, folder, _ = setup
    drafter = MTPDrafter.from_pretrained(folder, target=model)
    called: set[int] = set()
    real, real_cat = routing.norm_forward, norms.rms_norm_cat
    monkeypatch.setattr(routing, "norm_forward", lambda m, x: called.add(id(m)) or real(m, x))
    pre_fc = drafter.model.pre_fc_norm_embedding, drafter.model.pre_fc_norm_hidden

    def pair(a, b, wa, wb, *args, **kwargs):
        assert wa is pre_fc[0].weight and wb is pre_fc[1].weight  # the embedding's norm first
        called.update(id(m) for m in pre_fc)
        return real_cat(a, b, wa, wb, *args, **kwargs)

    monkeypatch.setattr(norms, "rms_norm_cat", pair)
    proposals: dict[str, list] = {"triton": [], "torch": []}
    original = MTPStatic.propose
    ids = prompts(1, 9, seed=3)
    want = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=10, do_sample=False)
    for kernel, seen in proposals.items():

        def spy(self, root, prefix, depth, span, seen=seen):
            out = original(self, root, prefix, depth, span)
            seen.append(out.logq.clone())
            return out

        monkeypatch.setattr(MTPStatic, "propose", spy)
        out = specdec.generate(model, ids, drafter=drafter, tree=tree, max_new_tokens=10,
                               backends={"target_norm": kernel})  # fmt: skip
        assert torch.equal(out.sequences, want), kernel
    head = {id(m) for m in routing.norm_modules(drafter.model)}
    assert head and head <= called  # every norm of the head that computes the reference's formula was routed
    assert len(proposals["triton"]) == len(proposals["torch"]) > 0
    for a, b in zip(proposals["triton"], proposals["torch"], strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
