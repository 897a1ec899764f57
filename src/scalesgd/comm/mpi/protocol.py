"""The parameter-server wire protocol: message tags, fixed header layouts, and the two endpoints.

One exchange between worker ``i`` and the server (``--servers K`` shards: ranks 0..K-1, each
holding a contiguous slice of the parameters) is four point-to-point messages per shard::

    worker i (to every shard s at once)             server shard s
    Irecv(REPLY_HEADER), Irecv(REPLY_PAYLOAD)       # reply buffers posted first
    Issend(PUSH_HEADER) to each shard  -------->    Recv(PUSH_HEADER, ANY_SOURCE) -> source i
    Waitsome: as shard s takes the header,
      Isend(its PUSH_PAYLOAD slice)    -------->    Recv(PUSH_PAYLOAD, source i)
                                       <--------    Send(REPLY_HEADER, i); Send(REPLY_PAYLOAD, i)
    Waitall(replies)

Headers are small int64 arrays (layouts below); payloads are the whole flat parameter-sized buffer
in one message (no per-tensor loop), received into preallocated host arrays.  Messages between
one pair of ranks do not overtake each other (MPI ordering), so the payload that follows a header
is always that header's.  Everything travels as buffers (uppercase mpi4py methods), never pickled.
"""
from __future__ import annotations

import numpy as np
from mpi4py import MPI

from ..wire import SERVER, PushHeader, ReplyHeader, Tag, header


class WorkerPort:
    """The worker's end, towards K server shards: ranks ``servers``, shard s holding elements
    ``bounds[s]:bounds[s+1]`` of the flat buffer.  One exchange sends the header and its payload
    slice to every shard and receives one reply header and payload slice from each, all
    non-blocking; with one server it is the four-message exchange drawn above."""

    def __init__(self, comm, servers=(SERVER,), bounds=None):
        self.comm, self.servers = comm, list(servers)
        self.bounds = bounds                          # None: the whole buffer to one server
        self.replies = np.zeros((len(self.servers), ReplyHeader.SIZE), dtype=np.int64)
        self.reply = self.replies[0]                  # server 0's: the count and the signals
        self._headers: list = []
        self._payloads: list = []
        self._sends: list = []                        # the push's payload sends, one per shard

    def parts(self, a: np.ndarray) -> list:
        """``a`` cut into the shards' contiguous slices (views)."""
        if self.bounds is None:
            return [a]
        return [a[lo:hi] for lo, hi in zip(self.bounds[:-1], self.bounds[1:])]

    def post_reply(self, payload: np.ndarray) -> None:
        """Posts the receives for the next reply (headers into ``self.replies``, each shard's
        payload into its slice of ``payload``)."""
        assert not self._payloads, "a reply is already pending"
        for row, srv, part in zip(self.replies, self.servers, self.parts(payload)):
            self._headers.append(self.comm.Irecv(row, source=srv, tag=Tag.REPLY_HEADER))
            self._payloads.append(self.comm.Irecv(part, source=srv, tag=Tag.REPLY_PAYLOAD))

    def send_push(self, hdr: np.ndarray, payload: np.ndarray) -> None:
        """Synchronous header sends (``Issend`` to every shard); each shard's payload slice is sent
        (``Isend``) as soon as THAT shard has received the header.  Returns once every shard has
        received it, i.e. has started serving this push, so the time in it is queueing behind other
        workers (wait); ``finish_push`` then completes the payloads' transfer.  With one server it
        is ``Ssend`` then ``Isend``, as drawn above.

        A shard's payload never waits for another shard: two shards may take two workers' headers
        in opposite orders (nothing orders messages from different senders), and a shard blocks
        in the payload receive of the header it took, so waiting for every header before sending
        any payload is a cycle (shard 0 waits for A's payload, A for shard 1, shard 1 for B's
        payload, B for shard 0)."""
        assert not self._sends, "a push is already in flight"
        parts = self.parts(payload)
        heads = [self.comm.Issend(hdr, dest=srv, tag=Tag.PUSH_HEADER) for srv in self.servers]
        while len(self._sends) < len(heads):
            for s in MPI.Request.Waitsome(heads):      # completed ones become REQUEST_NULL
                self._sends.append(self.comm.Isend(parts[s], dest=self.servers[s],
                                                   tag=Tag.PUSH_PAYLOAD))

    def finish_push(self) -> None:
        """Completes the payload sends posted by ``send_push``."""
        MPI.Request.Waitall(self._sends)
        self._sends = []

    def wait_reply_header(self) -> None:
        """Blocks until every shard's reply header has arrived (each is done with this push and
        replying); ``wait_reply`` then completes the payloads' transfer."""
        MPI.Request.Waitall(self._headers)

    def wait_reply(self) -> np.ndarray:
        """Completes the exchange; returns server 0's reply header (``self.replies`` has all)."""
        MPI.Request.Waitall(self._headers + self._payloads)
        self._headers, self._payloads = [], []
        return self.reply

    @property
    def awaiting_reply(self) -> bool:
        return bool(self._payloads)


class ServerPort:
    """The server's end: receives pushes in arrival order, replies to their sender."""

    def __init__(self, comm):
        self.comm = comm
        self.push_hdr = header(PushHeader.SIZE)
        self.reply = header(ReplyHeader.SIZE)
        self.status = MPI.Status()

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

    def next_message(self) -> int:
        """Blocks until a push header or a phase notice can be received; returns its tag (the
        sender is in ``self.status``).  Only those two tags arrive at a serving shard."""
        self.comm.Probe(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=self.status)
        return self.status.Get_tag()

    def send_notice(self, dest: int, counts: np.ndarray) -> None:
        self.comm.Send(counts, dest=dest, tag=Tag.PHASE_NOTICE)

    def recv_notice(self, counts: np.ndarray) -> None:
        self.comm.Recv(counts, source=SERVER, tag=Tag.PHASE_NOTICE)

    def push_waiting(self) -> int | None:
        """The rank of a worker whose push is waiting to be received, or None."""
        if self.comm.Iprobe(source=MPI.ANY_SOURCE, tag=Tag.PUSH_HEADER, status=self.status):
            return self.status.Get_source()
        return None
