"""``python -m scalesgd.virtual``: train p virtual workers in one process, write a real run directory.

Each virtual rank runs the program's own composition root and loop (``train.assemble.assemble``,
``train.loop.train``: the method from ``methods.create``, the control plane) against an
``InProcessTransport``; only the clock is simulated.  Timelines: ``model`` (the default: a hardware
``--profile``) and ``replay`` (``--replay RUN_DIR``: the order a real MPI run recorded; afterwards
its events and final checkpoint are compared with the run's).  A run of a method whose arithmetic
ignores the clock also writes its timeline tape (``RUN_DIR/timeline``), so
``python -m scalesgd.virtual retime`` can time it under another profile or condition without
computing it again (``retime.py``).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import logging
import signal
import sys
import time
from pathlib import Path

from .. import backend as backend_mod
from .. import choices
from .. import config as C
from ..errors import ConfigError, UserError
from . import profile as P
from . import variability as V
from .world import Deadlock

log = logging.getLogger("scalesgd")


def add_arguments(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("virtual cluster")
    g.add_argument("--workers", type=int, help="virtual workers, default 4 (a server method adds its "
                   "--servers shards as ranks of their own); with --replay: the run's")
    g.add_argument("--profile", help="hardware profile: a shipped name (--list-profiles) or a JSON "
                   "file (docs/virtual.md); default a100-100gbit; with --replay: ignored for the order")
    g.add_argument("--condition", help="the cluster's variability: a shipped condition (none, typical, "
                   "stragglers; --list-profiles) or a JSON file; default: the profile's own")
    g.add_argument("--replay", metavar="RUN_DIR", help="replay the event order a real MPI run "
                   "recorded in RUN_DIR/trace (its config is used: only --run-dir, --profile, --condition "
                   "and --threads may be given with it), then compare its events and final checkpoint "
                   "with the run's")
    g.add_argument("--threads", type=int, help="BLAS threads of the process (default: every core "
                   "it may use, at most an OMP_NUM_THREADS set; with --replay the real run's ranks' "
                   "count, summary.json's blas_threads; 1 when several virtual runs share a machine: "
                   "OpenBLAS threads spin between calls, and two runs of 2 threads on 2 cores run ~8x "
                   "slower)")
    g.add_argument("--list-profiles", action="store_true", help="list the shipped profiles and exit")


# What a replay takes from the command line (the rest is the recorded run's): argparse dests
REPLAY_FLAGS = {"replay", "train.run_dir", "profile", "condition", "threads", "dry_run"}


def ranks_for(cfg: C.Config, workers: int) -> int:
    """Ranks of a virtual run of ``workers`` workers: the server methods add their shards."""
    return choices.ranks_for(cfg.train.method, workers, cfg.dist.servers)


def run(cfg: C.Config, workers: int, prof: P.Profile, replay_dir: Path | None = None,
        threads: int | None = None, condition=None, clock_only: dict | None = None) -> dict:
    """Trains ``workers`` virtual workers; returns rank 0's summary (also in RUN_DIR/summary.json).
    ``condition``: the variability (``variability.Condition``; default: the profile's).
    ``clock_only``: {"train": samples, "val": samples, "classes": n}: the run's clock without its
    arithmetic, on splits of that size that are never read (``clockonly.py``)."""
    from ..io.files import write_json_atomic  # noqa: PLC0415
    from .timetape import Tape  # noqa: PLC0415
    from .replay import Replay, first_difference  # noqa: PLC0415
    from .retime import RETIMEABLE, write_tapes  # noqa: PLC0415
    from .cluster import Cluster  # noqa: PLC0415
    from .world import World  # noqa: PLC0415

    from .nodes import worker_nodes  # noqa: PLC0415
    if replay_dir is not None and cfg.dist.hierarchy == "node":
        raise ConfigError(f"--replay {replay_dir}: a --hierarchy node run cannot be replayed exactly "
                          "(its node split and MPI's order of the sums inside a node are not recorded)")
    size = ranks_for(cfg, workers)
    nodes = worker_nodes(size, size - workers, prof.ranks_per_node) if cfg.dist.hierarchy == "node" else None
    cfg = C.fit_to_world(cfg, size, nodes)   # (A-SGD's rate under the hierarchy: over the worker groups)
    if clock_only is not None:
        from . import clockonly  # noqa: PLC0415
        clockonly.check(prof)
        run_dir, resume, data_root = Path(cfg.train.run_dir), None, Path("(clock only)")
        splits = (clockonly.Shards(clock_only["train"], clock_only["classes"], "train"),
                  clockonly.Shards(clock_only["val"], clock_only["classes"], "val"))
    else:
        run_dir, resume, data_root, splits = _prepare(cfg, workers, size)
    backend = backend_mod.select("cpu", 0)
    threads = threads or backend_mod.blas_threads_for(1)
    backend_mod.set_blas_threads(threads)
    replay = Replay(replay_dir, size, size - workers) if replay_dir is not None else None
    world = World(size)
    cluster = Cluster(world, prof, replay)
    condition = condition if condition is not None else P.condition_of(prof)
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(run_dir / "config.json", cfg.to_dict())
    num_classes = splits[0].num_classes
    virtual = dict(workers=workers, ranks=size, profile=prof.to_dict(), condition=condition.to_dict(),
                   timeline="replay" if replay else "model", num_classes=num_classes,
                   blas_threads=threads, replay_of=str(replay_dir) if replay else None,
                   time="simulated seconds")
    write_json_atomic(run_dir / "virtual.json", virtual)
    cluster.compute = P.Compute(prof, cfg, num_classes, cfg.train.seed, condition,
                                range(size - workers, size), cluster.net.node)
    cluster.net.scale = P.byte_scale(prof, cfg, num_classes)
    cluster.mortal = cfg.train.on_failure == "continue"
    if cfg.train.method in RETIMEABLE and resume is None and cfg.train.on_failure != "continue" \
            and clock_only is None:
        cluster.tapes = [Tape() for _ in range(size)]
    setups, summaries = [None] * size, [None] * size
    rank_main = _rank_main(cfg, cluster, prof, backend, data_root, splits, resume, run_dir, setups, summaries,
                           clock_only is not None)
    t0 = time.perf_counter()
    with _stop_on_sigint(setups):
        world.run([rank_main(r) for r in range(size)])
    real = time.perf_counter() - t0
    summary = next(s for s in summaries if s is not None)   # rank 0's, or the survivors' rank 0's
    if cluster.tapes is not None:
        cluster.tapes[0].summary(summary)
        write_tapes(run_dir, cluster.tapes)
    summary["virtual"] = dict(virtual, real_seconds=real, switches=world.switches,
                              simulated_seconds=max(world.clock), node_bytes_sent=cluster.net.bytes_sent,
                              worker_steps=sum(n.steps for n in _transports(setups)))
    if replay is not None:
        summary["virtual"]["replay_first_difference"] = first_difference(replay_dir, run_dir, size)
    write_json_atomic(run_dir / "summary.json", summary)
    print(f"done: {workers} virtual workers, validation top-1 {100 * summary['val_top1_accuracy']:.2f}% "
          f"after {summary['train_seconds']:.4g} simulated s ({real:.1f} s real); results in "
          f"{run_dir}/summary.json", flush=True)
    return summary


def _prepare(cfg: C.Config, workers: int, size: int):
    """(run directory, the checkpoint to resume or None, data root, the shared splits), all checked
    before anything is written: a resumed checkpoint must come from this method (and from this many
    ranks, unless the method resumes on another rank count: ``resuming.RESHAPEABLE``),
    a new run may not reuse a run directory, the training split must fill one global batch."""
    from ..data.demo import build_digits, default_data_dir  # noqa: PLC0415
    from ..launch import refuse_occupied  # noqa: PLC0415
    from ..data.pipeline import require_dali  # noqa: PLC0415
    from ..io.files import free_name, stamped  # noqa: PLC0415
    from ..train import resuming  # noqa: PLC0415
    from ..train.assemble import open_splits, require_one_step  # noqa: PLC0415
    require_dali()
    data_root = Path(cfg.data.data) if cfg.data.data else build_digits(default_data_dir())
    run_dir = (Path(cfg.train.run_dir) if cfg.train.run_dir else
               free_name(stamped(f"virtual-{cfg.train.method}-{workers}")))
    resume = None
    if cfg.train.resume:
        given = Path(cfg.train.resume)
        resume = resuming.find_checkpoint(str(given) if given.is_file() else str(run_dir), size,
                                          cfg.train.method, "this virtual run")
    else:
        refuse_occupied(run_dir)
    splits = open_splits(data_root, cfg.data.cache_mb)      # one copy for every virtual rank
    require_one_step(splits[0].num_samples, cfg.data.batch_size, workers, data_root)
    return run_dir, resume, data_root, splits


def _rank_main(cfg, cluster, prof, backend, data_root, splits, resume, run_dir, setups, summaries,
               clock_only: bool = False):
    """``rank_main(r)``: the body of virtual rank ``r``: the composition root on an in-process
    transport, then the training loop; its Setup and summary land in ``setups[r]``/``summaries[r]``."""
    from ..comm.topology import Topology  # noqa: PLC0415
    from ..train import loop  # noqa: PLC0415
    from ..train.assemble import assemble  # noqa: PLC0415
    from .transport import InProcessTransport, RankDied  # noqa: PLC0415
    size = len(setups)

    def rank_main(r: int):
        def main():
            net = InProcessTransport(cluster, tuple(range(size)), r)
            topo = Topology(r, size, r % prof.ranks_per_node, min(size, prof.ranks_per_node),
                            None, None, net)
            if clock_only:
                from . import clockonly  # noqa: PLC0415
            s = assemble(cfg, topo, backend, data_root, 1, resume, splits=splits,
                         share_with=setups[0] if r > 0 else None, check_fast_paths=False,
                         make_loaders=clockonly.loaders if clock_only else None)
            if clock_only:
                clockonly.strip(s.model)
            if net.tape is not None:       # (its clock's reads are stamps: which row holds which)
                s.metrics_observer = net.tape.metrics_row
            setups[r] = s
            try:
                summaries[r] = loop.train(s, run_dir, resume)
            except RankDied:               # (SCALESGD_INJECT_FAULT=RANK:STEP:kill) the others go on
                pass
        return main
    return rank_main


def _recorded_threads(replay_dir: Path, summary: dict) -> int | None:
    """The BLAS threads the real run's ranks computed with (``summary.json["blas_threads"]``): a
    replay computes with as many, since a GEMM on another count of threads rounds differently.
    None (with a warning) where the run does not say, or its ranks differed."""
    n = summary.get("blas_threads")
    if isinstance(n, int) and n >= 1:
        log.info("replay: %d BLAS thread(s), as the run's ranks computed (summary.json)", n)
        return n
    spread = summary.get("blas_threads_range")
    log.warning("replay: %s does not say with how many BLAS threads its ranks computed%s; the "
                "replay uses --threads or every core, and a GEMM on another count of threads rounds "
                "differently (give --threads N)", replay_dir,
                f" (they differed: {spread[0]} to {spread[1]})" if spread else "")
    return None


@contextlib.contextmanager
def _stop_on_sigint(setups):
    """Ctrl-C asks every virtual rank to checkpoint at its next phase and stop (a second one
    interrupts at once)."""
    def on_sigint(signum, frame):
        for s in setups:
            if s is not None:
                s.control.signals.request_stop()
        log.info("virtual cluster: stop requested; every rank checkpoints at its next phase "
                 "(Ctrl-C again: interrupt at once, no checkpoint)")
        signal.signal(signal.SIGINT, signal.default_int_handler)

    old = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


def _transports(setups):
    return [s.topo.transport for s in setups if s is not None]


def main(argv: list[str] | None = None) -> int:
    from ..launch import EXIT_STOPPED, make_parser, resolve_config  # noqa: PLC0415
    from ..train.phases import Stopped  # noqa: PLC0415
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["retime"]:
        from .retime import main as retime_main  # noqa: PLC0415
        return retime_main(argv[1:])
    ap = make_parser()
    ap.prog = "python -m scalesgd.virtual"
    ap.description = ("Train a virtual cluster of p workers in one process (the real method code; "
                      "simulated time) and write a run directory like a real run's.")
    add_arguments(ap)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="scalesgd: %(message)s", stream=sys.stderr)
    try:
        if getattr(args, "list_profiles", False):
            for name in P.available():
                prof = P.load(name)
                print(f"{name:24s} {prof.description}")
            print("conditions (--condition):")
            for name in V.available():
                print(f"{name:24s} {V.load(name).description}")
            return 0
        replay_dir = Path(args.replay) if getattr(args, "replay", None) else None
        if replay_dir is not None:
            ignored = sorted(k for k in vars(args) if k not in REPLAY_FLAGS)
            if ignored:
                flags = ", ".join("--" + k.rpartition(".")[2].replace("_", "-") for k in ignored)
                raise ConfigError(f"--replay redoes the recorded run as it ran: {flags} cannot change it "
                                  "(with --replay only --run-dir, --profile, --condition, --threads and "
                                  "--dry-run apply)")
            if not (replay_dir / "config.json").is_file():
                raise ConfigError(f"--replay {replay_dir}: not a run directory (no config.json)")
            saved = json.loads((replay_dir / "config.json").read_text())
            summary = json.loads((replay_dir / "summary.json").read_text()) \
                if (replay_dir / "summary.json").is_file() else {}
            cfg = C.build(saved, {"train": {"run_dir": getattr(args, "train.run_dir", None) or
                                            str(replay_dir) + "-replay", "resume": "",
                                            "checkpoint_minutes": 0.0}})
            ranks = summary.get("ranks") or len(list((replay_dir / "metrics").glob("rank-*.jsonl")))
            workers = ranks - (ranks_for(cfg, 0))
            recorded = _recorded_threads(replay_dir, summary)
        else:
            cfg = resolve_config(args)
            workers = getattr(args, "workers", None) or 4
            recorded = None
        if workers < 1:
            raise ConfigError(f"--workers {workers}: need at least 1")
        prof = P.load(getattr(args, "profile", None) or "a100-100gbit")
        condition = P.condition_of(prof, getattr(args, "condition", None))
        threads = getattr(args, "threads", None)
        if threads is not None and threads < 1:
            raise ConfigError(f"--threads {threads}: need at least 1")
        if getattr(args, "dry_run", False):          # as the real program's, and the cluster: nothing run
            from ..launch import dry_run  # noqa: PLC0415
            dry_run(cfg, ranks_for(cfg, workers))
            print(f"virtual: {workers} worker(s), {ranks_for(cfg, workers)} rank(s); profile {prof.name}; "
                  f"condition {condition.name}" + (f"; replay of {replay_dir}" if replay_dir else ""))
            return 0
        run(cfg, workers, prof, replay_dir, threads or recorded, condition)
    except Stopped:
        print(f"scalesgd: stopped; checkpoint written; continue with --resume "
              f"{cfg.train.run_dir or 'RUN_DIR'}", file=sys.stderr)
        return EXIT_STOPPED
    except UserError as exc:
        print(f"scalesgd: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except Deadlock as exc:                # no rank can move: what each was doing, in one line
        print(f"scalesgd: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("scalesgd: interrupted", file=sys.stderr)
        return 130
    return 0


