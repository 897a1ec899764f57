"""``python -m scalesgd.virtual retime RUN_DIR --profile X [--condition C]``: the same run, other clock.

All-reduce, local SGD and one worker compute the same numbers whatever the clock says: which
collective comes next, and what it sums, never depends on time.  So one virtual run of them can
be timed under any profile and condition without computing a gradient again.  A virtual run of
such a method records each rank's *timeline tape* (``RUN_DIR/timeline/rank-K.json.gz``,
``virtual/timetape.py``): the actions that move its clock (a step's compute, a sleep, a collective's
kind and bytes, a read of the clock) and how every time it wrote was computed from the reads.

``retime`` replays the actions through the simulator under the new profile (the same scheduler,
the same ``InProcessTransport`` costs, the same per-rank variability draws), evaluates the recorded
arithmetic on the new reads, and writes a run directory like a virtual run's: ``config.json``,
``metrics/`` (every row, its times re-timed), ``summary.json`` (history, times to target, time
split, throughput), ``virtual.json`` (``timeline: "retime"``, ``retimed_from``), and the tape and
trace.  It holds no checkpoints: the arrays are the recorded run's (``--init-from`` that one).
Times equal a full virtual run's under the same profile and condition bit for bit (the same float
operations in the same order; ``tests/test_retime.py``).

Refused, with one line: a method whose arithmetic depends on the order of events (the server
methods, gossip: another clock is another trajectory), a run with clock-driven checkpoints
(``--checkpoint-minutes``: their steps move with the clock), a resumed run, a directory without a
tape (a real run: replay it first with ``--replay``), and a ``--hierarchy node`` run under a
profile of another ``ranks_per_node`` (other node groups sum in another order, and local SGD's
leaders are other ranks).  With the same node size, the hierarchy's collectives (the two-level
all-reduce, a node group's) are re-timed like any other.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import sys
import time
from pathlib import Path

from ..errors import ConfigError, RunDirError, UserError

RETIMEABLE = ("allreduce", "localsgd", "single")


def write_tapes(run_dir: Path, tapes) -> None:
    d = Path(run_dir) / "timeline"
    d.mkdir(parents=True, exist_ok=True)
    for r, tape in enumerate(tapes):
        tmp = d / f".rank-{r}.json.gz.tmp"       # (one dumps and one compress: json.dump into a
        text = json.dumps(tape.to_dict(), separators=(",", ":"))   # gzip stream was 4.6x slower)
        tmp.write_bytes(gzip.compress(text.encode(), compresslevel=6))
        os.replace(tmp, d / f"rank-{r}.json.gz")


def read_tapes(run_dir: Path, ranks: int) -> list[dict]:
    d = run_dir / "timeline"
    paths = [d / f"rank-{r}.json.gz" for r in range(ranks)]
    missing = [p.name for p in paths if not p.is_file()]
    if missing:
        raise RunDirError(f"{run_dir}: no timeline tape ({d}/{missing[0]} is missing): the run did not "
                          "finish, was resumed, or is not a virtual run of all-reduce, local SGD or "
                          "one worker")
    tapes = []
    for p in paths:
        try:
            with gzip.open(p, "rt") as fh:
                tapes.append(json.load(fh))
        except (OSError, ValueError, EOFError) as exc:
            raise RunDirError(f"{p}: cannot read the timeline tape ({exc})") from None
    return tapes


def check(run_dir: Path) -> tuple[dict, dict, dict]:
    """(config, virtual.json, summary) of a run that can be re-timed; else a one-line error."""
    if not (run_dir / "config.json").is_file():
        raise RunDirError(f"{run_dir}: not a run directory (no config.json)")
    if not (run_dir / "virtual.json").is_file():
        raise RunDirError(f"{run_dir}: not a virtual run (no virtual.json); to re-time a real run, "
                          f"replay it first: python -m scalesgd.virtual --replay {run_dir}")
    cfg = json.loads((run_dir / "config.json").read_text())
    virtual = json.loads((run_dir / "virtual.json").read_text())
    method = cfg["train"]["method"]
    if method not in RETIMEABLE:
        raise ConfigError(f"{run_dir}: a {method} run cannot be re-timed: its arithmetic depends on "
                          "the order of events in time (which push a server takes next, which copy "
                          "a gossip read sees), so another clock is another trajectory; run it again "
                          "under that profile (python -m scalesgd.virtual --profile ...)")
    if cfg["train"].get("checkpoint_minutes"):
        raise ConfigError(f"{run_dir}: checkpoints every {cfg['train']['checkpoint_minutes']} minutes "
                          "of the clock: under another clock they fall at other steps; re-run it")
    if not (run_dir / "summary.json").is_file():
        raise RunDirError(f"{run_dir}: no summary.json: the run did not finish")
    summary = json.loads((run_dir / "summary.json").read_text())
    if summary.get("allocations", 1) > 1:
        raise ConfigError(f"{run_dir}: a resumed run cannot be re-timed (its earlier allocations' "
                          "clock is in its checkpoint, not on a tape); re-time a run that went through")
    return cfg, virtual, summary


def play(tapes: list[dict], cfg, virtual: dict, prof, condition):
    """Replays every rank's actions under ``prof``/``condition``: (world, cluster, each rank's new
    clock reads, worker steps)."""
    from . import profile as P  # noqa: PLC0415
    from .cluster import Cluster  # noqa: PLC0415
    from .transport import InProcessTransport  # noqa: PLC0415
    from .world import World  # noqa: PLC0415
    size, workers = virtual["ranks"], virtual["workers"]
    world = World(size)
    cluster = Cluster(world, prof)
    cluster.compute = P.Compute(prof, cfg, virtual["num_classes"], cfg.train.seed, condition,
                                range(size - workers, size), cluster.net.node)
    cluster.net.scale = P.byte_scale(prof, cfg, virtual["num_classes"])
    reads: list[list[float]] = [[] for _ in range(size)]
    steps = [0]

    def body(r: int):
        def main():
            nets: dict = {}

            def net(group) -> InProcessTransport:
                g = tuple(group)
                if g not in nets:
                    nets[g] = InProcessTransport(cluster, g, r)
                return nets[g]
            me = net(range(size))
            for op in tapes[r]["ops"]:
                if op[0] == "r":
                    reads[r].append(world.clock[r])
                elif op[0] == "c":
                    me.compute(op[1])
                    steps[0] += 1
                elif op[0] == "s":
                    me.pause(op[1])
                elif op[0] == "k":
                    net(tapes[r]["groups"][op[1]])._collective(None, _nothing, (op[2], op[3]), op[4])
                else:
                    raise ConfigError(f"rank {r}'s tape holds {op[1] if len(op) > 1 else op[0]}, whose "
                                      "timing depends on the order of events: it cannot be re-timed")
        return main
    world.run([body(r) for r in range(size)], name="retime")
    return world, cluster, reads, steps[0]


def _nothing(values):
    return None


def default_out(src: Path, prof, condition) -> Path:
    return src.with_name(f"{src.name}-retimed-{prof.name}-{condition.name}")


def retime(src: Path, prof, condition, out: Path | None = None) -> dict:
    """Writes ``src`` re-timed under ``prof``/``condition`` to ``out``; returns its summary."""
    from .. import config as C  # noqa: PLC0415
    from ..io.files import write_json_atomic  # noqa: PLC0415
    from .timetape import evaluate, put  # noqa: PLC0415
    t0 = time.perf_counter()
    raw_cfg, virtual, summary = check(src)
    cfg = C.build(raw_cfg, {})
    rpn = virtual["profile"].get("ranks_per_node", 1)
    if cfg.dist.hierarchy == "node" and prof.ranks_per_node != rpn:
        raise ConfigError(f"{src}: a --hierarchy node run of {rpn} rank(s) per node cannot be re-timed "
                          f"on {prof.ranks_per_node} per node: other node groups are another trajectory "
                          "(the sums' order, who exchanges); re-run it under that profile")
    tapes = read_tapes(src, virtual["ranks"])
    for r, tape in enumerate(tapes):
        odd = next((op for op in tape["ops"] if op[0] == "x"), None)
        if odd is not None:
            raise ConfigError(f"{src}: rank {r} used {odd[1]}, whose timing depends on the order of "
                              "events: it cannot be re-timed")
    out = out or default_out(src, prof, condition)
    if (out / "config.json").exists():
        raise RunDirError(f"--run-dir {out} already holds a run (its config.json): choose another")
    world, cluster, reads, steps = play(tapes, cfg, virtual, prof, condition)
    values = [evaluate(t["nodes"], reads[r]) for r, t in enumerate(tapes)]
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics").mkdir(exist_ok=True)
    for r, tape in enumerate(tapes):
        lines = (src / "metrics" / f"rank-{r}.jsonl").read_text().splitlines()
        rows = [json.loads(line) for line in lines]
        for row, key, node in tape["rows"]:
            rows[row][key] = values[r][node]
        (out / "metrics" / f"rank-{r}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in rows))
    summary.pop("virtual", None)
    for *path, node in tapes[0]["paths"]:
        put(summary, path, values[0][node])
    new = dict(virtual, profile=prof.to_dict(), condition=condition.to_dict(), timeline="retime",
               retimed_from=str(src))
    write_json_atomic(out / "config.json", raw_cfg)
    write_json_atomic(out / "virtual.json", new)
    for sub in ("timeline", "trace"):
        if (src / sub).is_dir():
            shutil.copytree(src / sub, out / sub, dirs_exist_ok=True)
    summary["virtual"] = dict(new, real_seconds=time.perf_counter() - t0, switches=world.switches,
                              simulated_seconds=max(world.clock), node_bytes_sent=cluster.net.bytes_sent,
                              worker_steps=steps)
    write_json_atomic(out / "summary.json", summary)
    return summary


def main(argv: list[str]) -> int:
    from . import profile as P  # noqa: PLC0415
    ap = argparse.ArgumentParser(prog="python -m scalesgd.virtual retime",
                                 description="Time a recorded virtual run of all-reduce, local SGD or "
                                 "one worker under another profile or condition, without computing it "
                                 "again (docs/virtual.md).")
    ap.add_argument("run_dir", metavar="RUN_DIR", help="a finished virtual run")
    ap.add_argument("--profile", required=True, help="a shipped profile's name or a JSON file")
    ap.add_argument("--condition", help="a shipped condition (none, typical, stragglers) or a JSON "
                    "file; default: the profile's own")
    ap.add_argument("--run-dir", dest="out", help="where to write it (default "
                    "RUN_DIR-retimed-PROFILE-CONDITION)")
    args = ap.parse_args(argv)
    try:
        prof = P.load(args.profile)
        condition = P.condition_of(prof, args.condition)
        src = Path(args.run_dir)
        out = Path(args.out) if args.out else default_out(src, prof, condition)
        summary = retime(src, prof, condition, out)
    except UserError as exc:
        print(f"scalesgd: error: {exc}", file=sys.stderr)
        return exc.exit_code
    print(f"re-timed under {prof.name} / {condition.name}: validation top-1 "
          f"{100 * summary['val_top1_accuracy']:.2f}% after {summary['train_seconds']:.4g} simulated s; "
          f"results in {out}/summary.json", flush=True)
    return 0
