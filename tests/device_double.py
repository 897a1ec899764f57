"""A host stand-in for CuPy's device arrays, streams and events, for the ways that matter to the
staging, transport, timing and self-check code (issue 25):

- **Nothing on a stream runs until the host asks, and only what it depends on.**  ``set()`` (host
  -> device), ``get(blocking=False)`` (device -> host), item assignment and the few array functions
  below are *queued* work.  A queued op depends on its stream's earlier ops and on the events its
  stream was told to wait for (``wait_event``), nothing else, as in CUDA.  Work runs at a *host
  wait* (``Stream.synchronize()``, ``Event.synchronize()``, a blocking ``get()``; each counted in
  ``STATE.waits``, where a GPU would stall the host) or when ``Event.done`` is queried and
  ``STATE.gpu_keeps_up`` (a real GPU runs on its own; a query never stalls the host), and then
  only that op's dependencies run.  So a host buffer handed to ``set()`` may be read after the call
  returns, a copy on a side stream that did not wait for the compute stream reads the values from
  before the compute stream's pending writes, and a non-blocking copy has landed only once its
  event says so: the contracts CuPy and CUDA document.
- **Views share memory**: ``a[lo:hi]`` is a view of ``a``'s data, as a CuPy slice is;
  ``data.ptr`` is the real address, so an alignment check sees what a device pointer would.
- **Events carry the time they ran** (``get_elapsed_time``, in ms, as CuPy's), so work that takes
  time on "the device" shows between two events, not on the host clock of the call that queued it.

- **NCCL as CuPy 14 has it** (``Nccl``, also ``cuda.nccl``): ``get_unique_id()`` returns 128
  ``bytes`` and ``NcclCommunicator(ndev, commId, rank)`` refuses any other ``commId`` with
  ``TypeError``, as ``cupy_backends/cuda/libs/nccl.pyx`` does since CuPy 14.0 (``bytes commId``);
  its ``allReduce`` is queued work on the stream, the sum of every rank's buffer (one process:
  ``ndev`` 1, the array itself; ``ndev`` ranks launched by ``mpiexec``: summed over MPI's world).
- **``get(out=)`` and ``set()`` check as CuPy 14 does**: a NumPy array of the same dtype and shape,
  contiguous (the messages of ``cupy/_core/core.pyx``), where a lax double took anything.
- **Pinned memory** (``cupyx``: ``empty_pinned``, ``zeros_pinned``): host arrays flagged pinned
  (``is_pinned``), so the staging path that asks for them runs here too.

Installed as the module ``cupy`` (``install``), so ``backend.get_array_module`` and
``sys.modules["cupy"]`` hand it to the code under test exactly as they would hand CuPy.  Arithmetic
is modelled only for what the self-check's transport case uses (``array``, ``zeros_like``,
``ones``, ``matmul``, item assignment); ``.data`` is the NumPy array for a test to read and write.
"""
from __future__ import annotations

import sys
import time
import types

import numpy as np

STATE = types.SimpleNamespace(waits=0, gpu_keeps_up=True, ran=0)


class _Op:
    """Queued device work: runs once, after what it depends on."""

    def __init__(self, fn, deps):
        self.fn, self.deps, self.done = fn, [d for d in deps if d is not None], False

    def run(self) -> None:
        stack = [self]
        while stack:                              # depth first, without recursion limits
            op = stack[-1]
            todo = [d for d in op.deps if not d.done]
            if todo:
                stack.extend(todo)
                continue
            stack.pop()
            if not op.done:
                op.done = True
                op.fn()
                STATE.ran += 1


def enqueue(fn, stream=None) -> _Op:
    """Queues ``fn`` on ``stream`` (the current one by default): it runs when the device gets there."""
    stream = stream or _CURRENT
    op = _Op(fn, [stream.last])
    stream.last = op
    return op


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
    nbytes = property(lambda self: self._a.nbytes)

    def __getitem__(self, key):
        return ndarray(self._a[key], _view=True)

    def __setitem__(self, key, value):
        dst = self._a

        def copy():
            dst[key] = value._a if isinstance(value, ndarray) else value
        enqueue(copy)

    def set(self, arr, stream=None):
        """CuPy 14's checks (``cupy/_core/core.pyx``: ``set``), then the queued copy."""
        if not isinstance(arr, np.ndarray):
            raise TypeError("Only numpy.ndarray can be set to cupy.ndarray")
        if self.dtype != arr.dtype:
            raise TypeError(f"{arr.dtype} array cannot be set to {self.dtype} array")
        if self.shape != arr.shape:
            raise ValueError(f"Shape mismatch. Old shape: {self.shape}, new shape: {arr.shape}")
        if not (self._a.flags.c_contiguous or self._a.flags.f_contiguous):
            raise RuntimeError("Cannot set to non-contiguous array")
        dst = self._a

        def copy():
            dst[...] = arr                        # reads ``arr`` when the stream runs it
        enqueue(copy, stream)

    def get(self, stream=None, order="C", out=None, blocking=True):
        """CuPy 14's checks of ``out`` (``cupy/_core/core.pyx``: ``get``), then the queued copy."""
        src = self._a
        if out is not None:
            if not isinstance(out, np.ndarray):
                raise TypeError("Only numpy.ndarray can be obtained fromcupy.ndarray")
            if self.dtype != out.dtype:
                raise TypeError(f"{out.dtype} array cannot be obtained from {self.dtype} array")
            if self.shape != out.shape:
                raise ValueError(f"Shape mismatch. Expected shape: {self.shape}, actual shape: {out.shape}")
            if not (out.flags.c_contiguous or out.flags.f_contiguous):
                raise RuntimeError("`out` cannot be specified when copying to non-contiguous ndarray")
        out = np.empty(src.shape, src.dtype) if out is None else out

        def copy():
            out[...] = src
        op = enqueue(copy, stream)
        if blocking:
            STATE.waits += 1
            op.run()
        return out


ndarray.__module__ = "cupy"


class Stream:
    def __init__(self, null=False, non_blocking=False, ptds=False):
        self.ptr = 0 if null else id(self)
        self.last = None                          # the newest op queued on this stream

    def synchronize(self):
        STATE.waits += 1
        if self.last is not None:
            self.last.run()

    def wait_event(self, event):
        """Later work on this stream waits for what ``event`` recorded."""
        self.last = _Op(lambda: None, [self.last, event._op])

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
        if self._op is not None and not self._op.done and STATE.gpu_keeps_up:
            self._op.run()
        return self._op is None or self._op.done

    def synchronize(self):
        STATE.waits += 1
        if self._op is not None:
            self._op.run()


def get_elapsed_time(start: Event, end: Event) -> float:
    if start.time is None or end.time is None:
        raise RuntimeError("cudaErrorNotReady: an event has not completed")
    return (end.time - start.time) * 1000.0


NCCL_UNIQUE_ID_BYTES = 128


class Nccl:
    """``cupy.cuda.nccl`` of CuPy 14, for the calls ``comm/mpi/device.py`` makes; ``live`` counts the
    communicators made and not destroyed, ``arrays`` maps a device address to its NumPy memory."""

    NCCL_FLOAT32, NCCL_FLOAT64, NCCL_SUM = 7, 8, 0
    available = True
    live = 0
    arrays: dict = {}

    @staticmethod
    def get_unique_id() -> bytes:
        """128 bytes, some above 127 (a signed-char conversion would change them)."""
        return bytes((37 * i + 200) % 256 for i in range(NCCL_UNIQUE_ID_BYTES))

    @staticmethod
    def get_version() -> int:
        return 22703

    class NcclCommunicator:
        def __init__(self, ndev, commId, rank):  # noqa: N803 - CuPy's parameter name
            if not isinstance(commId, bytes):      # Cython's message for a typed ``bytes`` argument
                raise TypeError(f"Argument 'commId' has incorrect type (expected bytes, got "
                                f"{type(commId).__name__})")
            if len(commId) != NCCL_UNIQUE_ID_BYTES:
                raise ValueError(f"commId length {len(commId)} != {NCCL_UNIQUE_ID_BYTES}.")
            self.args = (ndev, commId, rank)
            self.destroyed = False
            Nccl.live += 1

        def allReduce(self, sendbuf, recvbuf, count, datatype, op, stream):  # noqa: N802
            """Queued on the stream; with ``ndev`` ranks (one a process, under ``mpiexec``: the
            ranks of MPI's world), the sum runs over MPI when the stream runs it, so every rank
            must run its queued work in the same order, as NCCL's kernels wait for their peers."""
            if self.destroyed:
                raise RuntimeError("NCCL_ERROR_INVALID_ARGUMENT: the communicator was destroyed")
            src, dst = Nccl.arrays[sendbuf], Nccl.arrays[recvbuf]
            ndev = self.args[0]

            def run():
                if ndev == 1:
                    dst[:count] = src[:count]
                    return
                from mpi4py import MPI  # noqa: PLC0415 - the peers' processes
                world = MPI.COMM_WORLD
                assert world.Get_size() == ndev, f"the double's {ndev} ranks are MPI's world"
                got = np.empty_like(src[:count])
                world.Allreduce(np.ascontiguousarray(src[:count]), got, op=MPI.SUM)
                dst[:count] = got
            enqueue(run)

        def destroy(self):
            if not self.destroyed:
                self.destroyed = True
                Nccl.live -= 1


cuda = types.SimpleNamespace(get_current_stream=lambda: _CURRENT, Stream=Stream, Event=Event,
                             get_elapsed_time=get_elapsed_time, nccl=Nccl)


# ----------------------------------------------------------------------------- queued arithmetic
def _queued(shape, dtype, fill) -> ndarray:
    out = ndarray(np.zeros(shape, dtype))
    dst = out._a

    def write():
        dst[...] = fill()
    enqueue(write)
    return out


def array(data, dtype=None) -> ndarray:
    """Host data to the device: the values are taken now (CuPy stages pageable data at once)."""
    return ndarray(np.array(data._a if isinstance(data, ndarray) else data, dtype=dtype))


asarray = array


def zeros_like(a) -> ndarray:
    return _queued(a.shape, a.dtype, lambda: 0)


def ones(shape, dtype=float) -> ndarray:
    return _queued(shape, dtype, lambda: 1)


def matmul(a, b) -> ndarray:
    """Queued work of a product's shape: its place in the queue is what the self-check uses (work
    that delays a later write), never its values, so the double does not compute them."""
    return _queued((a.shape[0], b.shape[1]), a.dtype, lambda: 0)


def reset() -> None:
    """An idle device: nothing queued, counters at zero, the GPU keeping up."""
    global _CURRENT
    _CURRENT = Stream(null=True)
    STATE.waits, STATE.ran, STATE.gpu_keeps_up = 0, 0, True


# ----------------------------------------------------------------------------- cupyx: pinned memory
PINNED: set = set()                     # ids of the host buffers handed out as pinned


def empty_pinned(shape, dtype=float, order="C") -> np.ndarray:
    a = np.empty(shape, dtype, order=order)
    PINNED.add(id(a))
    return a


def zeros_pinned(shape, dtype=float, order="C") -> np.ndarray:
    a = empty_pinned(shape, dtype, order)
    a[...] = 0
    return a


def is_pinned(a) -> bool:
    return id(a) in PINNED


cupyx = types.ModuleType("cupyx")
cupyx.empty_pinned, cupyx.zeros_pinned = empty_pinned, zeros_pinned


def install(monkeypatch=None, pinned: bool = True) -> types.ModuleType:
    """This module as ``cupy`` and its ``cupyx`` (``pinned=False``: none, so staging falls back to
    pageable buffers), reset; for one test with ``monkeypatch``, for the process without (an
    mpiexec check script)."""
    mod = sys.modules[__name__]
    reset()
    PINNED.clear()
    x = cupyx if pinned else None
    if monkeypatch is None:
        sys.modules["cupy"], sys.modules["cupyx"] = mod, x
    else:
        monkeypatch.setitem(sys.modules, "cupy", mod)
        monkeypatch.setitem(sys.modules, "cupyx", x)
    return mod
