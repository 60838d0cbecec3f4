"""State managers: committing accepted tree paths into target caches."""

from specdec.state.kv import KVState

__all__ = ["KVState", "manager_for"]


def manager_for(model, **kwargs):
    return KVState()
