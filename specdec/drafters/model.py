"""Small-LM drafter: a small HF causal LM sharing the target's tokenizer drafts greedily from its own cache.

Per round it runs the newly committed tokens, then drafts D tokens greedily (one forward each), keeping the
log-probabilities it saw at each depth. ``Chain(k)`` takes the greedy tokens (D = k); ``DDTree(budget, topk)``
builds the best-first tree from those per-depth distributions (D = min(budget, tree_depth)). The drafter's
cache is cut back to the committed tokens after each draft, so it always equals the committed prefix.
"""

from __future__ import annotations

import torch

from specdec.state.kv import KVState
from specdec.target import TargetModel
from specdec.trees import chain_tree, root_tree
from specdec.trees.ddtree import build_ddtree, chain_from_logq
from specdec.types import Chain, DecodeContext, DraftTree, TreeSpec, VerifyResult

__all__ = ["ModelDrafter"]


class ModelDrafter:
    """Drafts with a small HF causal LM.

    Args:
        model: the draft HF causal LM (attention layers only), same vocabulary and device as the target.
        tree_depth (int): drafted depth for DDTree specs (greedy steps whose distributions feed the builder).
            Default 8.
    """

    target_layer_ids = None

    def __init__(self, model, *, tree_depth: int = 8) -> None:
        if tree_depth < 1:
            raise ValueError(f"ModelDrafter: tree_depth={tree_depth} must be >= 1.")
        self.lm = TargetModel(model)
        if not isinstance(self.lm.state, KVState):
            raise ValueError(
                f"ModelDrafter needs an attention-only draft model; {type(model).__name__} has recurrent layers. "
                "Use an attention draft model (e.g. a small Llama/Qwen3)."
            )
        self.tree_depth = tree_depth
        self.num_forwards = 0
        self.default_tree = Chain(k=4)

    @classmethod
    def from_target_layers(cls, target, num_layers: int, **kwargs) -> ModelDrafter:
        """A self-speculative drafter: the target's first ``num_layers`` decoder layers plus its final norm and
        LM head (weights copied once; the target is untouched)."""
        import copy

        total = target.config.num_hidden_layers
        if not 1 <= num_layers < total:
            raise ValueError(f"num_layers={num_layers} must be in [1, {total - 1}] for a {total}-layer target.")
        config = copy.deepcopy(target.config)
        config.num_hidden_layers = num_layers
        if getattr(config, "layer_types", None) is not None:
            config.layer_types = config.layer_types[:num_layers]
        draft = type(target)(config).to(device=target.device, dtype=target.dtype)
        missing, _ = draft.load_state_dict(target.state_dict(), strict=False)
        if missing:
            raise ValueError(f"Cannot truncate {type(target).__name__}: weights {missing[:3]} have no source.")
        return cls(draft.eval(), **kwargs)

    def validate(self, target: TargetModel, tree: TreeSpec) -> None:
        if self.lm.vocab_size != target.vocab_size:
            raise ValueError(
                f"Draft model vocabulary ({self.lm.vocab_size}) differs from the target's ({target.vocab_size}); "
                "the drafter must share the target's tokenizer and LM-head size."
            )
        if self.lm.device != target.device:
            raise ValueError(
                f"Draft model is on {self.lm.device} but the target is on {target.device}; move it with "
                "draft_model.to(target.device)."
            )

    def reset(self) -> None:
        self.lm.cache = None
        self.lm.length = 0

    def prefill(self, ctx: DecodeContext) -> None:
        self.reset()

    def commit(self, ctx: DecodeContext, result: VerifyResult) -> None:
        pass  # the cache already equals the committed prefix minus the tokens of this round, fed next propose

    def _step(self, ctx: DecodeContext) -> torch.Tensor:
        """Run the committed tokens the cache lacks; return the next-token logits ``[V]``."""
        self.num_forwards += 1
        if self.lm.cache is None:
            logits, _ = self.lm.prefill(ctx.input_ids)
            return logits
        pending = ctx.input_ids[0, self.lm.length :].tolist()
        logits, _ = self.lm.verify(chain_tree(pending[0], pending[1:], self.lm.device))
        self.lm.commit(range(len(pending)))
        return logits[-1]

    def propose(self, ctx: DecodeContext, tree: TreeSpec) -> DraftTree:
        depth = tree.k if isinstance(tree, Chain) else min(tree.budget, self.tree_depth)
        rows = [torch.log_softmax(self._step(ctx).float(), dim=-1)]
        for _ in range(depth - 1):
            logits, _ = self.lm.verify(root_tree(int(rows[-1].argmax()), self.lm.device))
            self.lm.commit([0])
            self.num_forwards += 1
            rows.append(torch.log_softmax(logits[-1].float(), dim=-1))
        self.lm.truncate(ctx.length)  # drop the drafted tokens: the cache holds exactly the committed prefix
        logq = torch.stack(rows)  # [D, V]
        root = int(ctx.input_ids[0, -1])
        timer = ctx.timer
        if isinstance(tree, Chain):
            return chain_from_logq(logq, root, k=depth)
        if timer is None:
            return build_ddtree(logq, root, budget=tree.budget, topk=tree.topk)
        with timer("build"):
            return build_ddtree(logq, root, budget=tree.budget, topk=tree.topk)
