"""CUDA-graph capture of fixed-shape callables, with optional ``torch.compile`` underneath.

On CPU (or with capture switched off) a ``Captured`` simply calls its function, so the same device-side code
runs everywhere and the CPU suite proves it exact.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Mapping

import torch

from specdec.kernels._triton import prime_imports

__all__ = ["Captured", "check_compile", "compile_fn", "compile_key", "constant", "to_device"]

logger = logging.getLogger(__name__)


# Compiled variants kept per function (see compile_fn): a round per drafter, tree, sampling and span bucket, and, where
# a kernel call ends the compiled region, each layer's forward once per layer and round shape (Qwen3-8B: 36 layers x
# the AR step, the verify buckets and the rounds). Past the limit dynamo runs the rest uncompiled, silently.
RECOMPILE_LIMIT = 4096


MODES = ("default", "max-autotune-no-cudagraphs")


class _Held:
    """What ``OnModel`` keeps in one object's ``__dict__``. A copy or a pickle of that object gets none of it (a
    copied model gets its own engines; nothing on a device is pickled)."""

    __slots__ = ("value",)

    def __init__(self, value=None) -> None:
        self.value = value

    def __copy__(self) -> _Held:
        return _Held()

    def __deepcopy__(self, memo) -> _Held:
        return _Held()

    def __reduce__(self):
        return (_Held, ())


class OnModel:
    """A map ``object -> value`` whose values live on their key (in its ``__dict__`` under ``name``), so that a value
    referring back to its key (an engine holds its model) is freed with it: a ``WeakKeyDictionary`` would keep such
    a key alive for ever. The dict methods used here: ``get``, ``[]``, ``in``, ``setdefault``, ``pop``, ``[] =``."""

    def __init__(self, name: str) -> None:
        self.name = name

    def _held(self, key) -> _Held | None:
        held = key.__dict__.get(self.name)
        return held if isinstance(held, _Held) and held.value is not None else None

    def get(self, key, default=None):
        held = self._held(key)
        return default if held is None else held.value

    def __getitem__(self, key):
        held = self._held(key)
        if held is None:
            raise KeyError(key)
        return held.value

    def __contains__(self, key) -> bool:
        return self._held(key) is not None

    def __setitem__(self, key, value) -> None:
        key.__dict__[self.name] = _Held(value)

    def setdefault(self, key, default):
        held = self._held(key)
        if held is None:
            self[key] = default
            return default
        return held.value

    def pop(self, key, default=None):
        held = self._held(key)
        if held is None:
            return default
        key.__dict__.pop(self.name, None)
        return held.value


# key -> a tensor (or tuple of tensors) that depends only on the key: shapes and device (``constant``)
_CONSTANTS: dict = {}


def constant(key: tuple, make: Callable):
    """``make()``, made once per ``key`` (Python ints and the device: everything its values depend on) and kept, so
    that a round replayed from a CUDA graph launches no kernel to fill it again. Callers never write into it. Under
    ``torch.compile`` it is made in the traced function, where inductor folds it."""
    if torch.compiler.is_compiling():
        return make()
    value = _CONSTANTS.get(key)
    if value is None:
        value = _CONSTANTS[key] = make()
    return value


def to_device(values, device: torch.device, dtype: torch.dtype = torch.long) -> torch.Tensor:
    """A small tensor of Python ``values`` on ``device``, enqueued without a host wait: on CUDA through page-locked
    memory (``torch.tensor(values, device=...)`` copies from pageable memory, which waits for the device's queue
    to drain, e.g. for a prefill just launched)."""
    host = torch.tensor(values, dtype=dtype)
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def copy_to_host(values: torch.Tensor):
    """Enqueue a copy of the small tensor ``values`` to the host now; returns a function that waits for that copy
    only (not for work enqueued after it) and gives the host tensor. On CUDA the copy goes to page-locked memory
    behind an event; elsewhere it is made at once."""
    if values.device.type != "cuda":  # a copy now: the caller may change ``values`` after this call
        host = values.detach().to("cpu", copy=True)
        return lambda: host
    host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
    host.copy_(values, non_blocking=True)
    copied = torch.cuda.Event()
    copied.record()

    def wait() -> torch.Tensor:
        copied.synchronize()
        return host

    return wait


def check_compile(compile) -> None:
    """Refuse a ``compile`` argument ``compile_fn`` cannot use, before anything runs (see ``compile_fn``)."""
    if isinstance(compile, bool) or compile is None:
        return
    if isinstance(compile, str):
        if compile not in MODES:
            raise ValueError(
                f"compile={compile!r}: use True, 'default' or 'max-autotune-no-cudagraphs' (specdec captures the "
                "CUDA graphs itself), or a dict of inductor options."
            )
        return
    if isinstance(compile, Mapping):
        if not compile:
            raise ValueError("compile={}: use True for inductor's defaults, or name the options to set.")
        bad = [k for k in compile if not isinstance(k, str)]
        if bad:
            raise ValueError(f"compile options: keys must be inductor option names (strings), got {bad!r}.")
        if compile.get("triton.cudagraphs"):
            raise ValueError(
                "compile={'triton.cudagraphs': True}: specdec captures the CUDA graphs itself; leave it out."
            )
        unknown = [k for k in compile if k not in torch._inductor.list_options()]
        if unknown:
            raise ValueError(f"compile options {unknown!r} are not inductor options (torch._inductor.list_options()).")
        return
    raise TypeError(f"compile={compile!r}: use a bool, a mode name or a dict of inductor options.")


def compile_key(compile) -> object:
    """A hashable form of a ``compile`` argument (a dict of options becomes its sorted items, values by ``repr``:
    some options take lists)."""
    return tuple(sorted((k, repr(v)) for k, v in compile.items())) if isinstance(compile, Mapping) else compile


def compile_fn(fn: Callable, mode: bool | str | Mapping = True) -> Callable:
    """``torch.compile`` for fixed shapes without its own CUDA graphs (the caller captures).

    Every captured round compiles the same Python function (``_Round._round``) for its own drafter, tree,
    sampling and span; dynamo keeps at most ``recompile_limit`` variants of one function (and
    ``accumulated_recompile_limit`` in all) and runs the rest uncompiled (defaults 8 and 256). Where a Triton kernel
    call ends the compiled region (``SPECDEC_COMPILE_GRAPH=split``), the layer forward around it is compiled on its
    own, once per layer (its ``layer_idx`` is a constant to dynamo) and round shape. This raises both limits to at
    least ``RECOMPILE_LIMIT``. It also tries the kernels' Triton imports first
    (``specdec.kernels._triton.prime_imports``): an import traced inside the round would split it into separately
    compiled pieces at every kernel call.

    Args:
        fn (Callable): the function.
        mode (bool | str | Mapping): True = inductor's default mode; a string = that mode (e.g.
            ``"max-autotune-no-cudagraphs"``; modes that capture graphs themselves are refused); a mapping =
            inductor options (``torch.compile(options=...)``), e.g. ``{"max_autotune": True,
            "max_autotune_gemm_backends": "ATEN"}``.
    """
    check_compile(mode)
    config = torch._dynamo.config
    config.recompile_limit = max(config.recompile_limit, RECOMPILE_LIMIT)
    config.accumulated_recompile_limit = max(config.accumulated_recompile_limit, RECOMPILE_LIMIT)
    prime_imports()
    if isinstance(mode, Mapping):
        return torch.compile(fn, options=dict(mode), dynamic=False)
    return torch.compile(fn, mode=None if mode is True else mode, dynamic=False)


class Captured:
    """``fn()`` captured in a CUDA graph on first use and replayed afterwards.

    ``fn`` reads and writes only tensors that outlive it (static buffers). It runs ``warmup`` times on a side
    stream before capture (kernel selection, lazy loading, compilation); the function returned by ``snapshot()``
    is called after each warm-up run so that its side effects on the decode state are undone.

    Args:
        fn (Callable[[], None]): the work to capture.
        device (torch.device): where it runs; capture only on CUDA when ``graph`` is True.
        graph (bool): capture (CUDA only) or call eagerly.
        snapshot (Callable[[], Callable[[], None]] | None): called before the warm-up; returns the function
            that undoes a warm-up run's effect on the decode state (called after each warm-up run).
        warmup (int): eager runs before capture. Default 2.
        pool: a graph memory pool (``torch.cuda.graph_pool_handle()``) shared with other graphs that never run
            at the same time; None = a private pool.
        scope: a context manager entered around every run of ``fn`` (warm-up, capture, uncaptured calls), not
            around replays; e.g. ``specdec.attention.AttentionScope``. None = none.
        uncompiled (Callable[[], None] | None): when ``fn`` is a compiled function, the same work uncompiled. If
            compiling fails (``torch._dynamo.exc.BackendCompilerFailed``, e.g. inductor generating a kernel that
            needs more shared memory than the GPU has), the decode state is put back (``snapshot``), a warning
            names the error, and ``uncompiled`` takes ``fn``'s place from then on (still captured). None = errors
            propagate.
    """

    def __init__(
        self,
        fn,
        *,
        device: torch.device,
        graph: bool,
        snapshot=None,
        warmup: int = 2,
        pool=None,
        scope=None,
        uncompiled=None,
    ) -> None:
        self.fn, self.device, self.snapshot, self.warmup, self.pool = fn, device, snapshot, warmup, pool
        self.uncompiled = uncompiled
        self.compile_failed: str | None = None  # the error that made it fall back to ``uncompiled``
        self.capture_failed: str | None = None  # the error that made it run uncaptured (``capture``)
        self.scope = scope if scope is not None else contextlib.nullcontext()
        self.use_graph = graph and device.type == "cuda"
        self.graph: torch.cuda.CUDAGraph | None = None
        self.capture_s = 0.0  # later warm-up runs + capture, seconds
        self.first_run_s = 0.0  # the first warm-up run (where compilation happens), seconds
        # None until the first call; True when that call ran uncaptured (its time is then first_run_s)
        self.first_call_uncaptured: bool | None = None if not self.use_graph else False
        self.replays = 0  # of the captured graph: its first replay also uploads it to the device

    @property
    def warm(self) -> bool:
        """Whether the next call runs as it usually does: called eagerly, or replayed from a graph that already ran
        once (a call that captures runs the warm-up and the capture first; a graph's first replay uploads it)."""
        return not self.use_graph or self.replays > 0

    def __call__(self) -> None:
        if self.graph is not None:
            self.graph.replay()
            self.replays += 1
            return
        with self.scope:
            self._run()

    def _guarded(self, restore: Callable[[], None] | None) -> None:
        """``fn()``; when compiling it fails, ``restore()`` the state its partial run changed and run ``uncompiled``
        in its place from now on."""
        if self.uncompiled is None:
            self.fn()
            return
        try:
            self.fn()
        except torch._dynamo.exc.BackendCompilerFailed as err:
            inner = getattr(err, "inner_exception", None) or err  # what the backend raised
            reason = f"{type(inner).__name__}: {str(inner).strip().splitlines()[0] if str(inner).strip() else ''}"
            logger.warning("torch.compile failed for this round; it runs uncompiled: %s", reason)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            if restore is not None:
                restore()
            self.fn, self.uncompiled, self.compile_failed = self.uncompiled, None, reason
            self.fn()

    def _run(self) -> None:
        if not self.use_graph:
            if self.first_call_uncaptured is None:  # where a compiled function compiles: its first run
                restore = self.snapshot() if self.snapshot is not None and self.uncompiled is not None else None
                start = time.perf_counter()
                self._guarded(restore)
                self.first_run_s, self.first_call_uncaptured = time.perf_counter() - start, True
                return
            self.fn()
            return
        if self.graph is None and not self.capture():
            self.fn()  # a capture-unsafe op: the same code, called
            return
        self.graph.replay()
        self.replays += 1

    def capture(self) -> bool:
        """Capture ``fn`` now (warm-up runs undone by ``snapshot``, the captured run changes nothing); returns
        whether it is captured. A capture that fails (an op the graph cannot hold, such as a host read) is logged
        and recorded in ``capture_failed``; ``fn`` is called from then on, on the caller's stream."""
        if self.graph is not None:
            return True
        try:
            self._capture()
        except RuntimeError as err:
            cause = err  # what the captured code raised: the capture's own end then fails on it ("during handling")
            while isinstance(cause.__context__, RuntimeError):
                cause = cause.__context__
            text = str(cause).strip()
            self.capture_failed = f"{type(cause).__name__}: {text.splitlines()[0] if text else ''}"
            logger.warning("CUDA graph capture failed, running this round without a graph: %s", self.capture_failed)
            torch.cuda.synchronize(self.device)
            self.use_graph = False
            return False
        return True

    def _capture(self) -> None:
        start = time.perf_counter()
        restore = self.snapshot() if self.snapshot is not None else None
        current = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            for i in range(self.warmup):
                self._guarded(restore)
                if restore is not None:
                    restore()
                if i == 0:
                    torch.cuda.synchronize(self.device)
                    self.first_run_s = time.perf_counter() - start
        current.wait_stream(side)
        try:
            graph = self._graph(current)
        except RuntimeError as err:  # an API call from another thread may invalidate a global-mode capture
            logger.info("CUDA graph capture failed (%s); retrying with capture_error_mode='thread_local'", err)
            torch.cuda.synchronize(self.device)
            graph = self._graph(current, capture_error_mode="thread_local")
        torch.cuda.synchronize(self.device)
        self.graph = graph
        self.capture_s = time.perf_counter() - start - self.first_run_s
        logger.info("captured a CUDA graph: first run %.2f s, capture %.2f s", self.first_run_s, self.capture_s)

    def _graph(self, stream, **options) -> torch.cuda.CUDAGraph:
        """``fn`` captured into a new graph (``options``: ``torch.cuda.graph``'s), ``stream`` (the caller's) current
        again afterwards. ``torch.cuda.graph`` makes its own capture stream current and restores the caller's only
        when the capture ends cleanly: after a failed one its capture stream would stay current, and every later
        launch (this round called eagerly, the host copy of its result) would run there, unordered with the events
        the decode loop records on the caller's stream to know when a result has reached the host. A failed capture
        also leaves the device's default generator in capture mode, so its state from before is put back."""
        graph = torch.cuda.CUDAGraph()
        index = self.device.index if self.device.index is not None else torch.cuda.current_device()
        generator = torch.cuda.default_generators[index]
        saved = generator.clone_state()  # the capture registers this generator; a failed one leaves it capturing
        try:
            with torch.cuda.graph(graph, pool=self.pool, **options):
                self.fn()
        except BaseException:
            # every later random op of the process would fail ("Offset increment outside graph capture"): the
            # generator's state from before the capture (the capture drew nothing from it) takes its place again
            generator.graphsafe_set_state(saved)
            raise
        finally:
            if torch.cuda.current_stream(self.device) != stream:
                with torch.cuda.device(self.device):  # ``set_stream`` would also make the stream's device current
                    torch.cuda.set_stream(stream)
        return graph
