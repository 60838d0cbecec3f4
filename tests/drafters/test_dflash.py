"""DFlash drafter: the round's forward (``DFlashDrafter.attach``: static context) and the eager oracle
(``oracles.dflash_eager``) vs the training forward, incremental context, proposals, z-lab checkpoint I/O,
validation."""

from __future__ import annotations

import itertools
import json

import pytest
import torch
from models import tiny_model
from oracles.ddtree_heap import build_ddtree
from oracles.dflash_eager import DecodeContext, EagerDFlash
from oracles.host_trees import to_draft_tree
from safetensors.torch import save_file

import specdec
from specdec.drafters.dflash import DFlashConfig, DFlashDrafter, default_target_layer_ids
from specdec.train.dflash import block_hidden, target_features
from specdec.trees import Chain, DDTree

VOCAB, MASK = 128, 3


@pytest.fixture(scope="module")
def target():
    return tiny_model("qwen3", num_hidden_layers=4, eos_token_id=2)


def make_drafter(target, **kwargs) -> DFlashDrafter:
    opts = dict(mask_token_id=MASK, num_layers=2, block_size=6, target_layer_ids=(0, 2), seed=1)
    drafter = DFlashDrafter.for_target(target, **{**opts, **kwargs})
    with torch.no_grad():  # sharper drafts than the 0.02 init, so mistakes show up in the logits
        for p in drafter.model.parameters():
            if p.dim() == 2:
                p.mul_(8.0)
    return drafter


def tokens(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(4, VOCAB, (1, n), generator=torch.Generator().manual_seed(seed))


def ctx_at(ids: torch.Tensor, feats: torch.Tensor, anchor: int, first_row: int = 0) -> DecodeContext:
    """Context whose root is ``ids[anchor]`` and whose new target rows are positions first_row..anchor-1."""
    return DecodeContext(input_ids=ids[:, : anchor + 1], target_hidden=feats[:, first_row:anchor])


def round_state(drafter, target, ids: torch.Tensor, feats: torch.Tensor, anchor: int, capacity: int = 64):
    """The drafter's round state (``attach``) after the prompt ``ids[:anchor]``: the root ``ids[anchor]`` sits at
    position ``anchor``."""
    state = drafter.attach(target, capacity)
    state.prefill(ids[:, :anchor], feats[:, :anchor])
    return state


def propose(state, ids: torch.Tensor, anchor: int, tree):
    """The round's proposal from ``state`` at root ``ids[anchor]`` and the policy's tree of it (row 0)."""
    root = ids[0, anchor : anchor + 1]
    depth = state.drafter.draft_depth(tree)
    proposal = state.propose(root, torch.tensor([anchor]), depth, state.capacity)
    return proposal, to_draft_tree(tree.build(proposal, root, depth).row(0))


def test_default_target_layer_ids_match_zlab_examples():
    assert default_target_layer_ids(36, 5) == (1, 9, 17, 25, 33)
    assert default_target_layer_ids(32, 5) == (1, 8, 15, 22, 29)
    assert default_target_layer_ids(64, 5) == (1, 16, 31, 46, 61)
    assert default_target_layer_ids(8, 1) == (4,)


@pytest.mark.parametrize("variant", ["full", "sliding_causal"])
def test_draft_logq_matches_training_block_forward(target, variant):
    drafter = make_drafter(target)
    if variant == "sliding_causal":
        cfg = DFlashConfig.from_dict(
            {
                **drafter.config.to_dict(),
                "layer_types": ["sliding_attention", "full_attention"],
                "sliding_window": 5,
                "dflash_config": {"mask_token_id": MASK, "target_layer_ids": [0, 2], "causal": True},
            }
        )
        model = type(drafter.model)(cfg)
        model.load_state_dict(drafter.model.state_dict())
        drafter = DFlashDrafter(model, target=target)
    ids = tokens(24)
    feats = target_features(target, ids, drafter.target_layer_ids)
    anchors = torch.tensor([[3, 9, 10, 17]])
    with torch.no_grad():
        hidden = block_hidden(drafter.model, target.get_input_embeddings(), ids, feats, anchors)
        train_logq = torch.log_softmax(target.lm_head(hidden[0, :, 1:]), dim=-1)  # [n, B-1, V]
    oracle = EagerDFlash(drafter)
    depth = drafter.config.block_size - 1
    for i, a in enumerate(anchors[0].tolist()):
        oracle.prefill(ctx_at(ids, feats, a))
        torch.testing.assert_close(oracle.draft_logq(ctx_at(ids, feats, a)), train_logq[i], atol=2e-5, rtol=1e-5)
        logq = round_state(drafter, target, ids, feats, a).logq(ids[0, a : a + 1], torch.tensor([a]), depth)[0]
        torch.testing.assert_close(logq, train_logq[i], atol=2e-5, rtol=1e-5)


def test_incremental_commits_match_one_prefill(target):
    """Context rows arriving in several commits (with drafts in between, which write their block into the slots
    later commits fill) give the drafts of one prefill: in the round's state and in the eager oracle."""
    drafter = make_drafter(target)
    ids = tokens(30, seed=3)
    feats = target_features(target, ids, drafter.target_layer_ids)
    oracle = EagerDFlash(drafter)
    oracle.prefill(ctx_at(ids, feats, 21))
    want = oracle.draft_logq(ctx_at(ids, feats, 21))
    oracle.prefill(ctx_at(ids, feats, 7))
    oracle.draft_logq(ctx_at(ids, feats, 7))  # a draft in between must leave only context rows cached
    state = round_state(drafter, target, ids, feats, 7)
    depth = drafter.config.block_size - 1
    state.logq(ids[0, 7:8], torch.tensor([7]), depth)[0]
    for stop, first in [(12, 7), (13, 12), (21, 13)]:
        oracle.commit(ctx_at(ids, feats, stop, first))
        state.ingest(feats[:, first:stop], torch.tensor(first))
        state.logq(ids[0, stop : stop + 1], torch.tensor([stop]), depth)[0]
    assert oracle._len == 21
    torch.testing.assert_close(oracle.draft_logq(ctx_at(ids, feats, 21, 13)), want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(state.logq(ids[0, 21:22], torch.tensor([21]), depth)[0], want, atol=1e-5, rtol=1e-5)
    with pytest.raises(RuntimeError, match="continue the cache"):
        oracle.commit(ctx_at(ids, feats, 25, 22))


def test_propose_trees(target):
    drafter = make_drafter(target)
    ids = tokens(16, seed=5)
    feats = target_features(target, ids, drafter.target_layer_ids)
    state = round_state(drafter, target, ids, feats, 15)
    proposal, chain = propose(state, ids, 15, Chain(k=5))
    assert proposal.logq.shape == (1, 5, VOCAB) and proposal.paths is None
    assert chain.tokens[0].item() == ids[0, 15].item() and chain.parents.tolist() == [-1, 0, 1, 2, 3, 4]
    assert torch.equal(propose(state, ids, 15, DDTree(budget=5, topk=1))[1].tokens, chain.tokens)
    _, tree = propose(state, ids, 15, DDTree(budget=12, topk=3))
    assert tree.num_nodes == 13 and tree.max_depth <= 5
    oracle = EagerDFlash(drafter)
    oracle.prefill(ctx_at(ids, feats, 15))
    assert oracle.propose(ctx_at(ids, feats, 15), Chain(k=5)).tokens.tolist() == chain.tokens.tolist()
    assert drafter.forwards_per_round(Chain(k=5)) == drafter.forwards_per_round(DDTree(budget=12)) == 1


def best_prefixes(logq: torch.Tensor, budget: int, width: int) -> list[tuple[int, ...]]:
    """Brute force: every prefix over the top-``width`` tokens per depth, best ``budget`` by summed log-prob."""
    rows = logq.tolist()
    order = [sorted(range(len(row)), key=lambda v, row=row: (-row[v], v))[:width] for row in rows]
    scored = []
    for d in range(1, len(rows) + 1):
        for ranks in itertools.product(range(width), repeat=d):
            score = 0.0
            for j, r in enumerate(ranks):
                score += rows[j][order[j][r]]
            scored.append((-score, ranks, tuple(order[j][r] for j, r in enumerate(ranks))))
    return [path for _, _, path in sorted(scored)[:budget]]


def token_paths(tree) -> list[tuple[int, ...]]:
    tokens, parents = tree.tokens.tolist(), tree.parents.tolist()
    paths: list[tuple[int, ...]] = [()]
    for i in range(1, len(tokens)):
        paths.append((*paths[parents[i]], tokens[i]))
    return paths[1:]


@pytest.mark.parametrize("anchor", [7, 12, 15])
def test_propose_is_ddtree_of_own_draft_logq(target, anchor):
    """The round's proposal is the eager oracle's per-depth log-probs; the tree the DDTree policy builds from it is
    the heap oracle's ``build_ddtree`` of them, its node paths are the brute-force best prefixes, and the chain is
    their per-depth argmax."""
    drafter = make_drafter(target)
    ids = tokens(16, seed=anchor)
    feats = target_features(target, ids, drafter.target_layer_ids)
    oracle = EagerDFlash(drafter)
    oracle.prefill(ctx_at(ids, feats, anchor))
    want_logq = oracle.draft_logq(ctx_at(ids, feats, anchor))  # [B-1, V]
    state = round_state(drafter, target, ids, feats, anchor)
    root = int(ids[0, anchor])
    for budget, topk in [(12, 3), (20, 2), (5, None)]:
        proposal, tree = propose(state, ids, anchor, DDTree(budget=budget, topk=topk))
        logq = proposal.logq[0]
        torch.testing.assert_close(logq, want_logq[: logq.shape[0]], atol=1e-5, rtol=1e-5)
        want = build_ddtree(logq, root, budget=budget, topk=topk)
        assert torch.equal(tree.tokens, want.tokens) and torch.equal(tree.parents, want.parents)
        assert int(tree.tokens[0]) == root
        width = min(budget if topk is None else topk, budget)
        assert token_paths(tree) == best_prefixes(logq, budget, width)
    proposal, chain = propose(state, ids, anchor, Chain(k=4))
    assert chain.tokens.tolist() == [root, *proposal.logq[0].argmax(-1).tolist()]


def test_save_pretrained_round_trip_is_bit_identical(target, tmp_path):
    drafter = make_drafter(target)
    drafter.save_pretrained(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    assert raw["block_size"] == 6 and raw["dflash_config"] == {"mask_token_id": MASK, "target_layer_ids": [0, 2]}
    loaded = DFlashDrafter.from_pretrained(tmp_path, target=target)
    assert loaded.config == drafter.config
    for name, value in drafter.model.state_dict().items():
        assert torch.equal(loaded.model.state_dict()[name], value), name
    ids = tokens(12)
    feats = target_features(target, ids, drafter.target_layer_ids)
    logq = [propose(round_state(d, target, ids, feats, 11), ids, 11, Chain(k=5))[0].logq for d in (drafter, loaded)]
    assert torch.equal(logq[0], logq[1])
    drafter.save_pretrained(tmp_path / "bf16", dtype=torch.bfloat16)
    half = DFlashDrafter.from_pretrained(tmp_path / "bf16")
    assert half.model.fc.weight.dtype == torch.bfloat16 and half.model.fc.weight.device.type == "cpu"


def _zlab_tensors(h, i, hq, hkv, d, k, layers, *, prefix="", midlayer=False):
    g = torch.Generator().manual_seed(0)

    def t(*shape):
        return torch.randn(*shape, generator=g).to(torch.bfloat16)

    out = {"fc.weight": t(h, k * h), "hidden_norm.weight": t(h), "norm.weight": t(h)}
    for n in range(layers):
        lp = "midlayer." if midlayer else f"layers.{n}."
        out.update(
            {
                f"{lp}input_layernorm.weight": t(h),
                f"{lp}post_attention_layernorm.weight": t(h),
                f"{lp}self_attn.q_proj.weight": t(hq, h),
                f"{lp}self_attn.k_proj.weight": t(hkv, h),
                f"{lp}self_attn.v_proj.weight": t(hkv, h),
                f"{lp}self_attn.o_proj.weight": t(h, hq),
                f"{lp}self_attn.q_norm.weight": t(d),
                f"{lp}self_attn.k_norm.weight": t(d),
                f"{lp}mlp.gate_proj.weight": t(i, h),
                f"{lp}mlp.up_proj.weight": t(i, h),
                f"{lp}mlp.down_proj.weight": t(h, i),
            }
        )
    return {prefix + name: v for name, v in out.items()}


def test_loads_zlab_2026_04_layout(target, tmp_path):
    """The published b16 layout (config keys of the Qwen3-4B card, shapes scaled to the tiny target)."""
    config = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
        "block_size": 16,
        "num_target_layers": 4,
        "dflash_config": {"mask_token_id": MASK, "target_layer_ids": [0, 1, 2]},
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000,
        "rope_scaling": None,
        "max_position_embeddings": 40960,
        "vocab_size": VOCAB,
        "layer_types": ["full_attention"] * 3,
        "max_window_layers": 3,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": True,
        "dtype": "bfloat16",
        "bos_token_id": 1,
        "eos_token_id": 2,
        "use_sliding_window": False,
    }
    tensors = _zlab_tensors(64, 96, 64, 32, 16, 3, 3)
    assert len(tensors) == 3 + 3 * 11
    (tmp_path / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(tmp_path / "model.safetensors"))
    drafter = DFlashDrafter.from_pretrained(tmp_path, target=target, dtype=torch.float32)
    cfg = drafter.config
    assert (cfg.block_size, cfg.mask_token_id, cfg.target_layer_ids, cfg.rope_theta) == (16, MASK, (0, 1, 2), 1e6)
    assert cfg.extra["bos_token_id"] == 1
    for name, value in tensors.items():
        assert torch.equal(drafter.model.state_dict()[name], value.float()), name
    drafter.validate(target, Chain(k=15))
    ids = tokens(10)
    state = round_state(drafter, target, ids, target_features(target, ids, cfg.target_layer_ids), 9)
    assert propose(state, ids, 9, DDTree(budget=20))[1].num_nodes == 21


def test_loads_zlab_2026_06_layout_and_aliases(target, tmp_path):
    """June-2026 revision: block_size inside dflash_config, rope_parameters, sliding layers, taps != layers."""
    config = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "dflash_config": {"mask_token_id": MASK, "target_layer_ids": [0, 1, 2, 3], "block_size": 8},
        "num_target_layers": 4,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_theta": 10000000.0, "rope_type": "default"},
        "vocab_size": VOCAB,
        "layer_types": ["sliding_attention", "full_attention"],
        "sliding_window": 4096,
        "max_position_embeddings": 262144,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    save_file(_zlab_tensors(64, 96, 64, 32, 16, 4, 2, prefix="model."), str(tmp_path / "model.safetensors"))
    drafter = DFlashDrafter.from_pretrained(tmp_path, target=target)
    cfg = drafter.config
    assert (cfg.block_size, cfg.target_layer_ids, cfg.rope_theta, cfg.sliding_windows) == (
        8,
        (0, 1, 2, 3),
        1e7,
        (4096, None),
    )
    with pytest.raises(ValueError, match="use k <= 7"):
        drafter.validate(target, Chain(k=15))
    # EAGLE-style single-layer alias and TorchSpec names
    one = tmp_path / "one"
    one.mkdir()
    (one / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 1, "layer_types": ["full_attention"]}))
    tensors = _zlab_tensors(64, 96, 64, 32, 16, 4, 1, midlayer=True)
    tensors["context_proj.weight"] = tensors.pop("fc.weight")
    tensors["final_norm.weight"] = tensors.pop("norm.weight")
    save_file(tensors, str(one / "model.safetensors"))
    assert DFlashDrafter.from_pretrained(one, target=target).config.num_hidden_layers == 1


def test_from_pretrained_errors(target, tmp_path):
    drafter = make_drafter(target)
    drafter.save_pretrained(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({k: v for k, v in raw.items() if k != "block_size"}))
    with pytest.raises(ValueError, match="no block_size"):
        DFlashDrafter.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(
        json.dumps({**raw, "num_hidden_layers": 3, "layer_types": ["full_attention"] * 3})
    )
    with pytest.raises(ValueError, match="missing"):
        DFlashDrafter.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(
        json.dumps({**raw, "dflash_config": {**raw["dflash_config"], "attention_sink_bias": True}})
    )
    with pytest.raises(NotImplementedError, match="attention_sink_bias"):
        DFlashDrafter.from_pretrained(tmp_path)


def test_validate_names_problem_and_fix(target):
    drafter = make_drafter(target)
    drafter.validate(target, Chain(k=5))
    with pytest.raises(ValueError, match="use k <= 5"):
        drafter.validate(target, Chain(k=6))
    with pytest.raises(ValueError, match=r"name layers \[4\] but the target has 4 layers"):
        make_drafter(target, target_layer_ids=(0, 4))
    with pytest.raises(ValueError, match="mask_token_id=<a valid id"):
        make_drafter(target, mask_token_id=VOCAB)
    wide = tiny_model(
        "qwen3", hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1
    )
    with pytest.raises(ValueError, match="fc takes 128 features"):
        drafter.validate(wide, Chain(k=2))


def test_generate_greedy_is_lossless(target):
    drafter = make_drafter(target)
    for seed in range(2):
        prompt = tokens(9, seed=seed)
        want = target.generate(
            prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=12, do_sample=False, pad_token_id=0
        )
        for tree in (Chain(k=5), DDTree(budget=8, topk=3)):
            out = specdec.generate(target, prompt, drafter=drafter, tree=tree, max_new_tokens=12, do_sample=False)
            assert torch.equal(out.sequences, want), tree
            assert out.stats.draft_forwards == out.stats.rounds  # one block forward per round
