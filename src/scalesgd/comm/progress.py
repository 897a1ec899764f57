"""Keeping MPI progressing while a rank computes, so that one-sided calls aimed at it never wait.

Across nodes a one-sided call (gossip's ``Get`` / ``Accumulate`` and the sample counter's
``Fetch_and_op``) completes only when its *target* enters MPI: without help a reader waits up to
one of its peer's steps (docs/cluster.md measures ~900 ms for a 1 s compute).  On one node MPICH
and Open MPI serve these calls from shared memory and nothing waits.  ``dist.mpi_progress`` picks
what keeps the target progressing (``plan``):

- ``auto`` (default): nothing on one node; across nodes, for a method that is the target of
  one-sided calls (gossip), a **progress thread**: a Python thread that calls ``MPI_Iprobe`` every
  ``dist.mpi_progress_ms`` (2 ms) and sleeps in between (the GIL and the core are free while it
  sleeps; NumPy and CuPy release the GIL while they compute).  Overlapped gossip already has such
  a thread, its courier, which polls every 5 ms while idle (``jobs.IDLE_POLL_SECONDS``; its
  calls, not the step, wait): no second thread.
- ``thread``: the progress thread wherever ranks use one-sided calls, on one node too.
- ``mpi``: the MPI library's own asynchronous progress, switched on before ``MPI_Init``
  (``MPIR_CVAR_ASYNC_PROGRESS=1`` for MPICH, ``OMPI_MCA_btl_tcp_progress_thread=1`` for Open MPI's
  TCP transport; a value already in the environment is kept).  Measured to make compute 2.2-2.6x
  slower on a shared core (docs/cluster.md), so never chosen by ``auto``.
- ``none``: nothing; across nodes every one-sided call waits for its busy target.

The thread needs ``MPI_THREAD_MULTIPLE`` (the main thread calls MPI at the same time).  Where MPI
granted less, ``plan`` degrades to ``none`` with a one-line warning naming the consequence and
the fix, never a hang.  ``allreduce``, ``easgd``, ``asgd`` and ``localsgd`` use only two-sided and
collective calls, which progress whenever the rank calls MPI itself, so they need nothing.

This module does not import mpi4py at import time: ``prepare`` runs before MPI starts.
"""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass

ASYNC_ENV = {"MPIR_CVAR_ASYNC_PROGRESS": "1",            # MPICH (and Intel MPI's MPICH base)
             "OMPI_MCA_btl_tcp_progress_thread": "1",    # Open MPI, TCP BTL
             "I_MPI_ASYNC_PROGRESS": "1"}                 # Intel MPI


@dataclass(frozen=True)
class Plan:
    """What keeps this rank's MPI progressing: ``mechanism`` is ``none``, ``thread`` (a progress
    thread polling every ``interval`` seconds), ``courier`` (overlapped gossip's communication
    thread polls at ``interval`` while idle) or ``mpi`` (the library's own); ``why`` says so in a
    few words; ``warning`` is a one-line problem to report (empty when none)."""

    mechanism: str
    interval: float
    why: str
    warning: str = ""

    def describe(self) -> str:
        what = {"none": "none", "mpi": "the MPI library's asynchronous progress",
                "thread": f"a progress thread (MPI_Iprobe every {self.interval * 1e3:g} ms)",
                "courier": f"the overlapped exchange's courier (MPI_Iprobe every "
                           f"{self.interval * 1e3:g} ms while idle)"}[self.mechanism]
        return f"{what}: {self.why}"


def plan(setting: str, interval_ms: float, courier_poll: float, *, one_sided: bool,
         spans_nodes: bool, overlap: bool, thread_level: str) -> Plan:
    """The mechanism for a rank whose method is (``one_sided``) or is not the target of one-sided
    calls, in a job that does or does not ``span_nodes``, with overlapped gossip's courier
    (``overlap``, polling every ``courier_poll`` seconds while idle) and MPI started at
    ``thread_level``."""
    interval = interval_ms / 1e3
    if not one_sided:
        return Plan("none", 0.0, "the method uses two-sided and collective calls only, which "
                                 "progress when the rank calls MPI")
    if setting == "mpi":
        return Plan("mpi", 0.0, "dist.mpi_progress = mpi (set before MPI_Init)", warning="" if
                    thread_level == "multiple" else (
                        f"dist.mpi_progress: MPI granted thread level '{thread_level}', not "
                        "'multiple': the library's asynchronous progress may not run (MPICH needs "
                        "MPI_THREAD_MULTIPLE for it)"))
    if setting == "none":
        return Plan("none", 0.0, "dist.mpi_progress = none"
                    + ("; one-sided calls across nodes wait for a busy target" if spans_nodes else ""))
    if setting == "auto" and not spans_nodes:
        return Plan("none", 0.0, "one node: one-sided calls are served from shared memory")
    if overlap:                   # the courier exists only at thread level multiple (gossip checks)
        return Plan("courier", courier_poll,
                    "ranks span nodes" if spans_nodes else "dist.mpi_progress = thread")
    if thread_level != "multiple":
        return Plan("none", 0.0, f"MPI thread level '{thread_level}'", warning=(
            f"dist.mpi_progress: MPI granted thread level '{thread_level}', not 'multiple', so no "
            "progress thread can run: one-sided calls aimed at a computing rank will wait for its "
            "next exchange (start MPI with MPI_THREAD_MULTIPLE, or use --mpi-progress mpi)"))
    return Plan("thread", interval, "ranks span nodes" if spans_nodes else "dist.mpi_progress = thread")


def prepare(setting: str, method: str, env=None) -> list[str]:
    """Before ``MPI_Init``: for ``mpi`` and a method that is the target of one-sided calls
    (gossip), switch on the libraries' asynchronous progress in the environment (a variable
    already set is kept; the others' compute need not pay for it).  Returns the variables it set."""
    env = os.environ if env is None else env
    if setting != "mpi" or method != "gossip":
        return []
    return _set_missing(env, ASYNC_ENV)


def _set_missing(env, values: dict) -> list[str]:
    """Sets each of ``values`` that ``env`` lacks (a value already there is kept); returns those set."""
    added = [k for k in values if k not in env]
    for k in added:
        env[k] = values[k]
    return added


# A rank waiting in MPI (a receive, a collective, a server's probe) polls in a loop: it spins. On a
# node with more ranks than CPUs that spinning takes the CPU from the ranks that compute (measured:
# 2 s of one rank's compute took 4.2 s beside a rank waiting on the same core under MPICH, 2.3 s with
# MPICH's heavy yield; Open MPI 5.2 s against 2.8 s with yield_when_idle).  These make a waiting
# rank sleep between polls (MPICH: nanosleep instead of sched_yield, which frees no CPU).
YIELD_ENV = {"MPIR_CVAR_ENABLE_HEAVY_YIELD": "1",        # MPICH
             "OMPI_MCA_mpi_yield_when_idle": "1"}       # Open MPI


def prepare_waiting(env=None, cpus: int | None = None) -> str:
    """Before ``MPI_Init``: when the launcher puts more ranks on this node than it has CPUs
    (``cpus``, default ``os.cpu_count()``, or the job's CPUs on the node under Slurm,
    ``SLURM_CPUS_ON_NODE``, when fewer: a demo of 4 ranks on a 2-core machine, never a rank bound
    to its own cores), let waiting ranks sleep between polls (``YIELD_ENV``; a variable already set
    is kept, so ``MPIR_CVAR_ENABLE_HEAVY_YIELD=0`` keeps the spinning).  Returns the line to log
    (empty when the node is not oversubscribed or the launcher does not say)."""
    from .mpi.library import _int, local_size  # noqa: PLC0415
    env = os.environ if env is None else env
    ranks = local_size(env)
    cpus = cpus or min(n for n in (os.cpu_count() or 1, _int(env, "SLURM_CPUS_ON_NODE")) if n)
    if ranks is None or ranks <= cpus:
        return ""
    added = _set_missing(env, YIELD_ENV)
    said = [f"set {k}={env[k]}" for k in added] + [f"kept {k}={env[k]} as given" for k in YIELD_ENV
                                                      if k not in added]
    return (f"{ranks} ranks on this node's {cpus} CPU{'s' if cpus > 1 else ''}: more than one a CPU, so "
            f"waiting ranks should sleep between polls, not spin ({'; '.join(said)})")


class ProgressThread:
    """A daemon thread that runs ``poke()`` (one ``MPI_Iprobe``) every ``interval`` seconds until
    ``close()``.  If ``poke`` raises (a dead rank, under ULFM) the thread ends and keeps the error
    in ``error``; the rank's own next MPI call reports the failure."""

    def __init__(self, poke, interval: float, name: str = "scalesgd-progress"):
        self.poke, self.interval = poke, interval
        self.pokes, self.error = 0, None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.poke()
            except Exception as e:  # noqa: BLE001 - reported by the rank's next MPI call
                self.error = e
                return
            self.pokes += 1

    def close(self) -> None:
        """Stops the thread and waits for it (idempotent)."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()


class NoProgress:
    """What a plan without a thread starts: nothing."""

    pokes, error = 0, None

    def close(self) -> None:
        pass
