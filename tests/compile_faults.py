"""A ``torch.compile`` backend that fails, for the tests of what happens when a round cannot be compiled."""

from __future__ import annotations


def failing_backend(fail_at: int):
    """A backend that runs graphs as traced but fails on its ``fail_at``-th graph (counting from 1), with the error
    inductor raises when a generated kernel needs more shared memory than the GPU has."""
    seen = []

    def backend(gm, example_inputs):
        seen.append(gm)
        if len(seen) == fail_at:
            raise RuntimeError("No valid triton configs. OutOfResources: out of resource: shared memory")
        return gm.forward

    return backend
