"""The studies' shipped files as ``plan`` reads them (the crossover study's, the map by time to
final quality's): loading one, the job its task ran, that job's balance of communication to compute
on a profile, and its clock there (a clock-only virtual run) read at a target error.  Split from
``plan.py`` and ``planfinal.py``, which rank the methods from these."""
from __future__ import annotations

import contextlib
import json
import logging
import math
import multiprocessing
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from ..backend import usable_cores
from ..errors import ConfigError, UserError
from ..io.files import reserve_dir, stamped
from ..netmodel import transfer_seconds
from . import profile as P
from . import variability as V

STUDY = Path(__file__).parent / "study" / "crossover.json"

SYNC = {"allreduce", "localsgd", "single"}


def balance(prof: P.Profile, study: dict, cfg=None, agents: str = "rank") -> dict:
    """One step's compute (seconds) and the ratio of one gradient's transfer to it, for the study's
    task (``cfg``: its Config, read once by the caller) timed as ``prof`` times it, per *agent*:

    * ``agents="rank"`` (the study's flat methods, one agent a rank): the ``ranks_per_node`` ranks of
      a node share its link, so each gets a share of it; a profile of 8 GPUs a node on 10 GbE is an
      eighth of the link per rank, not all of it;
    * ``agents="node"`` (``--hierarchy node``: a node's ranks sum their gradients inside the node and
      the node is the agent): the whole link per agent, plus the node's own sum (reduce and
      broadcast, twice one gradient over ``intra_gbps``)."""
    if prof.measured or prof.step_seconds is not None:
        raise ConfigError(f"--profile {prof.name}: plan times the study's own small task on your cluster, so "
                          "it needs your GPUs' images_per_second on a reference model (and stands_for: your "
                          "model), not " + ("a measured step" if prof.measured else
                                            "step_seconds (one step of the job a profile runs with: here the "
                                            "study's task, not yours)"))
    cfg = cfg or task_config(study)
    classes = study["task"]["classes"]
    step = P.Compute(prof, cfg, classes, condition=V.load("none")).seconds
    nbytes = 4 * P.model_params(cfg.model.model, classes, cfg.model.width) * P.byte_scale(prof, cfg, classes)
    per_node = max(1, int(prof.ranks_per_node))
    lat = prof.latency_us * 1e-6
    if agents == "node":
        comm = transfer_seconds(nbytes, prof.link_gbps * 1e9 / 8, lat)
        if per_node > 1:
            comm += 2 * transfer_seconds(nbytes, prof.intra_gbps * 1e9 / 8, 0.0)
    else:
        comm = transfer_seconds(nbytes, prof.link_gbps * 1e9 / 8 / per_node, lat)   # bytes/s a rank gets
    return dict(step_seconds=step, comm_seconds=comm, ratio=comm / step)


def nearest_p(ps, workers: int) -> int:
    """The p of ``ps`` nearest to ``workers`` in log2 (the smaller on a tie; p = 1 only if alone)."""
    ps = [p for p in ps if p > 1] or list(ps)
    return min(ps, key=lambda p: (abs(math.log2(p) - math.log2(workers)), p))


def condition_name(prof: P.Profile, spec: str | None) -> tuple[str, str | None]:
    """(the studied condition to use, a note when it is not the user's own)."""
    name = spec if spec is not None else prof.variability
    if isinstance(name, str) and name in ("none", "typical", "stragglers"):
        return name, None
    return "typical", f"your condition ({name}) is not one the study ran: its times are under 'typical'"


def flag_value(flags: str, flag: str) -> str | None:
    """The value given to ``flag`` in the command-line string ``flags`` (None: not given)."""
    f = flags.split()
    return f[f.index(flag) + 1] if flag in f else None


def describe(method: str, config: str, flags: str) -> str:
    """The settings in words: the rate rule and the method's own."""
    rule, rate = config[0], config[1:].split("-")[0]
    words = {"F": f"fixed rate {rate}", "W": f"rate {rate} / p (A-SGD's own rule)",
             "L": f"linear scaling: {rate} per 8 images of global batch, 0.5-epoch warm-up"}[rule]
    knobs = [f"{label} {flag_value(flags, flag)}"
             for flag, label in (("--tau", "tau"), ("--beta", "beta"), ("--servers", "servers K"),
                                 ("--n-sync", "n_sync"), ("--slowmo-beta", "SlowMo beta"),
                                 ("--gossip-graph", "graph"), ("--hierarchy", "hierarchy"))
             if flag_value(flags, flag) is not None]
    return ", ".join([words, *knobs])


def load_study(path: Path = STUDY) -> dict:
    try:
        study = json.loads(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"{path}: the study's results cannot be read "
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


def _clock(args: tuple) -> list[tuple[float, float]]:
    return clock(*args)


def clocks(study: dict, prof: P.Profile, condition, jobs: list[tuple[str, int, int, float]],
           procs: int | None = None) -> list[list[tuple[float, float]]]:
    """``clock`` for each (flags, workers, seed, samples) of ``jobs``, in order, up to ``procs`` at a
    time in processes of their own (default: this machine's cores; 1: here, one after another).  A
    clock-only run is single-threaded Python, so they scale with the cores."""
    procs = min(len(jobs), procs or usable_cores())
    args = [(study, flags, workers, prof, condition, seed, samples) for flags, workers, seed, samples in jobs]
    if procs <= 1:
        return [_clock(a) for a in args]
    with ProcessPoolExecutor(procs, mp_context=multiprocessing.get_context("forkserver")) as pool:
        return list(pool.map(_clock, args))


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


def virtual_check(study: dict, row: dict, p: int, prof_spec: str, data: Path, condition: str | None,
                  epochs: str, more: list[str]) -> Path:
    """One ``--run`` check: ``row``'s flags on the study's task in the virtual cluster under the
    profile and ``condition``, at ``p``, ``epochs`` epochs (and ``more`` flags); its run directory."""
    from ..launch import EXIT_STOPPED  # noqa: PLC0415
    from .run import main as vmain  # noqa: PLC0415
    if not (data / "manifest.json").exists():
        raise ConfigError(f"--data {data}: no data set there (the study's glyphs: "
                          "python benchmarks/glyphs.py "
                          f"{data.parent}, then --data {data.parent}/main)")
    with task_job(study) as (_, job):
        # reserved: a check of the same method within the second, here or in another
        # plan --run, gets a directory of its own
        run_dir = reserve_dir(stamped(f"plan-{row['method']}-p{p}"))
        argv = ["--config", str(job), "--data", str(data), *row["flags"].split(), "--workers", str(p),
                "--profile", prof_spec, *(["--condition", condition] if condition is not None else []),
                "--epochs", epochs, "--eval-every", str(study["task"]["eval_every"]), *more,
                "--threads", "1", "--run-dir", str(run_dir)]
        with contextlib.redirect_stdout(sys.stderr):      # its progress: stdout is the plan's
            rc = vmain(argv)
    if rc == EXIT_STOPPED:            # Ctrl-C: the run checkpointed; not a failure
        stopped = UserError(f"--run: the virtual check of {row['method']} was stopped; its checkpoint "
                            f"is in {run_dir} (python -m scalesgd.virtual --resume {run_dir} "
                            "continues it)")
        stopped.exit_code = EXIT_STOPPED
        raise stopped
    if rc != 0:
        raise UserError(f"--run: the virtual check of {row['method']} failed")
    return run_dir
