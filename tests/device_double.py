"""A host stand-in for CuPy's device arrays, streams and events, for the ways that matter to the
staging, transport and timing code (issue 25):

- **Nothing on a stream runs until the host asks.**  ``set()`` (host -> device), ``get(blocking=
  False)`` (device -> host) and any ``enqueue``d work (a double NCCL all-reduce) are queued in one
  FIFO, in issue order, which respects every stream's order and every ``wait_event``.  They run at a
  *host wait*: ``Stream.synchronize()``, ``Event.synchronize()`` or a blocking ``get()``, each
  counted in ``waits`` (the host stalls there on a GPU), or when ``Event.done`` is queried and
  ``gpu_keeps_up`` (a real GPU runs on its own; a query never stalls the host).  So a host buffer
  handed to ``set()`` may be read later than the call returns, and a non-blocking copy has landed
  only once its event says so: the contracts CuPy documents.
- **Views share memory**: ``a[lo:hi]`` is a view of ``a``'s data, as a CuPy slice is; ``data.ptr``
  is the real address, so an alignment check sees what a device pointer would.
- **Events carry the time they ran** (``get_elapsed_time``, in ms, as CuPy's), so work that takes
  time on "the device" shows between two events and not on the host clock of the call that queued it.

Installed as the module ``cupy`` for one test (``install``), so ``backend.get_array_module`` and
``sys.modules["cupy"]`` hand it to the code under test exactly as they would hand CuPy.  Arithmetic
on these arrays is not modelled (``.data`` is the NumPy array for a test to read and write).
"""
from __future__ import annotations

import sys
import time
import types

import numpy as np

_QUEUE: list = []               # (stream, callable) in issue order: what "the device" has to run
STATE = types.SimpleNamespace(waits=0, gpu_keeps_up=True, ran=0)


def _run_until(op=None) -> None:
    """Runs the queue up to and including ``op`` (everything when None; nothing when ``op`` has
    already run)."""
    if op is not None and all(fn is not op for _, fn in _QUEUE):
        return
    while _QUEUE:
        stream, fn = _QUEUE.pop(0)
        fn()
        STATE.ran += 1
        if fn is op:
            return


def enqueue(fn, stream=None):
    """Queues ``fn`` on ``stream`` (the current one by default): it runs when the device gets there."""
    _QUEUE.append((stream or _CURRENT, fn))
    return fn


class _Memory(np.ndarray):
    """What ``ndarray.data`` gives: the NumPy view a test reads and writes, with CuPy's
    ``MemoryPointer.ptr`` (the address)."""

    ptr = property(lambda self: self.ctypes.data)


class ndarray:  # noqa: N801 - CuPy's name
    def __init__(self, data, _view=False):
        self._a = data if _view else np.array(data)

    data = property(lambda self: self._a.view(_Memory))
    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    size = property(lambda self: self._a.size)

    def __getitem__(self, key):
        return ndarray(self._a[key], _view=True)

    def set(self, arr, stream=None):
        dst = self._a

        def copy():
            dst[...] = arr                            # reads ``arr`` when the stream runs it
        enqueue(copy, stream)

    def get(self, stream=None, order="C", out=None, blocking=True):
        src = self._a
        out = np.empty(src.shape, src.dtype) if out is None else out

        def copy():
            out[...] = src
        op = enqueue(copy, stream)
        if blocking:
            STATE.waits += 1
            _run_until(op)
        return out


ndarray.__module__ = "cupy"


class Stream:
    def __init__(self, null=False, non_blocking=False, ptds=False):
        self.ptr = 0 if null else id(self)

    def synchronize(self):
        STATE.waits += 1
        last = [fn for s, fn in _QUEUE if s is self]
        if last:
            _run_until(last[-1])

    def wait_event(self, event):
        pass                                          # one FIFO: an event recorded earlier runs first

    def __enter__(self):
        global _CURRENT
        self._prev, _CURRENT = _CURRENT, self
        return self

    def __exit__(self, *exc):
        global _CURRENT
        _CURRENT = self._prev


_CURRENT = Stream(null=True)


class Event:
    def __init__(self, block=False, disable_timing=False, interprocess=False):
        self.time = None
        self._op = None

    def record(self, stream=None):
        self.time = None

        def mark():
            self.time = time.perf_counter()
        self._op = enqueue(mark, stream)

    @property
    def done(self) -> bool:
        if self.time is None and STATE.gpu_keeps_up and self._op is not None:
            _run_until(self._op)
        return self._op is None or self.time is not None

    def synchronize(self):
        STATE.waits += 1
        if self.time is None and self._op is not None:
            _run_until(self._op)


def get_elapsed_time(start: Event, end: Event) -> float:
    if start.time is None or end.time is None:
        raise RuntimeError("cudaErrorNotReady: an event has not completed")
    return (end.time - start.time) * 1000.0


cuda = types.SimpleNamespace(get_current_stream=lambda: _CURRENT, Stream=Stream, Event=Event,
                             get_elapsed_time=get_elapsed_time)


def array(data, dtype=None):
    return ndarray(np.asarray(data, dtype=dtype))


def reset() -> None:
    """An idle device: nothing queued, counters at zero, the GPU keeping up."""
    _QUEUE.clear()
    STATE.waits, STATE.ran, STATE.gpu_keeps_up = 0, 0, True


def install(monkeypatch=None) -> types.ModuleType:
    """This module as ``cupy`` (no ``cupyx``: staging falls back to pageable buffers), reset;
    for one test with ``monkeypatch``, for the process without (an mpiexec check script)."""
    mod = sys.modules[__name__]
    reset()
    if monkeypatch is None:
        sys.modules["cupy"], sys.modules["cupyx"] = mod, None
    else:
        monkeypatch.setitem(sys.modules, "cupy", mod)
        monkeypatch.setitem(sys.modules, "cupyx", None)
    return mod
