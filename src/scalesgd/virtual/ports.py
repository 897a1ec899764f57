"""The parameter-server endpoints of a virtual rank: ``comm/mpi/protocol.py``'s ``WorkerPort`` and
``ServerPort`` between buffers of one process (see ``transport.py`` for the timing)."""
from __future__ import annotations

import numpy as np

from ..comm.wire import PushHeader, ReplyHeader, Tag, header
from .cluster import Endpoint


class Push:
    """One worker's push to one shard: the header (copied), the payload slice (the worker's own
    buffer until the shard received it, as an MPI send buffer) and its times."""

    def __init__(self, src: int, hdr, part, arrival: float):
        self.src, self.hdr, self.part, self.arrival = src, hdr.copy(), part, arrival
        self.taken = self.received = None            # times


class VirtualWorkerPort:
    def __init__(self, net: Endpoint, servers: list, bounds):
        self.net, self.servers, self.bounds = net, servers, bounds
        net.c.ports[(net.key, net.wr)] = self
        self.replies = np.zeros((len(servers), ReplyHeader.SIZE), dtype=np.int64)
        self.reply = self.replies[0]
        self.reply_to = None          # this worker's reply buffer, while a reply is pending
        self.header_at = [None] * len(servers)
        self.payload_at = [None] * len(servers)
        self.sent: list[Push] = []

    def parts(self, a):
        if self.bounds is None:
            return [a]
        return [a[lo:hi] for lo, hi in zip(self.bounds[:-1], self.bounds[1:])]

    def post_reply(self, payload) -> None:
        self.net._raise_if_lost()          # (a revoked communicator: ULFM fails the call)
        assert self.reply_to is None, "a reply is already pending"
        self.reply_to = self.parts(payload)
        self.header_at = [None] * len(self.servers)
        self.payload_at = [None] * len(self.servers)

    def send_push(self, hdr, payload) -> None:
        self.net._raise_if_lost()          # (a revoked communicator: ULFM fails the call)
        n, net = self.net, self.net.c.net
        t = n.clock()
        self.sent = []
        for srv, part in zip(self.servers, self.parts(payload)):
            p = Push(n.wr, hdr, part, net.send(n.wr, srv, hdr.nbytes, t))
            n.c.pushes.setdefault((n.key, srv), []).append(p)
            self.sent.append(p)

        def taken():                   # Ssend: until every shard has taken the header
            ts = [p.taken for p in self.sent]
            return None if None in ts else max(ts)
        n._wait(taken, "pushing to the server (queued behind other workers)")

    def finish_push(self) -> None:
        def received():
            ts = [p.received for p in self.sent]
            return None if None in ts else max(ts)
        self.net._wait(received, "sending the push's payload")
        self.sent = []

    def wait_reply_header(self) -> None:
        self.net._wait(lambda: None if None in self.header_at else max(self.header_at),
                       "waiting for the server's reply")

    def wait_reply(self):
        self.net._wait(lambda: None if None in self.payload_at else max(self.payload_at),
                       "receiving the server's reply")
        self.reply_to = None
        return self.reply

    @property
    def awaiting_reply(self) -> bool:
        return self.reply_to is not None


class VirtualServerPort:
    """A shard's end.  ``next_message`` picks the push or notice that arrived first (``model``) or
    the push the real run's shard served next (``replay``)."""

    def __init__(self, net: Endpoint):
        self.net = net
        self.push_hdr = header(PushHeader.SIZE)
        self.reply = header(ReplyHeader.SIZE)
        self.current: Push | None = None
        self.served = 0

    def _queue(self):
        return self.net.c.pushes.setdefault((self.net.key, self.net.wr), [])

    def _next_push(self):
        """The push to take next, or None if it has not been sent yet."""
        q = self._queue()
        replay = self.net.c.replay
        if replay is not None:
            want = replay.next_serve(self.net.wr, self.served)     # None: past the trace's end
            if want is not None:
                return next((p for p in q if p.src == want), None)
        return min(q, key=lambda p: (p.arrival, p.src)) if q else None

    def next_message(self) -> int:
        notices = self.net.c.notices.setdefault((self.net.key, self.net.wr), [])

        def ready():
            p = self._next_push()
            times = ([p.arrival] if p is not None else []) + [a for a, _ in notices[:1]]
            return min(times) if times else None
        self.net._wait(ready, "serving: waiting for a push")
        p = self._next_push()
        if notices and (p is None or notices[0][0] <= p.arrival):
            return Tag.PHASE_NOTICE
        return Tag.PUSH_HEADER

    def recv_push_header(self) -> int:
        self.net._raise_if_lost()          # (a revoked communicator: ULFM fails the call)
        self.net._wait(lambda: None if self._next_push() is None else self._next_push().arrival,
                       "serving: waiting for a push")
        p = self._next_push()
        self._queue().remove(p)
        self.push_hdr[...] = p.hdr
        p.taken = self.net.clock() + self.net.c.net.lat
        self.current = p
        return self.net.group.index(p.src)

    def recv_push_payload(self, src: int, payload) -> None:
        self.net._raise_if_lost()          # (a revoked communicator: ULFM fails the call)
        p, n = self.current, self.net
        if p.part.size != payload.size:
            raise RuntimeError(f"parameter server: rank {src} pushed {p.part.nbytes} bytes, expected "
                               f"{payload.nbytes} (do all ranks build the same model?)")
        arrival = n.c.net.send(p.src, n.wr, p.part.nbytes, p.taken)
        n._wait(lambda: arrival, "serving: receiving a push's payload")
        payload[...] = p.part
        p.received = n.clock()
        self.served += 1
        n.advance(n.c.net.apply_seconds(payload.nbytes))   # the update's arithmetic

    def send_reply(self, dest: int, payload) -> None:
        self.net._raise_if_lost()          # (a revoked communicator: ULFM fails the call)
        n = self.net
        port = n.c.ports[(n.key, n.group[dest])]
        s = port.servers.index(n.wr)
        t = n.clock()
        port.replies[s] = self.reply
        port.header_at[s] = n.c.net.send(n.wr, n.group[dest], self.reply.nbytes, t)
        port.reply_to[s][...] = payload
        arrival = n.c.net.send(n.wr, n.group[dest], payload.nbytes, t)
        port.payload_at[s] = arrival
        n.advance(max(0.0, arrival - n.c.net.lat - t))    # until it left the NIC

    def send_notice(self, dest: int, counts) -> None:
        self.net._raise_if_lost()          # (a revoked communicator: ULFM fails the call)
        n = self.net
        wr = n.group[dest]
        n.c.notices.setdefault((n.key, wr), []).append((n.c.net.send(n.wr, wr, counts.nbytes, n.clock()),
                                               counts.copy()))

    def recv_notice(self, counts) -> None:
        self.net._raise_if_lost()          # (a revoked communicator: ULFM fails the call)
        notices = self.net.c.notices.setdefault((self.net.key, self.net.wr), [])
        self.net._wait(lambda: notices[0][0] if notices else None, "waiting for a phase notice")
        counts[...] = notices.pop(0)[1]

    def push_waiting(self):
        q, now = self._queue(), self.net.clock()
        early = [p for p in q if p.arrival <= now]
        return None if not early else self.net.group.index(min(early, key=lambda p: p.arrival).src)
