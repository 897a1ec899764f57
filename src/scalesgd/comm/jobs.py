"""A courier's job states and polling periods, without MPI: the MPI courier (``window.Courier``)
and the virtual cluster's (``virtual.windows.VirtualCourier``) share them, and the methods read the
periods without loading MPI.
"""
from __future__ import annotations

POLL_SECONDS = 0.001       # a courier's sleep between two MPI_Test of a request (it never spins)
IDLE_POLL_SECONDS = 0.005  # an idle courier runs MPI's progress engine this often (None: never)


class CourierJobs:
    """The job states a courier goes through, shared by the MPI one (``Courier``) and the virtual
    cluster's (``virtual.windows.VirtualCourier``): idle -> queued -> running -> done -> idle."""

    _state = "idle"
    _result = (None, None)
    idle_error = None          # what stopped the idle progress (MPI: a revoked communicator)

    @property
    def busy(self) -> bool:
        """A job was submitted and ``wait`` has not collected it yet."""
        return self._state != "idle"

    @property
    def done(self) -> bool:
        """The job submitted last has finished (``wait`` will not block)."""
        return self._state in ("done", "idle")

    def _collect(self, exposed: float):
        """Hands the finished job's value back (or raises its exception) and goes idle; ``exposed``:
        the seconds the caller was blocked waiting for it."""
        (value, error), self._result, self._state = self._result, (None, None), "idle"
        self.exposed_seconds += exposed
        if error is not None:
            raise error
        return value
