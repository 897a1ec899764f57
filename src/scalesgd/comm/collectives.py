"""Collectives on flat buffers: broadcast, sums, and the bucketed non-blocking gradient all-reduce.

Arrays travel as buffers (mpi4py's uppercase methods), never pickled.  Device (CuPy) arrays are
staged through host memory here (``HostStage``).  ``BucketedAllreduce`` is the ``host`` transport of
the gradient all-reduce and the base of the device transports (CUDA-aware MPI, NCCL) in
:mod:`device`, which also chooses among them (``device.create_allreducer``).
"""
from __future__ import annotations

import logging
import sys
import time

import numpy as np
from mpi4py import MPI


def _is_host(a) -> bool:
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


def _cupy_of(arr):
    """CuPy when ``arr`` is a device array (None for NumPy, and for any array while CuPy is not
    loaded: a CuPy array cannot exist then)."""
    return None if isinstance(arr, np.ndarray) else sys.modules.get("cupy")


def sync_stream(arr) -> None:
    """Waits for the current CuPy stream before MPI reads or writes ``arr`` (no-op for NumPy)."""
    cupy = _cupy_of(arr)
    if cupy is not None:
        cupy.cuda.get_current_stream().synchronize()


class DeviceTimer:
    """Seconds of device work that the host only enqueues (NCCL's all-reduce returns before the
    sum is done, so a host clock around the call reads ~0 and the time lands in whatever waits for
    the stream next): a pair of CUDA events around the work on the current stream.  ``seconds()``
    adds the pairs the device has finished (a query: the host never waits here) and forgets them;
    ``seconds(wait=True)`` waits for the rest first (for a checkpoint or the summary, where the
    stream has been synchronized anyway).  Not yet run on a GPU (tests/device_double.py)."""

    def __init__(self, arr):
        self.cupy = _cupy_of(arr)
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
    what the device gets.  The device path has not been run on a GPU (tests/device_double.py checks
    the contract on the CPU)."""

    def __init__(self, arr):
        self.arr = arr
        self.host = arr if _is_host(arr) else _pinned_like(arr)

    def to_host(self):
        if self.host is not self.arr:
            self.arr.get(out=self.host)          # synchronous on the current stream
        return self.host

    def to_device(self):
        if self.host is not self.arr:
            self.arr.set(self.host)
            sync_stream(self.arr)                # the host buffer may be written again at once


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


AUTO_BUCKETS = 8               # dist.bucket_mb = -1: the gradient buffer in about this many buckets,
MIN_CHUNK = 64 * 1024          # each at least ranks x 64 KiB (a ring sends a bucket as p chunks;
MAX_BUCKET = 25_000_000        # a smaller chunk is latency-bound), at most 25 MB (PyTorch DDP's)


def auto_bucket_bytes(nbytes: int, ranks: int) -> int:
    """The default bucket size (``dist.bucket_mb = -1``) for a gradient buffer of ``nbytes`` summed
    over ``ranks``: ``nbytes / 8``, at least ``ranks x 64 KiB``, at most 25 MB (docs/methods.md).
    ResNet-20 (1.09 MB) on 4 ranks: 256 KiB buckets (5); ResNet-18 (46.8 MB): 5.8 MB (8);
    ResNet-50 (102 MB): 12.8 MB (8) up to 195 ranks, then ranks x 64 KiB."""
    return int(min(max(nbytes / AUTO_BUCKETS, ranks * MIN_CHUNK), MAX_BUCKET))


def make_buckets(layout, bucket_bytes: int, itemsize: int) -> list[tuple[int, int, list[str]]]:
    """Contiguous ranges of the flat buffer, in reverse layout order (the order backward produces
    gradients), each of at least ``bucket_bytes`` except the last: [(lo, hi, tensor names)]."""
    buckets, names, hi = [], [], None
    for spec in reversed(layout.specs):
        lo_t, hi_t = layout.offsets[spec.name]
        if hi is None:
            hi = hi_t
        names.append(spec.name)
        if (hi - lo_t) * itemsize >= bucket_bytes:
            buckets.append((lo_t, hi, names))
            names, hi = [], None
    if names:
        buckets.append((layout.offsets[names[-1]][0], hi, names))
    return buckets


class BucketedAllreduce:
    """Sums a flat gradient buffer over ``comm`` in buckets, in place: the ``host`` transport, and
    the base of the device transports (``device.CudaAwareAllreduce``, ``device.NcclAllreduce``), which
    override where MPI's bytes live (``_mpi_buffer``, ``_to_mpi``, ``_from_mpi``) or ``finish``.

    The caller pre-scales the gradients by 1/p (for free, through dL/dlogits), so the sum is the
    average and no extra pass over the buffer is needed here.  With ``overlap``, ``ready(names)``
    is called as backward finishes each layer; a bucket's ``Iallreduce`` starts (``start(i)``) as
    soon as all its tensors are final, so communication overlaps the rest of backward; ``finish()``
    waits for them.  Without overlap, ``finish()`` reduces the buckets one after another with
    blocking all-reduces.  ``overlap`` is what runs: False when the transport cannot overlap
    (``can_overlap``); the factory says so in a log line.

    Host transport: on NumPy MPI uses ``flat`` itself; a device ``flat`` is staged through a pinned
    host copy.  With overlap, a bucket whose gradients are final is copied down on a side stream
    (after an event on the compute stream, so after the kernels that wrote it) without the host
    waiting; its ``Iallreduce`` starts once that copy's event has completed (queried at the next
    ``ready``, in bucket order, as every rank must start them in the same order), and ``finish()``
    waits only for the copies still in flight.  So backward's kernel launches never stall on a
    bucket.  Without overlap the buffer is copied down once in ``finish()``.  The sum is copied up
    once in ``finish()``.  The device path has not been run on a GPU (tests/device_double.py).
    """

    transport = "host"
    can_overlap = True

    def __init__(self, comm, flat, layout, bucket_bytes: int, overlap: bool = True):
        self.comm, self.flat, self.layout, self.bucket_bytes = comm, flat, layout, bucket_bytes
        self.overlap = overlap and self.can_overlap
        nbytes = flat.size * flat.dtype.itemsize
        self.buckets = make_buckets(layout, bucket_bytes if bucket_bytes > 0 else nbytes,
                                    flat.dtype.itemsize)
        self.bucket_of = {n: i for i, (_, _, names) in enumerate(self.buckets) for n in names}
        self.buf = self._mpi_buffer()            # (n,) what MPI reads and writes
        self._side = None                        # the copy stream of the overlapped host path
        self._reset()

    def on_host(self) -> "BucketedAllreduce":
        """The host transport over the same gradients, buckets and overlap as this reducer: what a
        device transport falls back to when the start-up check fails it (fastpaths/)."""
        return BucketedAllreduce(self.comm, self.flat, self.layout, self.bucket_bytes, self.overlap)

    def close(self) -> None:
        """Frees what the transport holds (the NCCL communicator); nothing for MPI."""

    def _mpi_buffer(self):
        self.stage = HostStage(self.flat)
        return self.stage.host                   # flat itself on NumPy

    def _to_mpi(self, lo: int, hi: int) -> None:
        """Makes buf[lo:hi] hold the final gradients before MPI reads them (waits for the stream)."""
        if self.buf is not self.flat:
            self.flat[lo:hi].get(out=self.buf[lo:hi])

    def _copy_down(self, lo: int, hi: int):
        """Starts copying flat[lo:hi] into buf[lo:hi] without waiting: the event that completes
        with the copy, or None when MPI reads ``flat`` itself (NumPy)."""
        if self.buf is self.flat:
            return None
        cuda = _cupy_of(self.flat).cuda
        if self._side is None:
            self._side = cuda.Stream(non_blocking=True)
        written = cuda.Event(disable_timing=True)
        written.record()                         # on the compute stream: after backward's kernels
        self._side.wait_event(written)
        self.flat[lo:hi].get(stream=self._side, out=self.buf[lo:hi], blocking=False)
        landed = cuda.Event(disable_timing=True)
        landed.record(self._side)
        return landed

    def device_seconds(self, wait: bool = False) -> float:
        """Seconds of this transport's work that ran on the device since the last call, beyond
        what the host clock saw (``DeviceTimer``); 0 for transports the host waits for."""
        return 0.0

    def _from_mpi(self) -> None:
        """Puts the summed buf back into flat."""
        self.stage.to_device()

    def _reset(self):
        self.grads_left = [len(names) for _, _, names in self.buckets]
        self.requests: list = []
        self.copying: list = []                  # [(bucket, event)] copied down, not yet started

    def start(self, i: int) -> None:
        """Starts bucket ``i`` (its gradients are final): its copy down, then its non-blocking sum
        as soon as the copy has landed (at once on NumPy)."""
        lo, hi, _ = self.buckets[i]
        self.copying.append((i, self._copy_down(lo, hi)))
        self._launch_landed()

    def _launch_landed(self, wait: bool = False) -> None:
        """Starts the ``Iallreduce`` of each copied bucket, in order, whose copy has landed (all of
        them with ``wait``, waiting for each copy)."""
        while self.copying:
            i, landed = self.copying[0]
            if landed is not None and not landed.done:
                if not wait:
                    return
                landed.synchronize()
            self.copying.pop(0)
            self._begin(i)

    def _begin(self, i: int) -> None:
        """Starts bucket ``i``'s sum (its bytes are in ``buf``)."""
        lo, hi, _ = self.buckets[i]
        self.requests.append(self.comm.Iallreduce(MPI.IN_PLACE, self.buf[lo:hi], op=MPI.SUM))

    def ready(self, names) -> None:
        """Called from backward when the gradients of ``names`` are final."""
        if not self.overlap:
            return
        for n in names:
            i = self.bucket_of[n]
            self.grads_left[i] -= 1
            if self.grads_left[i] == 0:
                self.start(i)
        self.progress()

    def progress(self) -> None:
        """Starts the buckets whose copies have landed and lets MPI progress the started ones
        (from ``ready``, and while the host waits for the device to finish the step: the loop
        calls it through ``Method.progress``, so on a GPU the sums overlap backward)."""
        self._launch_landed()
        if self.requests:
            MPI.Request.Testall(self.requests)

    def launch_all(self) -> None:
        """Starts every bucket not started yet, waiting for copies still in flight.  Must run before
        any other collective on the communicator (the method's barrier): every rank then starts
        the buckets' ``Iallreduce`` in the same order relative to it, as MPI requires, however far
        each rank's device had got."""
        self._launch_landed(wait=True)

    def finish(self) -> None:
        self._launch_landed(wait=True)
        if self.requests:
            MPI.Request.Waitall(self.requests)
            assert len(self.requests) == len(self.buckets), "a bucket was never started"
        else:                                    # no overlap: reduce now, bucket by bucket
            self._to_mpi(0, self.flat.size)
            for lo, hi, _ in self.buckets:
                self.comm.Allreduce(MPI.IN_PLACE, self.buf[lo:hi], op=MPI.SUM)
        self._from_mpi()
        self._reset()


def funnel(comm, arrays: dict, text: str, sink, root: int = 0) -> None:
    """Collective: every rank's named host arrays and a text reach ``sink(rank, arrays, text)`` on
    ``root``, one rank at a time (root never holds more than one rank's arrays).  Arrays travel as
    buffers; only their names, dtypes and shapes travel as JSON text (no pickle)."""
    import json  # noqa: PLC0415
    from .protocol import Tag  # noqa: PLC0415
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
