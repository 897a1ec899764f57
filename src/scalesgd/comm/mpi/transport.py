"""The transport: everything a method and the control plane ask of the network, behind one object.

A ``Method`` (``methods/``), the control plane (``train/control.py``), the loop and the recovery
from a lost rank (``train/survive.py``) make no MPI call themselves (``tests/test_architecture.py``
checks it): they hold a transport and ask it for collectives on flat buffers, the
parameter-server endpoints, the one-sided windows, the gradient all-reducer, the time, and, after a
lost rank, for the failure detector and the survivors' topology (``failure_detector``, ``shrunk``;
ULFM's part is ``comm/mpi/failures.py``).  Two
transports implement the same surface:

* ``MPITransport`` (here): one rank of a real MPI job; every call is the ``comm/`` code it always
  was (``collectives``, ``protocol``, ``window``, ``device``), so MPI runs are unchanged bit for bit.
* ``virtual.transport.InProcessTransport``: one of p virtual ranks stepped inside one process by a
  timeline (``python -m scalesgd.virtual``); the same method code, the same arithmetic.

The surface, by group (a new transport implements all of it; ``comm/contract.py`` states it as a
``typing.Protocol``, and ``tests/test_transport_contract.py`` holds both transports to it):

- identity and time: ``rank``, ``size``, ``clock()`` (seconds; the virtual one is simulated),
  ``step_done()`` (a worker finished a step's compute: the virtual timeline charges its compute
  time there), ``sleep(seconds)`` (a straggler's delay), ``split(color, key)`` (a sub-transport);
- collectives (buffers, never pickles): ``broadcast``, ``bcast_text``, ``allgather_text``,
  ``allgather_int64``, ``allreduce_sum_host``, ``allreduce_max_host``, ``iallreduce_max_host``,
  ``allreduce_mean``, ``barrier``, ``funnel``;
- endpoints: ``worker_port(servers, bounds)``, ``server_port()`` (``comm/mpi/protocol.py``);
- windows: ``published_vector(n, dtype)``, ``inbox(n, dtype)``, ``sample_counter(root)``,
  ``courier()`` (``comm/mpi/window.py``), ``thread_level()``;
- progress (``comm/progress.py``): ``spans_nodes`` (ranks on more than one node),
  ``keep_progressing(plan)`` (what ``progress.plan`` chose, running until ``close()``);
- ``allreducer(grads, layout, dist)``: the gradient all-reducer of ``dist`` (``comm/mpi/device.py``);
  ``reducer_like(red, flat, layout, bucket_bytes, host)``: a fresh one of ``red``'s kind, or the
  host transport's (the fast-path check's pair).
"""
from __future__ import annotations

import time

import numpy as np

from . import collectives, failures
from ..topology import Topology


class MPITransport:
    """One rank of a real MPI job, over the mpi4py communicator ``comm``."""

    name = "mpi"

    def __init__(self, comm, spans_nodes: bool = False, tracked: failures.Tracked | None = None):
        self.comm, self.spans_nodes = comm, spans_nodes
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.tracked = tracked if tracked is not None else failures.Tracked()   # the job's, shared
        self.tracked.add(comm)         # revoked with the others if a rank dies (train.on_failure)
        self.successor = None          # the survivors' transport, once a rank died (``shrunk``)
        self.after_failure = False     # made by ``shrunk``: the job ends without MPI_Finalize

    # identity and time ------------------------------------------------------
    clock = staticmethod(time.perf_counter)

    def step_done(self) -> None:
        """A worker finished a step's compute (real time already passed: nothing to charge)."""

    sleep = staticmethod(time.sleep)

    def node_split(self, alone: bool = False) -> "MPITransport":
        """Collective: the sub-transport of the ranks on this rank's node (MPI's shared-memory
        split, ``MPI_Comm_split_type``), in job rank order; a rank that passes ``alone`` (a
        server) gets a transport of its own and is in no other rank's."""
        from mpi4py import MPI  # noqa: PLC0415
        node = self.comm.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank)
        first = np.array([self.rank], np.int64)            # the node's lowest rank names it
        node.Allreduce(MPI.IN_PLACE, first, op=MPI.MIN)
        node.Free()
        color = self.size + self.rank if alone else int(first[0])
        return MPITransport(self.comm.Split(color, self.rank), tracked=self.tracked)

    def node_groups(self, alone: bool = False):
        """Collective: this rank's ``NodeSplit``: its node's sub-transport (``node_split``), on a
        leader the leaders' sub-transport, the group's leader and index, every group's size."""
        from ..topology import NodeSplit  # noqa: PLC0415
        node = self.node_split(alone)
        lead = self.split(0 if node.rank == 0 else 1, self.rank)
        head = np.array([self.rank, lead.rank], np.int64)
        node.broadcast(head, 0)
        sizes, _ = self.allgather_int64(np.array([node.size if node.rank == 0 else 0], np.int64))
        if node.rank != 0:                                  # (a member's "leaders" are the members)
            lead.free()
            lead = None
        return NodeSplit(node, lead, int(head[0]), int(head[1]), tuple(int(x) for x in sizes if x))

    def split(self, color: int, key: int) -> "MPITransport":
        """Collective: the sub-transport of the ranks with the same ``color``, ordered by ``key``."""
        return MPITransport(self.comm.Split(color, key), self.spans_nodes,   # (the job's answer)
                            tracked=self.tracked)

    def die(self) -> None:
        """This rank dies at once (SIGKILL: a lost rank, for testing ``train.on_failure``)."""
        import os  # noqa: PLC0415
        import signal  # noqa: PLC0415
        os.kill(os.getpid(), signal.SIGKILL)

    def hang(self) -> None:
        """Blocks for ever in a receive nobody answers (a deadlock, for testing: only a stop's
        deadline or the launcher ends it)."""
        from ..wire import Tag  # noqa: PLC0415
        self.comm.Recv(np.empty(1), source=self.rank, tag=Tag.NEVER_SENT)

    def free(self) -> None:
        """Collective on this (sub-)transport: frees its communicator (one ``split`` or
        ``node_split`` made); the transport is unusable afterwards."""
        if self.comm is not None:
            self.tracked.remove(self.comm)
            self.comm.Free()
            self.comm = None

    # lost ranks (train.on_failure = continue; ULFM: comm/mpi/failures.py) ------------
    def failure_detector(self) -> failures.Detector:
        """Collective: what notices a dead rank of this job at every ``check``."""
        return failures.Detector(self.comm, self.tracked)

    def shrunk(self):
        """Collective among the survivors of a lost rank: revokes every communicator of the job,
        shrinks this (the world's) transport's; returns (the survivors' ``Topology``, the ranks
        of this transport that died, the shrink's seconds).  This transport's ``successor`` is
        then the survivors' one, which errors and the job's end go through (``failures.current``)."""
        comm, dead, seconds = failures.shrink(self.comm, self.tracked)
        topo = topology_of(comm, self.tracked)
        topo.transport.after_failure = True
        self.successor = topo.transport
        return topo, dead, seconds

    # collectives -----------------------------------------------------------
    def broadcast(self, arr, root: int = 0) -> None:
        collectives.bcast(self.comm, arr, root)

    def bcast_text(self, text, root: int = 0) -> str:
        return collectives.bcast_text(self.comm, text, root)

    def allgather_text(self, text: str) -> list[str]:
        return collectives.allgather_text(self.comm, text)

    def allgather_int64(self, a):
        return collectives.allgather_int64(self.comm, a)

    def allreduce_sum_host(self, a):
        return collectives.allreduce_sum_host(self.comm, a)

    def allreduce_max_host(self, a):
        return collectives.allreduce_max_host(self.comm, a)

    def iallreduce_max_host(self, a, poll=None):
        return collectives.iallreduce_max_host(self.comm, a, poll)

    def allreduce_mean(self, arr) -> None:
        collectives.allreduce_mean(self.comm, arr)

    def barrier(self) -> None:
        self.comm.Barrier()

    def funnel(self, arrays: dict, text: str, sink, root: int = 0) -> None:
        collectives.funnel(self.comm, arrays, text, sink, root)

    # endpoints and windows --------------------------------------------------
    def worker_port(self, servers, bounds=None):
        from .protocol import WorkerPort
        return WorkerPort(self.comm, servers, bounds)

    def server_port(self):
        from .protocol import ServerPort
        return ServerPort(self.comm)

    def published_vector(self, n: int, dtype):
        from .window import PublishedVector
        return PublishedVector(self.comm, n, dtype)

    def inbox(self, n: int, dtype):
        from .inbox import Inbox
        return Inbox(self.comm, n, dtype)

    def sample_counter(self, root: int = 0):
        from .window import SampleCounter
        return SampleCounter(self.comm, root)

    def courier(self):
        """A communication thread that keeps MPI progressing while idle (``window.Courier``)."""
        from .window import Courier
        return Courier(progress=self.comm.Iprobe)

    def keep_progressing(self, plan):
        """Starts what ``plan`` (``comm/progress.plan``) asks this rank to run: for ``thread`` a
        thread that runs MPI's progress engine (``Iprobe``) every ``plan.interval`` seconds, so
        that one-sided calls aimed at this rank complete while it computes; nothing otherwise (the
        library's own progress was switched on before MPI_Init; a courier polls by itself)."""
        from ..progress import NoProgress, ProgressThread
        if plan.mechanism == "thread":
            return ProgressThread(self.comm.Iprobe, plan.interval)
        return NoProgress()

    @staticmethod
    def thread_level() -> str:
        from .library import thread_level
        return thread_level()

    def allreducer(self, grads, layout, dist):
        """Collective: the gradient all-reducer ``dist`` asks for (``device.create_allreducer``)."""
        from .device import create_allreducer
        groups = None
        if getattr(dist, "hierarchy", "none") == "node" and self.size > 1:
            from .hierarchy import NodeGroups  # noqa: PLC0415
            groups = NodeGroups.of(self.node_groups())       # the job's one node split
        return create_allreducer(self.comm, grads, layout, dist, groups=groups)

    def reducer_like(self, red, flat, layout, bucket_bytes: int, host: bool = False):
        """Collective: a fresh all-reducer of ``red``'s class (``host``: the host transport's,
        ``buckets.BucketedAllreduce``) over ``flat`` on ``red``'s communicator, with its overlap:
        what the fast-path check sums side by side (``fastpaths.parts.transport_components``)."""
        from .buckets import BucketedAllreduce  # noqa: PLC0415
        cls = BucketedAllreduce if host else type(red)
        return cls(red.comm, flat, layout, bucket_bytes, red.overlap)


def topology_of(comm, tracked: failures.Tracked | None = None) -> Topology:
    """Collective: the ``Topology`` of the job on ``comm`` (the world, or the survivors' after a
    shrink), with its ``MPITransport``."""
    from mpi4py import MPI  # noqa: PLC0415
    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    transport = MPITransport(comm, spans_nodes=node.Get_size() < comm.Get_size(), tracked=tracked)
    return Topology(comm.Get_rank(), comm.Get_size(), node.Get_rank(), node.Get_size(), comm, node,
                    transport)
