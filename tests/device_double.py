"""A host stand-in for a CuPy device array, for the ways that matter to the staging code: a
host-to-device ``set()`` from host memory is only *enqueued* (as CuPy's is from pinned memory: a
``cudaMemcpyAsync`` on the current stream) and reads the host buffer when the stream runs it, here at
the next ``synchronize()`` or ``get()``; ``get()`` is synchronous, as CuPy's is.  Installed as the
module ``cupy`` for one test (``install``), so ``backend.get_array_module`` hands it to the code
under test exactly as it would hand CuPy.  Arithmetic is not modelled: this double checks the
contract "the host buffer may be reused once the call returns", nothing else.
"""
from __future__ import annotations

import types

import numpy as np

_PENDING: list = []            # (device array, host buffer) copies enqueued on "the" stream


class ndarray:  # noqa: N801 - CuPy's name
    def __init__(self, data):
        self.data = np.array(data)

    shape = property(lambda self: self.data.shape)
    dtype = property(lambda self: self.data.dtype)
    size = property(lambda self: self.data.size)

    def set(self, arr, stream=None):
        _PENDING.append((self, arr))            # the copy reads ``arr`` when the stream runs it

    def get(self, stream=None, order="C", out=None):
        _run_stream()
        if out is None:
            return self.data.copy()
        out[...] = self.data
        return out


ndarray.__module__ = "cupy"


def _run_stream() -> None:
    while _PENDING:
        dev, host = _PENDING.pop(0)
        dev.data[...] = host


class Stream:
    def synchronize(self):
        _run_stream()


cuda = types.SimpleNamespace(get_current_stream=lambda: Stream())


def install(monkeypatch) -> types.ModuleType:
    """This module as ``cupy`` for the test (no cupyx: staging falls back to pageable buffers)."""
    import sys
    mod = sys.modules[__name__]
    _PENDING.clear()
    monkeypatch.setitem(sys.modules, "cupy", mod)
    monkeypatch.setitem(sys.modules, "cupyx", None)
    return mod
