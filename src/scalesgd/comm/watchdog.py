"""A stop request always ends the job: checkpoint and exit 75 in time, or exit 1 naming where it hung.

SIGTERM/SIGUSR1 ask every rank to checkpoint at the next phase and exit 75.  That path goes through
collectives; if the job is stuck (a deadlocked phase, a peer that stopped answering without dying),
the stop would wait for ever too.  So the first stop signal also arms a deadline
(``train.stop_timeout`` seconds): when it passes, the rank prints what it was doing (``doing()``,
kept current by the loop, the phases and the methods) and ends the whole job with MPI_Abort.

Python runs signal handlers only between bytecodes of the main thread: while that thread is blocked
inside an MPI call, a handler does not run at all.  ``signal.set_wakeup_fd`` makes the C-level
handler write the signal number into a socket, which a daemon thread reads at once; that thread
records the request and arms the timer.  MPI_Abort from the timer thread is allowed because mpi4py
initialises MPI with MPI_THREAD_MULTIPLE.
"""
from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time

from .shm import unlink_mapped_segments

EXIT_STUCK = 1
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class _State:
    activity = "starting up"         # what this rank is doing now (one short phrase)
    since = time.monotonic()
    stop_at: float | None = None     # monotonic time of the first stop signal
    deadline: float = 180.0          # seconds a stop may take (train.stop_timeout's default; 0 = off)
    timer: threading.Timer | None = None
    on_stop = None                   # callable: records the stop request (set by the CLI)
    installed = False
    saved = False                    # the stop's checkpoint has been written
    lock = threading.RLock()


def doing(activity: str) -> None:
    """Records what this rank is doing now (cheap: call it at every phase and exchange)."""
    _State.activity, _State.since = activity, time.monotonic()


def stop_requested() -> bool:
    """A stop signal came (at any time since start-up)."""
    return _State.stop_at is not None


def install(on_stop) -> None:
    """Main thread, first thing: ``on_stop()`` runs on SIGTERM/SIGUSR1, from the Python handler and
    (at once, even while the main thread is blocked in MPI) from the wake-up thread."""
    _State.on_stop = on_stop
    if _State.installed:              # (main() called again in one process, e.g. by tests)
        return
    _State.installed = True
    for sig in STOP_SIGNALS:          # the Python-level handler only records (no lock, no timer):
        signal.signal(sig, lambda signum, frame: _record())   # it may interrupt _arm itself
    r, w = socket.socketpair()
    w.setblocking(False)
    signal.set_wakeup_fd(w.fileno(), warn_on_full_buffer=False)
    threading.Thread(target=_watch, args=(r, w), name="scalesgd-signals", daemon=True).start()


def _watch(r: socket.socket, w: socket.socket) -> None:
    stops = {int(s) for s in STOP_SIGNALS}
    while True:
        data = r.recv(64)
        if not data:
            return
        if stops.intersection(data):
            _stop_signal()


def _record() -> None:
    """Records a stop request (flags only: safe in a signal handler and in any thread)."""
    if _State.stop_at is None:
        _State.stop_at = time.monotonic()
    if _State.on_stop is not None:
        _State.on_stop()


def _stop_signal() -> None:
    """The wake-up thread: records the request and arms the deadline."""
    _record()
    _arm()


def configure(stop_timeout: float) -> None:
    """Sets the deadline (seconds after the first stop signal; 0 = none; until this is called the
    config's default applies), arming it if a signal already came (e.g. during start-up)."""
    _State.deadline = float(stop_timeout)
    _arm()


def stop_checkpointed() -> None:
    """The stop's checkpoint is written; what is left is closing MPI objects and exiting 75."""
    _State.saved = True
    doing("closing after the stop checkpoint")


def disarm() -> None:
    """The job is ending as asked (exit 75): no deadline for the way out."""
    with _State.lock:
        _State.deadline = 0.0
        if _State.timer is not None:
            _State.timer.cancel()


def _arm() -> None:
    with _State.lock:
        if _State.stop_at is None or not _State.deadline or _State.timer is not None:
            return
        left = max(0.0, _State.stop_at + _State.deadline - time.monotonic())
        _State.timer = threading.Timer(left, _expired)
        _State.timer.daemon = True
    _State.timer.start()               # outside the lock: a signal may interrupt the start


def _expired() -> None:
    stuck = time.monotonic() - _State.since
    msg = (f"a stop was requested {_State.deadline:g} s ago (train.stop_timeout) but this rank is still "
           f"{_State.activity} (for {stuck:.0f} s); ending the job " +
           ("(its stop checkpoint was written)" if _State.saved else "without a checkpoint (the newest "
            "checkpoint in RUN_DIR/checkpoints is still good)"))
    mpi = sys.modules.get("mpi4py.MPI")
    running = mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized()
    size = mpi.COMM_WORLD.Get_size() if running else 1
    where = f" (rank {mpi.COMM_WORLD.Get_rank()}/{size})" if size > 1 else ""
    print(f"scalesgd: error{where}: {msg}", file=sys.stderr, flush=True)
    if running and mpi.Query_thread() == mpi.THREAD_MULTIPLE:    # else Abort from a 2nd thread is erroneous
        unlink_mapped_segments()      # MPI_Abort skips MPI_Finalize, which would free /dev/shm
        mpi.COMM_WORLD.Abort(EXIT_STUCK)
    os._exit(EXIT_STUCK)              # MPICH's MPI_Abort may return in a thread once it told the
                                      # launcher; without MPI_THREAD_MULTIPLE the launcher sees this exit
