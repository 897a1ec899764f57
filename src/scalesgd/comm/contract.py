"""The transport contract: everything a method, the control plane, the loop, the recovery from a
lost rank and the fast-path check ask of the network, as a ``typing.Protocol``.

Two transports implement it: ``comm.mpi.transport.MPITransport`` (one rank of a real MPI job) and
``virtual.transport.InProcessTransport`` (one of p virtual ranks in one process).  Code above
``comm/`` holds a ``Transport`` and makes no MPI call of its own (``tests/test_architecture.py``
scans methods/, train/, virtual/ and fastpaths/ for one); ``tests/test_transport_contract.py``
checks that both classes have every member below with the same parameters, and runs the same
closed-form checks of the collectives through both (the MPI one under ``mpiexec``).

Buffers are NumPy or CuPy arrays, never pickles; text travels as UTF-8 bytes.  "Collective": every
rank of the transport calls it, in the same order.
"""
from __future__ import annotations

from typing import Any, Callable, Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class Transport(Protocol):
    name: str                     # "mpi" or "virtual"
    rank: int                     # this rank in the transport's group
    size: int                     # ranks in the group

    # identity and time --------------------------------------------------------------------------
    def clock(self) -> float:
        """Seconds (the virtual one is simulated)."""

    def step_done(self) -> None:
        """A worker finished a step's compute (the virtual timeline charges its compute there)."""

    def sleep(self, seconds: float) -> None:
        """A straggler's delay."""

    def split(self, color: int, key: int) -> Transport:
        """Collective: the sub-transport of the ranks with the same ``color``, ordered by ``key``."""

    def node_split(self, alone: bool = False) -> Transport:
        """Collective: the sub-transport of this rank's node (``alone``: a server's own)."""

    def node_groups(self, alone: bool = False) -> Any:
        """Collective: this rank's ``topology.NodeSplit``."""

    def free(self) -> None:
        """Collective: the sub-transport is released and unusable afterwards."""

    # lost ranks ---------------------------------------------------------------------------------
    def die(self) -> None:
        """This rank dies at once (a lost rank, for testing ``train.on_failure``)."""

    def hang(self) -> None:
        """Blocks for ever (a deadlock, for testing stop deadlines)."""

    def failure_detector(self) -> Any:
        """Collective: what notices a dead rank at every ``check``."""

    def shrunk(self) -> tuple:
        """Collective among the survivors: (their ``Topology``, the ranks that died, seconds)."""

    # collectives --------------------------------------------------------------------------------
    def broadcast(self, arr, root: int = 0) -> None:
        """Collective: ``arr`` (in place) becomes ``root``'s."""

    def bcast_text(self, text: str | None, root: int = 0) -> str:
        """Collective: ``root``'s text on every rank."""

    def allgather_text(self, text: str) -> list[str]:
        """Collective: every rank's text, in rank order."""

    def allgather_int64(self, a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Collective: every rank's int64 values concatenated in rank order, and their owners."""

    def allreduce_sum_host(self, a: np.ndarray) -> np.ndarray:
        """Collective: the element-wise sum of a host array."""

    def allreduce_max_host(self, a: np.ndarray) -> np.ndarray:
        """Collective: the element-wise maximum of a host array."""

    def iallreduce_max_host(self, a: np.ndarray, poll: Callable[[], None] | None = None) -> np.ndarray:
        """Collective: the maximum, ``poll()`` called while it is in flight."""

    def allreduce_mean(self, arr) -> None:
        """Collective: ``arr`` (in place) becomes the ranks' mean."""

    def barrier(self) -> None:
        """Collective: returns once every rank entered it."""

    def funnel(self, arrays: dict, text: str, sink: Callable, root: int = 0) -> None:
        """Collective: every rank's ``arrays`` and ``text`` reach ``sink(rank, arrays, text)`` on
        ``root``, in rank order."""

    # endpoints and windows ----------------------------------------------------------------------
    def worker_port(self, servers, bounds=None) -> Any:
        """A worker's end of the parameter-server protocol (``comm/mpi/protocol.py``)."""

    def server_port(self) -> Any:
        """A server shard's end of it."""

    def published_vector(self, n: int, dtype) -> Any:
        """Collective: a one-sided window publishing n values per rank (pull gossip)."""

    def inbox(self, n: int, dtype) -> Any:
        """Collective: a one-sided inbox of n values per rank (push-sum)."""

    def sample_counter(self, root: int = 0) -> Any:
        """Collective: a shared counter on ``root`` (global samples)."""

    def courier(self) -> Any:
        """The thread that carries overlapped exchanges."""

    def thread_level(self) -> str:
        """The MPI thread level the job has ("multiple", ...)."""

    # progress and the gradient all-reduce -------------------------------------------------------
    spans_nodes: bool             # ranks on more than one node

    def keep_progressing(self, plan) -> Any:
        """What ``progress.plan`` chose, running until its ``close()``."""

    def allreducer(self, grads, layout, dist) -> Any:
        """Collective: the gradient all-reducer ``dist`` asks for."""

    def reducer_like(self, red, flat, layout, bucket_bytes: int, host: bool = False) -> Any:
        """Collective: a fresh all-reducer of ``red``'s kind (with ``host``, the host transport's)
        over ``flat``: what the fast-path check runs side by side (``fastpaths.parts``)."""


def members(protocol: type | None = None) -> dict[str, list[str]]:
    """Every member of ``protocol`` (``Transport`` by default; also ``methods/roles.py``'s roles):
    {name: [parameter names, self left out]} for the methods, [] for the data attributes (its
    annotations)."""
    import inspect  # noqa: PLC0415
    protocol = protocol or Transport
    out = {name: list(inspect.signature(v).parameters)[1:] for name, v in vars(protocol).items()
           if not name.startswith("_") and inspect.isfunction(v)}
    return {**out, **{name: [] for name in vars(protocol).get("__annotations__", {})}}
