"""EAGLE-3 drafter: checkpoints of the three published layouts (written here from a description of their key names
and configs), the fused-layer rule, ``d2t``/``t2d``, save/load, the round's static state against the plain reference
(``oracles.eagle3_reference``) over prefill and commits, and greedy decoding token-identical to HF ``generate`` with
``Chain`` and ``DDTree`` on dense and hybrid targets, one and two sequences."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch
from kernel_harness import route_gated_to_reference
from models import tiny_model
from oracles.eagle3_reference import Reference, reference_drafts
from safetensors.torch import save_file
from state.hybrid_harness import tiny_hybrid

import specdec
from specdec import attention
from specdec.drafters import eagle3_static
from specdec.drafters.eagle3 import Eagle3Drafter, fused_layers
from specdec.kernels import row_gather
from specdec.kernels.tree_attention import tree_attention
from specdec.trees import Chain, DDTree
from specdec.types import Accept

N, H, HEADS, KV, D, INTER, V, VD = 8, 64, 4, 2, 16, 96, 128, 100


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama", num_hidden_layers=N, scale=2.0)


# -- checkpoints from the format's description ------------------------------------------------------------------
SHAPES = {
    "fc.weight": (H, 3 * H),
    "midlayer.hidden_norm.weight": (H,),
    "midlayer.input_layernorm.weight": (H,),
    "midlayer.self_attn.q_proj.weight": (HEADS * D, 2 * H),
    "midlayer.self_attn.k_proj.weight": (KV * D, 2 * H),
    "midlayer.self_attn.v_proj.weight": (KV * D, 2 * H),
    "midlayer.self_attn.o_proj.weight": (H, HEADS * D),
    "midlayer.post_attention_layernorm.weight": (H,),
    "midlayer.mlp.gate_proj.weight": (INTER, H),
    "midlayer.mlp.up_proj.weight": (INTER, H),
    "midlayer.mlp.down_proj.weight": (H, INTER),
    "norm.weight": (H,),
    "lm_head.weight": (VD, H),
}
LLAMA_KEYS = dict(
    hidden_size=H, intermediate_size=INTER, num_attention_heads=HEADS, num_key_value_heads=KV, rms_norm_eps=1e-6,
    vocab_size=V, rope_theta=10000.0, max_position_embeddings=512, hidden_act="silu",
)  # fmt: skip


def described_weights(seed: int = 0, scale: float = 3.0) -> dict[str, torch.Tensor]:
    """Random official-layout tensors of the shapes above, with a sorted random draft vocabulary."""
    gen = torch.Generator().manual_seed(seed)
    weights = {}
    for name, shape in SHAPES.items():
        if len(shape) == 1:
            weights[name] = 1 + 0.3 * torch.randn(shape, generator=gen)
        else:
            weights[name] = scale * torch.randn(shape, generator=gen) / math.sqrt(shape[1])
    used = torch.randperm(V, generator=gen)[:VD].sort().values
    weights["d2t"] = used - torch.arange(VD)
    weights["t2d"] = torch.zeros(V, dtype=torch.bool).index_fill(0, used, True)
    return weights


def write_official(folder, weights, ids=None, **extra):
    folder.mkdir(parents=True, exist_ok=True)
    raw = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 1, **LLAMA_KEYS,
           "draft_vocab_size": VD, **extra}  # fmt: skip
    if ids is not None:
        raw["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(ids), "use_aux_hidden_state": True}
    (folder / "config.json").write_text(json.dumps(raw))
    torch.save(weights, folder / "pytorch_model.bin")
    return folder


def write_specforge(folder, weights, embed):
    folder.mkdir(parents=True, exist_ok=True)
    ids = [1, N // 2 - 1, N - 4]  # the output-of-layer convention
    raw = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "num_hidden_layers": 1, **LLAMA_KEYS,
           "head_dim": D, "draft_vocab_size": VD,
           "eagle_config": {"eagle_aux_hidden_state_layer_ids": ids, "use_aux_hidden_state": True}}  # fmt: skip
    (folder / "config.json").write_text(json.dumps(raw))
    save_file({**weights, "embed_tokens.weight": embed.clone()}, str(folder / "model.safetensors"))
    return folder


def write_speculators(folder, weights):
    folder.mkdir(parents=True, exist_ok=True)
    raw = {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "transformer_layer_config": {"model_type": "llama", "num_hidden_layers": 1, "head_dim": D, **LLAMA_KEYS},
        "draft_vocab_size": VD,
        "norm_before_residual": False,
        "eagle_aux_hidden_state_layer_ids": [2, N // 2, N - 3],
        "speculators_config": {"algorithm": "eagle3", "proposal_methods": [{"proposal_type": "greedy"}]},
    }
    (folder / "config.json").write_text(json.dumps(raw))
    renamed = {k.replace("midlayer.", "layers.0.", 1): v for k, v in weights.items()}
    save_file(renamed, str(folder / "model.safetensors"))
    return folder


def reference(weights) -> Reference:
    return Reference(weights, heads=HEADS, kv_heads=KV, head_dim=D)


def proposal_after(drafter, target, ids, feats, depth: int = 4) -> torch.Tensor:
    """``logq [1, depth, V]`` of the round state after the prompt ``ids[:, :-1]`` (states ``feats``), root
    ``ids[-1]``."""
    state = drafter.attach(target, 64)
    t = feats.shape[1]
    state.prefill(ids[:, :t], feats)
    return state.propose(ids[:, t], torch.tensor([t]), depth, 64).logq


def inputs(t: int = 9, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(4, V, (1, t + 1), generator=gen), torch.randn(1, t, 3 * H, generator=gen)


# -- layouts -----------------------------------------------------------------------------------------------------
def test_three_layouts_load_to_the_reference_logits(target, tmp_path):
    weights = described_weights()
    embed = target.get_input_embeddings().weight.detach()
    drafters = {
        "official": Eagle3Drafter.from_pretrained(write_official(tmp_path / "o", weights), target=target),
        "specforge": Eagle3Drafter.from_pretrained(write_specforge(tmp_path / "s", weights, embed), target=target),
        "speculators": Eagle3Drafter.from_pretrained(write_speculators(tmp_path / "v", weights), target=target),
    }
    assert {name: d.config.layout for name, d in drafters.items()} == {n: n for n in drafters}
    assert drafters["specforge"].model.embed_tokens is not None and drafters["official"].model.embed_tokens is None
    ids, feats = inputs()
    want = reference_drafts(reference(weights), embed, ids[0].tolist(), feats[0], 4)
    for name, drafter in drafters.items():
        assert drafter.hidden_state_ids == (2, N // 2, N - 3), name
        assert drafter.target_layer_ids == (1, N // 2 - 1, N - 4), name
        got = proposal_after(drafter, target, ids, feats)[0]
        assert torch.equal(torch.isfinite(got), torch.isfinite(want)), name
        finite = torch.isfinite(want)
        torch.testing.assert_close(got[finite], want[finite], atol=1e-5, rtol=1e-5, msg=name)
        assert int(finite[0].sum()) == VD  # only the draft vocabulary has mass
        assert torch.equal(finite[0], weights["t2d"])


def test_fused_layer_rule():
    assert fused_layers(None, 32) == (2, 16, 29)
    assert fused_layers([1, 15, 28], 32) == (2, 16, 29)  # output-of-layer ids (SpecForge default): shifted by one
    assert fused_layers([1, 46, 90], 94) == (2, 47, 91)
    assert fused_layers([2, 30, 57], 60) == (2, 30, 57)  # hidden_states indices: as given
    assert fused_layers([3, 5, 6], 8) == (3, 5, 6)


@pytest.mark.parametrize(
    ("ids", "want"), [(None, (2, 4, 5)), ([1, 3, 4], (2, 4, 5)), ([2, 4, 5], (2, 4, 5)), ([3, 5, 6], (3, 5, 6))]
)
def test_checkpoint_ids_pick_the_target_layers(target, tmp_path, ids, want):
    drafter = Eagle3Drafter.from_pretrained(write_official(tmp_path / "c", described_weights(), ids), target=target)
    assert drafter.hidden_state_ids == want
    assert drafter.target_layer_ids == tuple(i - 1 for i in want)
    # the engine taps hidden_states[i + 1] for each target_layer_id: the physical states named by ``want``
    out = target(torch.tensor([[5, 6, 7]]), output_hidden_states=True)
    tapped = torch.cat([out.hidden_states[i + 1] for i in drafter.target_layer_ids], -1)
    assert torch.equal(tapped, torch.cat([out.hidden_states[i] for i in want], -1))


def test_save_pretrained_writes_the_official_layout(target, tmp_path):
    weights = described_weights(seed=2)
    drafter = Eagle3Drafter.from_pretrained(write_speculators(tmp_path / "v", weights), target=target)
    drafter.save_pretrained(tmp_path / "saved")
    raw = json.loads((tmp_path / "saved" / "config.json").read_text())
    assert raw["architectures"] == ["LlamaForCausalLM"] and raw["draft_vocab_size"] == VD
    from safetensors.torch import load_file

    saved = load_file(str(tmp_path / "saved" / "model.safetensors"))
    assert set(saved) == set(weights)
    for name, tensor in weights.items():
        assert torch.equal(saved[name], tensor.to(saved[name].dtype)), name
    again = Eagle3Drafter.from_pretrained(tmp_path / "saved", target=target)
    ids, feats = inputs(seed=3)
    assert torch.equal(proposal_after(again, target, ids, feats), proposal_after(drafter, target, ids, feats))
    assert again.hidden_state_ids == drafter.hidden_state_ids


def test_full_vocabulary_head_needs_no_maps(target, tmp_path):
    weights = described_weights(seed=4)
    weights["lm_head.weight"] = torch.randn(V, H) / 8
    del weights["d2t"], weights["t2d"]
    folder = write_official(tmp_path / "f", weights, draft_vocab_size=V)
    drafter = Eagle3Drafter.from_pretrained(folder, target=target)
    ids, feats = inputs(seed=5)
    full = {**weights, "d2t": torch.zeros(V, dtype=torch.long), "t2d": torch.ones(V, dtype=torch.bool)}
    embed = target.get_input_embeddings().weight.detach()
    want = reference_drafts(reference(full), embed, ids[0].tolist(), feats[0], 3)
    torch.testing.assert_close(proposal_after(drafter, target, ids, feats, 3)[0], want, atol=1e-5, rtol=1e-5)


def test_errors_name_the_problem(target, tmp_path):
    weights = described_weights()
    no_map = {k: v for k, v in weights.items() if k != "d2t"}
    with pytest.raises(ValueError, match="no 'd2t' map"):
        Eagle3Drafter.from_pretrained(write_official(tmp_path / "a", no_map), target=target)
    extra = {**weights, "midlayer.self_attn.q_norm.weight": torch.ones(D)}
    with pytest.raises(ValueError, match="unexpected.*q_norm"):
        Eagle3Drafter.from_pretrained(write_official(tmp_path / "b", extra), target=target)
    with pytest.raises(ValueError, match="not outputs of this target"):
        Eagle3Drafter.from_pretrained(write_official(tmp_path / "c", weights, [2, 4, 12]), target=target)
    with pytest.raises(ValueError, match="needs target="):
        Eagle3Drafter.from_pretrained(tmp_path / "c", target=None)
    with pytest.raises(NotImplementedError, match="one-layer"):
        write_official(tmp_path / "d", weights)
        raw = json.loads((tmp_path / "d" / "config.json").read_text())
        (tmp_path / "d" / "config.json").write_text(json.dumps({**raw, "num_hidden_layers": 2}))
        Eagle3Drafter.from_pretrained(tmp_path / "d", target=target)
    narrow = tiny_model("llama", num_hidden_layers=N, hidden_size=32, num_attention_heads=2, num_key_value_heads=1)
    drafter = Eagle3Drafter.from_pretrained(write_official(tmp_path / "e", weights), target=target)
    with pytest.raises(ValueError, match="fc takes 192 features"):
        drafter.validate(narrow, Chain(k=2))


# -- the round's state: prefill, proposals and commits against the reference -----------------------------------------
@pytest.mark.parametrize("path", ["sdpa", "kernel", "gated"])
def test_state_over_commits_matches_the_reference(target, tmp_path, path, monkeypatch):
    """Two sequences of different prompt lengths; each round commits a random accepted path (tree node indices with
    their target states) and the next proposal equals the reference head run from scratch over everything
    committed. ``kernel``: the head's attention takes ``tree_attention`` (its reference here) with each row's
    lengths and flat prefix, as on CUDA. ``gated``: the MLP's gate, up and SiLU take ``gated_linear`` over the
    halves of the stacked weight, as on CUDA (its reference here)."""
    calls = []
    if path == "kernel":
        monkeypatch.setattr(attention, "KERNEL", "triton")  # the kernel's path; on the CPU its reference computes
        monkeypatch.setattr(eagle3_static, "tree_attention", lambda *a, **k: calls.append(1) or tree_attention(*a, **k))
    if path == "gated":
        route_gated_to_reference(monkeypatch, calls)
    weights = described_weights(seed=6)
    drafter = Eagle3Drafter.from_pretrained(write_official(tmp_path / "o", weights), target=target)
    embed = target.get_input_embeddings().weight.detach()
    gen = torch.Generator().manual_seed(7)
    lengths, width, depth, slots = [6, 9], 9, 3, 7
    tokens = [torch.randint(4, V, (n + 1,), generator=gen).tolist() for n in lengths]  # prompt + root
    feats = [torch.randn(n, 3 * H, generator=gen) for n in lengths]
    ids = torch.zeros(2, width, dtype=torch.long)
    padded = torch.zeros(2, width, 3 * H)
    for b, n in enumerate(lengths):
        ids[b, :n] = torch.tensor(tokens[b][:n])
        padded[b, :n] = feats[b]
    state = drafter.attach(target, 48, batch=2)
    state.prefill(ids, padded)
    for _ in range(4):
        prefix = torch.tensor([len(f) for f in feats])
        root = torch.tensor([t[-1] for t in tokens])
        got = state.propose(root, prefix, depth, 48).logq
        for b in range(2):
            want = reference_drafts(reference(weights), embed, tokens[b], feats[b], depth)
            finite = torch.isfinite(want)  # fp32 over up to 20 rows: a bug is O(1), rounding 1e-5
            torch.testing.assert_close(got[b][finite], want[finite], atol=1e-4, rtol=1e-4)
        # verification: ``slots`` tree nodes with their target states; an accepted path of 1..depth+1 nodes
        hidden = torch.randn(2, slots, 3 * H, generator=gen)
        num_path = torch.randint(1, depth + 2, (2,), generator=gen)
        acc_path = torch.zeros(2, depth + 1, dtype=torch.long)
        acc = torch.zeros(2, depth + 1, dtype=torch.long)
        for b in range(2):
            nodes = [0] + sorted(torch.randperm(slots - 1, generator=gen)[:depth].add(1).tolist())
            n = int(num_path[b])
            acc_path[b] = torch.tensor(nodes[:n] + [nodes[n - 1]] * (depth + 1 - n))
            acc[b, :n] = torch.randint(4, V, (n,), generator=gen)
            feats[b] = torch.cat([feats[b], hidden[b, acc_path[b, :n]]])
            tokens[b] += acc[b, :n].tolist()
        state.commit(Accept(path=acc_path, num_path=num_path, tokens=acc), hidden, prefix)
    assert path == "sdpa" or calls, "the kernel's path was not taken"


def test_a_hooked_embedding_is_honoured(target, tmp_path):
    """The round looks the head's token embeddings up inside its side-by-side norms only where the embedding is a
    plain table lookup (``plain_table``): a forward hook on the target's embedding (here doubling its output) is run,
    and the proposal equals the reference head over the doubled table."""
    weights = described_weights(seed=6)
    drafter = Eagle3Drafter.from_pretrained(write_official(tmp_path / "o", weights), target=target)
    module = target.get_input_embeddings()
    assert row_gather.plain_table(module) is module.weight
    gen = torch.Generator().manual_seed(3)
    tokens = torch.randint(4, V, (8,), generator=gen).tolist()
    feats = torch.randn(7, 3 * H, generator=gen)
    handle = module.register_forward_hook(lambda m, args, out: out * 2)
    try:
        assert row_gather.plain_table(module) is None
        state = drafter.attach(target, 32, batch=1)
        state.prefill(torch.tensor([tokens[:7]]), feats[None])
        got = state.propose(torch.tensor([tokens[7]]), torch.tensor([7]), 3, 32).logq[0]
    finally:
        handle.remove()
    want = reference_drafts(reference(weights), module.weight.detach() * 2, tokens, feats, 3)
    finite = torch.isfinite(want)
    torch.testing.assert_close(got[finite], want[finite], atol=1e-4, rtol=1e-4)
    scaled = torch.nn.Embedding(4, 2)
    scaled.forward = lambda ids: torch.nn.Embedding.forward(scaled, ids) * 3
    assert row_gather.plain_table(scaled) is None
    assert row_gather.plain_table(torch.nn.Embedding(4, 2, max_norm=1)) is None


# -- decoding --------------------------------------------------------------------------------------------------------
def sharp_head(target, seed: int = 1, **kwargs) -> Eagle3Drafter:
    drafter = Eagle3Drafter.for_target(target, seed=seed, **kwargs)
    with torch.no_grad():  # sharper drafts than the 0.02 init
        for p in drafter.model.parameters():
            if p.dim() == 2:
                p.mul_(8.0)
    return drafter


def left_padded(lengths, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.zeros(len(lengths), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, n in enumerate(lengths):
        ids[b, width - n :] = torch.randint(4, V, (n,), generator=gen)
        mask[b, width - n :] = 1
    return ids, mask


def check_greedy(target, drafter, lengths, max_new: int = 12):
    ids, mask = left_padded(lengths)
    want = target.generate(ids, attention_mask=mask, max_new_tokens=max_new, do_sample=False, pad_token_id=0)
    for tree in (Chain(k=4), DDTree(budget=8, topk=3)):
        out = specdec.generate(target, ids, attention_mask=mask, drafter=drafter, tree=tree, max_new_tokens=max_new,
                               do_sample=False, pad_token_id=0)  # fmt: skip
        assert torch.equal(out.sequences, want), tree
        if len(lengths) == 1:
            assert out.stats.draft_forwards == out.stats.rounds * drafter.forwards_per_round(tree)


def test_generate_greedy_is_lossless_with_the_kernels_in_the_interpreter():
    """The head's round with every kernel the GPU path takes (its norms and residual adds through ``rms_norm`` /
    ``add_rms_norm``, the MLP's ``silu_mul``, the K/V write, the attention) run by Triton's interpreter, in a
    subprocess: greedy output equal to HF's for a left-padded batch, chain and DDTree."""
    from kernel_harness import run_lines_interpreted

    run_lines_interpreted(
        "from models import tiny_model",
        "from test_eagle3 import check_greedy, sharp_head",
        "target = tiny_model('qwen3', num_hidden_layers=4, scale=2.0)",
        "check_greedy(target, sharp_head(target), (6, 10), max_new=5)",
        folders=["drafters"],
    )


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("lengths", [(9,), (6, 10)], ids=["b1", "b2"])
def test_generate_greedy_is_lossless_dense(arch, lengths):
    target = tiny_model(arch, num_hidden_layers=6, scale=2.0)
    check_greedy(target, sharp_head(target, draft_vocab_size=VD), lengths)


def test_a_head_for_a_gpt2_target():
    """GPT-2's config names the MLP width ``n_inner`` (None: four times the width) and has no rotary settings: a
    head is still shaped for it, and decodes losslessly (the head's own rotation; the target's learned positions)."""
    target = tiny_model("gpt2", n_layer=6, scale=2.0)
    head = sharp_head(target, draft_vocab_size=VD)
    assert head.config.intermediate_size == 4 * 64
    check_greedy(target, head, (6, 10))


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_next"])
@pytest.mark.parametrize("lengths", [(9,), (6, 10)], ids=["b1", "b2"])
def test_generate_greedy_is_lossless_hybrid(family, lengths):
    target = tiny_hybrid(family)  # three layers: gated delta net, attention, gated delta net
    check_greedy(target, sharp_head(target, layer_ids=(2, 1, 3), draft_vocab_size=VD), lengths)


def copy_head(target) -> Eagle3Drafter:
    """A head whose draft repeats its input token: fused states zeroed (fc = 0), attention sharp on the row itself
    (q = k = 8 x the normed embedding), values and output the identity, lm_head the target's embedding."""
    drafter = Eagle3Drafter.for_target(target)
    model, width = drafter.model, target.config.hidden_size
    eye = torch.eye(width)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.ones_like(p) if name.endswith("norm.weight") else torch.zeros_like(p))
        attn = model.midlayer.self_attn
        attn.q_proj.weight[:, :width] = 8 * eye
        attn.k_proj.weight[:, :width] = 8 * eye
        attn.v_proj.weight[:, :width] = eye
        attn.o_proj.weight.copy_(eye)
        model.lm_head.weight.copy_(target.get_input_embeddings().weight)
    return drafter


@pytest.mark.parametrize("lengths", [(8,), (5, 8)], ids=["b1", "b2"])
def test_repeating_target_accepts_the_copy_heads_drafts(lengths):
    """A target that repeats a token for a while and a head that drafts repeats: three drafts in a row are accepted
    there (the round commits a long path), and the output is still HF's."""
    target = tiny_model("llama", num_hidden_layers=6, num_key_value_heads=4, scale=2.0)
    drafter = copy_head(target)
    ids, mask = left_padded(lengths, seed=3)
    want = target.generate(ids, attention_mask=mask, max_new_tokens=24, do_sample=False, pad_token_id=0)
    for tree in (Chain(k=4), DDTree(budget=8, topk=2)):
        out = specdec.generate(target, ids, attention_mask=mask, drafter=drafter, tree=tree, max_new_tokens=24,
                               do_sample=False, pad_token_id=0)  # fmt: skip
        assert torch.equal(out.sequences, want), tree
        assert max(out.stats.accept_lengths) >= 4, (tree, out.stats.accept_lengths)  # 3 drafts and the bonus


@pytest.mark.parametrize("rule_name", sorted(specdec.RULES))
@pytest.mark.parametrize("policy_name", ["chain", "ddtree", "sampled-chain", "stochastic-ddtree"])
def test_every_rule_greedy_and_sampled(policy_name, rule_name):
    """Every verification rule with the policies that read per-depth log-probabilities: greedy settings give HF's
    tokens; sampling runs to the length asked (a pair a rule is not exact for is refused by name)."""
    from specdec.types import SamplingParams

    target = tiny_model("qwen3", num_hidden_layers=6, scale=2.0)
    drafter = sharp_head(target, draft_vocab_size=VD)
    policy, rule = specdec.TREES[policy_name](), specdec.RULES[rule_name]()
    ids, mask = left_padded((5, 9), seed=2)
    for sampling in (SamplingParams(), SamplingParams(do_sample=True, temperature=0.9, top_k=20)):
        kwargs = {"do_sample": True, "temperature": 0.9, "top_k": 20} if sampling.do_sample else {}

        def run(kwargs=kwargs):
            return specdec.generate(target, ids, attention_mask=mask, drafter=drafter, tree=policy, verifier=rule,
                                    max_new_tokens=10, pad_token_id=0, **kwargs)  # fmt: skip

        try:
            rule.check(sampling, policy)
        except ValueError as err:
            with pytest.raises(ValueError, match=re.escape(str(err).split(":")[0])):
                run()
            continue
        out = run()
        if not kwargs:
            want = target.generate(ids, attention_mask=mask, max_new_tokens=10, do_sample=False, pad_token_id=0)
            assert torch.equal(out.sequences, want)
        else:
            assert out.sequences.shape == (2, ids.shape[1] + 10) and int(out.sequences.max()) < V


def test_cli_and_bench_build_it(zoo, tmp_path):
    """``drafter=eagle3 drafter.path=<folder>`` in the CLI decodes the zoo target's greedy tokens; the bench builds
    ``{kind: eagle3}`` from a path or at random."""
    from test_cli import _compose
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specdec import cli
    from specdec.bench.config import _build, check_method_specs

    model = AutoModelForCausalLM.from_pretrained(zoo / "target-dense", dtype=torch.float32).eval()
    Eagle3Drafter.for_target(model, draft_vocab_size=512, seed=3).save_pretrained(tmp_path / "head")
    overrides = ["drafter=eagle3", f"drafter.path={tmp_path / 'head'}", "tree=ddtree", "tree.budget=6",
                 "prompts.limit=1", "max_new_tokens=8", "show_text=false", "threads=1", "device=cpu"]  # fmt: skip
    cfg, choices = _compose("generate", overrides)
    records = cli.run_command("generate", cfg, choices, tmp_path / "out")
    tok = AutoTokenizer.from_pretrained(zoo / "tokenizer")
    ids = tok(records[0]["prompt"], return_tensors="pt").input_ids
    assert records[0]["tokens"] == model.generate(ids, do_sample=False, max_new_tokens=8)[0, ids.shape[1] :].tolist()
    check_method_specs([{"drafter": {"kind": "eagle3", "path": "x", "tree_depth": 4}, "tree": {"kind": "chain"}}])
    built = _build({"kind": "eagle3", "path": str(tmp_path / "head")}, model, None, {}, None)
    assert isinstance(built, Eagle3Drafter) and built.config.draft_vocab_size == 512
    random = _build({"kind": "eagle3", "init": "random", "draft_vocab_size": 64}, model, None, {}, None)
    assert random.target_layer_ids == (1, 3, 4)  # hidden_states 2, N // 2, N - 3 of the 8-layer target
    with pytest.raises(ValueError, match="eagle3.*no path"):
        _build({"kind": "eagle3"}, model, None, {}, None)


def test_round_reads_nothing_on_the_host(monkeypatch):
    """Inside a round (proposal, verification, commit) no tensor value reaches the host: the round can be captured
    in a CUDA graph."""
    from host_reads import spy_round_reads

    target = tiny_model("qwen3", num_hidden_layers=6, scale=2.0)
    drafter = sharp_head(target, draft_vocab_size=VD)
    reads = spy_round_reads(monkeypatch)
    rounds = 0
    for lengths in ((9,), (6, 10)):
        ids, mask = left_padded(lengths)
        for tree in (Chain(k=4), DDTree(budget=8, topk=3)):
            out = specdec.generate(target, ids, attention_mask=mask, drafter=drafter, tree=tree, max_new_tokens=10,
                                   pad_token_id=0)  # fmt: skip
            rounds += out.stats.rounds
    assert rounds > 10 and reads == []


def test_own_embedding_and_speculators_flags(target, tmp_path):
    """A checkpoint's own ``embed_tokens`` is the one drafts embed with; a speculators config's flags
    (``norm_before_residual``, ``norm_output``) change the maths as the reference says."""
    weights = described_weights(seed=8)
    own = torch.randn(V, H, generator=torch.Generator().manual_seed(9)) / 4
    drafter = Eagle3Drafter.from_pretrained(write_specforge(tmp_path / "s", weights, own), target=target)
    ids, feats = inputs(seed=10)
    want = reference_drafts(reference(weights), own, ids[0].tolist(), feats[0], 4)
    finite = torch.isfinite(want)
    torch.testing.assert_close(
        proposal_after(drafter, target, ids, feats)[0][finite], want[finite], atol=1e-5, rtol=1e-5
    )

    folder = write_speculators(tmp_path / "v", weights)
    raw = json.loads((folder / "config.json").read_text())
    flags = {"norm_before_residual": True, "norm_output": True}
    (folder / "config.json").write_text(json.dumps({**raw, **flags}))
    drafter = Eagle3Drafter.from_pretrained(folder, target=target)
    embed = target.get_input_embeddings().weight.detach()
    ref = Reference(weights, heads=HEADS, kv_heads=KV, head_dim=D, flags=flags)
    want = reference_drafts(ref, embed, ids[0].tolist(), feats[0], 4)
    torch.testing.assert_close(
        proposal_after(drafter, target, ids, feats)[0][finite], want[finite], atol=1e-5, rtol=1e-5
    )


def test_vocabulary_maps_are_checked(target, tmp_path, caplog):
    weights = described_weights()
    bad = {**weights, "d2t": weights["d2t"] + 200}
    with pytest.raises(ValueError, match="outside the target vocabulary"):
        Eagle3Drafter.from_pretrained(write_official(tmp_path / "a", bad), target=target)
    off = {**weights, "t2d": ~weights["t2d"]}
    with caplog.at_level("WARNING"):
        Eagle3Drafter.from_pretrained(write_official(tmp_path / "b", off), target=target)
    assert "drafting follows d2t" in caplog.text


def test_speculators_qwen3_layer_has_qk_norms(target, tmp_path):
    """A speculators head whose ``transformer_layer_config`` is Qwen3's carries per-head ``q_norm``/``k_norm``
    (applied before the rotation); the target's norm and LM head copies (``verifier_*``) in the file are ignored."""
    gen = torch.Generator().manual_seed(11)
    weights = described_weights(seed=12)
    weights["midlayer.self_attn.q_norm.weight"] = 1 + 0.3 * torch.randn(D, generator=gen)
    weights["midlayer.self_attn.k_norm.weight"] = 1 + 0.3 * torch.randn(D, generator=gen)
    folder = write_speculators(tmp_path / "v", weights)
    raw = json.loads((folder / "config.json").read_text())
    raw["transformer_layer_config"]["model_type"] = "qwen3"
    (folder / "config.json").write_text(json.dumps(raw))
    from safetensors.torch import load_file

    tensors = load_file(str(folder / "model.safetensors"))
    extra = {"verifier_norm.weight": torch.ones(H), "verifier_lm_head.weight": torch.zeros(V, H)}
    save_file({**tensors, **extra}, str(folder / "model.safetensors"))
    drafter = Eagle3Drafter.from_pretrained(folder, target=target)
    assert drafter.config.qk_norm
    ids, feats = inputs(seed=13)
    embed = target.get_input_embeddings().weight.detach()
    ref = Reference(weights, heads=HEADS, kv_heads=KV, head_dim=D, flags={"qk_norm": True})
    want = reference_drafts(ref, embed, ids[0].tolist(), feats[0], 4)
    finite = torch.isfinite(want)
    torch.testing.assert_close(
        proposal_after(drafter, target, ids, feats)[0][finite], want[finite], atol=1e-5, rtol=1e-5
    )
    drafter.save_pretrained(tmp_path / "saved")  # official layout plus the qk_norm flag
    again = Eagle3Drafter.from_pretrained(tmp_path / "saved", target=target)
    assert torch.equal(proposal_after(again, target, ids, feats), proposal_after(drafter, target, ids, feats))
