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

from enum import IntEnum, unique

import numpy as np
from mpi4py import MPI

SERVER = 0                       # the server's rank in COMM_WORLD


@unique
class Tag(IntEnum):
    """Point-to-point tags (unique; collectives use no tags).  What each one carries, from whom to
    whom: ``TAG_MESSAGES``."""

    PUSH_HEADER = 0x5101
    PUSH_PAYLOAD = 0x5102
    REPLY_HEADER = 0x5103
    REPLY_PAYLOAD = 0x5104
    PHASE_NOTICE = 0x5105
    FUNNEL_META = 0x5201
    FUNNEL_DATA = 0x5202


# Tag -> (sender → receiver, the message).  The one description of each tag: reference_markdown()
# renders it into docs/methods.md.
TAG_MESSAGES = {
    Tag.PUSH_HEADER: ("worker → server", "`PushHeader`, sent with `Ssend` (returns once the server "
                      "has received it)"),
    Tag.PUSH_PAYLOAD: ("worker → server", "the flat parameter-sized buffer, params dtype: x_i (easgd) "
                       "or the update accumulated since the last fetch (asgd)"),
    Tag.REPLY_HEADER: ("server → worker", "`ReplyHeader`"),
    Tag.REPLY_PAYLOAD: ("server → worker", "the flat buffer: the center before this exchange's "
                        "update (easgd) / the master after it (asgd)"),
    Tag.PHASE_NOTICE: ("server 0 → server shard s > 0", "int64[workers]: each worker's exchanges "
                        "before the phase server 0 enters; the shard serves up to them, then enters "
                        "(`--servers K` > 1 only)"),
    Tag.FUNNEL_META: ("root → rank, then rank → root", "checkpoint funnel: an empty message (this "
                      "rank's turn), then UTF-8 JSON as uint8: a text and each array's name, dtype, "
                      "shape"),
    Tag.FUNNEL_DATA: ("rank → root", "checkpoint funnel: one announced array, as a buffer"),
}


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
    FIELDS = ("what the payload carries: a `Kind` (the server refuses any other)",
              "training samples this worker consumed since its previous exchange",
              "local steps since its previous exchange",
              "this worker's exchanges before this one (0 for its first)",
              "stop this worker raised: 1 after SIGTERM/SIGUSR1 reached it (max-merged)",
              "checkpoint generation this worker raised (max-merged; only rank 0's clock raises new ones)")


class ReplyHeader:
    """int64[7]: (global samples after this exchange, server version after it, staleness of this
    exchange in versions, exchanges served so far, then the signals the server has seen: stop,
    newest checkpoint generation; last, whether the push was rejected as too stale)."""

    GLOBAL, VERSION, STALENESS, SERVED, STOP, CKPT, REJECTED = range(7)
    SIZE = 7
    FIELDS = ("global sample count G after this exchange (the worker's progress until its next one)",
              "server version after this exchange (updates applied)",
              "staleness of this exchange: updates other workers applied since this worker's "
              "previous reply",
              "exchanges the server has served, this one included",
              "stop the server has seen (its own and every push's, max-merged)",
              "newest checkpoint generation the server has seen (max-merged)",
              "1 when the server did not apply this push (asgd `--max-staleness`: its staleness "
              "exceeded the bound; the reply still carries the current weights), else 0")


def header(size: int) -> np.ndarray:
    return np.zeros(size, dtype=np.int64)


def header_fields(cls) -> list[tuple[int, str, str]]:
    """[(index, NAME, meaning)] of a header class, in index order.  Raises ValueError unless its
    upper-case int constants are exactly 0..SIZE-1 and ``FIELDS`` has one meaning per index."""
    named = sorted((v, k) for k, v in vars(cls).items()
                   if k.isupper() and k != "SIZE" and isinstance(v, int))
    fields = getattr(cls, "FIELDS", ())
    if [v for v, _ in named] != list(range(cls.SIZE)) or len(fields) != cls.SIZE:
        raise ValueError(f"{cls.__name__}: fields {named} and {len(fields)} FIELDS meanings do not "
                         f"match SIZE = {cls.SIZE} (one name and one meaning per index)")
    return [(v, k, fields[v]) for v, k in named]


def reference_markdown() -> str:
    """The tag and header tables of docs/methods.md, rendered from ``Tag``, ``TAG_MESSAGES``,
    ``PushHeader``, ``ReplyHeader`` and ``Kind`` (``python docs/generate.py`` rewrites the doc's
    block; a test fails while the doc differs)."""
    missing = [t.name for t in Tag if t not in TAG_MESSAGES]
    if missing:
        raise ValueError(f"TAG_MESSAGES does not describe {', '.join(missing)}")
    out = ["| tag | value | from → to | message |", "|---|---|---|---|"]
    out += [f"| `{t.name}` | `{t.value:#06x}` | {TAG_MESSAGES[t][0]} | {TAG_MESSAGES[t][1]} |"
            for t in Tag]
    for cls in (PushHeader, ReplyHeader):
        out += ["", f"`{cls.__name__}`, int64[{cls.SIZE}]:", "",
                "| index | field | meaning |", "|---|---|---|"]
        out += [f"| {i} | `{name}` | {meaning} |" for i, name, meaning in header_fields(cls)]
    out += ["", "`Kind`: " + ", ".join(f"`{k.name}` = {k.value}" for k in Kind) + "."]
    return "\n".join(out)


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


def shard_bounds(n: int, k: int) -> list[int]:
    """Element offsets [0, ..., n] cutting a flat buffer of n elements into k contiguous shards of
    (nearly) equal size, hence equal bytes: shard s is ``bounds[s]:bounds[s+1]``."""
    if not 1 <= k <= max(n, 1):
        raise ValueError(f"cannot cut {n} elements into {k} shards")
    return [n * s // k for s in range(k + 1)]


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
