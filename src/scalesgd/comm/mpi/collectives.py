"""Collectives on flat buffers: broadcast, sums, gathers and the funnel to one rank.

Arrays travel as buffers (mpi4py's uppercase methods), never pickled.  Device (CuPy) arrays are
staged through host memory (:mod:`staging`).  The gradient all-reduce in buckets is in
:mod:`buckets`.
"""
from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI

from ..staging import HostStage


def bcast(comm, arr, root: int = 0) -> None:
    """Broadcasts ``arr`` (flat, contiguous) from ``root`` in place."""
    st = HostStage(arr)
    comm.Bcast(st.to_host(), root=root)
    st.to_device()


def bcast_text(comm, text: str | None, root: int = 0) -> str:
    """Broadcasts a short string from ``root`` as bytes (length first), without pickle."""
    data = np.frombuffer((text or "").encode(), dtype=np.uint8) if comm.Get_rank() == root else None
    n = np.array([0 if data is None else data.size], dtype=np.int64)
    comm.Bcast(n, root=root)
    buf = data.copy() if data is not None else np.empty(int(n[0]), dtype=np.uint8)
    comm.Bcast(buf, root=root)
    return buf.tobytes().decode()


def allgather_text(comm, text: str) -> list[str]:
    """Every rank's short string, in rank order, as bytes (lengths first), without pickle."""
    out, sizes = _allgatherv(comm, np.frombuffer(text.encode(), dtype=np.uint8))
    ends = np.cumsum(sizes)
    return [out[e - n:e].tobytes().decode() for n, e in zip(sizes, ends)]


def _allgatherv(comm, a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every rank's small 1-D array (any length), concatenated in rank order, and each rank's
    length: sizes first (one Allgather), then one Allgatherv of the data."""
    a = np.ascontiguousarray(a)
    sizes = np.empty(comm.Get_size(), dtype=np.int64)
    comm.Allgather(np.array([a.size], dtype=np.int64), sizes)
    out = np.empty(int(sizes.sum()), dtype=a.dtype)
    comm.Allgatherv(a.copy() if not a.flags.writeable else a, [out, sizes.tolist()])
    return out, sizes


def allreduce_sum_host(comm, a: np.ndarray) -> np.ndarray:
    """Sum of a small host array over ``comm`` (a new array)."""
    out = np.empty_like(a)
    comm.Allreduce(a, out, op=MPI.SUM)
    return out


def allreduce_max_host(comm, a: np.ndarray) -> np.ndarray:
    """Element-wise maximum of a small host array over ``comm`` (a new array)."""
    out = np.empty_like(a)
    comm.Allreduce(a, out, op=MPI.MAX)
    return out


def iallreduce_max_host(comm, a: np.ndarray, poll=None) -> np.ndarray:
    """``allreduce_max_host`` as a non-blocking collective (every rank must use this one: a
    non-blocking collective never matches a blocking one) that calls ``poll()`` while it waits, if
    given (``poll`` may raise: the caller then ends the job, so the request is never completed)."""
    out = np.empty_like(a)
    req = comm.Iallreduce(a, out, op=MPI.MAX)
    if poll is None:
        req.Wait()
        return out
    while not req.Test():
        poll()
        time.sleep(0.0002)
    return out


def allgather_int64(comm, a) -> tuple[np.ndarray, np.ndarray]:
    """Every rank's small int64 vector, concatenated in rank order, and the rank each entry came
    from: ((total,), (total,)) on every rank (no pickle)."""
    out, sizes = _allgatherv(comm, np.asarray(a, dtype=np.int64))
    return out, np.repeat(np.arange(comm.Get_size()), sizes)


def allreduce_mean(comm, arr) -> None:
    """In-place average of ``arr`` over ``comm`` (one blocking all-reduce)."""
    st = HostStage(arr)
    comm.Allreduce(MPI.IN_PLACE, st.to_host(), op=MPI.SUM)
    st.host /= comm.Get_size()
    st.to_device()


def funnel(comm, arrays: dict, text: str, sink, root: int = 0) -> None:
    """Collective: every rank's named host arrays and a text reach ``sink(rank, arrays, text)`` on
    ``root``, one rank at a time (root never holds more than one rank's arrays).  Arrays travel as
    buffers; only their names, dtypes and shapes travel as JSON text (no pickle)."""
    import json  # noqa: PLC0415
    from ..wire import Tag  # noqa: PLC0415
    if comm.Get_rank() != root:
        comm.Recv(np.empty(0, np.uint8), source=root, tag=Tag.FUNNEL_META)     # root's turn signal
        desc = json.dumps({"text": text, "arrays": [[k, str(a.dtype), list(a.shape)]
                                                    for k, a in arrays.items()]}).encode()
        comm.Send(np.frombuffer(desc, np.uint8), dest=root, tag=Tag.FUNNEL_META)
        for a in arrays.values():
            comm.Send(np.ascontiguousarray(a), dest=root, tag=Tag.FUNNEL_DATA)
        return
    sink(root, arrays, text)
    status = MPI.Status()
    for r in range(comm.Get_size()):
        if r == root:
            continue
        comm.Send(np.empty(0, np.uint8), dest=r, tag=Tag.FUNNEL_META)
        comm.Probe(source=r, tag=Tag.FUNNEL_META, status=status)
        meta = np.empty(status.Get_count(MPI.BYTE), np.uint8)
        comm.Recv(meta, source=r, tag=Tag.FUNNEL_META)
        desc = json.loads(meta.tobytes().decode())
        got = {}
        for name, dtype, shape in desc["arrays"]:
            got[name] = np.empty(shape, dtype=dtype)
            comm.Recv(got[name], source=r, tag=Tag.FUNNEL_DATA)
        sink(r, got, desc["text"])
