"""Small-LM drafter: a small HF causal LM sharing the target's tokenizer drafts greedily over its own storage.

Per round it re-runs the last committed tokens, then drafts D tokens greedily (one forward each), keeping the
log-probabilities it saw at each depth (``model_static.py``). ``Chain(k)`` takes the greedy tokens (D = k);
``DDTree(budget, topk)`` builds the best-first tree from those per-depth distributions (D = min(budget,
tree_depth)).
"""

from __future__ import annotations

import os

import torch

from specdec.drafters.checkpoints import GreedySteps
from specdec.drafters.follow import note_target
from specdec.state.kv import KVState
from specdec.target import TargetModel, check_causal_lm
from specdec.trees import Chain

__all__ = ["ModelDrafter"]


class ModelDrafter(GreedySteps):
    """Drafts with a small HF causal LM.

    Args:
        model: the draft HF causal LM (attention layers only), same vocabulary and device as the target.
        tree_depth (int): drafted depth for DDTree specs (greedy steps whose distributions feed the builder).
            Default 8.
    """

    target_layer_ids = None

    def __init__(self, model, *, tree_depth: int = 8) -> None:
        if isinstance(model, (str, os.PathLike)):
            raise TypeError(
                f"ModelDrafter takes a loaded model, not the path {str(model)!r}: pass "
                "AutoModelForCausalLM.from_pretrained(path) (on the target's device and dtype)."
            )
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"ModelDrafter takes an HF causal LM (an nn.Module); got {type(model).__name__}.")
        check_causal_lm(model, "ModelDrafter's model")
        if isinstance(tree_depth, bool) or not isinstance(tree_depth, int):
            raise TypeError(f"ModelDrafter: tree_depth={tree_depth!r} must be a Python int >= 1.")
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
        drafter = cls(draft.eval(), **kwargs)
        note_target(drafter, target)  # a later cast or move of the target moves this copy too
        return drafter

    def to(self, device=None, dtype=None) -> ModelDrafter:
        """Move the draft model like ``nn.Module.to(device=..., dtype=...)``; returns self. ``generate`` calls it when
        the target was cast or moved since the drafter last ran with it (``specdec.drafters.follow``)."""
        self.lm.model.to(device=device, dtype=dtype)
        return self

    def validate(self, target: TargetModel, tree) -> None:
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

    def forwards_per_round(self, tree) -> int:
        return self.draft_depth(tree)

    def attach(self, target, capacity: int, batch: int = 1):
        """The draft model's static storage and round code for sequences of up to ``capacity`` tokens."""
        from specdec.drafters.model_static import ModelStatic
        from specdec.state.storage import static_reason

        reason = static_reason(self.lm)
        if reason is not None:
            raise ValueError(f"The draft model {type(self.lm.model).__name__} cannot run in the round: {reason}.")
        return ModelStatic(self, capacity, batch)
