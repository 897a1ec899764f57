"""Host staging of device arrays for MPI, and device timing: no MPI here.

MPI reads and writes host memory on the ``host`` transport; a CuPy array reaches it through a
(pinned) host copy (``HostStage``).  Methods use this module to stage their exchanges without
importing MPI; the collectives that move the staged bytes are in :mod:`collectives` and
:mod:`buckets`.
"""
from __future__ import annotations

import logging
import sys

import numpy as np


def is_host(a) -> bool:
    return isinstance(a, np.ndarray)


_STAGING_LOGGED = False


def _pinned_like(arr) -> np.ndarray:
    """A page-locked host array (fast device<->host copies) when CuPy provides one."""
    global _STAGING_LOGGED
    try:
        import cupyx  # noqa: PLC0415 - only reached with CuPy arrays
        host = cupyx.empty_pinned(arr.shape, arr.dtype)
        how = "pinned host buffers"
    except Exception:
        host, how = np.empty(arr.shape, arr.dtype), "pageable host buffers"
    if not _STAGING_LOGGED:
        logging.getLogger("scalesgd").info("device buffers reach MPI through %s (host staging)", how)
        _STAGING_LOGGED = True
    return host


def cupy_of(arr):
    """CuPy when ``arr`` is a device array (None for NumPy, and for any array while CuPy is not
    loaded: a CuPy array cannot exist then)."""
    return None if isinstance(arr, np.ndarray) else sys.modules.get("cupy")


def sync_stream(arr) -> None:
    """Waits for the current CuPy stream before MPI reads or writes ``arr`` (no-op for NumPy)."""
    cupy = cupy_of(arr)
    if cupy is not None:
        cupy.cuda.get_current_stream().synchronize()


class DeviceTimer:
    """Seconds of device work that the host only enqueues (NCCL's all-reduce returns before the
    sum is done, so a host clock around the call reads ~0 and the time lands in whatever waits for
    the stream next): a pair of CUDA events around the work on the current stream.  ``seconds()``
    adds the pairs the device has finished (a query: the host never waits here) and forgets them;
    ``seconds(wait=True)`` waits for the rest first (for a checkpoint or the summary, where the
    stream has been synchronized anyway).  Timed one rank's NCCL sum on an H200; ``settle`` in a
    training run has not run on a GPU (tests/device_double.py)."""

    def __init__(self, arr):
        self.cupy = cupy_of(arr)
        self.pending: list = []

    def start(self):
        if self.cupy is None:
            return None
        ev = self.cupy.cuda.Event()
        ev.record()
        return ev

    def stop(self, start) -> None:
        if start is not None:
            end = self.cupy.cuda.Event()
            end.record()
            self.pending.append((start, end))

    def seconds(self, wait: bool = False) -> float:
        total = 0.0
        while self.pending and (wait or self.pending[0][1].done):
            start, end = self.pending.pop(0)
            if wait:
                end.synchronize()
            total += self.cupy.cuda.get_elapsed_time(start, end) / 1000.0
        return total


class HostStage:
    """A host array MPI can use for ``arr``: ``arr`` itself on NumPy, a (pinned) host copy for CuPy
    arrays.  ``to_host()`` copies device -> host (synchronous, so the stream is done with the data
    before MPI touches it), ``to_device()`` host -> device and waits for it: CuPy's ``set()`` from
    pinned memory is only enqueued on the stream and reads the host buffer when it runs, so without
    the wait the next MPI receive into the same buffer (the EASGD server's next push) could change
    what the device gets.  Run on a GPU only by the check's all-reduce on 2 ranks (tests/device_double.py
    checks the contract on the CPU)."""

    def __init__(self, arr):
        self.arr = arr
        self.host = arr if is_host(arr) else _pinned_like(arr)

    def to_host(self):
        if self.host is not self.arr:
            self.arr.get(out=self.host)          # synchronous on the current stream
        return self.host

    def to_device(self):
        if self.host is not self.arr:
            self.arr.set(self.host)
            sync_stream(self.arr)                # the host buffer may be written again at once
