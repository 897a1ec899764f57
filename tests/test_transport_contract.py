"""Both transports against the contract (``comm/contract.py``): every member of ``Transport`` on
``MPITransport`` and ``InProcessTransport`` with the same parameters, and the same closed-form
checks of the collectives through both (``tests/mpi/transport_contract.py``): in-process on a
bare virtual world of 3 ranks, and under ``mpiexec -n 3``."""
import inspect
import sys
from pathlib import Path

import pytest

from mpirun import check, needs_mpi, run_mpi
from test_virtual_nodes import in_world

from scalesgd.comm import contract
from scalesgd.comm.mpi.transport import MPITransport
from scalesgd.virtual.transport import InProcessTransport

sys.path.insert(0, str(Path(__file__).parent / "mpi"))
import transport_contract as T  # noqa: E402


def params(cls, name: str) -> list[str] | None:
    """A member's parameter names (self left out); None where a builtin has no signature."""
    static = isinstance(inspect.getattr_static(cls, name), staticmethod)
    try:
        names = list(inspect.signature(getattr(cls, name)).parameters)
    except ValueError:                              # e.g. time.sleep: a builtin without one
        return None
    return names if static else names[1:]


@pytest.mark.parametrize("cls", [MPITransport, InProcessTransport])
def test_each_transport_has_every_member_with_the_contracts_parameters(cls):
    members = contract.members()
    assert {"allreduce_mean", "worker_port", "reducer_like", "rank", "spans_nodes"} <= set(members)
    for name, want in members.items():
        if not want and not callable(getattr(contract.Transport, name, None)):
            continue                                # data attributes: on a live one (below)
        assert hasattr(cls, name), f"{cls.__name__} lacks {name}"
        got = params(cls, name)
        assert got is None or got == want, (cls.__name__, name, got, want)


def test_the_checker_sees_a_missing_member_and_a_renamed_parameter():
    class Short(MPITransport):
        def barrier(self, now) -> None:            # a parameter the contract does not have
            pass
    assert params(Short, "barrier") == ["now"] != contract.members()["barrier"]
    assert not isinstance(object(), contract.Transport)


def test_the_in_process_transport_passes_the_contract_checks():
    def body(net):
        for c in T.CHECKS:
            c(net)
        return net.rank
    got, _ = in_world(3, 1, body)
    assert got == [0, 1, 2]


@pytest.mark.mpi
@needs_mpi
def test_the_mpi_transport_passes_the_contract_checks():
    out = check(run_mpi(3, ["tests/mpi/transport_contract.py"], timeout=60))
    assert out.count(": ok") == len(T.CHECKS), out
