"""What a training run prints while it runs: the step line and the validation lines.

``ProgressLine`` is the first worker's step display: one updating line on a terminal, plain
periodic lines otherwise.  ``TrainLog`` is what the loop holds on every rank: the step line where
the first worker runs, validation lines where rank 0 runs (with a parameter server these are two
different ranks), nothing elsewhere.  ``format_duration`` and ``eta_seconds`` are shared with
``data/make_shards.py``'s build progress.

Pure apart from the injected ``stream`` and ``clock``, so it is testable without a terminal::

    bar = ProgressLine(total_epochs=90, every=10)          # stream=sys.stdout, clock=time.monotonic
    bar.update(step, epoch, loss, error, images_per_second, lr)   # every step
    bar.message("epoch 1.00 validation top-1 ...")           # any other line (clears the bar first)
    bar.close()                                               # ends the updating line

``mode`` (the ``progress`` key): ``bar`` redraws one line with ``\\r`` at most every ``min_interval``
seconds; ``lines`` prints a plain line every ``every`` steps (logs); ``off`` prints no step lines;
``auto`` is ``bar`` when the stream is a terminal and no MPI launcher started this process, else
``lines``.  The launcher test matters because Open MPI hands each rank a pty: ``isatty()`` is true
there even when the job's output is redirected to a file, which a ``\\r`` line would flood.

Loss and error are exponentially smoothed (``smoothing`` = weight of the past, bias-corrected like
Adam's moments so the first values are not pulled towards 0).  ETA: wall time since the first update
divided by the epochs done since then, times the epochs left (evaluation time included, so it is a
real ETA).
"""
from __future__ import annotations

import os
import sys
import time
from typing import Callable, Mapping, TextIO

from ..choices import PROGRESS_MODES
# Set in every rank by an MPI launcher: Open MPI (OMPI_*, PMIX_*), MPICH's hydra and srun --mpi=pmi2
# (PMI_*), srun --mpi=pmix (PMIX_*).  Under one of them stdout goes wherever the launcher's does.
LAUNCHER_VARS = ("OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE")


def launched_by_mpi(environ: Mapping[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return any(v in env for v in LAUNCHER_VARS)


def resolve_mode(mode: str, stream: TextIO, environ: Mapping[str, str] | None = None) -> str:
    """'auto' -> 'bar' on a terminal that no launcher stands between, else 'lines'; others as given."""
    if mode not in PROGRESS_MODES:
        raise ValueError(f"progress mode {mode!r} is not one of {', '.join(PROGRESS_MODES)}")
    if mode != "auto":
        return mode
    tty = bool(getattr(stream, "isatty", lambda: False)())
    return "bar" if tty and not launched_by_mpi(environ) else "lines"


def format_duration(seconds: float) -> str:
    """3725 -> '1:02:05'; 65 -> '1:05'; negative or unknown -> '?'."""
    if seconds != seconds or seconds < 0 or seconds == float("inf"):
        return "?"
    s = int(round(seconds))
    h, m, sec = s // 3600, s // 60 % 60, s % 60
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


def eta_seconds(elapsed: float, done: float, total: float) -> float:
    """Seconds left at the mean rate so far: ``elapsed / done * (total - done)``; nan before any
    work is done (``done`` and ``total`` in any unit: epochs, images)."""
    if done <= 0:
        return float("nan")
    return elapsed / done * max(total - done, 0.0)


class Smoothed:
    """Bias-corrected exponential moving average: value = sum b^k x_{n-k} (1-b) / (1 - b^n)."""

    def __init__(self, beta: float):
        self.beta, self.avg, self.n = beta, 0.0, 0

    def add(self, x: float) -> float:
        self.n += 1
        self.avg = self.beta * self.avg + (1.0 - self.beta) * x
        return self.value

    @property
    def value(self) -> float:
        return self.avg / (1.0 - self.beta ** self.n) if self.n else float("nan")


class ProgressLine:
    def __init__(self, total_epochs: float, every: int = 10, stream: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic, mode: str = "auto",
                 environ: Mapping[str, str] | None = None,
                 smoothing: float = 0.98, min_interval: float = 0.2, width: int = 120):
        self.total_epochs, self.every = float(total_epochs), max(1, int(every))
        self.stream = stream if stream is not None else sys.stdout
        self.mode = resolve_mode(mode, self.stream, environ)      # bar | lines | off
        self.tty = self.mode == "bar"
        self.clock, self.min_interval, self.width = clock, min_interval, width
        self.loss, self.err = Smoothed(smoothing), Smoothed(smoothing)
        self._start: tuple[float, float] | None = None     # (time, epoch) of the first update
        self._last_draw = -float("inf")
        self._open = False                                   # an unfinished \r line is on screen

    def eta(self, epoch: float) -> float:
        """Seconds left, from the mean rate since the first update (nan before any progress)."""
        if self._start is None:
            return float("nan")
        t0, e0 = self._start
        return eta_seconds(self.clock() - t0, epoch - e0, self.total_epochs - e0)

    def text(self, step: int, epoch: float, images_per_second: float, lr: float | None) -> str:
        lr_part = f" lr {lr:.3g}" if lr is not None else ""
        return (f"step {step} epoch {epoch:.2f}/{self.total_epochs:g} ETA {format_duration(self.eta(epoch))} "
                f"{images_per_second:,.0f} img/s loss {self.loss.value:.4f} "
                f"top1-err {100 * self.err.value:.1f}%{lr_part}")

    def update(self, step: int, epoch: float, loss: float, error: float, images_per_second: float,
               lr: float | None = None) -> None:
        """Records one step (loss and minibatch top-1 error in [0, 1]) and shows it when due."""
        if self._start is None:
            self._start = (self.clock(), epoch)
        self.loss.add(loss)
        self.err.add(error)
        if self.tty:
            now = self.clock()
            if now - self._last_draw >= self.min_interval:
                self._last_draw = now
                line = self.text(step, epoch, images_per_second, lr)[: self.width]
                self.stream.write("\r" + line.ljust(self.width) if self._open else line.ljust(self.width))
                self._open = True
                self.stream.flush()
        elif self.mode == "lines" and step % self.every == 0:
            self.stream.write(self.text(step, epoch, images_per_second, lr) + "\n")
            self.stream.flush()

    def message(self, line: str) -> None:
        """Prints a whole line (e.g. a validation result) without mixing it into the bar."""
        self._end_bar()
        self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        self._end_bar()

    def _end_bar(self) -> None:
        if self._open:
            self.stream.write("\n")
            self.stream.flush()
            self._open = False
            self._last_draw = -float("inf")


class TrainLog:
    """A rank's console output in training: ``steps`` -> the step line (this rank is the first
    worker; ``every``, ``epochs``, ``mode`` as ``ProgressLine``), ``evaluations`` -> the validation
    lines (this rank is rank 0).  A rank with neither prints nothing."""

    def __init__(self, steps: bool, evaluations: bool, every: int, epochs: float, mode: str = "auto",
                 stream: TextIO | None = None):
        self.stream = stream if stream is not None else sys.stdout
        self.epochs, self.every, self.mode = epochs, every, mode
        self.bar = None
        self.show_steps(steps)
        self.enabled = evaluations

    def show_steps(self, steps: bool) -> None:
        """Whether this rank shows the step line from now on: after a lost rank the new first
        worker takes it over (and a rank that is no longer the first worker ends its line)."""
        if steps and self.bar is None:
            self.bar = ProgressLine(self.epochs, every=self.every, mode=self.mode, stream=self.stream)
        elif not steps and self.bar is not None:
            self.bar.close()
            self.bar = None

    def step(self, epoch, step, loss, err, lr, ips):
        if self.bar is not None:
            self.bar.update(step, epoch, loss, err, ips, lr)

    def evaluation(self, epoch, epochs, top1, top5, t_train, t_eval, extra):
        """One line per validation: top-1/top-5 accuracy in [0, 1], seconds so far, ``extra``
        (the method's numbers, e.g. gossip's consensus distance) as ``, key value``."""
        if not self.enabled:
            return
        more = "".join(f", {k} {v:.4g}" for k, v in extra.items())
        line = (f"epoch {epoch:.2f}/{epochs} validation top-1 {100 * top1:.2f}% top-5 {100 * top5:.2f}% "
                f"(train {t_train:.1f}s, eval {t_eval:.1f}s{more})")
        if self.bar is not None:
            self.bar.message(line)
        else:
            self.stream.write(line + "\n")
            self.stream.flush()

    def close(self):
        if self.bar is not None:
            self.bar.close()
