"""The timeline tape of a virtual rank: what its clock did, and how every time it wrote was computed.

A virtual run (``scalesgd.virtual``) simulates time; for the methods whose arithmetic does not
depend on that time (all-reduce, local SGD, one worker) the same trajectory can be timed under any
other profile without computing a gradient again (``virtual/retime.py``).  That needs two records
per rank, both kept here:

- **ops**: every action that moves the rank's clock, in order: a step's compute (with the real
  seconds it took), a sleep, a collective (its group, an index into ``groups``, its cost's kind
  and bytes), a read of the clock.  Replaying them through the simulator under another profile
  gives the clock's new reads.
- **nodes**: the arithmetic on the reads.  ``Tape.read`` returns a :class:`Stamp`, a float that
  remembers how it was made; every +, -, *, / on stamps adds a node.  The training loop is
  unchanged: it subtracts and adds clock readings as always, and what it writes (a metrics row's
  ``train_seconds``, the summary's history) is a stamp whose node says how to compute it again.
  Evaluating the same nodes on the new reads repeats the same float operations in the same order,
  so a re-timed run's times equal a full run's bit for bit.

``rows`` maps a metrics row (its number in the rank's file) and field to a node; ``paths`` does the
same for the summary.  An operation a stamp does not know (``math`` functions, comparisons) gives a
plain float or bool: fine for decisions and display, not re-timed (``retime`` recomputes the
summary's derived numbers itself).
"""
from __future__ import annotations

import operator

OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}


def _binary(op: str, reflected: bool = False):
    """A stamp's ``op`` with a number (``reflected``: the number on the left)."""
    def method(self, o):
        if not isinstance(o, (int, float)):
            return NotImplemented
        return self._op(op, o, self) if reflected else self._op(op, self, o)
    return method


class Stamp(float):
    """A time read from a virtual clock or computed from such reads (see the module doc)."""

    __slots__ = ("tape", "node")

    def __new__(cls, value: float, tape: "Tape", node: int):
        obj = float.__new__(cls, value)
        obj.tape, obj.node = tape, node
        return obj

    def __reduce__(self):                 # copies, pickles and deep copies are plain floats
        return (float, (float(self),))

    def _ref(self, x):
        return x.node if isinstance(x, Stamp) and x.tape is self.tape else float(x)

    def _op(self, op: str, a, b):
        return Stamp(OPS[op](float(a), float(b)), self.tape, self.tape.node(op, self._ref(a), self._ref(b)))

    __add__, __radd__ = _binary("+"), _binary("+", reflected=True)
    __sub__, __rsub__ = _binary("-"), _binary("-", reflected=True)
    __mul__, __rmul__ = _binary("*"), _binary("*", reflected=True)
    __truediv__, __rtruediv__ = _binary("/"), _binary("/", reflected=True)

    def __neg__(self):
        return self._op("*", self, -1.0)

    def __pos__(self):
        return self


class Tape:
    """One virtual rank's ops, nodes, metrics rows and summary paths (see the module doc)."""

    def __init__(self):
        self.ops: list[list] = []
        self.nodes: list[list] = []
        self.rows: list[list] = []
        self.paths: list[list] = []
        self.groups: list[list] = []          # the collectives' groups (ops name them by index)
        self._group_index: dict = {}
        self.reads = 0

    def op(self, *entry) -> None:
        self.ops.append(list(entry))

    def group(self, ranks: tuple) -> int:
        """The index of a collective's group (world ranks) in ``groups``."""
        if ranks not in self._group_index:
            self._group_index[ranks] = len(self.groups)
            self.groups.append(list(ranks))
        return self._group_index[ranks]

    def read(self, value: float) -> Stamp:
        self.ops.append(["r"])
        self.nodes.append(["r", self.reads, None])
        self.reads += 1
        return Stamp(value, self, len(self.nodes) - 1)

    def node(self, op: str, a, b) -> int:
        self.nodes.append([op, a, b])
        return len(self.nodes) - 1

    def metrics_row(self, row: int, values: dict) -> None:
        for key, v in values.items():
            if isinstance(v, Stamp) and v.tape is self:
                self.rows.append([row, key, v.node])

    def summary(self, summary: dict) -> None:
        """Records where the stamps of ``summary`` (rank 0's) sit: [path..., node]."""
        def walk(obj, path):
            if isinstance(obj, Stamp) and obj.tape is self:
                self.paths.append([*path, obj.node])
            elif isinstance(obj, dict):
                for k, v in obj.items():
                    walk(v, path + [k])
            elif isinstance(obj, list):
                for i, v in enumerate(obj):
                    walk(v, path + [i])
        walk(summary, [])

    def to_dict(self) -> dict:
        return dict(ops=self.ops, nodes=self.nodes, rows=self.rows, paths=self.paths, groups=self.groups)


def evaluate(nodes: list, reads: list[float]) -> list[float]:
    """Every node's value with the clock's reads ``reads`` (the same operations, in order)."""
    vals: list[float] = []
    for op, a, b in nodes:
        if op == "r":
            vals.append(reads[a])
            continue
        x = vals[a] if isinstance(a, int) else a
        y = vals[b] if isinstance(b, int) else b
        vals.append(OPS[op](x, y))
    return vals


def put(obj, path: list, value) -> None:
    """Sets ``obj[path[0]][path[1]]...`` to ``value``."""
    for key in path[:-1]:
        obj = obj[key]
    obj[path[-1]] = value
