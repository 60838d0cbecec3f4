"""The speculative round, written once, and the engine that owns its storage.

One round = drafter proposal -> tree policy -> target forward over the padded tree -> verification rule -> commit
of the target's state (attention K/V and recurrent state) and of the drafter's state: tensor ops with shapes fixed
by the (drafter, tree policy, rule, sampling, span) of the round and no host read, so the same code runs when
called and when replayed from a CUDA graph (optionally under ``torch.compile``): ``specdec.runtime.Captured``
picks how. The host then reads one small tensor (accepted tokens and counts) for EOS, ``max_new_tokens`` and the
streamer. Engines (storage + rounds) are cached per target model and reused across ``generate`` calls while the
target's weights keep their dtype, device and storage (``weights_signature``); a drafter's state and rounds likewise
while its own weights do. See ``docs/round.md``.
"""

from __future__ import annotations

import logging
import operator
import struct
import time
import types
import weakref
from collections.abc import Mapping

import torch
from transformers import DynamicCache

from specdec.attention import AttentionScope, grouped_for
from specdec.distributed import is_dtensor
from specdec.drafters.follow import drafter_modules
from specdec.kernels.grouped_linear.routing import projection_kernel_for
from specdec.kernels.rms_norm.routing import norm_kernel_for
from specdec.kernels.rotary.routing import rotary_kernel_for
from specdec.kernels.round_tail import round_tail
from specdec.kernels.row_gather import embedding_forward, embedding_modules, gather_kernel_for
from specdec.kernels.silu_mul import mlp_kernel_for
from specdec.kernels.skinny_linear.routing import linear_kernel_for
from specdec.kernels.tree_accept import tree_masks, verify_inputs
from specdec.processors import Processors, node_history
from specdec.runtime import Captured, OnModel, compile_fn, compile_key, to_device
from specdec.state.hybrid import HybridState, VerifyRound, adapter_forwards, hybrid_prefill
from specdec.state.recurrent import CommitPlan, DeviceTopology, commit_recurrent, hybrid_reason
from specdec.state.storage import StaticModel, commit_rows, static_reason
from specdec.target import TargetModel, weights_signature, weights_state
from specdec.trees.build import root_trees
from specdec.types import DeviceTree, Proposal, SamplingParams
from specdec.validate import (
    ProtocolError,
    accept_flags,
    check_accept,
    check_proposal,
    check_tree,
    describe_flags,
    proposal_flags,
    sanitized_accept,
    sanitized_tree,
    tree_flags,
    trusted,
)
from specdec.verify.rules import noise_width

__all__ = [
    "PREFILL_BUCKET",
    "PREFILL_CAPTURE_MAX",
    "SPAN_MIN",
    "Engine",
    "Round",
    "capture_reason",
    "prefill_size",
    "round_reason",
    "tree_slots",
    "weights_signature",
]

logger = logging.getLogger(__name__)

PREFILL_BUCKET = 64  # prompts of up to PREFILL_WHOLE tokens are padded to a multiple of this for the captured prefill
PREFILL_WHOLE = 512  # a conversation's next prompt up to this long is prefilled whole (one replay), not extended
PREFILL_COARSE_BUCKET = 256  # longer prompts are padded to a multiple of this
PREFILL_CAPTURE_MAX = 2048  # longer prompts are prefilled eagerly (their compute hides the kernel launches)


def prefill_size(n: int) -> int:
    """The padded length a prompt of ``n`` tokens is prefilled at: a multiple of ``PREFILL_BUCKET`` up to
    ``PREFILL_WHOLE``, of ``PREFILL_COARSE_BUCKET`` past it (at most 14 captured prefills up to the maximum)."""
    bucket = PREFILL_BUCKET if n <= PREFILL_WHOLE else PREFILL_COARSE_BUCKET
    return -(-n // bucket) * bucket
SPAN_MIN = 256  # rounds attend over the first SPAN_MIN * 2**k slots of the storage (one graph per span in use)
_CAPACITY_STEP = 256
_SAMPLES = 8  # elements of a long vector in the reuse fingerprint (besides its norm)
_WHOLE_VECTOR = 1 << 16  # a 1-D weight or buffer of up to this many elements enters the fingerprint whole
SINGLE_RESERVE = 4096  # slots a single-sequence engine holds at least (capped by the target's positions)


def round_reason(target: TargetModel, drafter, tree) -> str | None:
    """None when the round can run ``target`` with ``drafter`` and ``tree``, else what stands in the way."""
    name = type(target.model).__name__
    state = target.state
    if isinstance(state, HybridState) and state.mode != "exact":
        return (
            f"{name}: hybrid_mode={state.mode!r} is not a round of its own (the round verifies recurrent layers "
            "exactly through their adapters, any tree, any budget); use hybrid_mode='exact'. specdec.state.snapshot "
            "and restore remain available for HF caches"
        )
    if getattr(target, "hybrid_mode", "exact") != "exact":  # a target without recurrent layers: the mode means nothing
        return (
            f"{name}: hybrid_mode={target.hybrid_mode!r} is not a round of its own, and this target has no recurrent "
            "layers; use hybrid_mode='exact' (the default)"
        )
    reason = hybrid_reason(state, target.device, needs_kernels=False) or static_reason(target)
    if reason is not None:
        return f"{name}: {reason}"
    if drafter is not None:
        wanted = set(getattr(tree, "reads", ()))
        if wanted == {"candidates"} and "candidates" not in drafter.provides:
            from specdec.trees.dynamic import CANDIDATE_DRAFTERS

            return (
                f"{tree!r} reranks a candidate tree that the drafter drafts itself; {type(drafter).__name__} proposes "
                f"{sorted(drafter.provides)}. Drafters that draft candidate trees: {', '.join(CANDIDATE_DRAFTERS)}; "
                "with this drafter use DDTree(budget) or Chain(k)"
            )
        if not wanted & set(drafter.provides):
            return (
                f"{type(tree).__name__} builds from {sorted(wanted)} but {type(drafter).__name__} proposes "
                f"{sorted(drafter.provides)}; pick a tree policy that reads what the drafter proposes"
            )
    return None


def capture_reason(target: TargetModel) -> str | None:
    """None when the round of ``target`` can be replayed from a CUDA graph on its device, else why not."""
    if target.device.type != "cuda":
        return f"the target is on {target.device.type}, CUDA graphs need a CUDA device"
    return hybrid_reason(target.state, target.device, needs_kernels=True)


def tree_slots(drafter, tree) -> int:
    """Slots a round of ``drafter`` with ``tree`` needs past the root's position (tree slots and draft window)."""
    if drafter is None:
        return 1
    return max(tree.budget + 1, drafter.window(tree))


class Round:
    """The speculative round for a fixed (drafter, tree policy, verification rule, sampling, span) on an engine.

    The target and the DFlash drafter attend over the first ``span`` slots of the static storage only (the
    committed prefix, the tree and the block must fit); ``generate`` picks the smallest span bucket that holds the
    round, so attention and masks cost in proportion to the sequence, not to the storage's capacity.
    """

    def __init__(
        self,
        engine: Engine,
        drafter,
        state,
        tree,
        rule,
        sampling: SamplingParams,
        graph: bool,
        compile: bool | str | Mapping,
        span: int | None = None,
        processors: Processors | None = None,
        keep_logits: bool = False,
    ) -> None:
        self.engine, self.drafter, self.state, self.tree, self.rule = engine, drafter, state, tree, rule
        self.sampling = sampling
        self.span = span or engine.capacity
        self.keys = engine.target.keys[: self.span]
        device = engine.device
        self.depth = 0 if drafter is None else drafter.draft_depth(tree)
        self.slots = 1 if drafter is None else tree.budget + 1
        self.path_len = self.depth + 1
        self.taps = getattr(drafter, "target_layer_ids", None)
        # a policy of budget 0 (``RootOnly``): plain decoding that still commits to the drafter, no proposal
        self.proposes = drafter is not None and tree.budget > 0
        self.draft_forwards = drafter.forwards_per_round(tree) if self.proposes else 0
        batch = self.batch = engine.batch
        # an adaptive policy's round (``DDTree(budget="auto")``): its expectations, whatever the policy computes from
        # the proposal (``tree.expectations``), ride in the round's one output copy (float64 bits in int64 columns)
        expect = tuple(getattr(tree, "expect_sizes", ())) if self.proposes else ()
        self.expect_sizes = expect
        # per sequence: the accepted tokens (drafts + bonus), the accepted count, the real tree nodes, the protocol
        # bitmask of a policy or rule not specdec's own (specdec.validate; 0 = sound), then the expectations
        self.fields = self.path_len + 3
        self.out = torch.zeros(batch, self.fields + len(expect), dtype=torch.long, device=device)
        self.expect = self.out[:, self.fields :].view(torch.float64)  # a view: written inside the round
        # a drafter of the user's: its proposal's shapes on the host, and the tree built from it on the device
        self.check_proposal = self.proposes and not trusted(drafter)
        self.check_tree = self.proposes and (not trusted(tree) or self.check_proposal)
        self.check_rule = drafter is not None and not trusted(rule)
        vocab = engine.target.target.vocab_size
        uses_noise = rule.uses_noise(sampling)
        width = noise_width(rule, vocab)  # [B, S, V], or the few uniforms per slot a rule reads
        # filled from the call's generator at each launch: made without drawing, so building a round consumes none
        # of the global generator's numbers (a call seeded with torch.manual_seed then samples as the next one does)
        self.noise = torch.zeros(batch, self.slots, width, device=device) if uses_noise else None
        stochastic = drafter is not None and getattr(tree, "stochastic", False)
        self.tree_noise = torch.zeros(batch, self.depth, vocab, device=device) if stochastic else None
        # HF's logits processors at every node, each with the node's own history (``specdec.processors``); the
        # committed tokens are then recorded in ``engine.history`` as the round commits them
        self.processors = processors or Processors()
        self.records = self.processors.needs_history
        self.steer = self.processors.captured()  # applied to a drafter's per-depth q before the tree is built
        self.out[:, self.path_len : self.path_len + 2] = 1  # plain decoding: one path node, one tree node
        # ``output_scores`` / ``output_logits``: the raw target logits at the accepted path's nodes (node i chose the
        # path's new token i), fp32, copied to the host with the tokens
        self.keep_logits = keep_logits
        self.kept = torch.zeros(batch, self.path_len, vocab, device=device) if keep_logits else None
        self.host_kept = (torch.zeros(2, batch, self.path_len, vocab, pin_memory=device.type == "cuda")
                          if keep_logits else None)  # fmt: skip
        # Two host copies of ``out`` so that the next round can be launched before this one is read.
        cuda = device.type == "cuda"
        self.host = torch.zeros(2, *self.out.shape, dtype=torch.long, pin_memory=cuda)
        self.warm = [True, True]  # per ticket: whether its launch ran as usual (``Captured.warm``)
        self.ready = [torch.cuda.Event() for _ in range(2)] if cuda else None
        # every round is timed on the device (two events): an adaptive policy's options include the rounds of
        # plain decoding without a drafter
        self.timing = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                       for _ in range(2)] if cuda else None  # fmt: skip
        self.elapsed_ms = [0.0, 0.0]
        self.launch_ms = [0.0, 0.0]  # per ticket: the host time its launch took (on the CPU, the round itself)
        self.expected: list[list[float]] | None = None  # of the round read last
        self.logits: torch.Tensor | None = None  # ``keep_logits``: the path's raw logits of the round read last
        self.launched = 0
        self.hybrid = engine.target.target.state if isinstance(engine.target.target.state, HybridState) else None
        fn = self._ar_round if drafter is None and self.hybrid is None else self._round
        self.compile = compile
        self.captured = Captured(
            compile_fn(fn, compile) if compile else fn,
            device=device,
            graph=graph,
            snapshot=self._snapshot,
            scope=engine.attention_scope(state, compiled=bool(compile)),
            uncompiled=fn if compile else None,
        )

    # -- the round (tensor ops only) ----------------------------------------------------------------------
    def _build(self) -> tuple[DeviceTree, Proposal | None]:
        """Drafter proposal -> tree policy: the trees ``[B, slots]`` and the proposal."""
        engine = self.engine
        if not self.proposes:
            return root_trees(engine.root), None
        topk = getattr(self.tree, "candidate_topk", None)  # a policy over the drafter's own candidate tree
        if topk is not None:
            proposal = self.state.propose_tree(engine.root, engine.prefix, self.depth, topk, self.span)
        else:
            proposal = self.state.propose(engine.root, engine.prefix, self.depth, self.span)
        if self.check_proposal:
            check_proposal(self.drafter, proposal, self.batch, engine.target.target.vocab_size)
        if self.steer and proposal.logq is not None:  # the draft steered away from what the processors forbid
            generated = engine.prefix + 1 - engine.prompt_len
            logq = self.steer.steer(proposal.logq, engine.history[:, : self.span], engine.prefix, engine.root,
                                    generated)  # fmt: skip
            proposal = proposal._replace(logq=logq)
        if self.expect_sizes:  # an adaptive policy's round: its expectations too (in one pass where it can)
            both = getattr(self.tree, "build_expecting", None)
            if callable(both):
                tree, expected = both(proposal, engine.root, self.depth, self.tree_noise)
            else:
                tree, expected = self.tree.build(proposal, engine.root, self.depth, self.tree_noise), None
            self.expect.copy_(self.tree.expectations(proposal) if expected is None else expected)
            return tree, proposal
        return self.tree.build(proposal, engine.root, self.depth, self.tree_noise), proposal

    def _process(self, logits: torch.Tensor, tree: DeviceTree) -> torch.Tensor:
        """The call's logits processors at every node of ``tree``, each with that node's own history."""
        if not self.processors:
            return logits
        engine = self.engine
        generated = engine.prefix + 1 - engine.prompt_len  # [B] tokens generated before the root's choice
        # the caller's left padding only for processors that read on the host (a captured round keeps no per-call
        # tensor): a user's processor sees HF's input_ids as they are
        pad = None if self.processors.capturable else engine.left_pad
        nodes = node_history(engine.history[:, : self.span], engine.prefix, tree, generated, self.path_len, pad)
        return self.processors(logits, nodes)

    def _record(self, tokens: torch.Tensor | None = None, tree: DeviceTree | None = None, path=None) -> None:
        """The path ``tokens [B, P]`` (or the tokens of ``tree`` at the nodes ``path``, gathered only when recorded)
        at slots ``prefix ..`` of ``engine.history``: the accepted ones become committed tokens, the rest lands past
        them (where the next commit writes again)."""
        if not self.records:
            return
        if tokens is None:
            tokens = tree.tokens.gather(1, path)
        engine = self.engine
        slots = engine.prefix[:, None] + torch.arange(tokens.shape[1], device=tokens.device)
        engine.history.scatter_(1, slots.clamp(max=engine.history.shape[1] - 1), tokens)

    def _ar_round(self) -> None:
        """Plain decoding: the root alone, no tree, no commit (its K/V already sits at slot ``prefix``)."""
        engine, target = self.engine, self.engine.target
        prefix = engine.prefix  # [B]
        mask = target.additive_mask((self.keys <= prefix[:, None])[:, None])  # [B, 1, 1, span]
        # the committed prefix is flat; the step reads it and its own slot (int64 as it is: the kernel reads either)
        logits, _ = target.forward(engine.root[:, None], prefix[:, None], mask, prefix[:, None], span=self.span,
                                   flat=prefix, lengths=prefix + 1)  # fmt: skip
        tree = root_trees(engine.root)
        accept = self.rule.accept(tree, self._process(logits, tree), self.sampling, self.noise, 0, None)
        if self.kept is not None:
            self.kept.copy_(logits[:, :1])
        self._record(engine.root[:, None])
        # out[:, 0] = the token; the root advances to it and the length by one where active (one launch on CUDA)
        round_tail(self.out, accept.tokens[:, :1], engine.active, engine.root, prefix)

    def _verify(self, tree: DeviceTree):
        """The target forward over the trees (``slots`` nodes per sequence) on top of each committed prefix; returns
        (logits ``[B, slots, V]``, taps or None, the hybrid ``VerifyRound`` or None). Writes only the K/V rows of the
        tree's slots (and the adapters' stash): until a commit, a repeat of it computes the same."""
        engine, target = self.engine, self.engine.target
        prefix = engine.prefix  # [B]
        # Node i of sequence b sits at slot prefix[b] + i and position prefix[b] + depth[b, i]; it sees the committed
        # prefix and its ancestors; padding nodes see only themselves (one Triton launch for the batch on CUDA).
        # With the mask come each node's position and key slot and each sequence's read length (one launch on CUDA).
        mask, positions, write_index, lengths = verify_inputs(tree.parents, tree.valid, tree.depth, prefix, self.span,
                                                              self.depth, target.target.dtype)  # fmt: skip
        args = (tree.tokens, positions, mask, write_index, self.taps)
        # the committed prefix is flat: every real node sees it whole, padding sees none of it; nothing past the
        # tree's last slot is read
        kw = {"span": self.span, "flat": prefix, "lengths": lengths}  # int64: the kernel reads either
        if self.hybrid is None:
            return (*target.forward(*args, **kw), None)
        # recurrent mixers run through their adapters over the device topology
        rnd = VerifyRound(model=target.target.model, cache=target.cache, tree=None, prefix_len=0,
                          topo=DeviceTopology(tree, chain=not self.tree.branching if self.tree else True))  # fmt: skip
        with adapter_forwards(self.hybrid.adapters, rnd):
            logits, hidden = target.forward(*args, **kw)
        return logits, hidden, rnd

    def _round(self) -> None:
        engine, target = self.engine, self.engine.target
        prefix = engine.prefix  # [B]
        tree, proposal = self._build()
        vocab = engine.target.target.vocab_size
        flags = None
        if tree.draft_probs is not None and not trusted(self.tree):  # q for the rules: from specdec's policies only
            tree = tree._replace(draft_probs=None)
        if self.check_tree:
            check_tree(self.tree, tree, self.batch, self.slots)
            flags = tree_flags(tree, vocab, engine.root)
            if self.check_proposal:  # a user's drafter: its scores must be log-probabilities
                flags = flags | proposal_flags(proposal, self.batch, flags.device)
            tree = sanitized_tree(tree, vocab, self.depth)  # the round runs to its read, which raises
        raw, hidden, rnd = self._verify(tree)
        logits = self._process(raw, tree)
        accept = self.rule.accept(tree, logits, self.sampling, self.noise, self.depth, proposal)
        if self.check_rule:
            check_accept(self.rule, accept, self.batch, self.path_len)
            bad = accept_flags(accept, tree, vocab)
            flags = bad if flags is None else flags | bad
            accept = sanitized_accept(accept, vocab, self.slots)
        if flags is not None:
            self.out[:, self.path_len + 2] = flags
        if self.kept is not None:  # the raw logits of the path's nodes: [B, P, V]
            self.kept.copy_(raw.gather(1, accept.path[..., None].expand(-1, -1, raw.shape[-1])))
        if self.depth:
            commit_rows(target.storage.kv, prefix, accept.path)
        # a round whose protocol check failed commits nothing its rows read later (its read raises): the committed
        # length, root and recurrent state stay; rows it wrote past the committed length are rewritten later
        sound = None if flags is None else flags == 0
        active = engine.active if sound is None else engine.active & sound
        if self.hybrid is not None:
            plan = CommitPlan(accept.path, accept.num_path, keep=sound)  # shared by the layers: built once
            for adapter in self.hybrid.adapters:
                commit_recurrent(adapter, rnd, accept.path, accept.num_path, plan=plan)
        if self.state is not None:
            self.state.commit(accept, hidden, prefix)
        self._record(tree=tree, path=accept.path)
        # the tokens, the path's length and the tree's size into the output row; the last accepted token becomes the
        # root and the length advances by the path, where active: a finished sequence (``active`` False) keeps its
        # root and length, its rounds commit nothing it reads (one launch on CUDA)
        round_tail(self.out, accept.tokens, active, engine.root, prefix, accept.num_path, tree.num_nodes)

    def _snapshot(self):
        """Save the decode state before the warm-up runs; returns the function that puts it back."""
        engine = self.engine
        prefix, root = engine.prefix.clone(), engine.root.clone()
        # Attention K/V and drafter rows are rewritten at the same slots by the next run; recurrent states are not.
        states = [t for layer in engine.target.recurrent.values() for t in (layer.conv_states, layer.recurrent_states)]
        saved = [t.clone() for t in states]

        def restore() -> None:
            engine.prefix.copy_(prefix)
            engine.root.copy_(root)
            for t, s in zip(states, saved, strict=True):
                t.copy_(s)

        return restore

    # -- host side ---------------------------------------------------------------------------------------
    def take_setup_ms(self) -> tuple[float, float]:
        """(compile, capture) in ms spent by this round since the last call: with ``compile``, its first run
        (captured rounds: the first warm-up run; uncaptured ones, e.g. on CPU: the first call) counts as compile
        time and the rest of the warm-up and capture as capture time; without, all of it is capture time (zero
        when the round is not captured)."""
        cap = self.captured
        first, rest = cap.first_run_s * 1e3, cap.capture_s * 1e3
        if cap.first_call_uncaptured and not self.compile:  # an uncaptured, uncompiled first call: no setup
            first = 0.0
        out = (first, rest) if self.compile else (0.0, first + rest)
        cap.first_run_s = cap.capture_s = 0.0
        return out

    def prepare(self) -> None:
        """Capture the round now, without running it (CUDA graphs: its warm-up runs are undone by the snapshot, the
        captured run changes nothing); nothing to do where it is not captured. An adaptive policy's loop prepares
        every size of a span bucket when it first meets that bucket, so that no later choice captures."""
        cap = self.captured
        if cap.use_graph and cap.graph is None:
            with cap.scope:
                cap.capture()  # as a first call does: where it fails, the round runs eagerly

    def launch(self, generator: torch.Generator | None, stream=None) -> int:
        """Enqueue one round (after any launched before) and the copy of its result to the host; no host wait.

        Returns the ticket to pass to :meth:`read`. At most two rounds may be launched and not yet read. ``stream``:
        the current CUDA stream, if the caller has it (asking for it costs more host time than recording an event).
        """
        entered = time.perf_counter()
        if self.ready is not None and stream is None:
            stream = torch.cuda.current_stream(self.engine.device)
        if self.noise is not None:
            self.noise.uniform_(generator=generator)
        if self.tree_noise is not None:
            self.tree_noise.uniform_(generator=generator)
        slot = self.launched % 2
        self.warm[slot] = self.captured.warm
        if self.timing is not None:
            self.timing[slot][0].record(stream)
        start = time.perf_counter()
        self.captured()
        if self.timing is not None:
            self.timing[slot][1].record(stream)
        else:  # the CPU runs the round before returning
            self.elapsed_ms[slot] = (time.perf_counter() - start) * 1e3
        self.launched += 1
        self.host[slot].copy_(self.out, non_blocking=True)
        if self.kept is not None:
            self.host_kept[slot].copy_(self.kept, non_blocking=True)
        if self.ready is not None:
            self.ready[slot].record(stream)
        self.launch_ms[slot] = (time.perf_counter() - entered) * 1e3
        return slot

    def elapsed(self, ticket: int) -> float | None:
        """The device time in ms of a round already read (its timing events; on the CPU the call's wall time); None
        for a round whose launch captured its graph or replayed it for the first time (not its usual cost). Asked
        only by an adaptive policy's loop, so the other loops pay no event query per round."""
        if not self.warm[ticket]:
            return None
        if self.timing is not None:
            return self.timing[ticket][0].elapsed_time(self.timing[ticket][1])
        return self.elapsed_ms[ticket]

    def read(self, ticket: int) -> list[tuple[list[int], int]]:
        """Wait for a launched round; returns per sequence (new tokens: accepted drafts + bonus, number of real tree
        nodes)."""
        if self.ready is not None:
            self.ready[ticket].synchronize()
        if self.drafter is not None:
            self.drafter.num_forwards += self.draft_forwards
        rows, flags = [], 0
        host = self.host[ticket].tolist()  # the round's one read: its pinned copy, whole
        for out in host:
            num_path = out[self.path_len]
            rows.append((out[:num_path], out[self.path_len + 1]))
            flags |= out[self.path_len + 2]
        if flags:
            raise ProtocolError(describe_flags(flags, self.tree, self.rule, self.drafter))
        # ``DDTree(budget="auto")``: the round's expectations, float64 bits in the same copy's last int64 columns
        width = len(self.expect_sizes)
        self.expected = ([list(struct.unpack(f"{width}d", struct.pack(f"{width}q", *out[self.fields :])))
                          for out in host] if width else None)  # fmt: skip
        # ``output_scores`` / ``output_logits``: the raw logits of the path's nodes, [B, P, V] on the host
        self.logits = self.host_kept[ticket].clone() if self.kept is not None else None
        return rows

    def __call__(self, generator: torch.Generator | None) -> list[tuple[list[int], int]]:
        """Run one round and read it."""
        return self.read(self.launch(generator))


class _Prefill:
    """The prompt forward padded to ``size`` tokens (one captured graph per size and drafter on an engine).

    Each sequence's prompt sits at slots ``0 .. n_b - 1`` (its own positions from 0, as left padding gives HF);
    padding tokens sit after it, so causal attention keeps them out of every prompt row; their K/V and drafter
    context rows land in slots past the prompt, which rounds mask out until they overwrite them.

    Hybrid targets run the prompt as a verify round over a chain tree: the ``n_b`` prompt tokens form a chain from
    slot 0, padding slots are single-node roots (they read the empty state and see only themselves), the tree
    scans of ``specdec.kernels`` run the recurrent layers, and the commit replays the chain from the zero state
    into the static conv windows and recurrent states. The recurrent state never sees a padding token.
    """

    def __init__(self, engine: Engine, drafter, static, size: int, graph: bool) -> None:
        device, batch = engine.device, engine.batch
        self.engine, self.drafter, self.static = engine, drafter, static
        self.taps = getattr(drafter, "target_layer_ids", None)
        self.size = size
        self.ids = torch.zeros(batch, size, dtype=torch.long, device=device)
        self.last = torch.zeros(batch, dtype=torch.long, device=device)  # each prompt's last row (its logits kept)
        self.positions = torch.arange(size, device=device)
        state = engine.target.target.state
        self.hybrid = state if isinstance(state, HybridState) else None
        if self.hybrid is None:
            self.mask = engine.target.causal_mask(self.positions, span=size)  # the prompt attends within itself
        else:
            self.length = torch.zeros(batch, dtype=torch.long, device=device)
        self.logits: torch.Tensor | None = None
        self.captured = Captured(
            self._run, device=device, graph=graph, pool=engine.graph_pool, scope=engine.attention_scope(static)
        )

    def _run(self) -> None:
        target = self.engine.target
        if self.hybrid is None:
            positions = self.positions[None].expand(self.ids.shape[0], -1)
            logits, hidden = target.forward(
                self.ids, positions, self.mask, self.positions, self.taps, rows=self.last, span=self.size
            )
        else:
            logits, hidden = self._run_chain()
        self.logits = logits[:, 0]  # [B, V]
        if self.static is not None:
            self.static.prefill(self.ids, hidden)

    def _run_chain(self):
        """Hybrid prompt forward: a verify round of the chain tree of each prompt, then its commit."""
        target, slots, n = self.engine.target, self.positions, self.length
        for layer in target.recurrent.values():  # a new sequence starts from the empty state
            layer.conv_states.zero_()
            layer.recurrent_states.zero_()
        batch = self.ids.shape[0]
        real = slots < n[:, None]  # [B, size]
        tree = DeviceTree(
            tokens=self.ids,
            parents=torch.where(real, slots - 1, -1),
            depth=torch.where(real, slots, 0),
            valid=real,
            num_nodes=n,
        )
        keys = target.keys[None, None, : self.size]
        visible = (keys <= slots[:, None]) & real[:, :, None] | (keys == slots[:, None])  # [B, size, size]
        rnd = VerifyRound(model=target.target.model, cache=target.cache, tree=None, prefix_len=0,
                          topo=DeviceTopology(tree), prompt=True)  # fmt: skip
        positions = slots[None].expand(batch, -1)
        with adapter_forwards(self.hybrid.adapters, rnd):
            logits, hidden = target.forward(
                self.ids, positions, target.additive_mask(visible), slots, self.taps, rows=self.last, span=self.size
            )
        for adapter in self.hybrid.adapters:
            commit_recurrent(adapter, rnd, positions, n)
        return logits, hidden

    def __call__(self, prompts: torch.Tensor, lengths: list[int]) -> torch.Tensor:
        """Prefill ``prompts [B, n]`` (n <= size; sequence b's tokens are its first ``lengths[b]``); returns the
        logits ``[B, V]`` at each sequence's last prompt position."""
        n = prompts.shape[1]
        self.ids[:, :n].copy_(prompts)
        self.ids[:, n:].zero_()
        self.last.copy_(to_device(lengths, self.last.device) - 1)
        if self.hybrid is not None:
            self.length.copy_(self.last + 1)
        self.captured()
        return self.logits


class Engine:
    """Static storage, captured rounds and decode state of one target model and batch size (cached across calls).

    Use :meth:`for_target` to get the engine of a target; ``generate`` does this.
    """

    _engines = OnModel("_specdec_engines")  # model -> {batch: Engine}, kept on the model: freed with it

    def __init__(self, target: TargetModel, capacity: int, batch: int = 1, signature: tuple | None = None) -> None:
        self.device, self.batch = target.device, batch
        # the target's weights this engine was built for (``weights_signature``): another one makes it stale
        self.signature = weights_signature([target.model]) if signature is None else signature
        self.target = StaticModel(target, capacity, batch)
        self.prefix = torch.zeros(batch, dtype=torch.long, device=self.device)  # each sequence's committed length
        self.root = torch.zeros(batch, dtype=torch.long, device=self.device)
        self.prompt_len = torch.zeros(batch, dtype=torch.long, device=self.device)
        self.left_pad: tuple[torch.Tensor, torch.Tensor] | None = None  # this call's left padding (NodeHistory.pad)
        self.active = torch.ones(batch, dtype=torch.bool, device=self.device)  # False: finished, commits nothing
        # each sequence's committed tokens (prompt, then what rounds with history-reading processors committed)
        self.history = torch.zeros(batch, capacity, dtype=torch.long, device=self.device)
        self._drafters: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._drafter_signatures: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # of their own weights
        self._rounds: dict = {}
        self._prefills: dict = {}
        self._scopes: dict = {}  # attention_scope's scopes by their settings (making one walks every module)
        # rounds and captured prefills built on this engine: each is a graph key (one CUDA graph, or one compiled
        # shape, once run); ``SpecStats.captures`` counts a call's new ones
        self.rounds_built = self.prefills_built = 0
        self._controllers: dict = {}  # an adaptive policy's controller per (drafter, policy): its costs persist
        # A single-sequence engine keeps what its last call left in storage: the tokens whose K/V (and recurrent
        # state) are valid, and the drafter whose state follows them; a call whose prompt extends them prefills only
        # the rest (``reusable`` / ``extend``).
        self.kept: torch.Tensor | None = None  # [n] on the device
        self.kept_drafter = None  # weakref of that drafter (None: plain decoding)
        self.kept_versions = 0
        self.kept_weights: torch.Tensor | None = None  # the target's weights' fingerprint at that call
        # the fingerprint the current call's ``reusable`` took (None: it took none): ``keep`` stores it instead of
        # reading every weight again (a call updates no weight); ``generate`` clears it as a call starts
        self.call_weights: torch.Tensor | None = None
        self.call_modules: int | None = None  # this call's ``_module_signature`` once read (``note_modules``)
        self.kept_modules: int | None = None  # the target's hooks and plain module attributes at that call
        self._params: list | None = None  # the target's parameters, listed once
        self._plan: tuple | None = None  # (weights signature, the fingerprint's tensors and sampled views)
        self._modules_plan: list | None = None  # ``_module_plan``
        self._sharded = False  # some of them are DTensor shards (tensor parallel)
        self._drafter_versions = (lambda: None, 0)  # (weakref of a drafter, its update counters read this call)
        self.graph_pool = torch.cuda.graph_pool_handle() if self.device.type == "cuda" else None  # prefill graphs

    @property
    def capacity(self) -> int:
        return self.target.capacity

    @classmethod
    def for_target(cls, target: TargetModel, *, capacity: int, batch: int = 1, drafter=None) -> Engine:
        """The cached engine of ``target.model`` for ``batch`` sequences if it holds ``capacity`` slots and the
        target's weights kept their dtype, device and storage since it was built, else a new one (every engine of a
        target whose weights changed is dropped). The state and rounds kept for ``drafter`` are dropped too if its
        own weights changed since their last call."""
        signature = target.signature if target.signature is not None else weights_signature([target.model])
        engines = cls._engines.setdefault(target.model, {})
        if any(engine.signature != signature for engine in engines.values()):
            logger.info("specdec: the target was cast or moved; its static storage and rounds are rebuilt")
            engines.clear()  # free the old storage first
        engine = engines.get(batch)
        if engine is None or engine.capacity < capacity:
            need = -(-capacity // _CAPACITY_STEP) * _CAPACITY_STEP
            if batch == 1:  # a conversation continues in place (``reusable``): room for later turns up front
                limit = target.max_length or SINGLE_RESERVE
                need = max(need, min(SINGLE_RESERVE, -(-limit // _CAPACITY_STEP) * _CAPACITY_STEP))
            if engine is not None:
                need = max(need, engine.capacity)
                logger.info("specdec: reallocating static storage for %d slots", need)
                engines.pop(batch)  # free the old storage first
                del engine
            engine = cls(target, need, batch, signature)
            engines[batch] = engine
        engine.target.target = target
        if engine.target.rope.refresh():  # the target's rotary frequencies were rewritten since the last call
            logger.info("specdec: the target's rotary frequencies changed; its position tables were remade")
        engine._check_drafter(drafter)
        return engine

    @classmethod
    def forget(cls, target: TargetModel) -> None:
        """Drop the engines of ``target.model`` (their storage is rebuilt on next use, e.g. after a move)."""
        cls._engines.pop(target.model, None)

    def _check_drafter(self, drafter) -> None:
        """Drop ``drafter``'s state, rounds and prefills on this engine if its own weights were cast, moved or
        reallocated since they were built (``weights_signature``)."""
        if drafter is None:
            return
        signature, versions = weights_state(drafter_modules(drafter))
        self._drafter_versions = (weakref.ref(drafter), versions)  # this call's: a call updates no weight
        if self._drafter_signatures.get(drafter, signature) != signature:
            logger.info("specdec: the drafter was cast or moved; its state and rounds are rebuilt")
            self._drafters.pop(drafter, None)
            self._rounds = {key: rnd for key, rnd in self._rounds.items() if rnd.drafter is not drafter}
            self._prefills = {key: pre for key, pre in self._prefills.items() if pre.drafter is not drafter}
            self._controllers = {key: c for key, c in self._controllers.items() if key[0] != id(drafter)}
        self._drafter_signatures[drafter] = signature

    def controller_for(self, drafter, tree, make):
        """The controller of an adaptive policy (``tree.controller``, ``make(batch)``) for ``drafter`` on this engine:
        made on first use, kept across calls (its measured round costs and calibration are this target's, batch
        bucket's and device's, so later calls do not measure every size again) and ``resume()``-d at each call."""
        key = (id(drafter), tree)
        ctrl = self._controllers.get(key)
        if ctrl is None:
            ctrl = make(self.batch)
            self._controllers[key] = ctrl
        elif callable(getattr(ctrl, "resume", None)):
            ctrl.resume()
        return ctrl

    def _static(self, drafter):
        """The drafter's state on this engine (made on first use, refreshed on reuse)."""
        if drafter is None:
            return None
        static = self._drafters.get(drafter)
        if static is None:
            static = drafter.attach(self.target.target, self.capacity, self.batch)
            self._drafters[drafter] = static
        else:
            static.refresh()
        return static

    def keep(self, tokens: torch.Tensor, drafter) -> None:
        """After a single-sequence call whose row is ``tokens`` (``[n]`` on the device: prompt + output): remember
        them, and the drafter, so that the next call can tell whether its prompt continues them (``reusable``).
        Nothing is read here: how many of them the storage holds (the committed length) is read by that check."""
        self.kept = tokens
        self.kept_drafter = None if drafter is None else weakref.ref(drafter)
        self.kept_versions = self._versions(drafter)
        self.kept_weights = self._fingerprint() if self.call_weights is None else self.call_weights
        self.call_weights = None
        self.kept_modules = self._module_signature() if self.call_modules is None else self.call_modules
        self.call_modules = None

    def note_modules(self) -> None:
        """Read this call's module signature for ``keep`` now (a call changes no module): the host reads it while
        the device runs the prefill instead of after the last round."""
        if self.call_modules is None:
            self.call_modules = self._module_signature()

    def _fingerprint(self) -> torch.Tensor:
        """``[N]`` float64, on the device (launched, not read): the norm of each of the target's floating parameters
        and buffers, then elements of each: of a matrix (a tensor of 2 or more dims as ``[shape[0], -1]``) a
        wrapping diagonal (``flat[c::cols - 1]``: one element of every row, at shifting columns) and one whole row,
        of a vector of up to ``_WHOLE_VECTOR`` elements all of them, of a longer one a few at evenly spread places.
        An edit that the update counters miss (through ``.data``, as adapter merges write; a buffer such as a
        rotary ``inv_freq`` rewritten) changes it, so the kept K/V is not reused with weights it was not computed
        with: the norms see a scaled or replaced tensor, the elements one whose norm an edit kept (two rows of a
        matrix swapped, which the diagonal sees unless they agree at its columns, or two columns, which the row
        sees; a row's sign flipped; any edit of a norm's weight). It reads every
        weight once: one fused multi-tensor pass per dtype (a list of mixed dtypes takes the per-tensor path, one
        launch per tensor) and two gathers of the elements per dtype (the rows and vectors, contiguous, in one
        batched copy; the strided diagonals and samples one copy each, one per tensor as before the rows were
        added), through views listed once per weight layout (``_fingerprint_plan``)."""
        groups, samples = self._fingerprint_plan()
        with torch.no_grad():  # float64 sums: no narrowing of any float dtype, and an edit's change is not rounded away
            parts = [torch.stack(torch._foreach_norm(group, 2, dtype=torch.float64)) for group in groups]
            parts += [torch.cat(views).double() for views in samples]
            return torch.cat(parts)

    def _fingerprint_plan(self) -> tuple[list[list[torch.Tensor]], list[list[torch.Tensor]]]:
        """The fingerprint's tensors grouped by dtype, and per dtype the views of each one's sampled elements: made
        once per weight layout (the target's ``signature``: every parameter's and buffer's address, dtype and device;
        a tensor replaced or moved gives another), since listing them walks every module and tensor."""
        target = self.target.target
        key = target.signature
        if key is not None and self._plan is not None and self._plan[0] == key:
            return self._plan[1]
        if self._params is None:  # this engine's target keeps its parameters (a replaced one gets another engine)
            params = [p for p in target.model.parameters() if p.is_floating_point()]
            self._sharded = any(is_dtensor(p) for p in params)
            # a tensor-parallel target: each rank's own shard (the ranks' verdicts are combined in ``reusable``)
            self._params = [p.to_local() if is_dtensor(p) else p for p in params]
        buffers = [b for b in target.model.buffers() if b.is_floating_point() and not is_dtensor(b)]
        groups: dict[torch.dtype, list[torch.Tensor]] = {}
        # per (dtype, contiguous): the gather copies contiguous views in one batched launch, strided ones one by one
        samples: dict[tuple[torch.dtype, bool], list[torch.Tensor]] = {}
        for i, t in enumerate(self._params + buffers):
            groups.setdefault(t.dtype, []).append(t)
            if t.is_contiguous() and t.numel():
                flat = t.view(-1)
                strided, whole = samples.setdefault((t.dtype, False), []), samples.setdefault((t.dtype, True), [])
                if t.dim() >= 2 and t[0].numel() >= 2:  # a matrix [rows, cols] (the trailing dims flattened)
                    rows, cols = t.shape[0], t[0].numel()
                    # a wrapping diagonal, one element a row (every row, at shifting columns: a permutation of
                    # rows), and one whole row (every column: a permutation of columns)
                    strided.append(flat[(i * 7919) % cols :: cols - 1])
                    whole.append(flat.view(rows, cols)[(i * 104729) % rows])
                elif flat.numel() <= _WHOLE_VECTOR:  # a norm's weight, a bias: every element
                    whole.append(flat)
                else:
                    step = max(1, flat.numel() // _SAMPLES)
                    strided.append(flat[(i * 7919) % step :: step][:_SAMPLES])
        plan = (list(groups.values()), [views for views in samples.values() if views])
        self._plan = (key, plan) if key is not None else None
        return plan

    def _module_signature(self) -> int:
        """A hash of what the target's forward depends on besides its tensors: each module's hooks and its plain
        attributes (numbers, flags, strings, None: an ``eps``, a scaling), which buffers and submodules it holds, and
        how many attributes it has. A hook added, an attribute set or changed, a submodule swapped between calls
        means the kept K/V was computed by another forward. The modules and the names of their plain attributes are
        listed once (``_module_plan``) and listed again when a module's submodules, its attributes or their kinds
        changed: each call then reads the attributes by name instead of scanning every module's ``__dict__``."""
        for _ in range(2):
            plan = self._module_plan()
            try:
                parts = []
                for module, get, count, children in plan:
                    own = module.__dict__
                    kids = tuple(map(id, module._modules.values()))
                    if len(own) != count or kids != children:
                        raise LookupError  # an attribute added or removed, a submodule swapped: list again
                    parts.append((get(own), tuple(module._forward_hooks), tuple(module._forward_pre_hooks),
                                  tuple(map(id, module._buffers.values())), kids))  # fmt: skip
                return hash(tuple(parts))
            except (LookupError, TypeError):  # a missing name (KeyError), a value no longer hashable
                self._modules_plan = None
        return hash(object())  # still unreadable: equal to nothing, so nothing is reused

    def _module_plan(self) -> list[tuple]:
        """Per module of the target: (its own module, a getter of its plain attributes by name, its attribute count,
        its submodules' ids), listed once and again after ``_module_signature`` saw the layout change."""
        if self._modules_plan is None:
            plain = (int, float, bool, str, type(None))
            plan = []
            for module in self.target.target.model.modules():
                own = module.__dict__
                names = [k for k, v in own.items() if type(v) in plain and k != "training"]
                get = operator.itemgetter(*names) if names else (lambda d: ())
                plan.append((module, get, len(own), tuple(map(id, module._modules.values()))))
            self._modules_plan = plan
        return self._modules_plan

    def _versions(self, drafter) -> int:
        """The in-place update counters of the target's (and the drafter's) weights: an update between calls (a
        training step's ``copy_``) makes the kept state stale. The target's are those ``TargetModel.wrap`` read at
        this call (a call updates no weight), the drafter's are read here."""
        target = self.target.target
        versions = target.versions if target.versions is not None else weights_state([target.model])[1]
        if drafter is None:
            return versions
        ref, read = self._drafter_versions
        return versions + (read if ref() is drafter else weights_state(drafter_modules(drafter))[1])

    def reusable(self, prompt: torch.Tensor, drafter, *, graph: bool = False) -> int:
        """How many leading tokens of ``prompt`` (``[T]``, one sequence, on the device) the storage already holds
        from the last call: the common prefix with that call's sequence, within what it committed, short of the
        prompt's last token (its logits are needed); 0 when the drafter differs, its state cannot resume or the
        weights changed in place (seen by their update counters, or by their norms for an edit through ``.data``),
        and for hybrid targets all of the committed tokens or none (the recurrent state
        cannot step back). With ``graph``, prompts of up to ``PREFILL_WHOLE`` tokens are prefilled whole (one replay
        beats the uncaptured forward of their rest). One host read, only when there is something to compare.
        """
        length = prompt.shape[0]
        if self.batch != 1 or self.kept is None or length < 2:
            return 0
        if graph and prefill_size(length) <= min(PREFILL_WHOLE, self.capacity):
            return 0  # a captured prefill of the whole prompt costs about one round: less than the eager rest
        kept_drafter = self.kept_drafter() if self.kept_drafter is not None else None
        if kept_drafter is not drafter or (drafter is not None and not hasattr(self._drafters.get(drafter), "resume")):
            return 0
        if self._versions(drafter) != self.kept_versions:
            return 0
        self.call_modules = self._module_signature()
        if self.call_modules != self.kept_modules:
            return 0
        kept_len = self.kept.shape[0]
        span = min(kept_len, length - 1)
        differ = self.kept[:span] != prompt[:span]
        first = torch.where(differ.any(), differ.long().argmax(), span)
        now = self.call_weights = self._fingerprint()
        if self.kept_weights is None or now.shape != self.kept_weights.shape:
            return 0
        weights = (now == self.kept_weights).all().long()
        if self._sharded:  # every rank reuses or none does: a shard edited on one rank counts for all
            torch.distributed.all_reduce(weights, op=torch.distributed.ReduceOp.MIN)
        committed, first, unchanged = torch.stack([self.prefix[0], first, weights]).tolist()  # the one read
        if not unchanged:  # the weights were edited where no update counter sees it (``.data``)
            return 0
        if self.target.recurrent:  # the state sits after ``committed`` tokens: all of them or nothing
            return committed if committed <= min(first, kept_len) else 0
        return min(first, committed)
    def extend(self, prompts: torch.Tensor, start: int, drafter) -> torch.Tensor:
        """Prefill ``prompts [1, T]`` of which slots ``0 .. start - 1`` already hold the first ``start`` tokens:
        the rest runs as one chain on top of them (a verify of that chain, with its commit for recurrent layers), and
        the drafter's state resumes from ``start``. Returns the logits ``[1, V]`` at the last prompt position."""
        target, device = self.target, self.device
        ids = prompts[:, start:]
        n, total = ids.shape[1], prompts.shape[1]
        index = torch.arange(n, device=device)
        prefix = torch.full((1,), start, dtype=torch.long, device=device)
        tree = DeviceTree(tokens=ids, parents=(index - 1)[None], depth=index[None],
                          valid=torch.ones(1, n, dtype=torch.bool, device=device),
                          num_nodes=torch.full((1,), n, dtype=torch.long, device=device))  # fmt: skip
        span = self.span_for(total)
        taps = getattr(drafter, "target_layer_ids", None)
        static = self._static(drafter)
        positions = prefix[:, None] + index
        last = torch.full((1,), n - 1, dtype=torch.long, device=device)
        with self.attention_scope(static):
            if not target.recurrent:  # attention only: the prompt forward's causal mask, from slot ``start`` on
                mask = target.causal_mask(positions[0], span=span)
                logits, hidden = target.forward(ids, positions, mask, positions[0], taps, rows=last, span=span)
            else:
                mask = tree_masks(tree.parents, tree.valid, prefix, span, n - 1, target.target.dtype)
                args = (ids, positions, mask, positions, taps)
                hybrid = target.target.state
                rnd = VerifyRound(model=target.target.model, cache=target.cache, tree=None, prefix_len=0,
                                  topo=DeviceTopology(tree, chain=True), prompt=True)  # fmt: skip
                with adapter_forwards(hybrid.adapters, rnd):
                    logits, hidden = target.forward(*args, span=span, flat=prefix, rows=last)
                for adapter in hybrid.adapters:
                    commit_recurrent(adapter, rnd, index[None], tree.num_nodes)
        if static is not None:
            static.resume(ids, hidden, start)
        self.prefix.fill_(total)
        self.history[:, :total].copy_(prompts)
        return logits[:, 0]


    def prefill(self, prompts: torch.Tensor, lengths: list[int], drafter, *, graph: bool = False) -> torch.Tensor:
        """Run the prompts into the static caches; returns the logits ``[B, V]`` at each one's last position.

        ``prompts [B, n]``: sequence b's tokens are its first ``lengths[b]`` (right-padded to the longest). Prompts
        of up to ``PREFILL_CAPTURE_MAX`` tokens are padded (``prefill_size``) and run through a captured forward per
        padded length (``graph``); longer prompts run uncaptured. Hybrid targets prefill as
        ``specdec.state.hybrid_prefill`` says: the model's own forward, copied into static storage, or (``scan``,
        the default on CUDA for prompts up to 4096 tokens) the chain-tree verify of ``_Prefill`` (prompts over
        ``PREFILL_CAPTURE_MAX`` run it uncaptured, at their padded size).
        """
        n = prompts.shape[1]
        size = prefill_size(n)
        scan = bool(self.target.recurrent) and hybrid_prefill(self.device, n) == "scan"
        if self.target.recurrent and not scan:
            with self.attention_scope(self._static(drafter)):
                logits = self._prefill_model(prompts, lengths, drafter)
        else:
            if size <= min(PREFILL_CAPTURE_MAX, self.capacity):
                pre = self._prefill_for(drafter, size, graph)
            else:  # a long prompt: the same forward, not captured and not kept
                pre = _Prefill(self, drafter, self._static(drafter), min(size, self.capacity), graph=False)
            logits = pre(prompts, lengths)
        self.prefix.copy_(to_device(lengths, self.device))
        self.history[:, : prompts.shape[1]].copy_(prompts)
        return logits

    def _prefill_model(self, prompts: torch.Tensor, lengths: list[int], drafter) -> torch.Tensor:
        """Hybrids: each prompt through the model's own forward into an HF cache, copied into sequence b's storage."""
        taps = getattr(drafter, "target_layer_ids", None)
        target = self.target.target
        logits, hidden = [], []
        for b, n in enumerate(lengths):
            cache = DynamicCache(config=target.config)
            row_logits, row_hidden = target.prefill_into(cache, prompts[b : b + 1, :n], taps)
            self.target.load(cache, n, row=b)
            logits.append(row_logits)
            if row_hidden is not None:
                hidden.append(torch.nn.functional.pad(row_hidden, (0, 0, 0, prompts.shape[1] - n)))
        static = self._static(drafter)
        if static is not None:
            static.prefill(prompts, torch.cat(hidden) if hidden else None)
        return torch.stack(logits)

    def attention_scope(self, static, *, compiled: bool = False) -> AttentionScope:
        """The scope in which this engine runs the forwards of its target (and of ``static``'s draft model, for a
        drafter state with a ``draft_model``): grouped-query attention without K/V expansion where
        ``specdec.attention.grouped_for`` says so (``compiled``: the forwards run under ``torch.compile``), and the
        linear layers through the split-K kernel with ``Backends(linear_kernel="triton")``, and in uncompiled forwards
        the RMSNorm layers (on CUDA by default, ``Backends.target_norm``), the rotary embedding
        (``Backends.target_rotary``) and the gated MLPs' activation and product (``Backends.silu_mul``) through one
        launch each, and in uncompiled forwards the target's rotary modules answer from their tables
        (``specdec.state.rope``)."""
        draft = getattr(static, "draft_model", None)
        kv = self.target.storage.kv  # [L, 2, 1, H_kv, capacity, D]: the attention's own dtype and head dim
        grouped = grouped_for(compiled, self.device, kv.dtype, kv.shape[-1])
        norms = not compiled and norm_kernel_for(self.device)
        rotary = not compiled and rotary_kernel_for(self.device)
        mlps = not compiled and mlp_kernel_for(self.device)
        gathers = not compiled and gather_kernel_for(self.device)
        projections = not compiled and projection_kernel_for(self.device)
        linear = linear_kernel_for()
        # made once per setting and draft model: this engine's target keeps its modules (another one gets another
        # engine, ``weights_signature``), and a drafter whose weights changed gets a new state (``_check_drafter``)
        key = (id(draft), compiled, grouped, norms, rotary, mlps, gathers, projections, linear)
        held = self._scopes.get(key)
        if held is not None and held[0] is draft:
            return held[1]
        rope = [] if compiled else self.target.rope.forwards()  # the rotary tables: one gather per forward
        if gathers:  # plain embedding lookups: one row_gather launch each
            rope = rope + [(m, types.MethodType(embedding_forward, m))
                     for m in embedding_modules(self.target.target.model, draft)]  # fmt: skip
        scope = AttentionScope(self.target.target.model, draft, grouped=grouped, linear=linear, norms=norms,
                               rotary=rotary, mlps=mlps, projections=projections, forwards=rope)  # fmt: skip
        self._scopes[key] = (draft, scope)
        return scope

    def _prefill_for(self, drafter, size: int, graph: bool) -> _Prefill:
        from specdec.backends import current

        key = (id(drafter) if drafter is not None else None, size, graph, current())
        pre = self._prefills.get(key)
        if pre is None or pre.drafter is not drafter:
            pre = _Prefill(self, drafter, self._static(drafter), size, graph)
            self._prefills[key] = pre
            self.prefills_built += 1
        return pre

    def start(self, roots: torch.Tensor, prompt_lengths: list[int], active: list[bool]) -> None:
        """Set each sequence's first root token ``[B]``, prompt length and whether it decodes at all."""
        self.root.copy_(roots)
        self.prompt_len.copy_(to_device(prompt_lengths, self.device))
        self.active.copy_(to_device(active, self.device, torch.bool))

    def finish(self, row: int) -> None:
        """Sequence ``row`` is done: later rounds commit nothing for it (enqueued, no host wait)."""
        self.active.narrow(0, row, 1).fill_(False)  # a fill launch: indexed assignment copies and waits

    def span_for(self, need: int) -> int:
        """The span bucket of a round that must see slots ``[0, need)``: the smallest ``SPAN_MIN * 2**k`` that holds
        them, or the whole capacity."""
        span = SPAN_MIN
        while span < need:
            span *= 2
        return min(span, self.capacity)

    def round_for(
        self,
        drafter,
        tree,
        rule,
        sampling: SamplingParams,
        *,
        graph: bool,
        compile: bool | str | Mapping = False,
        span: int | None = None,
        processors: Processors | None = None,
        backends=None,
        keep_logits: bool = False,
    ) -> Round:
        """The (cached) round of this drafter, tree policy, rule, sampling and span (None: the capacity); built on
        first use (``rounds_built`` counts them) and captured on its first call or :meth:`Round.prepare`."""
        span = min(span or self.capacity, self.capacity)
        key = (
            id(drafter) if drafter is not None else None,
            tree if drafter is not None else None,
            rule,
            sampling,
            graph,
            compile_key(compile),
            span,
            processors,
            backends,
            keep_logits,
        )
        rnd = self._rounds.get(key)
        if rnd is None or rnd.drafter is not drafter:
            rnd = Round(self, drafter, self._static(drafter), tree, rule, sampling, graph, compile, span, processors,
                        keep_logits)  # fmt: skip
            self._rounds[key] = rnd
            self.rounds_built += 1
        return rnd
