"""EAGLE-3 network (``specdec.drafters.eagle3_model``) against a plain reference forward written here from the format's
description: fc over concat(low, mid, high) target states; one layer whose q/k/v read concat(input_layernorm(embed),
hidden_norm(hidden)); residual = hidden (or hidden_norm(hidden)); MLP; final norm; draft-vocabulary head mapped to
target ids by ``t = d + d2t[d]``; the pre-norm (or post-norm) output fed back as the next hidden."""

from __future__ import annotations

import math

import pytest
import torch

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


# -- the reference ------------------------------------------------------------------------------------------------
def rms(x, w, eps=1e-5):
    return w * (x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps))


def rotate(x, pos):
    """Rotary embedding of one vector ``x [D]`` at integer ``pos`` (pairs i and i + D/2, theta 500)."""
    half = x.shape[-1] // 2
    freq = 500.0 ** (-torch.arange(half, dtype=torch.float64) / half)
    ang = pos * freq
    c, s = torch.cos(ang).float(), torch.sin(ang).float()
    a, b = x[:half], x[half:]
    return torch.cat([a * c - b * s, b * c + a * s])


class Reference:
    """Row-at-a-time EAGLE-3 forward with its own key/value list (one sequence)."""

    def __init__(self, model: Eagle3Model, flags: dict) -> None:
        self.w = {k: v.detach() for k, v in model.state_dict().items()}
        self.flags = flags
        self.keys, self.values = [], []

    def fuse(self, feats):  # feats [3 * HT]
        w = self.w
        if self.flags.get("fc_norm"):
            feats = torch.cat([rms(feats[i * HT : (i + 1) * HT], w[f"fc_norm.{i}.weight"]) for i in range(3)])
        if self.flags.get("norm_before_fc"):
            feats = rms(feats, w["input_norm.weight"])
        return w["fc.weight"] @ feats

    def step(self, emb, hidden, pos):
        """One row: returns (target-vocabulary log-probs [V], fed-back hidden [H])."""
        w, p = self.w, "midlayer."
        hn = rms(hidden, w[p + "hidden_norm.weight"])
        x = torch.cat([rms(emb, w[p + "input_layernorm.weight"]), hn])
        q = (w[p + "self_attn.q_proj.weight"] @ x).view(HEADS, D)
        k = (w[p + "self_attn.k_proj.weight"] @ x).view(KV, D)
        v = (w[p + "self_attn.v_proj.weight"] @ x).view(KV, D)
        self.keys.append(torch.stack([rotate(k[j], pos) for j in range(KV)]))
        self.values.append(v)
        outs = []
        for h in range(HEADS):
            g = h // (HEADS // KV)
            qh = rotate(q[h], pos)
            scores = torch.stack([qh @ key[g] for key in self.keys]) / math.sqrt(D)
            prob = torch.softmax(scores, 0)
            outs.append(sum(pr * val[g] for pr, val in zip(prob, self.values, strict=True)))
        residual = hn if self.flags.get("norm_before_residual") else hidden
        y = residual + w[p + "self_attn.o_proj.weight"] @ torch.cat(outs)
        z = rms(y, w[p + "post_attention_layernorm.weight"])
        gate, up = w[p + "mlp.gate_proj.weight"] @ z, w[p + "mlp.up_proj.weight"] @ z
        y = y + w[p + "mlp.down_proj.weight"] @ (gate * torch.sigmoid(gate) * up)
        normed = rms(y, w["norm.weight"])
        draft = torch.log_softmax(w["lm_head.weight"] @ normed, 0)
        full = torch.full((V,), float("-inf"))
        for d in range(VD):
            full[d + int(w["d2t"][d])] = draft[d]
        return full, normed if self.flags.get("norm_output") else y


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
]


@pytest.mark.parametrize("flags", FLAGS, ids=lambda f: "+".join(f) or "official")
def test_module_matches_reference_over_autoregressive_steps(flags):
    model = random_model(config(**flags), seed=len(flags))
    gen = torch.Generator().manual_seed(1)
    t, steps = 7, 4
    embed = torch.randn(V, H, generator=gen)
    tokens = torch.randint(0, V, (t + 1,), generator=gen)  # token i at position i
    feats = torch.randn(t, 3 * HT, generator=gen)  # target states of positions 0 .. t-1

    ref = Reference(model, flags)
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
