"""How much any rule that weighs q can gain over sample-and-match at one node of the shipped EAGLE-3 head's trees.

On the zoo dense target (CPU, float32) each of the first N dev prompts is continued by M tokens sampled from the
target at T = 1 with the bench's sampling settings (HF's default top-k 50, seeded; past EOS, as the head's
training data). At every generated position t (root s_t, committed s_0..s_{t-1}) the script takes, from the same
quantities the library's round uses,

* p: the target's processed distribution of s_{t+1} (``process_logits`` on the logits of one forward over the whole
  sequence, which also gives the fused states the head reads);
* q: the head's depth-1 distribution (``Eagle3Static.logq``, the round's own drafting code, over the target
  vocabulary with ``d2t``, 0 outside the draft vocabulary), processed as the rules process it (``draft_probs``);
  its top-k ranks are the children a DDTree gives the root.

and computes, for k children:

* ``sm_k`` = sum of p over q's top k: the chance that sample-and-match accepts at a node whose children are q's
  top k (the best any rule can do with that fixed set);
* ``ss_1`` = sum_x min(p(x), q(x)): speculative sampling with one draft;
* ``opt_k`` = sum_x min(p(x), 1 - (1 - q(x))^k): the most any rule can accept with k i.i.d. drafts of q (no rule
  accepts x more often than x is drawn or than the target emits it); SpecInfer is at or below it;
* ``opt_wor_k`` = sum_x min(p(x), pi_k(x)), pi_k(x) the chance that x is among k draws of q without replacement
  (Gumbel-top-k, estimated by Monte Carlo): the same bound for RSD's siblings, which are drawn that way;
* ``specinfer_k`` / ``rsd_k``: what recursive rejection sampling with and without replacement actually accepts at
  such a node (exact per draw of the siblings, averaged over Monte-Carlo draws);
* ``top_p_mass_k``: the k largest p(x) (an oracle drafter's k children).

The row ``DDTree b32`` uses at each node the number of children that ``DDTree(32, topk=8)`` over the head's
8-step ``logq`` gives it (the stochastic DDTree has the same shape). Depth 2 repeats this with the head's step-2
distribution (after its own greedy step-1 draft) where that draft equals the sampled s_{t+1}, against the target's
distribution of s_{t+2}; the node counted is the greedy depth-1 node's children. Prints Markdown tables
(``docs/verification.md``, 317 s on a 2-core CPU; the defaults, 8 prompts x 64 positions, take about 130 s)::

    SPECDEC_ZOO=/work/shared/zoo PYTHONPATH=. .venv/bin/python scripts/q_rule_ceiling.py --prompts 20 --tokens 64
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import torch

KS = (1, 2, 4, 8)


# -- per-node acceptances (p, q: probability vectors over one vocabulary, [..., V]) --------------------------------
def sm_k(p: torch.Tensor, scores: torch.Tensor, k: int) -> torch.Tensor:
    """Sample-and-match's acceptance at a node whose children are the top ``k`` of ``scores`` (q or log q):
    the target's sample is one of them."""
    return p.gather(-1, scores.topk(k, dim=-1).indices).sum(-1)


def ss_1(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Speculative sampling's acceptance with one draft of q: ``sum min(p, q)``."""
    return torch.minimum(p, q).sum(-1)


def inclusion_iid(q: torch.Tensor, k: int) -> torch.Tensor:
    """The chance that each token is among ``k`` i.i.d. draws of q: ``1 - (1 - q)^k``."""
    return 1.0 - (1.0 - q) ** k


def opt_k(p: torch.Tensor, q: torch.Tensor, k: int) -> torch.Tensor:
    """The most any exact rule accepts with ``k`` i.i.d. drafts of q: ``sum min(p, 1 - (1 - q)^k)`` (accepting x
    needs x drafted and the target emitting x; the optimal coupling reaches it)."""
    return torch.minimum(p, inclusion_iid(q, k)).sum(-1)


def top_p_mass(p: torch.Tensor, k: int) -> torch.Tensor:
    """The ``k`` largest probabilities of p: sample-and-match's acceptance with an oracle drafter's k children."""
    return p.topk(k, dim=-1).values.sum(-1)


def draw_siblings(q: torch.Tensor, k: int, n: int, replacement: bool, generator: torch.Generator) -> torch.Tensor:
    """``n`` sets of ``k`` siblings drawn from q (``[V]``), ``[n, k]`` token ids in draw order: i.i.d. draws, or a
    draw without replacement (Gumbel-top-k; past q's support the slots hold tokens of probability 0)."""
    if replacement:
        return torch.multinomial(q.expand(n, -1), k, replacement=True, generator=generator)
    u = torch.rand(n, q.shape[-1], generator=generator, dtype=q.dtype).clamp(min=torch.finfo(q.dtype).tiny)
    keys = q.log() - torch.log(-torch.log(u))  # log q + Gumbel; tokens outside the support stay at -inf
    return keys.topk(k, dim=-1).indices


def inclusion_wor(q: torch.Tensor, k: int, n: int, generator: torch.Generator) -> torch.Tensor:
    """Monte-Carlo estimate (``n`` draws) of the chance that each token is among ``k`` draws of q without
    replacement (only tokens of q > 0 count)."""
    drawn = draw_siblings(q, k, n, False, generator)
    hits = torch.zeros_like(q).index_add_(0, drawn.flatten(), torch.ones(drawn.numel(), dtype=q.dtype))
    return torch.where(q > 0, hits / n, 0.0)


def rejection_accept(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, replacement: bool) -> torch.Tensor:
    """The chance that recursive rejection sampling accepts one of the siblings ``drafts`` (``[n, k]``, in test
    order) at a node of target p and draft distribution q (``[V]``), for each of the ``n`` sets, ``[n]``: child j is
    accepted with probability ``min(1, r(x_j) / q_j(x_j))``; a rejection sets ``r <- norm(max(0, r - q_j))`` and,
    without replacement, ``q_{j+1} = q_j`` without ``x_j``, renormalised. A sibling of ``q_j(x_j) = 0`` is no draw
    (neither tested nor subtracted), as in the library's rule."""
    n, k = drafts.shape
    tiny = torch.finfo(p.dtype).tiny
    r = p.expand(n, -1).clone()
    qj = q.expand(n, -1).clone()
    reject = torch.ones(n, dtype=p.dtype)
    for j in range(k):
        x = drafts[:, j : j + 1]
        q_x, r_x = qj.gather(1, x)[:, 0], r.gather(1, x)[:, 0]
        live = q_x > 0
        accept = torch.where(live, (r_x / q_x.clamp(min=tiny)).clamp(max=1.0), 0.0)
        reject = reject * (1.0 - accept)
        residual = (r - qj).clamp(min=0.0)
        mass = residual.sum(-1, keepdim=True)
        r = torch.where(live[:, None] & (mass > 0), residual / mass.clamp(min=tiny), r)
        if not replacement:
            removed = qj.scatter(1, x, 0.0)
            qj = torch.where(live[:, None], removed / removed.sum(-1, keepdim=True).clamp(min=tiny), qj)
    return 1.0 - reject


def node_stats(p: torch.Tensor, q: torch.Tensor, logq: torch.Tensor, k: int, draws: int,
               generator: torch.Generator) -> dict[str, float]:  # fmt: skip
    """Every per-node figure of one node (``p``, ``q``, ``logq``: ``[V]``) with ``k`` children."""
    support = ((p > 0) | (q > 0)).nonzero()[:, 0]  # the rules never touch a token outside both supports
    ps, qs = p[support].double(), q[support].double()
    ps, qs = ps / ps.sum(), qs / qs.sum()
    kk = min(k, int((qs > 0).sum()))
    iid = draw_siblings(qs, k, draws, True, generator)
    wor = draw_siblings(qs, kk, draws, False, generator)
    return {
        "top_p_mass": float(top_p_mass(p.double(), k)),
        "sm": float(sm_k(p.double(), logq, k)),
        "opt": float(opt_k(ps, qs, k)),
        "opt_wor": float(torch.minimum(ps, inclusion_wor(qs, kk, draws, generator)).sum()),
        "specinfer": float(rejection_accept(ps, qs, iid, True).mean()),
        "rsd": float(rejection_accept(ps, qs, wor, False).mean()),
        "ss_1": float(ss_1(ps, qs)),
    }


# -- the measurement ------------------------------------------------------------------------------------------------
@torch.no_grad()
def sample_sequence(model, ids: torch.Tensor, new: int, sampling, generator: torch.Generator,
                    stop_at_eos: bool = False) -> torch.Tensor:  # fmt: skip
    """``ids`` continued by ``new`` tokens sampled from the target's processed distribution (past EOS too, as the
    bench's ``ignore_eos`` and the head's training data, unless ``stop_at_eos``)."""
    from transformers import DynamicCache

    from specdec.verify.processing import process_logits

    eos = model.generation_config.eos_token_id
    cache = DynamicCache()
    out = model(input_ids=ids, past_key_values=cache, use_cache=True)
    tokens = []
    for _ in range(new):
        probs = torch.softmax(process_logits(out.logits[0, -1], sampling), -1)
        token = torch.multinomial(probs, 1, generator=generator)
        tokens.append(token)
        if stop_at_eos and int(token) == eos:
            break
        out = model(input_ids=token[None], past_key_values=cache, use_cache=True)
    return torch.cat([ids, torch.cat(tokens)[None]], 1)


@torch.no_grad()
def measure(prompts: int, tokens: int, seed: int, draws: int, top_k: int, head: str, stop_at_eos: bool = False) -> dict:
    from transformers import AutoModelForCausalLM

    import specdec
    from specdec.drafters.eagle3_static import Eagle3Static
    from specdec.loading import load_prompts, load_tokenizer, zoo_path
    from specdec.types import Proposal, SamplingParams
    from specdec.verify.draws import draft_probs
    from specdec.verify.processing import process_logits

    model = AutoModelForCausalLM.from_pretrained(zoo_path("target-dense"), dtype=torch.float32).eval()
    tok = load_tokenizer(zoo_path("tokenizer"))
    drafter = specdec.Eagle3Drafter.from_pretrained(head, target=model)
    sampling = SamplingParams(do_sample=True, temperature=1.0, top_k=top_k or None, top_p=1.0)
    tree = specdec.DDTree(budget=32, topk=8)
    depth = min(tree.budget, drafter.tree_depth)
    gen = torch.Generator().manual_seed(seed)
    rows: dict[tuple[int, str], list[dict]] = {}
    extra = {"positions": 0, "depth2": 0, "p_outside_draft_vocab": [], "c1": [], "c2": []}
    in_draft = drafter.model.target_ids()
    for i, row in enumerate(load_prompts(limit=prompts)):
        ids = tok(row["prompt"], return_tensors="pt").input_ids
        n_prompt = ids.shape[1]
        gen_i = torch.Generator().manual_seed(seed + i)
        seq = sample_sequence(model, ids, tokens + 1, sampling, gen_i, stop_at_eos)
        out = model(input_ids=seq, output_hidden_states=True)
        p_all = torch.softmax(process_logits(out.logits[0], sampling), -1)  # [L, V]: p of token t + 1
        hidden = torch.cat([out.hidden_states[j + 1] for j in drafter.target_layer_ids], -1)
        state = Eagle3Static(drafter, capacity=seq.shape[1] + depth + 2, batch=1)
        state.prefill(seq, hidden)  # the committed rows, as the round's prefill and commits write them
        kept = state.kv.clone()
        for t in range(n_prompt, seq.shape[1] - 1):
            state.kv.copy_(kept)  # drafting writes rows past t - 1: restore the committed ones
            logq = state.logq(seq[:, t], torch.tensor([t]), depth)  # [1, depth, V]: the round's proposal
            q = draft_probs(logq, sampling)[0]
            shape = tree.build(Proposal(logq=logq), seq[:, t], depth)
            parents, real = shape.parents[0], shape.valid[0] & (shape.depth[0] > 0)
            c1 = int((real & (parents == 0)).sum())
            greedy = int(logq[0, 0].argmax())
            first = int(((shape.tokens[0] == greedy) & real & (shape.depth[0] == 1)).nonzero()[0, 0])
            c2 = int((real & (parents == first)).sum())
            extra["positions"] += 1
            extra["c1"].append(c1)
            extra["p_outside_draft_vocab"].append(float(1.0 - p_all[t, in_draft].sum()))
            for k in (*KS, "DDTree b32"):
                kk = c1 if k == "DDTree b32" else k
                rows.setdefault((1, str(k)), []).append(node_stats(p_all[t], q[0], logq[0, 0], kk, draws, gen))
            if greedy == int(seq[0, t + 1]):
                extra["depth2"] += 1
                extra["c2"].append(c2)
                for k in (*KS, "DDTree b32"):
                    kk = c2 if k == "DDTree b32" else k
                    rows.setdefault((2, str(k)), []).append(node_stats(p_all[t + 1], q[1], logq[0, 1], kk, draws, gen))
        print(f"prompt {i + 1}/{prompts}: {seq.shape[1] - 1 - n_prompt} positions", file=sys.stderr, flush=True)
    return {"rows": rows, **extra}


COLUMNS = ("top_p_mass", "sm", "opt", "opt_wor", "specinfer", "rsd")


def table(rows: dict, level: int, counts: list[int]) -> str:
    head = ("| k | top_p_mass_k | sm_k | opt_k (i.i.d.) | opt_wor_k | SpecInfer_k | RSD_k | ss_1 | opt_k / sm_k "
            "| opt_wor_k / sm_k | RSD_k / sm_k |")  # fmt: skip
    lines = [head, "|" + "---|" * 11]
    for k in (*map(str, KS), "DDTree b32"):
        stats = rows.get((level, k), [])
        if not stats:
            continue
        mean = {c: sum(s[c] for s in stats) / len(stats) for c in (*COLUMNS, "ss_1")}
        label = k if k != "DDTree b32" else f"DDTree b32 (mean {sum(counts) / max(len(counts), 1):.2f} children)"
        ss = f"{mean['ss_1']:.3f}" if k == "1" else "–"
        cells = [f"{mean[c]:.3f}" for c in COLUMNS]
        ratios = [mean[c] / mean["sm"] if mean["sm"] else math.nan for c in ("opt", "opt_wor", "rsd")]
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {ss} | " + " | ".join(f"{r:.2f}" for r in ratios)
                     + " |")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=8, help="the first N dev prompts")
    parser.add_argument("--tokens", type=int, default=64, help="sampled positions per prompt")
    parser.add_argument("--seed", type=int, default=0, help="prompt i samples with seed + i; Monte Carlo with seed")
    parser.add_argument("--draws", type=int, default=4096, help="Monte-Carlo sibling draws per node")
    parser.add_argument("--top-k", type=int, default=50, help="sampling top-k (HF's default 50, as the bench; 0 off)")
    parser.add_argument("--stop-at-eos", action="store_true", help="end a prompt's sample at EOS (default: go on)")
    parser.add_argument("--head", default="assets/drafters/zoo-dense-eagle3", help="the EAGLE-3 head")
    args = parser.parse_args()
    torch.set_num_threads(1)
    start = time.perf_counter()
    res = measure(args.prompts, args.tokens, args.seed, args.draws, args.top_k, args.head, args.stop_at_eos)
    outside = res["p_outside_draft_vocab"]
    print(f"\n{args.prompts} dev prompts x {args.tokens} sampled tokens, T = 1, top-k {args.top_k or 'off'}, "
          f"{args.draws} draws per node, {time.perf_counter() - start:.0f} s\n")  # fmt: skip
    print(f"Depth 1 ({res['positions']} nodes; p's mass outside the draft vocabulary: "
          f"{sum(outside) / len(outside):.3f}):\n")  # fmt: skip
    print(table(res["rows"], 1, res["c1"]))
    print(f"\nDepth 2 ({res['depth2']} nodes where the head's greedy step-1 draft is the sampled token):\n")
    print(table(res["rows"], 2, res["c2"]))


if __name__ == "__main__":
    main()
