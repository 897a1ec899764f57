"""Command line: flags generated from the config dataclasses, TOML job files, one-line errors.

``python -m src.main [--config jobs/X.toml] [--flag value ...]``; ``--dry-run`` prints the resolved
config and the model's parameter count.  User errors (bad flag or key, missing/corrupt data, unknown
model, wrong rank count: ``errors.UserError``) print one line ``scalesgd: error: ...`` and exit non-zero;
with several ranks the whole job is aborted so no rank hangs.  Any other exception is a bug: its
traceback is printed, then the job is aborted.
"""
from __future__ import annotations

import contextlib
import logging
import sys
from pathlib import Path

from . import backend as backend_mod
from . import config as C
from .choices import servers_of
from .errors import CheckpointError, ResumeError, RunDirError, UserError
from .launch import EXIT_ERROR, EXIT_STOPPED, dry_run, make_parser, refuse_occupied, resolve_config

def _stopped():
    from .train.phases import Stopped
    return Stopped


def _data_root(cfg: C.Config, topo) -> Path:
    """The dataset directory; the built-in digits are built (once per node) on first use."""
    if cfg.data.data:
        return Path(cfg.data.data)
    from .data.demo import build_digits, default_data_dir
    with together(topo):
        if topo.local_rank == 0:
            build_digits(default_data_dir())
    with together(topo):                     # (a barrier) the others then find it built: writes are atomic
        return build_digits(default_data_dir())


class SetupError(Exception):
    """A set-up error settled by all ranks together (``together``); every rank raises it."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


@contextlib.contextmanager
def together(topo):
    """Set-up work every rank does, with no collective inside.  A user error on any rank is settled
    by all ranks at the end of the block (one all-gather of the messages): an error every rank hit
    alike is reported once, one that only some ranks hit names them (``ranks 1,3/4: ...``), and
    every rank raises ``SetupError``, so the job ends cleanly with one report.  On one rank the
    error passes through unchanged.  Anything that is not a user error is a bug and aborts at once."""
    if topo.size == 1:
        yield
        return
    from .comm.mpi.collectives import allgather_text
    text = ""
    try:
        yield
    except UserError as exc:                  # anything else is a bug: it aborts the job at once
        text = f"{exc.exit_code} {exc}"
    texts = allgather_text(topo.comm, text)
    failed = {r: t.split(" ", 1) for r, t in enumerate(texts) if t}
    if not failed:
        return
    by_message: dict[str, list[int]] = {}
    for r, (_, msg) in failed.items():
        by_message.setdefault(msg, []).append(r)
    if len(by_message) == 1 and len(failed) == topo.size:
        message = next(iter(by_message))
    else:
        message = "; ".join(f"rank{'s' if len(rs) > 1 else ''} {','.join(map(str, rs))}/{topo.size}: {msg}"
                            for msg, rs in by_message.items())
    raise SetupError(message, max(int(code) for code, _ in failed.values()))


def _run_dir(cfg: C.Config, topo) -> Path:
    """``--run-dir``, or ``runs/<time>-<method>-<model>`` reserved by rank 0 for every rank (``.2``,
    ``.3``, ... after it for a run started within the same second as another; the virtual cluster
    names its own: virtual/run.py)."""
    if cfg.train.run_dir:
        return Path(cfg.train.run_dir)
    from .comm.mpi.collectives import bcast_text
    from .io.files import reserve_dir, stamped
    name, err = None, ""
    if topo.is_root:
        try:
            name = str(reserve_dir(stamped(f"{cfg.train.method}-{cfg.model.model}")))
        except OSError as exc:            # runs/ a file, a read-only directory: the user's to fix
            err = f"cannot create a run directory under runs/ ({exc.strerror or exc})"
    err = bcast_text(topo.comm, err)
    if err:
        raise RunDirError(err)
    return Path(bcast_text(topo.comm, name))


def _resume_checkpoint(cfg: C.Config, topo) -> Path | None:
    """The checkpoint to resume (rank 0 finds and verifies it, ``resuming.find_checkpoint``, and
    tells the others); None for a new run."""
    if not cfg.train.resume:
        return None
    from .comm.mpi.collectives import bcast_text
    from .train import resuming
    path, err = None, ""
    if topo.is_root:
        try:
            path = resuming.find_checkpoint(cfg.train.resume, topo.size, cfg.train.method)
        except CheckpointError as exc:
            err = str(exc)
    err = bcast_text(topo.comm, err)
    if err:
        raise ResumeError(err)
    return Path(bcast_text(topo.comm, str(path) if path else None))


class StopRelay:
    """Hands a stop signal to the run's ``Signals`` once they exist.  Installed first thing, so a
    signal during start-up (e.g. Slurm's early warning arriving during MPI initialisation) is
    remembered instead of killing the rank."""

    def __init__(self):
        self.signals = None              # the run's Signals, once attached

    def install(self) -> "StopRelay":
        from .comm import watchdog
        watchdog.install(self.fire)
        return self

    def fire(self) -> None:
        """SIGTERM / SIGUSR1 on any rank: checkpoint at the next phase, then exit 75 everywhere (or
        exit 1 after ``train.stop_timeout`` if the job is stuck: ``comm/watchdog.py``).  May run on
        the watchdog's signal thread: it only sets flags."""
        if self.signals is not None:
            self.signals.request_stop()

    def attach(self, signals) -> None:
        from .comm import watchdog
        self.signals = signals
        if watchdog.stop_requested():    # the signal came during start-up
            signals.request_stop()


def run(cfg: C.Config, topo, stop: StopRelay | None = None) -> dict:
    import numpy as np
    from .io.files import write_json_atomic
    from .train import loop
    from .train.assemble import assemble
    nodes = None
    if cfg.dist.hierarchy == "node":             # (collective) A-SGD's rate: over the node groups
        nodes = topo.worker_nodes(servers_of(cfg.train.method, cfg.dist.servers))
    cfg = C.fit_to_world(cfg, topo.size, nodes)  # rank-count defaults of unset keys (rank 0 logs)
    with together(topo):
        from .data.pipeline import require_dali
        from .methods import check_ranks
        check_ranks(cfg, topo.size)              # a wrong rank count is refused before anything
        require_dali()                           # (from an extra: one line, nothing written)
        if cfg.train.on_failure == "continue":   # refused at start where MPI cannot survive a death
            from .comm.mpi import failures
            failures.require(topo, cfg)
        backend = backend_mod.select(cfg.train.device, topo.local_rank)
        threads = backend_mod.blas_threads_for(topo.local_size)
        backend_mod.set_blas_threads(threads)
    resume = _resume_checkpoint(cfg, topo)
    data_root = _data_root(cfg, topo)
    setup = assemble(cfg, topo, backend, data_root, cfg.data.data_threads or threads, resume,
                     settle=lambda: together(topo))
    most = topo.transport.allreduce_max_host(np.array([threads, -threads], np.int64))
    setup.blas_threads = (-int(most[1]), int(most[0]))   # (collective) recorded in summary.json
    control = setup.control
    run_dir = _run_dir(cfg, topo)
    with together(topo):
        if topo.is_root:
            if resume is None:
                refuse_occupied(run_dir)
            try:
                run_dir.mkdir(parents=True, exist_ok=True)
                write_json_atomic(run_dir / "config.json", cfg.to_dict())
            except OSError as exc:          # read-only, a file in the way, disk full: the user's path
                raise RunDirError(f"--run-dir {run_dir}: cannot write the run directory "
                                  f"({exc.strerror or exc})") from None
    if stop is not None:
        stop.attach(control.signals)
    if topo.is_root:
        cap = backend_mod.thread_cap()
        logging.info("run directory %s; model %s, %s parameters; device %s; %d BLAS thread(s)%s",
                     run_dir, cfg.model.model, f"{setup.model.num_params:,}", backend.name, threads,
                     f" (at most {cap[1]}={cap[0]})" if cap is not None else "")
    if resume is not None and topo.is_root:
        logging.info("resuming from %s", resume)
    try:
        summary = loop.train(setup, run_dir, resume)
    except loop.Stopped as stop:
        stop.run_dir = run_dir
        raise
    from .comm.mpi import failures
    if failures.is_root(topo):                   # (after a lost rank 0: the new one)
        print(f"done: validation top-1 {100 * summary['val_top1_accuracy']:.2f}%, "
              f"{summary['images_per_second']:.1f} img/s, {summary['wall_seconds']:.1f} s; "
              f"results in {run_dir}/summary.json", flush=True)
    return summary


def _launched_world():
    """For an error found before MPI started (a bad flag): the topology when a launcher started
    several ranks, so that the error is printed once (by rank 0) instead of once per rank."""
    from .comm.mpi import library, start
    if max(library.launched_size(), 1) == 1:
        return None
    try:
        return start.init()
    except Exception:                     # a broken launch: every rank reports on its own
        return None


def _dry_run_ranks(cfg: C.Config) -> int | None:
    """The ranks a dry run stands for: the launcher's rank count when one started several (read
    from its environment: no MPI is started), one for ``single``; else unknown (None)."""
    from .comm.mpi import library
    launched = library.launched_size()
    if launched > 1:
        return launched
    return 1 if cfg.train.method == "single" else None


def main(argv: list[str] | None = None) -> int:
    if (sys.argv[1:] if argv is None else argv)[:1] == ["doctor"]:   # `scalesgd doctor`: doctor/
        from .doctor import main as doctor
        return doctor((sys.argv[1:] if argv is None else argv)[1:])
    stop = StopRelay().install()
    args = make_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="scalesgd: %(message)s", stream=sys.stderr)
    topo = None
    from .comm.mpi.abort import fail
    try:
        cfg = resolve_config(args)
        from .comm import watchdog
        watchdog.configure(cfg.train.stop_timeout)
        if getattr(args, "dry_run", False):
            dry_run(cfg, _dry_run_ranks(cfg))
            return 0
        from .comm import progress
        from .comm.mpi import start
        progress.prepare(cfg.dist.mpi_progress, cfg.train.method)   # (mpi: before MPI_Init)
        waiting = progress.prepare_waiting()                         # (before MPI_Init)
        topo = start.init()
        if not topo.is_root:
            logging.getLogger().setLevel(logging.WARNING)
        elif waiting:
            logging.info("%s", waiting)
        run(cfg, topo, stop)
    except _stopped() as exc:
        from .comm import watchdog
        from .comm.mpi import failures
        watchdog.disarm()
        if topo is not None and failures.is_root(topo):   # (after a lost rank 0: the new one)
            print(f"scalesgd: stopped on a signal; checkpoint written; continue with "
                  f"--resume {getattr(exc, 'run_dir', 'RUN_DIR')}", file=sys.stderr, flush=True)
        failures.leave(topo, EXIT_STOPPED)      # (only after a lost rank was survived)
        return EXIT_STOPPED
    except SetupError as exc:
        fail(topo, str(exc), exc.code, shared=True)
    except UserError as exc:                # errors.py: bad input, one line; exit_code 2 for usage
        where = topo if topo is not None or not exc.shared else _launched_world()
        fail(where, str(exc), exc.exit_code, shared=exc.shared, release=getattr(exc, "release", None))
    except KeyboardInterrupt:
        fail(topo, "interrupted", 130)
    except BaseException as exc:            # a bug: show the traceback, but still end every rank
        if isinstance(exc, SystemExit):
            raise
        import traceback
        traceback.print_exc()
        fail(topo, f"unexpected {type(exc).__name__}: {exc}", EXIT_ERROR)
    from .comm.mpi import failures
    failures.leave(topo, 0)                     # (only after a lost rank was survived)
    return 0
