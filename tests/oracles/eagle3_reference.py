"""A plain EAGLE-3 head, row at a time, over a dict of tensors named as in the official layout: the oracle of
``specdec.drafters.eagle3_model`` and of the round's static drafter.

Written from the format's description, not from the module: ``fc`` over concat(low, mid, high) target states (after
``fc_norm.{i}`` per state or ``input_norm`` over the concat when flagged); q/k/v read concat(input_layernorm(embed),
hidden_norm(hidden)) (per-head ``q_norm``/``k_norm`` before the rotation with ``qk_norm``); residual = hidden
(``hidden_norm(hidden)`` with ``norm_before_residual``); SiLU-GLU MLP; final norm; ``lm_head`` over the draft
vocabulary, log-softmaxed and placed at target id ``d + d2t[d]`` (-inf elsewhere); the pre-norm output (post-norm
with ``norm_output``) fed back. Row t pairs the state of position t with the embedding of the token at t + 1, at
rotary position t.
"""

from __future__ import annotations

import math

import torch


def rms(x, w, eps):
    return w * (x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps))


def rotate(x, pos, theta):
    """Rotary embedding of one vector ``x [D]`` at integer ``pos`` (pairs i and i + D/2)."""
    half = x.shape[-1] // 2
    freq = theta ** (-torch.arange(half, dtype=torch.float64) / half)
    ang = pos * freq
    c, s = torch.cos(ang).float(), torch.sin(ang).float()
    a, b = x[:half], x[half:]
    return torch.cat([a * c - b * s, b * c + a * s])


class Reference:
    """One sequence's EAGLE-3 head with its own growing key/value lists.

    Args:
        weights (dict): official-layout tensor names -> tensors (fp32).
        heads, kv_heads, head_dim (int): attention shape.
        theta (float): rotary base. eps (float): RMSNorm epsilon.
        flags (dict): ``norm_before_residual``, ``norm_before_fc``, ``fc_norm``, ``norm_output``, ``qk_norm``.
    """

    def __init__(self, weights, *, heads, kv_heads, head_dim, theta=10000.0, eps=1e-6, flags=None) -> None:
        self.w = {k: v.detach().float() if v.is_floating_point() else v for k, v in weights.items()}
        self.heads, self.kv_heads, self.head_dim, self.theta, self.eps = heads, kv_heads, head_dim, theta, eps
        self.flags = flags or {}
        self.keys, self.values = [], []

    def fuse(self, feats):  # feats [K * H_t]
        w = self.w
        if self.flags.get("fc_norm"):
            parts = feats.chunk(3)
            feats = torch.cat([rms(p, w[f"fc_norm.{i}.weight"], self.eps) for i, p in enumerate(parts)])
        if self.flags.get("norm_before_fc"):
            feats = rms(feats, w["input_norm.weight"], self.eps)
        return w["fc.weight"] @ feats

    def step(self, emb, hidden, pos):
        """One row: returns (target-vocabulary log-probs [V], fed-back hidden [H])."""
        w, p, eps, d = self.w, "midlayer.", self.eps, self.head_dim
        hn = rms(hidden, w[p + "hidden_norm.weight"], eps)
        x = torch.cat([rms(emb, w[p + "input_layernorm.weight"], eps), hn])
        q = (w[p + "self_attn.q_proj.weight"] @ x).view(self.heads, d)
        k = (w[p + "self_attn.k_proj.weight"] @ x).view(self.kv_heads, d)
        if self.flags.get("qk_norm"):  # one RMSNorm per head vector, before the rotation
            q = torch.stack([rms(row, w[p + "self_attn.q_norm.weight"], eps) for row in q])
            k = torch.stack([rms(row, w[p + "self_attn.k_norm.weight"], eps) for row in k])
        v = (w[p + "self_attn.v_proj.weight"] @ x).view(self.kv_heads, d)
        self.keys.append(torch.stack([rotate(k[j], pos, self.theta) for j in range(self.kv_heads)]))
        self.values.append(v)
        outs = []
        for h in range(self.heads):
            g = h // (self.heads // self.kv_heads)
            qh = rotate(q[h], pos, self.theta)
            scores = torch.stack([qh @ key[g] for key in self.keys]) / math.sqrt(d)
            prob = torch.softmax(scores, 0)
            outs.append(sum(pr * val[g] for pr, val in zip(prob, self.values, strict=True)))
        residual = hn if self.flags.get("norm_before_residual") else hidden
        y = residual + w[p + "self_attn.o_proj.weight"] @ torch.cat(outs)
        z = rms(y, w[p + "post_attention_layernorm.weight"], eps)
        gate, up = w[p + "mlp.gate_proj.weight"] @ z, w[p + "mlp.up_proj.weight"] @ z
        y = y + w[p + "mlp.down_proj.weight"] @ (gate * torch.sigmoid(gate) * up)
        normed = rms(y, w["norm.weight"], eps)
        draft = torch.log_softmax(w["lm_head.weight"] @ normed, 0)
        full = torch.full((w["t2d"].shape[0],), float("-inf"))
        for i in range(draft.shape[0]):
            full[i + int(w["d2t"][i])] = draft[i]
        return full, normed if self.flags.get("norm_output") else y


def reference_drafts(ref: Reference, embed, tokens, feats, depth: int):
    """The greedy draft after a committed sequence: ``tokens [T + 1]`` (the last one the root), ``feats [T, K*H_t]``
    the target states of positions ``0 .. T-1``. Returns ``[depth, V]`` per-depth log-probabilities."""
    t = feats.shape[0]
    for i in range(t):
        want, fed = ref.step(embed[tokens[i + 1]], ref.fuse(feats[i]), i)
    rows = [want]
    for s in range(1, depth):
        want, fed = ref.step(embed[int(rows[-1].argmax())], fed, t - 1 + s)
        rows.append(want)
    return torch.stack(rows)
