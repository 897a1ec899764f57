"""The crossover study's shipped file as ``plan`` reads it: loading it, the job its task ran, and the
clock of that job on a user's profile (a clock-only virtual run) read at a target error.  Split
from ``plan.py``, which ranks the methods from these."""
from __future__ import annotations

import contextlib
import json
import logging
import math
import tempfile
from pathlib import Path

from ..errors import ConfigError
from . import profile as P

STUDY = Path(__file__).parent / "study" / "crossover.json"


def load_study(path: Path = STUDY) -> dict:
    try:
        study = json.loads(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"{path}: the crossover study's results cannot be read "
                          f"({exc.strerror or exc})") from exc
    except ValueError as exc:
        raise ConfigError(f"{path}: not a study file ({exc})") from exc
    if "cells" not in study:
        raise ConfigError(f"{path}: not a study file (no 'cells')")
    task = study.get("task")
    if not isinstance(task, dict) or not {"job", "classes", "train", "eval_every"} <= set(task):
        raise ConfigError(f"{path}: not a study file (its 'task' needs the job it ran, its classes, "
                          "training images and validation interval)")
    return study


@contextlib.contextmanager
def task_job(study: dict):
    """A temporary folder holding the job file the study ran (``task.toml``): yields (folder, job)."""
    with tempfile.TemporaryDirectory() as tmp:
        job = Path(tmp) / "task.toml"
        job.write_text(study["task"]["job"])
        yield Path(tmp), job


def task_config(study: dict):
    """The study's task as a Config: the job file it ran (``study["task"]["job"]``, the text of
    ``jobs/glyphs.toml``), read as ``--config`` reads it, so that its steps and bytes are timed as
    the study's runs were."""
    from ..launch import make_parser, resolve_config  # noqa: PLC0415
    with task_job(study) as (_, job):
        try:
            return resolve_config(make_parser().parse_args(["--config", str(job)]))
        except ConfigError as exc:
            raise ConfigError(f"the study's task (its 'task.job'): "
                              f"{str(exc).replace(str(job), 'the job')}") from None


def clock(study: dict, flags: str, workers: int, prof: P.Profile, condition, seed: int,
          samples: float) -> list[tuple[float, float]]:
    """(global samples, simulated training seconds) at every validation of the study's task run
    with ``flags`` on ``prof`` under ``condition``, up to ``samples``: a clock-only virtual run
    (``clockonly.py``: the same clock as the real run, no arithmetic)."""
    import io  # noqa: PLC0415

    from ..launch import make_parser, resolve_config  # noqa: PLC0415
    from .run import run as vrun  # noqa: PLC0415
    task = study["task"]
    epochs = max(1, math.ceil(samples / task["train"] - 1e-9))
    with task_job(study) as (tmp, job):
        argv = ["--config", str(job), *flags.split(), "--seed", str(seed), "--epochs", str(epochs),
                "--eval-every", str(task["eval_every"]), "--run-dir", str(tmp / "run")]
        cfg = resolve_config(make_parser().parse_args(argv))
        log = logging.getLogger("scalesgd")
        level = log.level
        log.setLevel(logging.WARNING)
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                s = vrun(cfg, workers, prof, threads=1, condition=condition,
                         clock_only=dict(train=task["train"], val=task["val"], classes=task["classes"]))
        finally:
            log.setLevel(level)
    return [(h["global_samples"], h["train_seconds"]) for h in s["history"]]


def at(points: list[tuple[float, float]], samples: float) -> float:
    """The clock at ``samples``, linear between the validations around it (as the study reads its
    own runs)."""
    prev = (0.0, 0.0)
    for x, t in points:
        if samples <= x:
            return prev[1] + (samples - prev[0]) / (x - prev[0]) * (t - prev[1]) if x > prev[0] else t
        prev = (x, t)
    return prev[1]


def to_target(curve: list, points: list[tuple[float, float]], target: float) -> float | None:
    """Seconds to ``target`` of a run whose validation errors are ``curve`` ([samples, error]) on
    the clock ``points``: linear between the last validation above it and the first at or below,
    as the study's records are read."""
    t = dict(points)
    prev = None
    for x, e in curve:
        if e <= target:
            if prev is None or prev[1] <= e:
                return t[x]
            f = (prev[1] - target) / (prev[1] - e)
            return t[prev[0]] + f * (t[x] - t[prev[0]])
        prev = (x, e)
    return None


def samples_to(curve: list, target: float) -> float | None:
    """Global samples at which a run whose validation errors are ``curve`` ([samples, error])
    first reaches ``target``: linear between the validations around it, as the study reads its
    runs (its ``samples`` to its own target are this at that target)."""
    return to_target(curve, [(x, x) for x, _ in curve], target)
