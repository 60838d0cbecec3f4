"""EAGLE-3 network (``specdec.drafters.eagle3_model``) against the plain row-at-a-time reference
(``oracles.eagle3_reference``) over several autoregressive steps, for every variant flag."""

from __future__ import annotations

import math

import pytest
import torch
from oracles.eagle3_reference import Reference

from specdec.drafters.eagle3_model import Eagle3Config, Eagle3Model

H, HEADS, KV, D, INTER, V, VD, HT = 32, 4, 2, 16, 48, 96, 40, 24


def config(**flags) -> Eagle3Config:
    return Eagle3Config(
        hidden_size=H, intermediate_size=INTER, num_attention_heads=HEADS, num_key_value_heads=KV, head_dim=D,
        vocab_size=V, draft_vocab_size=VD, target_hidden_size=HT, rope_theta=500.0, rms_norm_eps=1e-5, **flags,
    )  # fmt: skip


def random_model(cfg: Eagle3Config, seed: int = 0) -> Eagle3Model:
    gen = torch.Generator().manual_seed(seed)
    model = Eagle3Model(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or ".weight" in name and "norm" in name:
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[-1]))
        used = torch.randperm(V, generator=gen)[:VD].sort().values
        model.d2t.copy_(used - torch.arange(VD))
        model.t2d.zero_()
        model.t2d[used] = True
    return model.eval()


def module_logq(model: Eagle3Model, logits: torch.Tensor) -> torch.Tensor:
    """Draft logits ``[.., Vd]`` -> target-vocabulary log-probs through the module's own map."""
    full = torch.full((*logits.shape[:-1], V), float("-inf"))
    return full.index_copy(-1, model.target_ids(), torch.log_softmax(logits, -1))


FLAGS = [
    {},
    {"norm_before_residual": True},
    {"norm_before_fc": True},
    {"fc_norm": True},
    {"norm_output": True, "norm_before_residual": True},
    {"qk_norm": True},
]


@pytest.mark.parametrize("flags", FLAGS, ids=lambda f: "+".join(f) or "official")
def test_module_matches_reference_over_autoregressive_steps(flags):
    model = random_model(config(**flags), seed=len(flags))
    gen = torch.Generator().manual_seed(1)
    t, steps = 7, 4
    embed = torch.randn(V, H, generator=gen)
    tokens = torch.randint(0, V, (t + 1,), generator=gen)  # token i at position i
    feats = torch.randn(t, 3 * HT, generator=gen)  # target states of positions 0 .. t-1

    weights = model.state_dict()
    ref = Reference(weights, heads=HEADS, kv_heads=KV, head_dim=D, theta=500.0, eps=1e-5, flags=flags)
    for i in range(t):  # row i: hidden of position i with the embedding of token i + 1
        want, fed = ref.step(embed[tokens[i + 1]], ref.fuse(feats[i]), i)
    wants = [want]
    draft = [int(want.argmax())]
    for s in range(1, steps):
        want, fed = ref.step(embed[draft[-1]], fed, t - 1 + s)
        wants.append(want)
        draft.append(int(want.argmax()))

    with torch.no_grad():
        logits, got_fed, past = model(embed[tokens[1:]][None], model.fuse(feats)[None], torch.arange(t)[None])
        gots = [module_logq(model, logits[0, -1])]
        fed_m = got_fed[:, -1:]
        for s in range(1, steps):
            token = model.target_ids()[gots[-1][model.target_ids()].argmax()]
            assert int(token) == draft[s - 1]
            logits, fed_m, past = model(embed[token][None, None], fed_m, torch.tensor([[t - 1 + s]]), past)
            gots.append(module_logq(model, logits[0, -1]))
    for s, (got, want) in enumerate(zip(gots, wants, strict=True)):
        finite = torch.isfinite(want)
        assert torch.equal(finite, torch.isfinite(got)), s
        torch.testing.assert_close(got[finite], want[finite], atol=1e-5, rtol=1e-5, msg=f"step {s}")


def test_config_checks_name_the_problem():
    with pytest.raises(ValueError, match="not a multiple"):
        config().replace(num_key_value_heads=3)
    with pytest.raises(ValueError, match="draft_vocab_size"):
        config().replace(draft_vocab_size=V + 1)
