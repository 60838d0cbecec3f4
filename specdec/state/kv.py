"""The state manager of attention-only targets.

Their K/V live in the round's static storage, committed by ``specdec.state.storage.commit_rows`` (one gather of
the accepted rows); nothing else is kept per model. ``specdec.state.manager_for`` returns a ``KVState`` for a model
without recurrent layers, and the round (``specdec.engine``) and ``ModelDrafter`` tell the two kinds of target
apart by it. See ``docs/trees.md``.
"""

from __future__ import annotations

__all__ = ["KVState"]


class KVState:
    """State manager of attention-only targets (every layer attention): a marker, the K/V commit is the round's."""

    name = "kv"

    def __repr__(self) -> str:
        return "KVState()"
