"""Plant realistic bugs, one at a time, in a temporary copy of the repository and show that CPU tests catch each.

Each mutant is a list of ``(file, old, new)`` string replacements plus the tests to run on it. A replacement
whose ``old`` text is not found exactly once aborts the script, so a refactor that moves the code is noticed:
update the tuple to the new code. A baseline row runs every listed test on the unmodified copy first (it must
pass, or a kill would prove nothing).

Usage (from the repository root)::

    python scripts/mutants.py              # all mutants, 2 at a time
    python scripts/mutants.py --jobs 1 --only eos_truncation_removed tie_order_reversed
    python scripts/mutants.py --only temperature_twice --tests tests/round/test_deep_rounds.py

``--tests`` replaces the tests of the selected mutants (paths or node ids, as pytest takes them).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

PROCESSING = "specdec/verify/processing.py"
RULES = "specdec/verify/rules.py"
ENGINE = "specdec/engine.py"
GENERATE = "specdec/generate.py"
PROCESSORS = "specdec/processors.py"
RUNTIME = "specdec/runtime.py"
PROCESSOR_TESTS = ("tests/round/test_processors.py", "-m", "not slow")
ACCEPT_REFERENCE = "specdec/kernels/tree_accept/reference.py"
DDTREE_TOPK = "specdec/kernels/ddtree_build/reference.py"  # the per-depth top-k of the DDTree build
REJECTION_REFERENCE = "specdec/kernels/tree_rejection/reference.py"  # recursive rejection's sibling-rank loop
REJECTION_TRITON = "specdec/kernels/tree_rejection/triton.py"
TRAVERSAL_TRITON = "specdec/kernels/tree_traversal/triton.py"  # traversal verification's walk
TRAVERSAL_TESTS = ("tests/kernels/test_tree_traversal.py", "-m", "interpreter")
TOPK_MASK_TRITON = "specdec/kernels/topk_mask/triton.py"  # HF's top-k warper in one launch
TOPK_MASK_TESTS = ("tests/kernels/test_topk_mask.py", "-m", "interpreter")
TOP_K_THEN_TOP_P = """    if sampling.top_k:
        procs.append(TopKThreshold(top_k=sampling.top_k, min_tokens_to_keep=1))
    if sampling.top_p is not None and sampling.top_p < 1.0:
        procs.append(TopPLogitsWarper(top_p=sampling.top_p, min_tokens_to_keep=1))
"""
TOP_P_THEN_TOP_K = """    if sampling.top_p is not None and sampling.top_p < 1.0:
        procs.append(TopPLogitsWarper(top_p=sampling.top_p, min_tokens_to_keep=1))
    if sampling.top_k:
        procs.append(TopKThreshold(top_k=sampling.top_k, min_tokens_to_keep=1))
"""
# A top-p warper that keeps only the tokens whose cumulative mass stays <= top_p (drops the crossing token).
TOP_P_NO_CROSSING = """class _TopPNoCrossing:
    def __init__(self, top_p):
        self.top_p = top_p

    def __call__(self, input_ids, scores):
        sorted_p, order = scores.softmax(-1).sort(-1, descending=True)
        drop = sorted_p.cumsum(-1) > self.top_p
        drop[..., 0] = False
        return scores.masked_fill(drop.scatter(-1, order, drop), float("-inf"))


def process_logits("""

# The deep-round suite (tests/round): an oracle drafter makes rounds accept every length 0..D. Each mutant runs
# its tests there first, then the older test files that catch it.
ROUND = "tests/round/test_deep_rounds.py"
IDENTITY = (f"{ROUND}::test_identity_deep_rounds",)
CHI2 = (f"{ROUND}::test_sampling_multi_round_chi2",)  # 3rd and 4th new token against HF's exact marginals
SUPPORT = (f"{ROUND}::test_sampling_support_hf_defaults",)
EOS = (f"{ROUND}::test_eos_inside_accepted_run",)
MAX_NEW = (f"{ROUND}::test_max_new_tokens_inside_accepted_run",)
HYBRID = (f"{ROUND}::test_hybrid_recurrent_state_through_sibling_rounds",)
PADDING = (f"{ROUND}::test_padding_slots",)
TREE_REFERENCES = (f"{ROUND}::test_round_trees_match_host_references",)
REGISTRY = (f"{ROUND}::test_custom_registered_policy_and_rule_are_used",)
STOPPING = "tests/round/test_stopping.py"
SCORES = "tests/round/test_output_scores.py"
NUM_RETURN = "tests/round/test_num_return_sequences.py"

SAMPLING_TESTS = (*CHI2, "tests/unit/test_verify_sampling.py")
CHI2_TESTS = ("tests/unit/test_verify_sampling.py", "-k", "not equals_hf_warpers")  # its statistical tests alone
GREEDY_TESTS = (*IDENTITY, "tests/unit/test_generate_greedy.py")
# The stochastic DDTree's tests, its slow chi-square tests included (policy draws, RSD rounds, generate's joint).
STOCHASTIC_DDTREE_TESTS = ("tests/verify/test_sampled_policies.py", "tests/verify/test_multidraft.py", "-k",
                           "stochastic", "-m", "slow or not slow")  # fmt: skip


@dataclass(frozen=True)
class Mutant:
    name: str
    edits: tuple[tuple[str, str, str], ...]  # (file, old, new)
    tests: tuple[str, ...]


MUTANTS = [
    # -- sampling: the distribution each node samples from ------------------------------------------------
    Mutant(  # temperature applied inverted: logits x T instead of logits / T
        "temperature_inverted",
        (
            (
                PROCESSING,
                "TemperatureLogitsWarper(sampling.temperature)",
                "TemperatureLogitsWarper(1 / sampling.temperature)",
            ),
        ),
        SAMPLING_TESTS,
    ),
    Mutant(  # top-p drops the token that crosses the cutoff
        "top_p_crossing_dropped",
        (
            (
                PROCESSING,
                "procs.append(TopPLogitsWarper(top_p=sampling.top_p, min_tokens_to_keep=1))",
                "procs.append(_TopPNoCrossing(sampling.top_p))",
            ),
            (PROCESSING, "def process_logits(", TOP_P_NO_CROSSING),
        ),
        SAMPLING_TESTS,
    ),
    Mutant(  # top-p applied before top-k
        "top_p_before_top_k", ((PROCESSING, TOP_K_THEN_TOP_P, TOP_P_THEN_TOP_K),), SAMPLING_TESTS
    ),
    Mutant(  # temperature applied twice: logits / T before the warpers, which divide by T again
        "temperature_twice",
        ((PROCESSING, "scores = target_logits.float()", "scores = target_logits.float() / sampling.temperature"),),
        SAMPLING_TESTS,
    ),
    Mutant(  # HF's fallback top_k=50 forgotten when neither the call nor generation_config sets top_k
        "top_k_default_ignored",
        (("specdec/hf_args.py", '"top_k": 50,', '"top_k": None,'),),
        (*SUPPORT, "tests/unit/test_verify_sampling.py"),
    ),
    Mutant(  # the sample-and-match walk reads each node's sample from the previous slot's logits
        "sample_wrong_node",
        (
            (
                RULES,
                "return _walk(tree, target_choices(logits, sampling, noise), max_depth)",
                "return _walk(tree, target_choices(logits.roll(1, dims=1), sampling, noise), max_depth)",
            ),
        ),
        SAMPLING_TESTS,
    ),
    Mutant(  # the Gumbel noise drawn once (when the round is built) and reused by every round
        "noise_reused_across_rounds",
        ((ENGINE, "self.noise.uniform_(generator=generator)", "pass  # the noise of the first draw, reused"),),
        SAMPLING_TESTS,
    ),
    # -- EOS and max_new_tokens -----------------------------------------------------------------------------
    Mutant(  # stop at EOS but keep the rest of the round's tokens
        "eos_truncation_removed",
        ((GENERATE, "accepted, done[b] = accepted[: i + 1], True", "done[b] = True"),),
        (*EOS, "tests/unit/test_eos.py"),
    ),
    Mutant(  # batches: every row writes its tree's K/V at row 0's slots
        "batch_write_slots_of_row_0",
        (("specdec/kernels/tree_accept/__init__.py", "prefix[:, None] + index, prefix + slots",
          "prefix[:1, None] + index, prefix + slots"),),  # fmt: skip
        ("tests/round/test_batch.py",),
    ),
    Mutant(  # batches: the left padding kept in the prompt (a row reads pad tokens as its first tokens)
        "left_padding_not_stripped",
        ((GENERATE, "input_ids[b if b < batch else 0, width - n :]", "input_ids[b if b < batch else 0, :n]"),),
        ("tests/round/test_batch.py",),
    ),
    Mutant(  # prompts without attention_mask: no mask inferred from pad_token_id (the pads decoded as text)
        "mask_inference_dropped",
        ((GENERATE, "    if attention_mask is None:  # HF's rule", "    if False:  # HF's rule"),),
        ("tests/test_input_rules.py",),
    ),
    # -- the model changing under the library: a cast or move between calls ----------------------------------
    Mutant(  # the engine built for the target's old weights reused after a dtype change (stale storage and rounds)
        "stale_engine_after_dtype_change",
        ((ENGINE, "if any(engine.signature != signature for engine in engines.values()):", "if False:"),),
        ("tests/test_model_changes.py",),
    ),
    Mutant(  # the drafter's state and rounds built for its old weights reused after the drafter was cast
        "stale_drafter_state_after_cast",
        ((ENGINE, "if self._drafter_signatures.get(drafter, signature) != signature:", "if False:"),),
        ("tests/test_model_changes.py",),
    ),
    Mutant(  # the drafter left at the target's old dtype when the target is cast
        "drafter_does_not_follow_the_target",
        ((GENERATE, "        follow_target(drafter, tgt)", "        pass"),),
        ("tests/test_model_changes.py",),
    ),
    Mutant(  # a round's tokens past max_new_tokens kept
        "max_new_tokens_cut_removed",
        ((GENERATE, "            accepted = accepted[: remaining[b]]\n", ""),),
        (*MAX_NEW, "tests/unit/test_generate_greedy.py"),
    ),
    # -- structure: verification, commit, trees, positions, masks, recurrent state ---------------------------
    Mutant(  # greedy acceptance on the wrong logits (node i judged by node i-1's logits)
        "accept_wrong_logits",
        (
            (
                RULES,
                "return _walk(tree, logits.argmax(dim=-1), max_depth)",
                "return _walk(tree, logits.roll(1, dims=1).argmax(dim=-1), max_depth)",
            ),
        ),
        GREEDY_TESTS,
    ),
    Mutant(  # KV commit keeps the first rows of the tree instead of gathering the accepted nodes' rows
        "commit_without_gather",
        (
            ("specdec/kernels/kv_commit/reference.py", "src = kv.index_select(4, (path + prefix)[0])",
             "src = kv.index_select(4, dst[0])"),  # fmt: skip
        ),
        GREEDY_TESTS,
    ),
    Mutant(  # the same in the batched commit (several sequences)
        "batch_commit_without_gather",
        (
            (
                "specdec/kernels/kv_commit/reference.py",
                "kv[:, :, rows, :, dst] = kv[:, :, rows, :, path + prefix]",
                "kv[:, :, rows, :, dst] = kv[:, :, rows, :, dst]",
            ),
        ),
        ("tests/round/test_batch.py",),
    ),
    Mutant(  # equal log-probs ranked by decreasing token id in the DDTree's per-depth top-k
        "tie_order_reversed",
        (
            (DDTREE_TOPK, "keys = ordered * 2**32 + (logq.shape[1] - 1 - ids)", "keys = ordered * 2**32 + ids"),
            (DDTREE_TOPK, "top_ids = logq.shape[1] - 1 - (top & _LOW32)", "top_ids = top & _LOW32"),
        ),
        (*TREE_REFERENCES, "tests/trees/test_ddtree.py", "tests/trees/test_device_trees.py"),
    ),
    Mutant(  # tree positions one too far
        "position_off_by_one",
        (("specdec/kernels/tree_accept/__init__.py", "prefix[:, None] + depth, prefix[:, None] + index",
          "prefix[:, None] + depth + 1, prefix[:, None] + index"),),  # fmt: skip
        GREEDY_TESTS,
    ),
    Mutant(  # positions one too far at depth > 1 only (the root and depth-1 nodes stay right)
        "positions_off_deeper_than_1",
        (("specdec/kernels/tree_accept/__init__.py", "prefix[:, None] + depth, prefix[:, None] + index",
          "prefix[:, None] + depth + (depth > 1).long(), prefix[:, None] + index"),),  # fmt: skip
        GREEDY_TESTS,
    ),
    Mutant(  # each node sees the previous node's ancestors instead of its parent's (mask and acceptance walk)
        "ancestor_mask_wrong",
        (
            (
                ACCEPT_REFERENCE,
                "jump = parents.long()  # the ancestor 2**t levels up, -1 above the root",
                "jump = torch.where(parents >= 0, torch.arange(n, device=parents.device) - 1, -1)",
            ),
        ),
        (*GREEDY_TESTS, "tests/trees/test_tree_basics.py"),
    ),
    Mutant(  # padding slots visible to every node of the tree (real ones included) in the round's mask
        "padding_visible_to_real_node",
        (
            (
                ACCEPT_REFERENCE,
                "    ancestors = ancestor_mask(parents, max_depth)\n",
                "    ancestors = ancestor_mask(parents, max_depth) | ~valid[None, :]\n",
            ),
        ),
        PADDING,
    ),
    Mutant(  # Gated DeltaNet recurrence continues from the previous node's state instead of the parent's
        "recurrent_parent_state_wrong",
        (("specdec/state/gdn.py", "parents = topo.parents if isinstance(topo.parents, torch.Tensor)",
          "parents = (torch.arange(n) - 1).expand(rows, -1) if True"),),
        (*HYBRID, "tests/state/test_hybrid_tree.py", "tests/state/test_hybrid_generate.py"),
    ),
    Mutant(  # the same in the Mamba2 mixers' tree scan
        "recurrent_parent_state_wrong_mamba2",
        (("specdec/state/mamba2.py", "parents = topo.parents if isinstance(topo.parents, torch.Tensor)",
          "parents = (torch.arange(n) - 1).expand(rows, -1) if True"),),
        (*HYBRID, "tests/state/test_hybrid_tree.py"),
    ),
    Mutant(  # the recurrent state committed after all accepted nodes but the last
        "recurrent_commit_one_short",
        (
            (
                "specdec/state/recurrent.py",
                "state = adapter.replay(rec.float(), stash, flat, plan.num_path)",
                "state = adapter.replay(rec.float(), stash, flat, plan.num_path - 1)",
            ),
        ),
        (*HYBRID, "tests/state/test_hybrid_generate.py"),
    ),
    # -- the call's own tree policy and verification rule ---------------------------------------------------
    Mutant(  # the tree passed to generate replaced by the drafter's default tree
        "tree_policy_ignored",
        ((GENERATE, "    if tree is None:\n        tree = getattr", "    if True:\n        tree = getattr"),),
        REGISTRY,
    ),
    Mutant(  # the verifier passed to generate replaced by the default rule
        "verifier_ignored",
        ((GENERATE, "default_rule(sampling) if verifier is None else verifier", "default_rule(sampling)"),),
        REGISTRY,
    ),
    # -- the rules that weigh the draft distribution q and their sampled trees (tests/verify) ------------------
    Mutant(  # the residual after a rejection subtracts the current node's own q instead of the rejected child's
        "residual_wrong_node_q",
        (
            (
                REJECTION_REFERENCE,
                "residual = (r - qk).clamp(min=0.0)",
                "residual = (r - q).clamp(min=0.0)",
            ),
        ),
        ("tests/verify/test_speculative.py", "tests/verify/test_multidraft.py"),
    ),
    Mutant(  # the residual left unnormalised: the next sibling's acceptance ratio reads a shrunken distribution
        "residual_not_renormalised",
        (
            (
                REJECTION_REFERENCE,
                "r = torch.where(correct, residual / mass.clamp(min=tiny), r)",
                "r = torch.where(correct, residual, r)",
            ),
        ),
        ("tests/verify/test_multidraft.py",),
    ),
    Mutant(  # Gumbel-top-k siblings drawn i.i.d. from q (with replacement) where the policy and its rule say without
        "siblings_with_replacement",
        (
            (
                "specdec/trees/sampled.py",
                "ranked = torch.sort(scores, dim=-1, descending=True, stable=True).indices[:, :width]",
                "ranked = torch.multinomial(draft_logprobs(logq[:, d], self.sampling).exp(), width, replacement=True)",
            ),
        ),
        ("tests/verify/test_sampled_policies.py", "tests/verify/test_multidraft.py"),
    ),
    Mutant(  # the stochastic DDTree's shape (sibling counts) from the perturbed scores: the counts depend on the draws
        "stochastic_ddtree_shape_from_draws",
        (
            (
                "specdec/trees/sampled.py",
                "shape = DDTree(self.budget, self.topk).build(Proposal(logq=logq), root, depth)",
                "shape = DDTree(self.budget, self.topk).build(Proposal(logq=(draft_logprobs(logq, self.sampling) + "
                "gumbel_from_uniform(noise[:, : logq.shape[1]].float())) if self.stochastic else logq), root, depth)",
            ),
        ),
        STOCHASTIC_DDTREE_TESTS,
    ),
    Mutant(  # the stochastic DDTree's siblings drawn i.i.d. from q (with replacement)
        "stochastic_ddtree_with_replacement",
        (
            (
                "specdec/trees/sampled.py",
                "drawn = topk_last(keys, k, largest=False)[1]",
                "drawn = torch.multinomial(draft_logprobs(logq, self.sampling).exp().flatten(0, 1), k, "
                "replacement=True).view(*logq.shape[:2], k)",
            ),
        ),
        STOCHASTIC_DDTREE_TESTS,
    ),
    Mutant(  # the without-replacement rule weighs each sibling against q, not q without the earlier siblings
        # (renormalised); zeroing the earlier tokens alone changes nothing: a rejected token's residual is already 0
        "without_replacement_weighed_as_with",
        (
            (
                REJECTION_REFERENCE,
                "q_tok = torch.where(repeat, 0.0, q_tok / kept)",
                "q_tok = torch.where(repeat, 0.0, q_tok)",
            ),
            (
                REJECTION_REFERENCE,
                "qk = (qk.scatter(2, tokens[..., :k], 0.0) if k else qk) / kept[..., k, None]",
                "qk = qk",
            ),
        ),  # fmt: skip
        ("tests/verify/test_multidraft.py",),
    ),
    Mutant(  # the Triton round keeps testing a node's later children after one was accepted
        "rejection_kernel_tests_after_accept",
        (
            (REJECTION_TRITON, "live = (child < S) & (q_tok > 0) & (nxt == node)", "live = (child < S) & (q_tok > 0)"),
        ),
        ("tests/kernels/test_tree_rejection.py", "-m", "interpreter"),  # the interpreted kernel tier
    ),
    Mutant(  # the round over a per-depth q reads a child's own depth's row (one level too deep)
        "rejection_kernel_depth_row_off_by_one",
        (
            (
                REJECTION_TRITON,
                "tl.maximum(tl.load(depth_ptr + slots_row + slot) - 1, 0)",
                "tl.maximum(tl.load(depth_ptr + slots_row + slot), 0)",
            ),
        ),
        ("tests/kernels/test_tree_rejection.py", "-m", "interpreter"),
    ),
    Mutant(  # the rejection and traversal kernels make a slot's uniform of its float32 halves in the wrong order
        "kernel_uniform_halves_swapped",
        (("specdec/kernels/triton_ops.py", "u = tl.minimum(first + second * GRID, TOP)",
          "u = tl.minimum(second + first * GRID, TOP)"),),  # fmt: skip
        ("tests/kernels/test_tree_rejection.py", "tests/kernels/test_rejection_walk.py",
         "tests/kernels/test_tree_traversal.py", "-m", "interpreter"),  # fmt: skip
    ),
    Mutant(  # the traversal kernels over a per-depth q read a node's own depth's row (one level too deep)
        "traversal_kernel_depth_row_off_by_one",
        (("specdec/kernels/tree_traversal/triton.py", "tl.minimum(tl.maximum(depth - 1, 0), q_rows - 1)",
          "tl.minimum(tl.maximum(depth, 0), q_rows - 1)"),),  # fmt: skip
        ("tests/kernels/test_tree_traversal.py", "-m", "interpreter"),
    ),
    Mutant(  # the per-depth q's rows (the reference path, node_proposals) read one level too deep
        "rejection_depth_rows_off_by_one",
        (("specdec/verify/draws.py", "rows = (depth - 1).clamp(0, q.shape[1] - 1)",
          "rows = depth.clamp(0, q.shape[1] - 1)"),),  # fmt: skip
        ("tests/kernels/test_tree_rejection.py", "tests/verify/test_multidraft.py"),
    ),
    Mutant(  # the fused round's setup ranks a node's children in reverse slot order (within a block of slots)
        "rejection_round_kernel_siblings_reversed",
        (
            (
                REJECTION_TRITON,
                "rank = count + tl.cumsum(flag, 0) - flag",
                "rank = count + tl.sum(flag, 0) - tl.cumsum(flag, 0)",
            ),
        ),
        ("tests/kernels/test_tree_rejection.py", "-m", "interpreter"),
    ),
    Mutant(  # the fused round's setup, without replacement, weighs a sibling repeating an earlier one's token
        "rejection_round_kernel_repeats_drawn",
        (
            (
                REJECTION_TRITON,
                "repeat = repeat | (tl.load(ranked_ptr + ranks + j) == token)",
                "repeat = repeat",
            ),
        ),
        ("tests/kernels/test_tree_rejection.py", "-m", "interpreter"),
    ),
    Mutant(  # the walk's Accept reads the token of the path node itself instead of the next one
        "accept_path_tokens_off_by_one",
        (("specdec/verify/draws.py", "tree.tokens.gather(1, path).roll(-1, 1)", "tree.tokens.gather(1, path)"),),
        ("tests/verify/test_forward_walk.py", "tests/verify/test_multidraft.py"),
    ),
    Mutant(  # traversal: a node's weight reads its parent's target from before the parent's correction
        "traversal_without_ancestor_correction",
        (
            (
                "specdec/kernels/tree_traversal/reference.py",
                "        p_tok = torch.where(parents == above[:, None], fresh_tok, p_tok)\n",
                "",
            ),
        ),
        ("tests/verify/test_traversal.py",),
    ),
    Mutant(  # block verification's backward pass tests eta_i against h_{i+1}
        "block_backward_off_by_one",
        (
            (
                "specdec/verify/block.py",
                "passed = ((u[..., 0] <= h) | (index == 0))",
                "passed = ((u[..., 0] <= h.roll(-1, 1)) | (index == 0))",
            ),
        ),
        ("tests/verify/test_block.py",),
    ),
]
# The sampling bugs again, against the statistical tests of tests/unit/test_verify_sampling.py alone (without
# its exact comparison with HF's warpers).
CHI2_VARIANTS = ("temperature_inverted", "top_p_crossing_dropped", "top_p_before_top_k", "top_k_default_ignored",
                 "sample_wrong_node")  # fmt: skip
# -- the round's attention lengths and routed kernels --------------------------------------------------------
MUTANTS += [
    Mutant(  # each sequence's readable length one short: the newest row hidden from every query
        "kv_lengths_one_short",
        (("specdec/state/storage.py", "lengths = (write_index.amax(1) + 1).to(torch.int32)",
          "lengths = write_index.amax(1).to(torch.int32)"),),  # fmt: skip
        ("tests/round/test_grouped_attention.py", "-k", "length"),
    ),
    Mutant(  # the attention reference ignores the lengths: slots past them (stale rows) are read
        "kv_lengths_ignored",
        (("specdec/kernels/tree_attention/reference.py", "    if lengths is not None:\n", "    if False:\n"),),
        ("tests/kernels/test_tree_attention_lengths.py",),
    ),
    Mutant(  # the length penalty adds inf to an EOS score already -inf where HF's release leaves it (NaN, then EOS)
        "decay_penalty_on_infinite_eos",
        (("specdec/processors.py", "            eos = eos & scores.isfinite()", "            eos = eos"),),
        ("tests/round/test_processors.py", "-k", "length_penalty_after_min_new"),
    ),
    Mutant(  # a steered draft keeps NaN scores: the tree is built over NaN
        "steer_keeps_nan",
        (("specdec/processors.py", "        steered = torch.where(steered.isnan(), -math.inf, steered)\n", ""),),
        ("tests/round/test_processors.py", "-k", "length_penalty_after_min_new or steering"),
    ),
    Mutant(  # the prompt processors read the prompt without its left padding (HF's "encoder input" holds it)
        "prompt_processors_padding_dropped",
        (("specdec/processors.py", "    if nodes.pad is None:\n        return history, positions < prompt_len[:, None]",
          "    if True:\n        return history, positions < prompt_len[:, None]"),),  # fmt: skip
        ("tests/round/test_processors.py", "-k", "prompt_processors or padding_counts"),
    ),
    Mutant(  # the prompt one token short: its last token is not the prompt's
        "prompt_processors_prompt_one_short",
        (("specdec/processors.py", "    prompt_len = nodes.length + 1 - nodes.generated[:, 0]  # [B]",
          "    prompt_len = nodes.length - nodes.generated[:, 0]  # [B]"),),  # fmt: skip
        ("tests/round/test_processors.py", "-k", "prompt_"),
    ),
    Mutant(  # the prompt n-gram ban's key stops at a short row's first token (HF's reaches into the padding)
        "prompt_ngram_key_padding_dropped",
        (("specdec/processors.py", "            key = torch.where((key < 0) & (at >= 0), padding, key)",
          "            key = key"),),  # fmt: skip
        ("tests/round/test_processors.py", "-k", "prompt_processors"),
    ),
    Mutant(  # the two-launch top-k forgets each chunk's offset: ids of later chunks point into the first
        "topk_two_stage_chunk_offset_dropped",
        (("specdec/kernels/ddtree_build/triton.py",
          "    ids = ids.view(depth, chunks, kc) + torch.arange(chunks, device=x.device)[:, None] * _CHUNK",
          "    ids = ids.view(depth, chunks, kc)"),),  # fmt: skip
        ("tests/kernels/test_ddtree_build.py", "-m", "interpreter", "-k", "topk"),
    ),
    Mutant(  # the smallest's padding is -inf: the padded slots win
        "topk_two_stage_padding_wins",
        (("specdec/kernels/ddtree_build/triton.py", "value=math.inf if smallest else -math.inf",
          "value=-math.inf"),),  # fmt: skip
        ("tests/kernels/test_ddtree_build.py", "-m", "interpreter", "-k", "topk"),
    ),
    Mutant(  # the attention's combine drops a partial last block of rows (never written: the output's garbage)
        "combine_last_row_block_dropped",
        (("specdec/kernels/tree_attention/triton.py", "    blocks = tl.cdiv(R, ROWS)\n", "    blocks = R // ROWS\n"),),
        ("tests/kernels/test_tree_attention.py", "-m", "interpreter"),
    ),
    Mutant(  # the flat prefix's run rounded up to whole tiles: its last "whole" tile reads past the prefix unchecked
        "tree_attention_full_tile_past_flat",
        (("specdec/kernels/tree_attention/triton.py",
          "        mid = start + tl.maximum(flat - start, 0) // BLOCK_N * BLOCK_N",
          "        mid = start + tl.cdiv(tl.maximum(flat - start, 0), BLOCK_N) * BLOCK_N"),),  # fmt: skip
        ("tests/kernels/test_tree_attention_lengths.py", "-m", "interpreter"),
    ),
    Mutant(  # a validator check disabled on the device: depth against the parents' depth
        "validator_depth_unchecked",
        (("specdec/validate.py", "(real_child & (depth != parent_depth + 1)).any(1)", "(real_child & False).any(1)"),),
        ("tests/test_protocol_validation.py",),
    ),
    Mutant(  # a validator check disabled on the host: a rule's result of the wrong shape accepted
        "validator_shape_unchecked",
        (("specdec/validate.py", "    if tuple(t.shape) != shape:\n", "    if False:\n"),),
        ("tests/test_protocol_validation.py",),
    ),
    Mutant(  # accepted draft tokens not compared with the tree's: a rule may emit tokens the target never verified
        "validator_tokens_unchecked",
        (("specdec/validate.py", "flags |= (drafts & (tokens != tree_tokens)).any(1).long() * 1024", "pass"),),
        ("tests/test_protocol_validation.py",),
    ),
    Mutant(  # positions not capped for a learned position table: tree nodes past the last position index past it
        "learned_positions_uncapped",
        (("specdec/state/storage.py", "        self.position_cap = learned_position_cap(target)\n",
          "        self.position_cap = None\n"),),  # fmt: skip
        ("tests/unit/test_generate_greedy.py",),
    ),
    Mutant(  # the weights' fingerprint not compared: an edit through .data leaves stale K/V reused
        "reuse_ignores_data_edits",
        ((ENGINE, "        if not unchanged:  # the weights were edited", "        if False:  # the weights were edited"),),
        ("tests/round/test_multi_turn.py",),
    ),
    Mutant(  # the DFlash block's all-visible mask (the flat prefix over the kernel's lengths) taken by causal drafters too
        "dflash_visible_mask_when_causal",
        (("specdec/drafters/dflash_static.py", "if window not in biases and kernel and not cfg.causal and not window:",
          "if window not in biases and kernel and not window:"),),  # fmt: skip
        ("tests/round/test_dflash_static.py", "-m", "interpreter", "-k", "norms_in_the_interpreter"),
    ),
    Mutant(  # the selection's padded trees: padding slots with parent 0 (padding nodes as children of the root)
        "best_first_padding_parent_zero",
        (("specdec/kernels/ddtree_build/triton.py", "tl.store(parents_ptr + at, tl.full([BLOCK_PAD], -1, tl.int64)",
          "tl.store(parents_ptr + at, tl.full([BLOCK_PAD], 0, tl.int64)"),),  # fmt: skip
        ("tests/kernels/test_ddtree_build.py", "-m", "interpreter", "-k", "batched"),
    ),
    Mutant(  # the selection's expectations one pop late: E(n) written after n + 1 pops
        "best_first_expectation_one_pop_late",
        (("specdec/kernels/ddtree_build/triton.py", "mask=t + 1 == (SIZES >> (16 * j)) & 0xFFFF)",
          "mask=t + 2 == (SIZES >> (16 * j)) & 0xFFFF)"),),  # fmt: skip
        ("tests/kernels/test_ddtree_build.py", "-m", "interpreter", "-k", "auto_step"),
    ),
    Mutant(  # a closed slot keeps a finite score (its parent's): it wins over the open prefixes scored below it
        "best_first_closed_slot_keeps_score",
        (("specdec/kernels/ddtree_build/triton.py", "tl.where(has_sibling, p_parent_score + sibling, closed)",
          "p_parent_score + sibling"),),  # fmt: skip
        ("tests/kernels/test_ddtree_build.py", "-m", "interpreter", "-k", "selection_equals and trees"),
    ),
    Mutant(  # a closed slot keeps its rank key (its score -inf): it wins ties against open prefixes of score -inf
        "best_first_closed_slot_keeps_key",
        (("specdec/kernels/ddtree_build/triton.py", "tl.where(has_sibling, low + digit, _INT64_MAX)", "low + digit"),),
        ("tests/kernels/test_ddtree_build.py", "-m", "interpreter", "-k", "exhausted"),
    ),
    Mutant(  # the auto round's tree takes one pop more than its budget (a node over the padded tree's slots)
        "best_first_tree_one_node_more",
        (("specdec/kernels/ddtree_build/triton.py", "        in_tree = t < TREE_N\n", "        in_tree = t <= TREE_N\n"),),
        ("tests/kernels/test_ddtree_build.py", "-m", "interpreter", "-k", "auto_step"),
    ),
    Mutant(  # the batched walk reads every tree's choices from the first tree's row
        "accept_paths_choices_of_row_zero",
        (("specdec/kernels/tree_accept/triton.py", "    choices_ptr += row * S\n", ""),),
        ("tests/kernels/test_tree_accept.py", "-m", "interpreter", "-k", "batched_accepts"),
    ),
    Mutant(  # a failed graph capture leaves the default generator in capture mode: every later random op fails
        "capture_failure_keeps_generator_capturing",
        ((RUNTIME, "            generator.graphsafe_set_state(saved)\n", "            pass\n"),),
        ("tests/round/test_capture_failure.py",),
    ),
    Mutant(  # a failed graph capture leaves torch's capture stream current: later launches unordered with the loop's events
        "capture_failure_keeps_capture_stream",
        ((RUNTIME, "                    torch.cuda.set_stream(stream)", "                    pass"),),
        ("tests/round/test_capture_failure.py",),
    ),
    Mutant(  # a call's rounds looked up by size alone: a call that crosses into the next span bucket keeps the first
        "call_rounds_ignore_span",
        ((GENERATE, "        rnd = call_rounds.get((size, span))", "        rnd = call_rounds.get((size, 0))"),
         (GENERATE, "            rnd = call_rounds[(size, span)] = make_round(size, span)",
          "            rnd = call_rounds[(size, 0)] = make_round(size, span)")),  # fmt: skip
        ("tests/round/",),
    ),
    Mutant(  # the fingerprint's norms dropped: an edit that misses the sampled elements (one weight) is unseen
        "fingerprint_without_norms",
        ((ENGINE, "            parts = [torch.stack(torch._foreach_norm(group, 2, dtype=torch.float64)) for group in groups]",
          "            parts = []"),),  # fmt: skip
        ("tests/round/test_multi_turn.py", "-k", "edited_through_data"),
    ),
    Mutant(  # the module plan never listed again: a swapped submodule without weights goes unseen
        "module_plan_never_relisted",
        ((ENGINE, "                    if len(own) != count or kids != children:",
          "                    if False:"),),  # fmt: skip
        ("tests/round/test_multi_turn.py", "-k", "edited_through_data or swapped_in"),
    ),
    Mutant(  # the root slot's token not compared with the round's root: a policy may verify another root
        "validator_root_unchecked",
        (("specdec/validate.py", "flags |= (tree.tokens[:, 0] != root).long() * 128", "pass"),),
        ("tests/test_protocol_validation.py",),
    ),
    Mutant(  # a broken tree sanitised with its parents clamped into the slots only: a hybrid's walk raises first
        "sanitized_parents_after_child",
        (("specdec/validate.py", "parents=torch.minimum(tree.parents.clamp(min=-1), before),",
          "parents=tree.parents.clamp(-1, slots - 1),"),),  # fmt: skip
        ("tests/test_protocol_validation.py",),
    ),
    Mutant(  # a user's drafter trusted as specdec's own: its proposals go unchecked
        "drafter_proposal_unchecked",
        ((ENGINE, "self.check_proposal = self.proposes and not trusted(drafter)", "self.check_proposal = False"),),
        ("tests/test_protocol_validation.py",),
    ),
    Mutant(  # the tree verify's flat prefix two slots too long: the first nodes' mask read as the prefix's
        "kv_flat_too_long",
        ((ENGINE, '"flat": prefix, "lengths": lengths}', '"flat": prefix + 2, "lengths": lengths}'),),
        ("tests/round/test_grouped_attention.py", "tests/e2e/test_long_prompt.py"),
    ),
    Mutant(  # the attention reference reads the mask inside the flat prefix (the kernel's contract unchecked)
        "kv_flat_mask_read",
        (("specdec/kernels/tree_attention/reference.py", "    if flat is not None:\n", "    if False:\n"),),
        ("tests/kernels/test_tree_attention_lengths.py",),
    ),
    Mutant(  # a Gemma / Qwen3.5 norm routed with Llama's formula: the probed formula ignored
        "norm_formula_ignored",
        (("specdec/kernels/rms_norm/routing.py", 'unit_offset=_formula(module) == "unit_offset"',
          "unit_offset=False"),),  # fmt: skip
        ("tests/round/test_norm_routing.py",),
    ),
    Mutant(  # every RMSNorm routed, norms of another formula (x / rms * (2 + w), gated) included: the probe skipped
        "norm_probe_skipped",
        (("specdec/kernels/rms_norm/routing.py", "if _candidate(module) and _computes_the_reference(module):",
          "if _candidate(module):"),),  # fmt: skip
        ("tests/round/test_norm_routing.py",),
    ),
    # -- HF stopping options: where a round is cut -------------------------------------------------------------
    Mutant(  # stopping criteria / stop strings: the round cut one token after the stop
        "stop_truncation_off_by_one",
        ((GENERATE, "accepted, done[b] = accepted[: stop + 1], True",
          "accepted, done[b] = accepted[: stop + 2], True"),),  # fmt: skip
        (STOPPING,),
    ),
    Mutant(  # stopping criteria / stop strings: a stop inside a round noticed one round late (the round kept whole)
        "stop_found_one_round_late",
        ((GENERATE, "accepted, done[b] = accepted[: stop + 1], True", "done[b] = True"),),
        (STOPPING,),
    ),
    Mutant(  # stopping criteria checked on the round's tokens without the earlier generated ones
        "stop_criteria_without_history",
        (("specdec/stopping.py", "new = torch.tensor(generated + accepted,", "new = torch.tensor(accepted,"),),
        (STOPPING,),
    ),
    # -- output_scores / output_logits ---------------------------------------------------------------------------
    Mutant(  # the kept logits read from the first path-length nodes of the tree, not the accepted path's nodes
        "scores_of_tree_order_not_path",
        ((ENGINE, "self.kept.copy_(raw.gather(1, accept.path[..., None].expand(-1, -1, raw.shape[-1])))",
          "self.kept.copy_(raw[:, : self.path_len])"),),  # fmt: skip
        (SCORES,),
    ),
    Mutant(  # the min-length processor applied to the scores one position late
        "scores_processed_one_step_late",
        ((GENERATE, "row = args.processors(row[None], chain_nodes(history, lengths[b] - 1, path, 0, pad))[0]",
          "row = args.processors(row[None], chain_nodes(history, lengths[b] - 1, path, -1, pad))[0]"),),  # fmt: skip
        (SCORES,),
    ),
    Mutant(  # the kept logits taken after the round's processing (min-length) instead of raw
        "logits_kept_processed",
        ((ENGINE, "logits = self._process(raw, tree)", "logits = raw = self._process(raw, tree)"),),
        (SCORES,),
    ),
    # -- logits processors under trees ---------------------------------------------------------------------------
    Mutant(  # the repetition penalty sees the committed tokens and the root only, not the node's own ancestors
        "penalty_with_root_history",
        ((PROCESSORS, "path = _token_mask(nodes.paths, nodes.paths >= 0, vocab)",
          "path = _token_mask(nodes.paths[..., :1], nodes.paths[..., :1] >= 0, vocab)"),),  # fmt: skip
        PROCESSOR_TESTS,
    ),
    Mutant(  # the n-gram ban counts the committed n-grams only, not those running into the tree's own tokens
        "ngram_ban_ignores_tree_tokens",
        ((PROCESSORS, "banned.scatter_(2, torch.where(match, ext[..., -1], vocab), True)", "pass"),),
        PROCESSOR_TESTS,
    ),
    Mutant(  # a node's sequence length (and so every length rule) counted from the root instead of the node
        "processors_generated_from_root",
        ((PROCESSORS, "tree_paths(tree, path_len), tree.depth, generated[:, None] + tree.depth, pad)",
          "tree_paths(tree, path_len), tree.depth, generated[:, None] + 0 * tree.depth, pad)"),),  # fmt: skip
        PROCESSOR_TESTS,
    ),
    # -- multi-turn prefix reuse ---------------------------------------------------------------------------------
    Mutant(  # the reused prefix one token longer than what still matches the kept sequence
        "reused_prefix_off_by_one",
        ((ENGINE, "        return min(first, committed)\n", "        return min(first + 1, committed, length - 1)\n"),),
        ("tests/round/test_multi_turn.py",),
    ),
    Mutant(  # a hybrid's recurrent state reused although the prompt leaves the kept sequence before its end
        "hybrid_state_reused_from_the_wrong_point",
        ((ENGINE, "            return committed if committed <= min(first, kept_len) else 0\n",
          "            return min(first, committed)\n"),),  # fmt: skip
        ("tests/round/test_multi_turn.py",),
    ),
    # -- num_return_sequences ---------------------------------------------------------------------------------
    Mutant(  # the prompts tiled (0, 1, 0, 1) instead of repeated in place (0, 0, 1, 1) as HF orders them
        "return_sequences_tiled",
        ((GENERATE, "input_ids = input_ids.repeat_interleave(copies, 0)", "input_ids = input_ids.repeat(copies, 1)"),),
        (NUM_RETURN,),
    ),
    Mutant(  # the first token of every row drawn with the same noise
        "return_sequences_share_first_draw",
        ((GENERATE, "noise = torch.rand(logits.shape[0], 1, width,", "noise = torch.rand(1, 1, width,"),
         (GENERATE, "device=logits.device, generator=generator)\n", "device=logits.device, generator=generator)"
          ".expand(logits.shape[0], 1, -1)\n"),),  # fmt: skip
        (NUM_RETURN,),
    ),
    Mutant(  # rotate_half with the sign on the wrong half
        "rotary_sign_swapped",
        (("specdec/kernels/rotary/reference.py", "return torch.cat((-x[..., half:], x[..., :half]), dim=-1)",
          "return torch.cat((x[..., half:], -x[..., :half]), dim=-1)"),),  # fmt: skip
        ("tests/kernels/test_rotary.py",),
    ),
    Mutant(  # partial rotary: the kernel copies the head's first dims where the unrotated rest belongs
        "rotary_partial_rest_from_the_start",
        (("specdec/kernels/rotary/triton.py", "rest = tl.load(src + 2 * HALF + j,", "rest = tl.load(src + j,"),),
        ("tests/kernels/test_rotary.py", "-m", "interpreter"),
    ),
    Mutant(  # partial rotary: the reference rotates the part but drops the rest of the head
        "rotary_partial_rest_dropped",
        (("specdec/kernels/rotary/reference.py", "_rotate_half(part) * sin, x[..., rot:]), dim=-1)",
          "_rotate_half(part) * sin, 0 * x[..., rot:]), dim=-1)"),),  # fmt: skip
        ("tests/kernels/test_rotary.py",),
    ),
    Mutant(  # a partial cos sent to the kernel for a function that rotates whole heads only (Llama's)
        "rotary_partial_routed_unprobed",
        (("specdec/kernels/rotary/routing.py", "or (cos.shape[-1] != q.shape[-1] and not _partial(original))",
          "or False"),),  # fmt: skip
        ("tests/kernels/test_rotary.py",),
    ),
    Mutant(  # the mask kernel's key slots one past each node's (the verify's K/V written one slot late)
        "verify_inputs_write_one_late",
        (("specdec/kernels/tree_accept/triton.py", "tl.store(write_ptr + row, start + slot)",
          "tl.store(write_ptr + row, start + slot + 1)"),),  # fmt: skip
        ("tests/kernels/test_tree_accept.py::test_interpreted_verify_inputs", "-m", "interpreter"),
    ),
    Mutant(  # the stochastic DDTree's nodes take the draws in reverse order of their places
        "stochastic_ddtree_draws_reversed",
        (("specdec/trees/sampled.py", "rank_tokens=drawn)", "rank_tokens=drawn.flip(-1))"),),
        ("tests/verify/test_sampled_policies.py",),
    ),
    Mutant(  # the target's sample: the largest exponential key wins the race instead of the smallest
        "target_sample_largest_key",
        ((RULES, "clamp(_TINY, 1.0 - 2.0**-24)).argmin(dim=-1)", "clamp(_TINY, 1.0 - 2.0**-24)).argmax(dim=-1)"),),
        SAMPLING_TESTS,
    ),
    Mutant(  # tensor parallel: the ranks no longer compare what they committed
        "ranks_not_compared",
        (("specdec/distributed.py", "if high != digest or -low != digest:", "if False:"),),
        ("tests/distributed/test_tensor_parallel.py::test_a_rank_with_other_noise_makes_every_rank_raise", "-m", "slow"),
    ),
    Mutant(  # tensor parallel: each rank stops on its own clock (max_time)
        "ranks_clock_not_agreed",
        (("specdec/distributed.py", "bool(any_flag)", "bool(flag)"),),
        ("tests/distributed/test_tensor_parallel.py::test_max_time_passed_on_one_rank_stops_every_rank_at_the_same_read",
         "-m", "slow"),  # fmt: skip
    ),
    Mutant(  # tensor parallel: each rank's adaptive budget sees its own round time
        "ranks_time_their_own_rounds",
        (("specdec/distributed.py", "else slowest / 1000", "else ms"),),
        ("tests/distributed/test_tensor_parallel.py::test_two_ranks_equal_the_single_process_runs", "-m", "slow"),
    ),
]
# -- the auto budget: its bounded graph keys and its choices -----------------------------------------------------
AUTO_KEYS = "tests/round/test_auto_budget_keys.py"
MUTANTS += [
    Mutant(  # capture allowed after warm-up: a span bucket's sizes built lazily, each on its first choice
        "auto_capture_after_warmup",
        ((GENERATE, "if auto is not None and span not in prepared:", "if False and span not in prepared:"),),
        (AUTO_KEYS,),
    ),
    Mutant(  # auto picks a size its cost model says loses: plain decoding never chosen, the smallest tree instead
        "auto_picks_a_losing_size",
        (("specdec/budget.py", "size = next(o for o in attached if value[o] * (1.0 + self.margin) >= best)",
          "size = next((o for o in attached if value[o] * (1.0 + self.margin) >= best and o), self.sizes[0])"),),
        (AUTO_KEYS, "tests/round/test_auto_budget.py"),
    ),
    Mutant(  # a call that left the drafter behind still offers its stale state to the next call's prefix reuse
        "auto_detached_drafter_kept",
        ((GENERATE, "None if behind else drafter)", "drafter)"),),
        (AUTO_KEYS,),
    ),
    Mutant(  # the drafter detached at the first model choice that detaching wins, not after four in a row
        "auto_detaches_unsettled",
        (("specdec/budget.py", "if self.settle and self.votes >= self.settle:", "if self.settle and self.votes:"),),
        ("tests/round/test_auto_budget.py",),
    ),
    Mutant(  # the MTP head's forwards outside the round's scope: its norms keep their own many-op forwards
        "mtp_head_outside_the_scope",
        (("specdec/drafters/mtp_static.py", "    def draft_model(self):", "    def _draft_model(self):"),),
        ("tests/drafters/test_mtp.py",),
    ),
    Mutant(  # the MTP head's rotary table read at half the position (a uniform shift would be invisible: RoPE is
        # relative)
        "mtp_rope_table_half_position",
        (("specdec/drafters/mtp_static.py", "self.rope_table[positions.clamp(max=self.capacity - 1)]",
          "self.rope_table[(positions // 2).clamp(max=self.capacity - 1)]"),),
        ("tests/drafters/test_mtp.py",),
    ),
    Mutant(  # a detach verdict made on one poorly drafted prompt starts the next calls detached
        "auto_detach_verdict_always_carries",
        (("specdec/budget.py", "self.start_detached or (self.verdict and self.carries)",
          "self.start_detached or self.verdict"),),
        ("tests/round/test_auto_budget.py",),
    ),
    Mutant(  # an auto round (lookahead off, the default) still pops the next size up (its cost then includes them)
        "auto_step_lookahead_ignored",
        (("specdec/trees/policies.py", "        if not self.lookahead:\n            return self.budget\n", ""),),
        ("tests/kernels/test_ddtree_build.py", "tests/round/test_auto_budget.py"),
    ),
    Mutant(  # the wall clock keeps the launch ahead's host time in the round read meanwhile (on the CPU: the next
        # round's whole cost)
        "auto_wall_keeps_the_launch_ahead",
        ((GENERATE, "(now - last_read) * 1e3 - launched_ms[0] + rnd.launch_ms[ticket]", "(now - last_read) * 1e3"),),
        ("tests/round/test_auto_budget.py",),
    ),
    Mutant(  # a round read while a capture ran ahead of it is timed with the capture
        "auto_wall_times_a_capture",
        ((GENERATE, "and (ahead is None or ahead[0].warm[ahead[1]])", ""),),
        ("tests/round/test_auto_budget.py",),
    ),
    Mutant(  # the model's choice is the plain argmax: no margin for the larger trees' overrated values
        "auto_margin_dropped",
        (("specdec/budget.py", "if value[o] * (1.0 + self.margin) >= best)", "if value[o] >= best)"),),
        ("tests/round/test_auto_budget.py", AUTO_KEYS),
    ),
    Mutant(  # the controller rebuilt at every call: every call measures every size again
        "auto_controller_not_kept",
        ((ENGINE, "ctrl = self._controllers.get(key)", "ctrl = None"),),
        (AUTO_KEYS,),
    ),
    Mutant(  # the checks never run: a neighbour the model does not pick is judged by a decayed calibration forever
        "auto_checks_never_run",
        (("specdec/budget.py", "if self.check and self.since_check >= self.check:", "if False:"),),
        ("tests/round/test_auto_budget.py",),
    ),
    Mutant(  # a batch weighed by the sum over its rows (its slowest row ignored)
        "auto_finish_ignored",
        (("specdec/budget.py", "if self.finish and remaining and len(remaining) > 1",
          "if False and remaining and len(remaining) > 1"),),  # fmt: skip
        ("tests/round/test_auto_budget.py", AUTO_KEYS),
    ),
    Mutant(  # a new call keeps the last call's expectations (a poorly drafted call's tail opens the next)
        "auto_call_keeps_the_last_expectations",
        (("specdec/budget.py", "if self.expected_long is not None and not self.start_detached:",
          "if False:"),),  # fmt: skip
        ("tests/round/test_auto_budget.py",),
    ),
    Mutant(  # the expectations written to a buffer of their own, not into the round's output copy
        "auto_expectations_outside_the_output",
        ((ENGINE, "self.expect = self.out[:, self.fields :].view(torch.float64)",
          "self.expect = self.out[:, self.fields :].view(torch.float64).clone()"),),  # fmt: skip
        (AUTO_KEYS,),
    ),
    Mutant(  # a cold first run counted as the option's cost
        "auto_cold_run_counted",
        (("specdec/budget.py", "self.timed.get(size, 0) < self.cold:", "self.timed.get(size, 0) < 0:"),),
        ("tests/round/test_auto_budget.py", AUTO_KEYS),
    ),
    Mutant(  # the sizes a round did not compute extrapolated flat (the growth learned from full rows ignored)
        "auto_growth_ignored",
        (("specdec/budget.py", "out.append(out[k - 1] * (self.growth[k] or 1.0))", "out.append(out[k - 1])"),),
        ("tests/unit/test_budget.py", "tests/round/test_auto_budget.py"),
    ),
    Mutant(  # an auto round computes its expectations only up to its own size (the next size up never known)
        "auto_expects_only_its_own_size",
        (("specdec/trees/policies.py", "above = [s for s in self.expect_sizes if s > self.budget]",
          "above = [s for s in self.expect_sizes if s >= self.budget]"),),  # fmt: skip
        ("tests/kernels/test_ddtree_build.py", "tests/unit/test_budget.py"),
    ),
]
# -- the host's work per call ----------------------------------------------------------------------------------
MUTANTS += [
    Mutant(  # the weights' state walks parameters only: a buffer's cast or move goes unseen
        "weights_state_skips_buffers",
        (("specdec/target.py", "for tensors in (module._parameters, module._buffers):",
          "for tensors in (module._parameters,):"),),  # fmt: skip
        ("tests/unit/test_target_wrap.py",),
    ),
    Mutant(  # a round that captured its graph or replayed it first is timed: that option is priced by a cold run
        "first_replay_timed",
        ((ENGINE, "        if not self.warm[ticket]:\n            return None\n", ""),),
        ("tests/round/test_auto_budget.py", "-k", "captures_or_replays"),
    ),
    Mutant(  # a graph's replays not counted: it never counts as warm, and no replayed round is timed
        "graph_replays_not_counted",
        (("specdec/runtime.py", "            self.graph.replay()\n            self.replays += 1\n            return",
          "            self.graph.replay()\n            return"),),  # fmt: skip
        ("tests/round/test_auto_budget.py", "-k", "captures_or_replays"),
    ),
    Mutant(  # the tail of a call waits for each read again (the last D + 1 tokens' rounds not launched ahead)
        "tail_not_launched_ahead",
        ((GENERATE, "    if rounds < 4:\n        return path_len", "    if True:\n        return path_len"),),
        ("tests/round/test_round.py", "-k", "tail_of_a_call"),
    ),
]
# -- batches where bugs hide: long ragged rows, finished rows, per-row settings, per-row drafts ----------------
REACH = "tests/round/test_batch_reach.py"
MUTANTS += [
    Mutant(  # a finished row keeps committing: its length grows and its K/V rows keep being written
        "finished_row_still_writes",
        ((ENGINE, "round_tail(self.out, accept.tokens, active, engine.root,",
          "round_tail(self.out, accept.tokens, torch.ones_like(active), engine.root,"),),  # fmt: skip
        (REACH, "-k", "finished"),
    ),
    Mutant(  # min_new_tokens counted from row 0's prompt length for every row
        "min_new_tokens_row0_prompt",
        ((ENGINE, "generated = engine.prefix + 1 - engine.prompt_len  #",
          "generated = engine.prefix + 1 - engine.prompt_len[:1]  #"),),  # fmt: skip
        (REACH, "-k", "min_new"),
    ),
    Mutant(  # the n-gram lookup searches row 0's text for every row: tokens stay exact, acceptance does not
        "ngram_lookup_row0_history",
        (("specdec/drafters/ngram.py", "rows = [self._lookup(self.history[b], p, depth, span)",
          "rows = [self._lookup(self.history[0], p, depth, span)"),),  # fmt: skip
        (REACH, "-k", "accept and ngram"),
    ),
]
MUTANTS += [
    Mutant(  # a draft whose p / q > 1 accepted with probability 0.9, not 1 (the tokens with p / q < 1 exact)
        "rejection_capped_above_ratio_1",
        ((REJECTION_REFERENCE, "accept = live & (weighed[..., k] < r.gather(2, tokens[..., k, None])[..., 0])",
          "accept = live & (weighed[..., k] < torch.where(r.gather(2, tokens[..., k, None])[..., 0] >= "
          "qk.gather(2, tokens[..., k, None])[..., 0], 0.9 * qk.gather(2, tokens[..., k, None])[..., 0], "
          "r.gather(2, tokens[..., k, None])[..., 0]))"),),  # fmt: skip
        ("tests/verify/test_speculative.py", "-k", "first"),
    ),
    Mutant(  # the stochastic DDTree's Gumbel draws from q at 1.2x its log-probabilities (a sharper q)
        "stochastic_ddtree_sharpened",
        (("specdec/trees/sampled.py",
          "keys = exponential_keys(probs, noise[:, :length])",
          "keys = exponential_keys(probs ** 1.2, noise[:, :length])"),),
        ("tests/verify/test_sampled_policies.py", "-k", "quick"),
    ),
]
# -- the precision of the rules that weigh q (p, q and residuals float32; the final draw's cumulative sum float64) --
MUTANTS += [
    Mutant(  # a rejection's residual drops the entries below float32's epsilon as rounding noise (a tail of tiny p)
        "residual_tiny_entries_flushed",
        ((REJECTION_REFERENCE, "residual = (r - qk).clamp(min=0.0)",
          "residual = (r - qk).clamp(min=0.0) * ((r - qk) > torch.finfo(torch.float32).eps)"),),  # fmt: skip
        ("tests/verify/test_precision.py",),
    ),
]
# -- the MTP drafter: the head's maths and the rows it keeps (drafts change, tokens stay exact) ------------------------
MTP_MODEL, MTP_STATIC = "specdec/drafters/mtp_model.py", "specdec/drafters/mtp_static.py"
MTP_TESTS = ("tests/drafters/test_mtp.py", "-k", "propose or proposals or accepted_drafts")
MUTANTS += [
    Mutant(  # fc fed concat(hidden, embedding): the published layout puts the embedding first
        "mtp_concat_order_swapped",
        ((MTP_MODEL, "torch.cat((self.pre_fc_norm_embedding(embeds), self.pre_fc_norm_hidden(hidden)), dim=-1)",
          "torch.cat((self.pre_fc_norm_hidden(hidden), self.pre_fc_norm_embedding(embeds)), dim=-1)"),),  # fmt: skip
        MTP_TESTS,
    ),
    Mutant(  # the head's norms scale by w, not 1 + w (a plain RMSNorm class instead of the target's)
        "mtp_norms_without_unit_offset",
        ((MTP_MODEL, "norm = type(stack.norm)",
          "norm = __import__('transformers').models.llama.modeling_llama.LlamaRMSNorm"),),  # fmt: skip
        MTP_TESTS,
    ),
    Mutant(  # the first draft row placed at the root's position instead of the one before it
        "mtp_first_row_at_root_position",
        ((MTP_STATIC, "position = (prefix - 1)[:, None]  # [B, 1]", "position = prefix[:, None]  # [B, 1]"),),
        MTP_TESTS,
    ),
    Mutant(  # each MTP draft step's attention kernel reads one slot short: it misses its own key
        "mtp_step_extent_one_short",
        ((MTP_STATIC, "lengths = (positions + 1).clamp(max=span)", "lengths = positions.clamp(max=span)"),),
        ("tests/drafters/test_mtp.py::test_propose_matches_reference",),
    ),
    Mutant(  # every MTP draft step reads the extent computed for the first step (a slice index frozen)
        "mtp_steps_share_first_extent",
        ((MTP_STATIC, "(lengths[k], flat[k])", "(lengths[0], flat[0])"),),
        ("tests/drafters/test_mtp.py::test_propose_matches_reference",),
    ),
    Mutant(  # a committed row joins its hidden state with its own token instead of the next accepted one
        "mtp_commit_token_not_shifted",
        ((MTP_STATIC, "self.step(accept.tokens, rows, positions, span)",
          "self.step(torch.cat((prefix[:, None] * 0 + accept.tokens[:, :1], accept.tokens[:, :-1]), 1), rows, "
          "positions, span)"),),  # fmt: skip
        MTP_TESTS,
    ),
]
EAGLE3_MODEL = "specdec/drafters/eagle3_model.py"
EAGLE3_STATIC = "specdec/drafters/eagle3_static.py"
EAGLE3_TESTS = ("tests/drafters/test_eagle3_model.py", "tests/drafters/test_eagle3.py")
MUTANTS += [
    Mutant(  # draft ids taken as target ids: d2t ignored
        "eagle3_d2t_ignored",
        ((EAGLE3_MODEL, "return torch.arange(self.d2t.shape[0], device=self.d2t.device) + self.d2t",
          "return torch.arange(self.d2t.shape[0], device=self.d2t.device)"),),  # fmt: skip
        EAGLE3_TESTS,
    ),
    Mutant(  # each draft id takes its neighbour's offset (still inside the vocabulary)
        "eagle3_d2t_wrong_offset",
        ((EAGLE3_MODEL, "return torch.arange(self.d2t.shape[0], device=self.d2t.device) + self.d2t",
          "return torch.arange(self.d2t.shape[0], device=self.d2t.device) + self.d2t.roll(1)"),),  # fmt: skip
        EAGLE3_TESTS,
    ),
    Mutant(  # output-of-layer ids (first id 1) used as hidden_states indices: every fused state one layer early
        "eagle3_layer_ids_not_shifted",
        ((EAGLE3_MODEL, "return tuple(i + 1 for i in ids)", "return ids"),),
        EAGLE3_TESTS,
    ),
    Mutant(  # a committed row paired with its own token instead of the next one
        "eagle3_commit_tokens_unshifted",
        ((EAGLE3_STATIC, "self._write(accept.tokens[:, :-1], fused[:, :-1]",
          "self._write(torch.cat([accept.tokens[:, :1], accept.tokens[:, :-2]], 1), fused[:, :-1]"),),  # fmt: skip
        EAGLE3_TESTS,
    ),
    Mutant(  # the round's first row reads the fused state at the root's position (not yet known), not the one before
        "eagle3_first_row_at_root",
        ((EAGLE3_STATIC, "position = (prefix - 1).clamp(min=0)[:, None]", "position = prefix[:, None]"),),
        EAGLE3_TESTS,
    ),
    Mutant(  # the head's attention kernel reads one slot short: each draft step misses its own key
        "eagle3_kernel_lengths_one_short",
        ((EAGLE3_STATIC, "lengths = flat + 1", "lengths = flat"),),
        ("tests/drafters/test_eagle3.py::test_state_over_commits_matches_the_reference",),
    ),
    Mutant(  # the candidate tree's levels miss the root's committed row (strictly before it)
        "eagle3_tree_root_row_unseen",
        ((EAGLE3_STATIC, "torch.le(self.slots[:span], root_row[..., None].expand(-1, topk, -1)",
          "torch.lt(self.slots[:span], root_row[..., None].expand(-1, topk, -1)"),),  # fmt: skip
        ("tests/drafters/test_eagle3_dynamic.py",),
    ),
    Mutant(  # every level rotated at the first level's position
        "eagle3_tree_levels_one_rotation",
        ((EAGLE3_STATIC, "rotary = tables[:, level - 1 : level]", "rotary = tables[:, :1]"),),
        ("tests/drafters/test_eagle3_dynamic.py",),
    ),
    Mutant(  # every chain step reads the attention extent computed for the first step (a slice index frozen)
        "eagle3_steps_share_first_extent",
        ((EAGLE3_STATIC, "(mask[:, :, j : j + 1], lengths[j], flat[j])", "(mask[:, :, :1], lengths[0], flat[0])"),),
        ("tests/drafters/test_eagle3.py::test_state_over_commits_matches_the_reference",),
    ),
    Mutant(  # the stacked MLP projection split in the wrong order (up taken for gate) on gate_up_silu's CPU path
        "eagle3_gate_up_swapped",
        (("specdec/kernels/grouped_linear/routing.py", "    gate, up = F.linear(x, weight, bias).chunk(2, dim=-1)",
          "    up, gate = F.linear(x, weight, bias).chunk(2, dim=-1)"),),  # fmt: skip
        EAGLE3_TESTS,
    ),
    Mutant(  # refresh stacks the changed weights anew but never writes them where the captured round reads
        "eagle3_stacked_weights_not_refreshed",
        ((EAGLE3_STATIC, "self.drafter.model.packed_weights(out=self.packed)",
          "self.drafter.model.packed_weights()"),),  # fmt: skip
        ("tests/round/test_refresh_in_place.py",),
    ),
    Mutant(  # refresh replaces the stacked weights by new tensors: a captured round keeps reading the freed ones
        "eagle3_stacked_weights_replaced",
        ((EAGLE3_STATIC, "self.drafter.model.packed_weights(out=self.packed)",
          "self.packed = self.drafter.model.packed_weights()"),),  # fmt: skip
        ("tests/round/test_refresh_in_place.py",),
    ),
    Mutant(  # the target's wrapper reused after its attention implementation changed
        "target_wrap_ignores_attention",
        (("specdec/target.py", 'getattr(target.config, "_attn_implementation", None),', "None,"),),
        ("tests/unit/test_target_wrap.py",),
    ),
    Mutant(  # the target's wrapper reused after a cast or a replaced layer (the weights' signature not compared)
        "target_wrap_ignores_weights",
        (("specdec/target.py", "key = (signature, id(target.config)", "key = ((), id(target.config)"),),
        ("tests/unit/test_target_wrap.py", "tests/test_model_changes.py"),
    ),
    Mutant(  # refresh replaces the id map by a new tensor: a captured round keeps reading the freed one
        "eagle3_refresh_replaces_ids",
        ((EAGLE3_STATIC, "self.target_ids.copy_(self.drafter.model.target_ids())",
          "self.target_ids = self.drafter.model.target_ids()"),),  # fmt: skip
        ("tests/round/test_refresh_in_place.py",),
    ),
]
EAGLE3_TRAIN = "specdec/train/eagle3.py"
EAGLE3_TRAIN_TESTS = ("tests/train/test_eagle3_train.py::test_loss_matches_a_chain_drafting_reference",)
MUTANTS += [
    Mutant(  # step k weighted decay^(k+1): the first step no longer counts fully
        "eagle3_train_step_weights_shifted",
        ((EAGLE3_TRAIN, "loss = loss + decay**k *", "loss = loss + decay ** (k + 1) *"),),
        EAGLE3_TRAIN_TESTS,
    ),
    Mutant(  # every unrolled step fed the target's fused state instead of the head's own previous output
        "eagle3_train_true_hidden_fed",
        ((EAGLE3_TRAIN, "logits, hidden = model.head(model.finish(", "logits, _ = model.head(model.finish("),),
        EAGLE3_TRAIN_TESTS,
    ),
    Mutant(  # step k's rows see the step-0 row of their own position only through themselves (strict causal)
        "eagle3_train_step0_row_hidden",
        ((EAGLE3_TRAIN, "allowed = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()",
          "allowed = torch.ones(n, n, dtype=torch.bool, device=q.device).tril(-1 if k else 0)"),),  # fmt: skip
        EAGLE3_TRAIN_TESTS,
    ),
    Mutant(  # the soft targets taken over the whole vocabulary, then cut to the draft ids (not renormalised)
        "eagle3_train_targets_not_renormalised",
        ((EAGLE3_TRAIN, "p = target_logits.float().index_select(-1, target_ids).softmax(-1)",
          "p = target_logits.float().softmax(-1).index_select(-1, target_ids)"),),  # fmt: skip
        EAGLE3_TRAIN_TESTS,
    ),
]
DYNAMIC_TREE = "specdec/trees/dynamic.py"
EAGLE2_SELECTION = ("tests/trees/test_dynamic_tree.py",)
EAGLE2_ROWS = ("tests/drafters/test_eagle3_dynamic.py::test_tree_rows_match_the_reference_over_commits",)
MUTANTS += [
    Mutant(  # the candidate tree's draft rows see every earlier row of the block (causal), not their ancestors only
        "eagle2_draft_causal_not_ancestor",
        ((EAGLE3_STATIC, 'seen = torch.bitwise_or(state["seen"].gather(1, pick.expand(-1, -1, size)), own[first : first + topk],',
          'seen = torch.bitwise_or(torch.ones(topk, size, dtype=torch.bool, device=own.device).tril(first).expand(len(tokens), -1, -1), own[first : first + topk],'),
         ),  # fmt: skip
        EAGLE2_ROWS,
    ),
    Mutant(  # the tree's draft rows also see committed slots past the root's row (stale rows of earlier rounds)
        "eagle2_draft_sees_stale_rows",
        ((EAGLE3_STATIC, "root_row = self._seen(last, span)  # [B, 1]", "root_row = self._seen(last + 1, span)  # [B, 1]"),),  # fmt: skip
        EAGLE2_ROWS,
    ),
    Mutant(  # the candidate tree's first row read at the root's position instead of the last committed one
        "eagle2_first_row_at_root",
        ((EAGLE3_STATIC, "last = torch.clamp(prefix - 1, min=0)[:, None]", "last = prefix[:, None]"),),
        EAGLE2_ROWS,
    ),
    Mutant(  # the rerank lays the kept candidates out children first (descending candidate index)
        "eagle2_rerank_children_first",
        ((DYNAMIC_TREE, "chosen = ranked.sort(dim=1).values", "chosen = ranked.sort(dim=1, descending=True).values"),),
        EAGLE2_SELECTION,
    ),
    Mutant(  # the next frontier fed the state of the wrong expanded row (rank instead of row of the pick)
        "eagle2_frontier_wrong_parent_row",
        ((DYNAMIC_TREE, "parent_rows = pick // k", "parent_rows = pick % k"),),
        EAGLE2_SELECTION,
    ),
]
# -- resuming a continued prompt in the heads with their own keys/values (multi-turn) -------------------------------
RESUME_TESTS = ("tests/round/test_multi_turn_heads.py", "-k", "state_after_resume or chain")
MUTANTS += [
    Mutant(  # the continued prompt's rows written one slot late (row start - 1 keeps the earlier call's token)
        "mtp_resume_suffix_one_slot_late",
        ((MTP_STATIC, "positions = (start - 1 + torch.arange(n + 1, device=input_ids.device))",
          "positions = (start + torch.arange(n + 1, device=input_ids.device))"),),  # fmt: skip
        RESUME_TESTS,
    ),
    Mutant(  # the same slip in the EAGLE-3 head
        "eagle3_resume_suffix_one_slot_late",
        ((EAGLE3_STATIC, "positions = (start - 1 + self.slots[:n])", "positions = (start + self.slots[:n])"),),
        RESUME_TESTS,
    ),
    Mutant(  # the new positions' fused target states not stored (the rows still see them once, in the resume)
        "eagle3_resume_states_not_kept",
        ((EAGLE3_STATIC, "self.fused[:, start : start + n] = fused.to(self.fused.dtype)\n", "states = fused\n"),
         (EAGLE3_STATIC, "states = self.fused[:, start - 1 : start + n - 1]",
          "states = torch.cat((self.fused[:, start - 1 : start], states[:, :-1]), 1)"),),  # fmt: skip
        RESUME_TESTS,
    ),
]
MTP_TRAIN = "specdec/train/mtp.py"
MTP_TRAIN_TESTS = ("tests/train/test_mtp_train.py::test_loss_matches_a_chain_drafting_reference",)
MUTANTS += [
    Mutant(  # every unrolled step fed the target's hidden state instead of the head's own previous output
        "mtp_train_true_hidden_fed",
        ((MTP_TRAIN, "prev = module(embeds, prev[:, :n], rotary, mask[None, None], positions, cache)",
          "prev = module(embeds, hidden[:, :n].to(prev.dtype), rotary, mask[None, None], positions, cache)"),),
        MTP_TRAIN_TESTS,
    ),
    Mutant(  # the soft target shifted by one: row t of step k scored against the target's next-token distribution
        "mtp_train_target_shifted",  # at t + k (the token the row already holds), not at t + k + 1
        ((MTP_TRAIN, "ce = -(logp[:, k + 1 : k + 1 + n].exp() * logq).sum(-1)",
          "ce = -(logp[:, k : k + n].exp() * logq).sum(-1)"),),  # fmt: skip
        MTP_TRAIN_TESTS,
    ),
    Mutant(  # step k weighted decay^(k+1): the first step no longer counts fully
        "mtp_train_step_weights_shifted",
        ((MTP_TRAIN, "loss = loss + decay**k * ce.mean()", "loss = loss + decay ** (k + 1) * ce.mean()"),),
        MTP_TRAIN_TESTS,
    ),
    Mutant(  # a later step's rows see every earlier row of the steps after 0 (not only their own chain's)
        "mtp_train_steps_see_other_chains",
        ((MTP_TRAIN, "blocks = [cols[0] <= rows[:, None]] + [c == rows[:, None] for c in cols[1:]]",
          "blocks = [cols[0] <= rows[:, None]] + [c <= rows[:, None] for c in cols[1:]]"),),  # fmt: skip
        MTP_TRAIN_TESTS,
    ),
]
# -- the round's kernel cuts: rotary tables, kept tree constants, the attention's lengths ------------------------------
MUTANTS += [
    Mutant(  # the rotary table read one position late
        "rope_table_one_late",
        (("specdec/state/rope.py", "rows = row_gather(table, position_ids)",
          "rows = row_gather(table, (position_ids + 1).clamp(max=table.shape[0] - 1))"),),  # fmt: skip
        ("tests/round/test_rope_tables.py",),
    ),
    Mutant(  # kept chain depths one short (the parents right)
        "chain_constants_depth_short",
        (("specdec/trees/build.py", "depth = torch.where(real, slots, 0).expand(batch, -1).contiguous()",
          "depth = torch.where(real, slots - 1, 0).clamp(min=0).expand(batch, -1).contiguous()"),),  # fmt: skip
        ("tests/trees/test_device_trees.py", "-k", "chain_batch"),
    ),
    Mutant(  # kept padding constants count the root out of num_nodes
        "pad_constants_num_nodes_short",
        (("specdec/trees/build.py", "torch.full((batch,), n + 1, dtype=torch.long, device=device),",
          "torch.full((batch,), n, dtype=torch.long, device=device),"),),  # fmt: skip
        ("tests/trees/test_device_trees.py", "-k", "chain_batch"),
    ),
    Mutant(  # the tree verify's lengths one short: the last slot's K/V unread
        "verify_lengths_one_short",
        (("specdec/kernels/tree_accept/__init__.py", "prefix[:, None] + index, prefix + slots",
          "prefix[:, None] + index, prefix + slots - 1"),),  # fmt: skip
        ("tests/round/test_grouped_attention.py", "-k", "length"),
    ),
]
# -- trust: what the model may change between calls, a user's processors and drafters, Gated DeltaNet gates --------
GATES = "specdec/kernels/gdn_gates"
MUTANTS += [
    Mutant(  # the Triton gates leave the keys unnormalised
        "gdn_gates_keys_unnormalised",
        ((f"{GATES}/triton.py", "kk = kk * tl.rsqrt(tl.sum(kk * kk, axis=1) + 1e-6)[:, None]", "kk = kk * 1.0"),),
        ("tests/kernels/test_gdn_gates.py", "-m", "interpreter"),
    ),
    Mutant(  # the Triton gates read x's columns as contiguous (a tree's transposed rows read wrongly)
        "gdn_gates_column_stride_ignored",
        ((f"{GATES}/triton.py", "*x.stride(), *b.stride()", "x.stride(0), 1, *b.stride()"),),
        ("tests/kernels/test_gdn_gates.py", "-m", "interpreter"),
    ),
    Mutant(  # softplus as log(1 + e): a small e loses its digits
        "gdn_gates_softplus_plain_log",
        ((f"{GATES}/triton.py", "tl.log(u) * (e / (u - 1.0))", "tl.log(1.0 + e)"),),
        ("tests/kernels/test_gdn_gates.py", "-m", "interpreter"),
    ),
    Mutant(  # the reference's beta not rounded to b's dtype (the layer's sigmoid runs in it)
        "gdn_gates_reference_beta_widened_first",
        ((f"{GATES}/reference.py", "beta = b.reshape(total, -1).sigmoid().float()",
          "beta = b.reshape(total, -1).float().sigmoid()"),),  # fmt: skip
        ("tests/kernels/test_gdn_gates.py", "-k", "own_formulas"),
    ),
    Mutant(  # the reuse fingerprint without a matrix's diagonal: two rows swapped unseen (the row is one of neither)
        "reuse_fingerprint_without_diagonal",
        (("specdec/engine.py", "strided.append(flat[(i * 7919) % cols :: cols - 1])", "strided.append(flat[:1])"),),
        ("tests/round/test_multi_turn.py", "-k", "edited_through_data and swap-rows"),
    ),
    Mutant(  # the reuse fingerprint without a matrix's diagonal and row: two rows or columns swapped unseen
        "reuse_fingerprint_without_row_and_column",
        (("specdec/engine.py", "strided.append(flat[(i * 7919) % cols :: cols - 1])", "strided.append(flat[:1])"),
         ("specdec/engine.py", "whole.append(flat.view(rows, cols)[(i * 104729) % rows])", "whole.append(flat[:1])")),
        ("tests/round/test_multi_turn.py", "-k", "edited_through_data"),
    ),
    Mutant(  # the reuse fingerprint without the sampled elements (norms only)
        "reuse_fingerprint_norms_only",
        ((ENGINE, "            parts += [torch.cat(views).double() for views in samples]\n", ""),),
        ("tests/round/test_multi_turn.py", "-k", "edited_through"),
    ),
    Mutant(  # the module signature not compared (hooks and attributes unseen)
        "reuse_module_signature_ignored",
        ((ENGINE, "        if self.call_modules != self.kept_modules:\n            return 0\n",
          "        if False:\n            return 0\n"),),  # fmt: skip
        ("tests/round/test_multi_turn.py", "-k", "edited_through"),
    ),
    Mutant(  # the rotary tables never remade
        "rope_tables_never_refreshed",
        (("specdec/state/rope.py", "            if now.shape == freq.shape and torch.equal(now, freq) and "
          "_scaling(module) == scaling:", "            if True:"),),  # fmt: skip
        ("tests/round/test_multi_turn.py", "-k", "edited_through and buffer"),
    ),
    Mutant(  # a call under inference mode builds inference tensors again
        "generate_inside_inference_mode",
        ((GENERATE, "        with torch.inference_mode(False), torch.no_grad():",
          "        with torch.no_grad():"),),  # fmt: skip
        ("tests/test_model_changes.py", "-k", "inference_mode"),
    ),
    Mutant(  # a user's processor sees rows without their left padding
        "user_processor_padding_dropped",
        ((PROCESSORS, "            if padded:\n                before = torch.cat([pad[0][b, :padded], before])\n",
          ""),),  # fmt: skip
        ("tests/round/test_processors.py", "-k", "left_padding"),
    ),
    Mutant(  # a padded batch's history-reading processors left as the captured ones (the pad tokens unseen)
        "padded_processors_not_swapped",
        ((GENERATE, "        args = dataclasses.replace(args, processors=args.processors.padded())\n", ""),),
        ("tests/round/test_processors.py", "-k", "padding_counts"),
    ),
    Mutant(  # a drafter's positive scores not flagged
        "proposal_logq_flag_disabled",
        (("specdec/validate.py", "(logq > LOGQ_SLACK)", "(logq > float('inf'))"),),
        ("tests/test_protocol_validation.py", "-k", "broken_proposal"),
    ),
    Mutant(  # NaN in a user drafter's logq not flagged (the auto budget then fails on its expectations, unnamed)
        "proposal_nan_flag_disabled",
        (("specdec/validate.py", "logq.isnan().any(1).long() * 8192", "logq.isnan().any(1).long() * 0"),),
        ("tests/test_protocol_validation.py", "-k", "broken_proposal"),
    ),
    Mutant(  # the rejection kernel's earlier-sibling check one short (a repeated token drawn twice)
        "rejection_triton_repeat_check_short",
        ((REJECTION_TRITON, "            for j in range(k):\n                repeat = repeat |",
          "            for j in range(k - 1):\n                repeat = repeat |"),),  # fmt: skip
        ("tests/kernels/test_tree_rejection.py", "-m", "interpreter"),
    ),
]
GATED = "specdec/kernels/gated_rms_norm"
MUTANTS += [
    Mutant(  # the Triton gated norm leaves the recurrence's fp32 output unrounded
        "gated_norm_input_not_rounded",
        ((f"{GATED}/triton.py", "    x = round_to(tl.load(", "    x = (tl.load("),),
        ("tests/kernels/test_gated_rms_norm.py", "-m", "interpreter"),
    ),
    Mutant(  # the weight product not rounded to the model dtype
        "gated_norm_product_not_rounded",
        ((f"{GATED}/triton.py", "y = round_to(normed * w[None, :], PROD)", "y = normed * w[None, :]"),),
        ("tests/kernels/test_gated_rms_norm.py", "-m", "interpreter"),
    ),
    Mutant(  # the probe skipped: any gated norm (Mamba2's gate-first one) routed to the kernel
        "gated_norm_probe_skipped",
        ((f"{GATED}/__init__.py", "    if key not in _PROBED:\n", "    _PROBED[key] = True\n    if key not in _PROBED:\n"),),
        ("tests/kernels/test_gated_rms_norm.py", "-k", "probe"),
    ),
    Mutant(  # the reference widens x without its rounding to the model dtype
        "gated_norm_reference_input_unrounded",
        ((f"{GATED}/reference.py", "h = x.to(dtype).to(torch.float32)", "h = x.to(torch.float32)"),),
        ("tests/kernels/test_gated_rms_norm.py", "-k", "own_norm"),
    ),
]
MUTANTS += [
    Mutant(  # the Triton tree conv reads the committed window one column off
        "tree_conv_window_column_off",
        (("specdec/kernels/tree_conv/triton.py", "tl.minimum(idx, S - 1) * sw_s", "tl.minimum(idx + 1, S - 1) * sw_s"),),
        ("tests/kernels/test_tree_conv.py", "-m", "interpreter"),
    ),
    Mutant(  # the Triton tree conv drops the bias
        "tree_conv_bias_dropped",
        (("specdec/kernels/tree_conv/triton.py", "        acc += tl.load(b_ptr + cols", "        acc -= 0 * tl.load(b_ptr + cols"),),
        ("tests/kernels/test_tree_conv.py", "-m", "interpreter"),
    ),
    Mutant(  # a failed round's rows commit their recurrent state anyway
        "commit_plan_keep_ignored",
        (("specdec/state/recurrent.py", "            num_path = torch.where(keep, num_path, 0)\n", ""),),
        ("tests/test_protocol_validation.py", "-k", "hybrid"),
    ),
]
MUTANTS += [
    Mutant(  # the Triton K/V write stores every sequence's rows at sequence 0's slots
        "kv_write_row_slots_of_row_zero",
        (("specdec/kernels/kv_write/triton.py", "slot = tl.load(index_ptr + b * s_ib + n * s_in)",
          "slot = tl.load(index_ptr + n * s_in)"),),  # fmt: skip
        ("tests/kernels/test_kv_write.py", "-m", "interpreter"),
    ),
    Mutant(  # the Triton K/V write writes the keys into the values too
        "kv_write_values_from_keys",
        (("specdec/kernels/kv_write/triton.py", "value = tl.load(v_ptr + b * s_yb", "value = tl.load(k_ptr + b * s_yb"),),
        ("tests/kernels/test_kv_write.py", "-m", "interpreter"),
    ),
]
MUTANTS += [
    Mutant(  # the Triton silu_mul skips the rounding of the SiLU to the gate's dtype
        "silu_mul_silu_not_rounded",
        (("specdec/kernels/silu_mul/triton.py", "y = round_to(tl.div_rn(g, 1.0 + tl.exp(-g)), GATE) * u",
          "y = tl.div_rn(g, 1.0 + tl.exp(-g)) * u"),),  # fmt: skip
        ("tests/kernels/test_silu_mul.py", "-m", "interpreter"),
    ),
    Mutant(  # the MLP probe keyed by the module type only (a GELU MLP of a routed class is routed too)
        "silu_mul_probe_ignores_the_activation",
        (("specdec/kernels/silu_mul/__init__.py", "    key = (type(module), act, weight.dtype, weight.device)",
          "    key = (type(module), weight.dtype, weight.device)"),),  # fmt: skip
        ("tests/kernels/test_silu_mul.py", "-k", "probe"),
    ),
    Mutant(  # the walk's bonus counts the entries strictly below u * T (draws a token of probability 0 at a tie)
        "rejection_walk_strict_boundary",
        (("specdec/kernels/tree_rejection/triton.py", "bonus += tl.sum(((cdf <= at) & (cols < V))",
          "bonus += tl.sum(((cdf < at) & (cols < V))"),),  # fmt: skip
        ("tests/kernels/test_rejection_walk.py", "-m", "interpreter"),
    ),
    Mutant(  # a correction leaves the parent's other children at the uncorrected P_b(x_c) (their entry weights)
        "traversal_children_keep_stale_target",
        ((TRAVERSAL_TRITON, "                        ptok = tl.where(children, tl.maximum(w_parent * ptok - q_c, 0.0) "
          "/ scaled, ptok)\n", ""),),  # fmt: skip
        TRAVERSAL_TESTS,
    ),
    Mutant(  # a residual of mass 0 still replaces the parent's P (the reference keeps it)
        "traversal_zero_mass_replaces_target",
        ((TRAVERSAL_TRITON, "                    if mass > 0:  # the residual becomes", "                    if mass >= 0:  # the residual becomes"),),  # fmt: skip
        TRAVERSAL_TESTS,
    ),
    Mutant(  # without replacement, a rejected node's Q keeps its earlier siblings' tokens
        "traversal_residual_keeps_earlier_siblings",
        ((TRAVERSAL_TRITON, "                q = tl.where(cols == drawn, 0.0, q)\n", ""),),  # fmt: skip
        TRAVERSAL_TESTS,
    ),
    Mutant(  # without replacement, a rejected node's Q is its q, not renormalised over the tokens left
        "traversal_residual_not_renormalised",
        ((TRAVERSAL_TRITON, "            q = q / kept\n", ""),),
        TRAVERSAL_TESTS,
    ),
    Mutant(  # a node repeating an earlier sibling's token counts as a draw
        "traversal_repeat_is_a_draw",
        ((TRAVERSAL_TRITON, "tl.store(qtok_ptr + row, tl.where(repeat, 0.0, q_tok) / kept)",
          "tl.store(qtok_ptr + row, q_tok / kept)"),),  # fmt: skip
        TRAVERSAL_TESTS,
    ),
    Mutant(  # the bonus counts the entries strictly below u * T (draws a token of probability 0 at a tie)
        "traversal_bonus_strict_boundary",
        ((TRAVERSAL_TRITON, "bonus += tl.sum(((cdf <= at) & (start + cols < V))",
          "bonus += tl.sum(((cdf < at) & (start + cols < V))"),),  # fmt: skip
        TRAVERSAL_TESTS,
    ),
    Mutant(  # the walk's post-order visits a node's next sibling before the node's own test is done (pre-order)
        "traversal_reference_siblings_reversed",
        (("specdec/kernels/tree_traversal/reference.py", "    return order.flip(1)\n", "    return order\n"),),
        ("tests/verify/test_traversal.py",),
    ),
    Mutant(  # a shared prefix takes the last earlier path holding it, not the first (a node number of no node)
        "path_trie_last_sharing_path",
        (("specdec/kernels/path_trie/triton.py", "first = tl.where(agree & (first == m), mp, first)",
          "first = tl.where(agree, mp, first)"),),  # fmt: skip
        ("tests/kernels/test_path_trie.py", "-m", "interpreter"),
    ),
    Mutant(  # a node's parent read at its own entry instead of the entry one depth up
        "path_trie_parent_is_itself",
        (("specdec/kernels/path_trie/triton.py", "tl.load(scratch + E + e - 1,", "tl.load(scratch + E + e,"),),
        ("tests/kernels/test_path_trie.py", "-m", "interpreter"),
    ),
    Mutant(  # the reference compares only each entry's own token, not the whole prefix
        "path_trie_reference_token_not_prefix",
        (("specdec/kernels/path_trie/reference.py", ".long().cumprod(-1).bool()  # [B, M, M', L]",
          ".bool()  # [B, M, M', L]"),),  # fmt: skip
        ("tests/kernels/test_path_trie.py",),
    ),
    Mutant(  # a path's entries past its real length make nodes too (trie_device's short paths)
        "path_trie_reference_past_length",
        (("specdec/kernels/path_trie/reference.py", "        new = new & real\n", "        new = new | ~real\n"),),
        ("tests/kernels/test_path_trie.py", "tests/trees/test_device_trees.py"),
    ),
    Mutant(  # every program copies the table row of its own output row, not the row its index names
        "row_gather_own_row",
        (("specdec/kernels/row_gather/triton.py", "tl.load(table_ptr + at * stride_t + cols",
          "tl.load(table_ptr + row * stride_t + cols"),),  # fmt: skip
        ("tests/kernels/test_row_gather.py", "-m", "interpreter"),
    ),
    Mutant(  # a hooked embedding counted as a plain lookup (its hooks skipped by the routed gather)
        "row_gather_hooks_ignored",
        (("specdec/kernels/row_gather/__init__.py", "or module.max_norm is not None or _hooked(module) or",
          "or module.max_norm is not None or"),),  # fmt: skip
        ("tests/kernels/test_row_gather.py", "tests/drafters/test_eagle3.py", "-k", "plain or hooked"),
    ),
    Mutant(  # the draws count the running sums strictly below u * T (a token of probability 0 drawn at a tie)
        "categorical_draws_strict_boundary",
        (("specdec/kernels/categorical_draws/triton.py", "below = (cdf[None, :] <= at[:, None])",
          "below = (cdf[None, :] < at[:, None])"),),  # fmt: skip
        ("tests/kernels/test_categorical_draws.py", "-m", "interpreter"),
    ),
    Mutant(  # the uniform's pair read the other way round (the fine part as the coarse one)
        "categorical_draws_pair_swapped",
        (("specdec/kernels/categorical_draws/triton.py", "at = tl.minimum(first + second * GRID, TOP) * total",
          "at = tl.minimum(second + first * GRID, TOP) * total"),),  # fmt: skip
        ("tests/kernels/test_categorical_draws.py", "-m", "interpreter"),
    ),
    Mutant(  # the walk stops a step early (the last step's child never followed)
        "rejection_walk_one_step_short",
        (("specdec/kernels/tree_rejection/triton.py", "    for h in range(P - 1):  # slot h + 1 of the path",
          "    for h in range(P - 2):  # slot h + 1 of the path"),),  # fmt: skip
        ("tests/kernels/test_rejection_walk.py", "-m", "interpreter"),
    ),
    Mutant(  # the fused residual add normalises the exact fp32 sum, not the sum rounded to x's dtype
        "add_rms_norm_sum_not_rounded",
        (("specdec/kernels/rms_norm/triton.py",
          "        x = (to_bf16(x) if X_BF16 else x.to(x_ptr.dtype.element_ty)).to(tl.float32)\n", ""),),  # fmt: skip
        ("tests/kernels/test_add_rms_norm.py", "-m", "interpreter"),
    ),
    Mutant(  # the side-by-side norms: the second half normalised with the first one's eps
        "rms_norm_cat_one_eps",
        (("specdec/kernels/rms_norm/triton.py",
          "    y = _normalise(b, wb, D, eps_b, ROWS,", "    y = _normalise(b, wb, D, eps_a, ROWS,"),),  # fmt: skip
        ("tests/kernels/test_rms_norm_cat.py", "-m", "interpreter"),
    ),
    Mutant(  # EAGLE-3's residual taken from the embedding's half of the side-by-side norms
        "eagle3_norm_cat_wrong_half",
        (("specdec/drafters/eagle3_model.py",
          "return x[..., hidden.shape[-1] :] if", "return x[..., : hidden.shape[-1]] if"),),  # fmt: skip
        ("tests/drafters/test_eagle3.py", "-x", "-q"),
    ),
    Mutant(  # the folded lookup reads draft ids as target ids (the id map skipped)
        "rms_norm_cat_map_skipped",
        (("specdec/kernels/rms_norm/triton.py",
          "            ids = tl.load(map_ptr + ids, mask=row_ok, other=0)\n", ""),),  # fmt: skip
        ("tests/kernels/test_rms_norm_cat.py", "-m", "interpreter"),
    ),
    Mutant(  # a routed MTP head's pair of norms in the wrong order before fc
        "mtp_norm_cat_swapped",
        (("specdec/kernels/rms_norm/routing.py",
          "return rms_norm_cat(a, b, module_a.weight, module_b.weight, _eps(module_a), _eps(module_b),",
          "return rms_norm_cat(b, a, module_b.weight, module_a.weight, _eps(module_b), _eps(module_a),"),),  # fmt: skip
        ("tests/round/test_norm_routing.py", "-k", "pair"),
    ),
    Mutant(  # heads cut out of a fused q / k / v product read as if their rows were evenly spaced
        "rms_norm_split_rows_one_stride",
        (("specdec/kernels/rms_norm/triton.py",
          "(rows % inner).to(tl.int64)[:, None] * stride_xi", "(rows % inner).to(tl.int64)[:, None] * stride_x"),),
        ("tests/kernels/test_rms_norm.py", "-m", "interpreter"),
    ),
    Mutant(  # the k smallest ranked as the k largest: the stochastic DDTree's draws would be its least likely tokens
        "topk_last_smallest_ignored",
        (("specdec/trees/build.py", "topk_rows(x.reshape(-1, vocab), k, smallest=not largest)",
          "topk_rows(x.reshape(-1, vocab), k, smallest=False)"),),
        ("tests/trees/test_topk_last.py", "-m", "interpreter"),
    ),
    Mutant(  # the scanning top-k's next pass compared in the unnegated order: the smallest after the first go wrong
        "topk_scan_smallest_previous_unnegated",
        (("specdec/kernels/ddtree_build/triton.py", "prev_v = -value if SMALLEST else value", "prev_v = value"),),
        ("tests/trees/test_topk_last.py", "-m", "interpreter"),
    ),
    Mutant(  # dims taken as mergeable when a row's stride only holds the next dims (heads cut out of a wider row)
        "rms_norm_rows_merge_loose",
        (("specdec/kernels/rms_norm/triton.py",
          "x.stride(a) == x.stride(b) * x.shape[b] for a, b", "x.stride(a) >= x.stride(b) * x.shape[b] for a, b"),),
        ("tests/kernels/test_rms_norm.py", "-k", "rows_view"),
    ),
    Mutant(  # the DFlash block's stacked q / k / v and gate / up copies not refreshed after an in-place update
        "dflash_packed_not_refreshed",
        (("specdec/drafters/dflash_static.py",
          "_tensors(self._weight, self._bias, self._k_norm, self.packed)",
          "_tensors(self._weight, self._bias, self._k_norm)"),),  # fmt: skip
        ("tests/round/test_dflash_static.py", "-k", "follows"),
    ),
    Mutant(  # the commit stores the accepted rows one slot past where the next forward reads them
        "kv_commit_one_slot_off",
        (("specdec/kernels/kv_commit/triton.py",
          "tl.store(base + (start + steps)[:, None] * s_s", "tl.store(base + (start + steps + 1)[:, None] * s_s"),),
        ("tests/kernels/test_kv_commit.py", "-m", "interpreter"),
    ),
    Mutant(  # the round's next root taken from the first accepted token instead of the last
        "round_tail_root_from_first_token",
        (("specdec/kernels/round_tail/triton.py",
          "choice = tl.load(tok_ptr + rows64 * s_tb + (num - 1) * s_tp", "choice = tl.load(tok_ptr + rows64 * s_tb"),),
        ("tests/kernels/test_round_tail.py", "-m", "interpreter"),
    ),
    Mutant(  # the reference's length advanced on finished rows too
        "round_tail_finished_rows_advance",
        (("specdec/kernels/round_tail/reference.py", "prefix.add_(num_path * active)", "prefix.add_(num_path)"),),
        ("tests/kernels/test_round_tail.py", "tests/round/test_batch_reach.py", "-x", "-q"),
    ),
    Mutant(  # a user's policy may hand the rules its own q (the round keeps any tree's draft_probs)
        "draft_probs_kept_from_any_policy",
        ((ENGINE, "if tree.draft_probs is not None and not trusted(self.tree):",
          "if tree.draft_probs is not None and False:"),),  # fmt: skip
        ("tests/test_protocol_validation.py", "-k", "own_q"),
    ),
    Mutant(  # the stochastic DDTree hands over q one depth off (depth d's nodes weighed against depth d + 1's q)
        "draft_probs_one_depth_off",
        (("specdec/trees/sampled.py", "return tree._replace(max_children=self.effective_topk, draft_probs=probs)",
          "return tree._replace(max_children=self.effective_topk, draft_probs=probs.roll(-1, 1))"),),  # fmt: skip
        ("tests/verify/test_sampled_policies.py", "-k", "carries"),
    ),
    Mutant(  # the auto budget keeps an option's median cost after new times of that option came in
        "auto_cost_kept_stale",
        (("specdec/budget.py", "                self._costs.pop(size, None)\n", ""),),  # fmt: skip
        ("tests/round/test_auto_budget_keys.py", "tests/unit"),
    ),
    Mutant(  # the auto rounds' times in the stats in reverse order
        "auto_budget_ms_reversed",
        (("specdec/generate.py", "            stats.budget_ms.append(ms)\n",
          "            stats.budget_ms.insert(0, ms)\n"),),  # fmt: skip
        ("tests/round/test_auto_budget_keys.py", "-k", "stats_hold"),
    ),
]
MUTANTS += [
    Mutant(  # the top-k threshold one rank too low: the (k + 1)-th largest value, one token too many kept
        "topk_mask_threshold_one_rank_low",
        ((TOPK_MASK_TRITON, "        keep = n >= K\n", "        keep = n >= K + 1\n"),),
        TOPK_MASK_TESTS,
    ),
    Mutant(  # the values tied with the k-th largest removed too (HF keeps every value >= it)
        "topk_mask_ties_removed",
        ((TOPK_MASK_TRITON, "tl.where(ukey < lo.to(tl.uint32), fill, x)", "tl.where(ukey <= lo.to(tl.uint32), fill, x)"),),
        TOPK_MASK_TESTS,
    ),
    Mutant(  # -0.0 not folded onto +0.0: ranked below it, so removed where +0.0 is the k-th largest
        "topk_mask_negative_zero_not_folded",
        ((TOPK_MASK_TRITON, "key = tl.where(bits < 0, -(bits & 0x7FFFFFFF), bits)",
          "key = tl.where(bits < 0, -(bits & 0x7FFFFFFF) - 1, bits)"),),  # fmt: skip
        TOPK_MASK_TESTS,
    ),
    Mutant(  # the padding lanes past V counted as +0.0 scores (V not a power of two)
        "topk_mask_padding_counted",
        ((TOPK_MASK_TRITON, "    ukey = tl.where(inside, ukey, tl.zeros_like(ukey))", "    pass"),),
        TOPK_MASK_TESTS,
    ),
    Mutant(  # the bracket's upper end snapped onto the largest key below the candidate, not one past it
        "topk_mask_upper_end_on_a_key",
        ((TOPK_MASK_TRITON, "hi = tl.where(keep, hi, below.to(tl.int64) + 1)", "hi = tl.where(keep, hi, below.to(tl.int64))"),),
        TOPK_MASK_TESTS,
    ),
]
GROUPED = "specdec/kernels/grouped_linear/triton.py"
GROUPED_TESTS = ("tests/kernels/test_grouped_linear.py", "-m", "interpreter")
MUTANTS += [
    Mutant(  # the third weight's partials read at the second weight's offset in the workspace
        "grouped_linear_third_offset",
        ((GROUPED, "w_ptr, b_ptr, d_ptr, n, local, off = w2_ptr, b2_ptr, d2_ptr, N2, block - C2, N0 + N1",
          "w_ptr, b_ptr, d_ptr, n, local, off = w2_ptr, b2_ptr, d2_ptr, N2, block - C2, N0 + 0"),),  # fmt: skip
        GROUPED_TESTS,
    ),
    Mutant(  # the gated epilogue skips rounding the products to the output dtype before the SiLU
        "gated_linear_products_not_rounded",
        ((GROUPED, "    g = round_to(g, KIND)\n    u = round_to(u, KIND)\n", ""),),
        GROUPED_TESTS,
    ),
    Mutant(  # the reduction sums one split too few
        "grouped_linear_reduce_drops_a_split",
        ((GROUPED, "    for _ in range(0, SPLIT_K):  # in split order: the same sum on every run\n        acc += tl.load(parts",
          "    for _ in range(1, SPLIT_K):  # in split order: the same sum on every run\n        acc += tl.load(parts"),),  # fmt: skip
        GROUPED_TESTS,
    ),
    Mutant(  # a host conversion inside the kernel: the interpreter runs it, the compiler cannot lower it
        "skinny_split_start_on_the_host",
        (("specdec/kernels/skinny_linear/triton.py", "    start = split * (TILES * BLOCK_K)",
          "    start = int(split) * (TILES * BLOCK_K)"),),  # fmt: skip
        ("tests/kernels/test_linear_kernels_compile.py",),
    ),
    Mutant(  # a member's product taken from the group's last launch although its input changed in place since
        "grouped_linear_stale_input",
        (("specdec/kernels/grouped_linear/routing.py",
          "if self._x is x and _version(x) == self._version and self._outs[index] is not None:",
          "if self._x is x and self._outs[index] is not None:"),),  # fmt: skip
        ("tests/kernels/test_grouped_linear.py", "-k", "another_input"),
    ),
    Mutant(  # a drafter's stacked gate / up weight split with its halves swapped (gate taken as up)
        "drafter_gate_up_halves_swapped",
        (("specdec/kernels/grouped_linear/routing.py", "    gate_w, up_w = weight[:half], weight[half:]",
          "    gate_w, up_w = weight[half:], weight[:half]"),),  # fmt: skip
        ("tests/round/test_dflash_static.py", "tests/drafters/test_eagle3.py", "-k", "gated"),
    ),
]
MUTANTS += [Mutant(f"{m.name}/chi2", m.edits, CHI2_TESTS) for m in MUTANTS if m.name in CHI2_VARIANTS]
# Mutants of code that no longer exists in the library in any form (kept here so that they are not re-added):
#   prune_parents_not_remapped: ``prune_depth`` (specdec/trees/paths.py) now lives only in the test oracles
#   (tests/oracles/host_trees.py); the round never prunes a tree.


def copy_repo(dest: Path) -> None:
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, check=True, capture_output=True, text=True,
    ).stdout.split("\0")  # fmt: skip
    for name in filter(None, files):
        src = REPO / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


def apply(dest: Path, edits) -> None:
    for file, old, new in edits:
        path = dest / file
        text = path.read_text()
        count = text.count(old)
        if count != 1:
            raise SystemExit(f"mutation target not found exactly once ({count}x) in {file}: {old!r}; update MUTANTS")
        path.write_text(text.replace(old, new))


def run(mutant: Mutant, zoo: str, stop_first: bool = True) -> tuple[str, int, str, float]:
    """Returns (name, pytest exit code, first failing test or summary, seconds)."""
    start = time.time()
    with tempfile.TemporaryDirectory(prefix=f"mutant-{mutant.name.replace('/', '-')}-") as tmp:
        dest = Path(tmp)
        copy_repo(dest)
        apply(dest, mutant.edits)
        env = {**os.environ, "PYTHONPATH": str(dest), "SPECDEC_ZOO": zoo, "PYTHONDONTWRITEBYTECODE": "1"}
        stop = ["-x"] if stop_first else []
        cmd = [sys.executable, "-m", "pytest", *stop, "-q", "-p", "no:cacheprovider", "--durations=0", *mutant.tests]
        proc = subprocess.run(cmd, cwd=dest, env=env, capture_output=True, text=True)
    failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", proc.stdout, flags=re.M)
    summary = failed[0] if failed else (proc.stdout.strip().splitlines() or ["(no output)"])[-1]
    if len(failed) > 1:
        summary = f"{len(failed)} failed: " + ", ".join(f.split("::")[-1] for f in failed)
    return mutant.name, proc.returncode, summary, time.time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--only", nargs="*", help="mutant names")
    parser.add_argument("--no-baseline", action="store_true")
    parser.add_argument("--all-failures", action="store_true", help="run each subset to the end (no -x)")
    parser.add_argument("--tests", nargs="+", help="run these tests (paths or node ids) instead of each mutant's own")
    args = parser.parse_args()
    unknown = sorted(set(args.only or ()) - {m.name for m in MUTANTS})
    if unknown:
        raise SystemExit(f"unknown mutants {unknown}; choose from {[m.name for m in MUTANTS]}")
    mutants = [m for m in MUTANTS if not args.only or m.name in args.only]
    if args.tests:
        mutants = [Mutant(m.name, m.edits, tuple(args.tests)) for m in mutants]
    zoo = os.environ.get("SPECDEC_ZOO", str((REPO.parent / "shared" / "zoo").resolve()))
    if not args.no_baseline:
        tests = tuple(dict.fromkeys(t for m in mutants for t in m.tests if t.startswith("tests/")))
        name, code, summary, secs = run(Mutant("(none: baseline)", (), tests), zoo)
        print(f"baseline: exit {code}, {summary} ({secs:.0f} s)", flush=True)
        if code != 0:
            raise SystemExit("the unmodified copy fails its tests: fix that first")
    print("| mutant | tests failed | killed? | s |\n|---|---|---|---|", flush=True)
    survived = []
    with ThreadPoolExecutor(args.jobs) as pool:
        for name, code, summary, secs in pool.map(lambda m: run(m, zoo, not args.all_failures), mutants):
            killed = code == 1  # 1 = tests failed; other codes are collection/usage errors
            if not killed:
                survived.append(name)
            print(f"| {name} | {summary if code else '-'} | {'yes' if killed else 'NO'} | {secs:.0f} |", flush=True)
    if survived:
        raise SystemExit(f"mutants not killed: {survived}")


if __name__ == "__main__":
    main()
