"""The bucketed non-blocking gradient all-reduce: ``BucketedAllreduce`` is the ``host`` transport
and the base of the device transports (CUDA-aware MPI, NCCL) in :mod:`device`, which also chooses
among them (``device.create_allreducer``).
"""
from __future__ import annotations

from mpi4py import MPI

from ..staging import HostStage, cupy_of


AUTO_BUCKETS = 8               # dist.bucket_mb = -1: the gradient buffer in about this many buckets,
MIN_CHUNK = 64 * 1024          # each at least ranks x 64 KiB (a ring sends a bucket as p chunks;
MAX_BUCKET = 25_000_000        # a smaller chunk is latency-bound), at most 25 MB (PyTorch DDP's)


def auto_bucket_bytes(nbytes: int, ranks: int) -> int:
    """The default bucket size (``dist.bucket_mb = -1``) for a gradient buffer of ``nbytes`` summed
    over ``ranks``: ``nbytes / 8``, at least ``ranks x 64 KiB``, at most 25 MB (docs/methods.md).
    On 4 ranks: ResNet-20 (1.09 MB): 256 KiB buckets (4); ResNet-18 (46.8 MB): 5.8 MB (6);
    ResNet-50 (102 MB): 12.8 MB (7), up to 194 ranks, then ranks x 64 KiB."""
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
    once in ``finish()``.  On a GPU only the check's 2-rank sum ran it (tests/device_double.py).
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
        cuda = cupy_of(self.flat).cuda
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
        calls it through the gradient role's ``progress``, so on a GPU the sums overlap backward)."""
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
