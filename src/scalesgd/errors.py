"""The errors a user can cause, and only those (imports nothing).

A ``UserError`` means bad input: a flag, a job file, a data set, a checkpoint, a run directory, a
launch that does not fit the method.  The command line prints its message as one line
``scalesgd: error: ...`` and exits with ``exit_code``.  Every other exception (``ValueError``,
``OSError``, ``KeyError``... raised anywhere) is a bug: the failing rank prints its traceback and the
whole job is aborted.  So code that can fail on bad input must raise one of these classes where it
knows the cause, naming the file or key; an ``OSError`` on a path the user gave is wrapped there.

``shared``: every rank detects the error alike (same config, same world), so rank 0 alone reports
it and every rank exits cleanly; otherwise the rank that hit it reports it and aborts the job.
Classes that were ``ValueError``/``RuntimeError`` before this module existed keep that base too,
so library callers that catch those still do.
"""
from __future__ import annotations


class UserError(Exception):
    """Bad input; the message names the file or key and the cause (one line, no traceback)."""

    exit_code = 1
    shared = False


class ConfigError(UserError, ValueError):
    """A bad key or value; the message names the key (``section.key``) and the cause."""

    exit_code = 2           # a usage error, as argparse's
    shared = True


class DataError(UserError):
    """Bad input data: one line naming the file (and index) and the cause."""


class CheckpointError(UserError, ValueError):
    """A checkpoint that cannot be used (or written): the message names the file and the cause."""


class RunDirError(UserError):
    """The run directory cannot be created or written (read-only, not a directory, disk full)."""


class MethodError(UserError, RuntimeError):
    """The method cannot run on this MPI world (wrong number of ranks, bad setting...)."""

    shared = True


class TopologyError(UserError, RuntimeError):
    """The MPI world is not what the launcher promised (e.g. srun with the wrong --mpi plugin)."""

    shared = True


class ResumeError(UserError, RuntimeError):
    """The checkpoint cannot be resumed (every rank raises it alike)."""

    shared = True


class BackendError(UserError, RuntimeError):
    """The requested device cannot be used (e.g. ``--device gpu`` without CuPy or a GPU)."""

    report = None      # a strict fast-path failure: the check's evidence (``fastpaths.Report``)


class PhaseError(UserError, RuntimeError):
    """A phase can never complete (inconsistent state found by one rank); the job ends, not hangs."""


class RankFailed(Exception):
    """A rank of the job died (``train.on_failure = continue``: the survivors recover); raised by
    either transport's failure detection (``comm/mpi/failures.py``, the virtual cluster's)."""


class LostRankError(UserError, RuntimeError):
    """A rank died and the job cannot train on without it (``train.on_failure = continue``: a server
    rank, or too few ranks left).  Raised by the survivors' rank 0 alone (the world communicator is
    revoked, so the error cannot be shared): it ends the job."""


class Diverged(UserError, RuntimeError):
    """The training loss is no longer finite (a per-rank error: the job ends, naming rank and step)."""
