"""The parameter-server wire protocol: message tags, fixed header layouts, and the two endpoints.

One exchange between worker ``i`` and the server (rank 0) is four point-to-point messages::

    worker i                                   server (rank 0)
    Irecv(REPLY_HEADER), Irecv(REPLY_PAYLOAD)  # reply buffers posted first
    Ssend(PUSH_HEADER)   ----------------->    Recv(PUSH_HEADER, ANY_SOURCE) -> source i
    Send(PUSH_PAYLOAD)   ----------------->    Recv(PUSH_PAYLOAD, source i)
                         <-----------------    Send(REPLY_HEADER, i); Send(REPLY_PAYLOAD, i)
    Waitall(replies)

Headers are small int64 arrays (layouts below); payloads are the whole flat parameter-sized buffer
in one message (no per-tensor loop), received into preallocated host arrays.  Messages between
one pair of ranks do not overtake each other (MPI ordering), so the payload that follows a header
is always that header's.  Everything travels as buffers (uppercase mpi4py methods), never pickled.
"""
from __future__ import annotations

from enum import IntEnum, unique

import numpy as np
from mpi4py import MPI

SERVER = 0                       # the server's rank in COMM_WORLD


@unique
class Tag(IntEnum):
    """Point-to-point tags of the parameter server (unique; collectives use no tags)."""

    PUSH_HEADER = 0x5101         # worker -> server: PushHeader
    PUSH_PAYLOAD = 0x5102        # worker -> server: x_i (easgd) or accumulated update (asgd)
    REPLY_HEADER = 0x5103        # server -> worker: ReplyHeader
    REPLY_PAYLOAD = 0x5104       # server -> worker: center before its update (easgd) / new master (asgd)
    FUNNEL_META = 0x5201         # any rank -> root: JSON description of the arrays that follow
    FUNNEL_DATA = 0x5202         # any rank -> root: one array (checkpoint writing)


@unique
class Kind(IntEnum):
    """What a push carries (checked by the server: a mismatch means two methods were mixed)."""

    EASGD = 1
    ASGD = 2


class PushHeader:
    """int64[6]: (kind, samples consumed since the previous exchange, local steps since it, seq,
    then the worker's raised signals: stop (SIGTERM/SIGUSR1), checkpoint generation)."""

    KIND, SAMPLES, STEPS, SEQ, STOP, CKPT = range(6)
    SIZE = 6


class ReplyHeader:
    """int64[6]: (global samples after this exchange, server version after it, staleness of this
    exchange in versions, exchanges served so far, then the signals the server has seen: stop,
    newest checkpoint generation)."""

    GLOBAL, VERSION, STALENESS, SERVED, STOP, CKPT = range(6)
    SIZE = 6


def header(size: int) -> np.ndarray:
    return np.zeros(size, dtype=np.int64)


class WorkerPort:
    """The worker's end: posts the reply receives, sends a push, waits for the reply."""

    def __init__(self, comm):
        self.comm = comm
        self.reply = header(ReplyHeader.SIZE)
        self._requests: list = []

    def post_reply(self, payload: np.ndarray) -> None:
        """Posts the receives for the next reply (header into ``self.reply``, payload in place)."""
        assert not self._requests, "a reply is already pending"
        self._requests = [self.comm.Irecv(self.reply, source=SERVER, tag=Tag.REPLY_HEADER),
                          self.comm.Irecv(payload, source=SERVER, tag=Tag.REPLY_PAYLOAD)]

    def push(self, hdr: np.ndarray, payload: np.ndarray) -> None:
        self.push_header(hdr)
        self.push_payload(payload)

    def push_header(self, hdr: np.ndarray) -> None:
        """Synchronous send (``Ssend``): returns once the server has received the header, i.e. has
        started serving this push, so the time in it is queueing behind other workers (wait) and
        the payload's transfer can be timed apart.  Costs one small-message round trip."""
        self.comm.Ssend(hdr, dest=SERVER, tag=Tag.PUSH_HEADER)

    def push_payload(self, payload: np.ndarray) -> None:
        self.comm.Send(payload, dest=SERVER, tag=Tag.PUSH_PAYLOAD)

    def wait_reply_header(self) -> None:
        """Blocks until the reply's header has arrived (the server is done with this push and
        replying); ``wait_reply`` then completes the payload's transfer."""
        self._requests[0].Wait()

    def wait_reply(self) -> np.ndarray:
        MPI.Request.Waitall(self._requests)
        self._requests = []
        return self.reply

    @property
    def pending(self) -> bool:
        return bool(self._requests)


class ServerPort:
    """The server's end: receives pushes in arrival order, replies to their sender."""

    def __init__(self, comm):
        self.comm = comm
        self.push_hdr = header(PushHeader.SIZE)
        self.reply = header(ReplyHeader.SIZE)
        self.status = MPI.Status()

    def recv_push(self, payload: np.ndarray) -> int:
        """Blocks for the next push from any worker; fills ``self.push_hdr`` and ``payload``;
        returns the sender's rank.  A payload of the wrong size is a protocol error."""
        src = self.recv_push_header()
        self.recv_push_payload(src, payload)
        return src

    def recv_push_header(self) -> int:
        """Blocks for the next push's header from any worker (into ``self.push_hdr``); its sender."""
        self.comm.Recv(self.push_hdr, source=MPI.ANY_SOURCE, tag=Tag.PUSH_HEADER, status=self.status)
        return self.status.Get_source()

    def recv_push_payload(self, src: int, payload: np.ndarray) -> None:
        """The payload that follows ``src``'s header, checked for size."""
        self.comm.Recv(payload, source=src, tag=Tag.PUSH_PAYLOAD, status=self.status)
        got = self.status.Get_count(MPI.BYTE)
        if got != payload.nbytes:
            raise RuntimeError(f"parameter server: rank {src} pushed {got} bytes, expected "
                               f"{payload.nbytes} (do all ranks build the same model?)")

    def send_reply(self, dest: int, payload: np.ndarray) -> None:
        """Sends ``self.reply`` and ``payload`` to ``dest`` (which posted its receives first)."""
        self.comm.Send(self.reply, dest=dest, tag=Tag.REPLY_HEADER)
        self.comm.Send(payload, dest=dest, tag=Tag.REPLY_PAYLOAD)

    def push_waiting(self) -> int | None:
        """The rank of a worker whose push is waiting to be received, or None."""
        if self.comm.Iprobe(source=MPI.ANY_SOURCE, tag=Tag.PUSH_HEADER, status=self.status):
            return self.status.Get_source()
        return None

    def anything_pending(self) -> bool:
        """True if a parameter-server message is waiting (used to check clean termination)."""
        return any(self.comm.Iprobe(source=MPI.ANY_SOURCE, tag=t) for t in Tag)
