"""A method is four roles that compose (``methods/roles.py``): the docs' table is the protocols,
every implementation has every member of its role (with the role's parameters), ``create``
composes each method as docs/architecture.md says, on a virtual world of 6 ranks (2 a node), flat
and as node groups, and the sizes that table reports are the classes'."""
import ast
import inspect
import re
from pathlib import Path

import numpy as np
import pytest

from test_virtual_nodes import in_world

from scalesgd import config as C
from scalesgd.comm import contract
from scalesgd.comm.topology import Topology
from scalesgd.methods import METHODS, create, roles
from scalesgd.methods.base import Exchange
from scalesgd.methods.gossip import Gossip, PullGossip, PushGossip
from scalesgd.methods.gradients import LocalGradients, SummedGradients
from scalesgd.methods.hierarchical import NodeLeader
from scalesgd.methods.server import ServerMethod
from scalesgd.train.control import Signals

ARCHITECTURE = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"
EXCHANGES = [*(c for c in METHODS.values() if c is not Gossip), PullGossip, PushGossip, NodeLeader]


def table() -> dict[str, set[str]]:
    """docs/architecture.md's role table: {role: the members it names}."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    section = text[text.index("### A method: four roles and its traits"):]
    section = section[:section.index("\n### ", 5)]
    out = {}
    for line in section.splitlines():
        m = re.match(r"\| (\w+) \(", line)
        if m:
            out[m.group(1)] = set(re.findall(r"`(\w+)`", line.split("|")[2]))
    return out


def test_the_docs_table_is_the_protocols_and_the_traits():
    got = table()
    assert set(got) == {*roles.ROLES, "traits"}, sorted(got)
    for name, protocol in roles.ROLES.items():
        want = set(contract.members(protocol))
        assert got[name] == want, (name, got[name] ^ want)
    from dataclasses import fields

    from scalesgd.methods.base import Traits
    assert got["traits"] == {f.name for f in fields(Traits)}


def callables(protocol) -> dict[str, list[str]]:
    return {n: p for n, p in contract.members(protocol).items()
            if inspect.isfunction(vars(protocol).get(n))}


def _params(cls, name: str) -> list[str]:
    return list(inspect.signature(getattr(cls, name)).parameters)[1:]


@pytest.mark.parametrize("role, classes", [
    ("gradients", [LocalGradients, SummedGradients]),
    ("exchange", EXCHANGES),
    ("codec", EXCHANGES),
    ("server", [c for c in EXCHANGES if issubclass(c, ServerMethod)]),
])
def test_every_implementation_has_its_roles_callables_with_their_parameters(role, classes):
    want = callables(roles.ROLES[role])
    assert want and classes
    for cls in classes:
        for name, params in want.items():
            assert callable(getattr(cls, name, None)), (cls.__name__, name)
            assert _params(cls, name) == params, (cls.__name__, name, _params(cls, name), params)


def test_the_checker_sees_a_renamed_parameter():
    class Renamed(LocalGradients):
        def after_backward(self, step, ps, finite):      # not the role's loss_finite
            return not finite
    with pytest.raises(AssertionError):
        test_every_implementation_has_its_roles_callables_with_their_parameters("gradients", [Renamed])


def _compose(method: str, hierarchy: str, **dist):
    """Every rank's (method record's roles, described) on 6 virtual ranks, 2 a node."""
    cfg = C.build(overrides={"train": {"method": method}, "dist": {"hierarchy": hierarchy, **dist}})

    def body(net):
        m = create(cfg, Topology(net.rank, net.size, 0, 1, None, None, net), Signals())
        missing = [(r, n) for r, protocol in roles.ROLES.items() if getattr(m, r) is not None
                   for n in contract.members(protocol) if not hasattr(getattr(m, r), n)]
        out = (type(m.gradients).__name__, type(m.exchange).__name__, m.codec is m.exchange,
               None if m.server is None else type(m.server).__name__, missing,
               getattr(m.gradients, "signals", None) is not None, m.gradients.grad_scale)
        return out
    got, _ = in_world(6, 2, body)
    return got


def test_create_composes_each_method_as_the_docs_say():
    ar = _compose("allreduce", "none")
    assert ar == [("SummedGradients", "AllReduce", True, None, [], True, 1 / 6)] * 6
    for method, cls in (("gossip", "PullGossip"), ("localsgd", "LocalSGD")):
        assert _compose(method, "none") == [("LocalGradients", cls, True, None, [], False, 1.0)] * 6
    easgd = _compose("easgd", "none")
    assert easgd[0] == ("LocalGradients", "EASGD", True, "EASGD", [], False, 1.0)
    assert easgd[1:] == [("LocalGradients", "EASGD", True, None, [], False, 1.0)] * 5


def test_node_groups_are_composed_from_the_node_sum_and_a_leaders_exchange():
    """6 ranks, 2 a node: gossip's node groups sum gradients over the node (1/2, not the job's
    barrier); every rank's exchange is a NodeLeader; EASGD's server rank (a group of its own) has
    the method's server role; all-reduce has no node agents (its sum is hierarchical in comm/)."""
    assert _compose("gossip", "node") == [("SummedGradients", "NodeLeader", True, None, [], False, 0.5)] * 6
    easgd = _compose("easgd", "node")
    assert easgd[0] == ("SummedGradients", "NodeLeader", True, "EASGD", [], False, 1.0)
    assert {g[:4] for g in easgd[1:]} == {("SummedGradients", "NodeLeader", True, None)}
    assert _compose("allreduce", "node")[0][:2] == ("SummedGradients", "AllReduce")


def written(cls) -> int:
    """Callables ``cls`` itself defines, ``__init__`` left out (the table's measure)."""
    return sum(1 for n, v in vars(cls).items() if n != "__init__" and
               (callable(v) or isinstance(v, (property, classmethod, staticmethod))))


def test_the_sizes_the_docs_report_are_the_classes():
    from scalesgd.methods.allreduce import AllReduce
    from scalesgd.methods.easgd import EASGD
    from scalesgd.methods.localsgd import LocalSGD
    text = ARCHITECTURE.read_text(encoding="utf-8")
    row = next(line for line in text.splitlines() if line.startswith("| callables a method writes"))
    now = [int(n) for n in re.findall(r"\d+", row.split("|")[-2])]
    assert now == [written(Gossip), written(EASGD), written(ServerMethod), written(LocalSGD),
                   written(AllReduce)], now
    row = next(line for line in text.splitlines() if line.startswith("| the node-group form"))
    overrides = sum(n in vars(Exchange) for n in vars(NodeLeader) if not n.startswith("_"))
    assert f"`NodeLeader`: {overrides} overrides" in row
    row = next(line for line in text.splitlines() if line.startswith("| what the loop talks to"))
    sizes = dict(re.findall(r"(gradients|exchange|server|codec) (\d+)", row.split("|")[-2]))
    assert {k: int(v) for k, v in sizes.items()} == {k: len(callables(p)) for k, p in roles.ROLES.items()}


def test_the_loop_sets_nothing_on_a_method():
    """No assignment in train/ to an attribute of the method record or of one of its roles."""
    root = Path(__file__).resolve().parents[1] / "src" / "scalesgd" / "train"
    found = []
    for f in sorted(root.glob("*.py")):
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            for t in getattr(node, "targets", []):
                text = ast.unparse(t)
                if re.search(r"\bmethod\.|\bm\.(gradients|exchange|server|codec)\b", text):
                    found.append(f"{f.name}:{node.lineno}: {text}")
    assert not found, found


class _Dead(Exception):
    pass


def _dead():
    raise _Dead("a rank died")


class _Garbage:
    """A job of 2 whose collectives complete with garbage (as Open MPI's over TCP did after a rank
    died in one): a huge stop request and checkpoint generation."""

    size, clock = 2, staticmethod(lambda: 0.0)

    def allreduce_max_host(self, v):
        return np.array([0, 1, 2 ** 40], np.int64)[-len(v):] if len(v) == 3 else np.array([1, 2 ** 40])


def test_a_collective_a_rank_died_in_never_reaches_the_signals():
    """The all-reduce's barrier and the lockstep exchange's maximum merge what the collective
    returned only after the liveness check: a garbage stop request would otherwise reach ``seen``
    and a survivor would carry it on (found by review: the barrier merged before the loop's check)."""
    import types
    signals = Signals()
    signals.check_alive = _dead
    grads = SummedGradients(_Garbage(), None, {"comm": 0.0, "wait": 0.0}, signals)
    grads.engine = types.SimpleNamespace(launch_all=lambda: None, finish=lambda: None)
    with pytest.raises(_Dead):
        grads.after_backward(0, None, True)
    assert signals.seen.tolist() == [0, 0]
    ex = Exchange.__new__(Exchange)                 # (its merge alone: no config needed)
    ex.signals, ex.comm, ex.roles = signals, _Garbage(), types.SimpleNamespace(size=2)
    with pytest.raises(_Dead):
        ex.merge_signals()
    assert signals.seen.tolist() == [0, 0]
    signals.check_alive = None                      # (no failure detector: merged as it came)
    grads.after_backward(1, None, True)
    assert signals.seen.tolist() == [1, 2 ** 40]
