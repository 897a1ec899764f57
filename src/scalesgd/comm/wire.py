"""The parameter-server protocol's vocabulary: message tags, header layouts, message kinds and the
cut of the flat buffer into server shards.  No MPI here: the methods and the in-process cluster
speak it without loading MPI; the endpoints that move these messages over MPI are in
:mod:`protocol`, which describes one exchange.
"""
from __future__ import annotations

from enum import IntEnum, unique

import numpy as np

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
    NEVER_SENT = 0x5301


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
    Tag.NEVER_SENT: ("nobody", "the receive of a rank told to hang (`SCALESGD_INJECT_FAULT=RANK:STEP:hang`, "
                     "testing): no message ever answers it"),
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


def shard_bounds(n: int, k: int) -> list[int]:
    """Element offsets [0, ..., n] cutting a flat buffer of n elements into k contiguous shards of
    (nearly) equal size, hence equal bytes: shard s is ``bounds[s]:bounds[s+1]``."""
    if not 1 <= k <= max(n, 1):
        raise ValueError(f"cannot cut {n} elements into {k} shards")
    return [n * s // k for s in range(k + 1)]
