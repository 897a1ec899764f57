"""Running the study: one resumable piece at a time (at most ``--jobs`` runs side by side, each
a virtual-cluster run of the pinned commit in a git worktree of it), its status and projection,
and pinning the commit.  Every finished run is a record in ``store``; nothing else is state, so a
piece stopped anywhere resumes where the records end."""
from __future__ import annotations

import argparse

import collections
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path

from . import store
from . import study as S           # (its names read at call time: a test can point them elsewhere)


def load(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def tree(sha: str) -> Path:
    """A worktree of the pinned commit (made once): every run executes its code and job file."""
    wt = S.ROOT / "runs" / f"pinned-{sha[:12]}"
    if not (wt / "src" / "scalesgd").is_dir():
        wt.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "worktree", "prune"], cwd=S.ROOT, check=True)
        subprocess.run(["git", "worktree", "add", "--detach", str(wt), sha], cwd=S.ROOT, check=True,
                       capture_output=True)
    return wt


def data_dirs(data: Path) -> dict[str, Path]:
    """The glyph data sets (built once): main (train + val), tune (train + tune), timing."""
    import glyphs  # noqa: PLC0415  (benchmarks/glyphs.py: benchmarks/ is on the path)
    if not (data / "main" / "manifest.json").exists():
        glyphs.build(data, 51_200, 5_000, 5_000)
    timing = data.parent / f"{data.name}-timing"
    if not (timing / "main" / "manifest.json").exists():
        glyphs.build(timing, S.TIMING_TRAIN, 1_000, 1_000)
    return {"sweep": data / "main", "authors": data / "main", "extra": data / "main", "tune": data / "tune",
            "time": timing / "main"}


def glyph_run(wt: Path, name: str, run_dir: Path, args: list[str]) -> dict:
    """``python -m scalesgd.virtual --config jobs/glyphs.toml ARGS --threads 1 --run-dir RUN_DIR``
    from the pinned tree ``wt`` (one BLAS thread, its code on the path; ``run_dir`` made empty
    first).  A failure other than a divergence raises with the command and its stderr.  Returns
    ``diverged``, ``why`` (the divergence's last line), ``argv`` (as recorded: no local paths),
    ``env`` (for a re-timing) and the clock's start ``t0``."""
    argv, env = glyph_argv(wt, _emptied(run_dir), args)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "scalesgd.virtual", *argv], cwd=wt, capture_output=True,
                          text=True, env=env)
    diverged = proc.returncode != 0 and "the training loss became" in proc.stderr
    if proc.returncode and not diverged:
        raise RuntimeError(f"{name}: {' '.join(argv)} failed:\n{proc.stderr[-3000:]}")
    return dict(diverged=diverged, why=proc.stderr.strip().splitlines()[-1:] if diverged else [],
                argv=shown_argv(wt, argv), env=env, t0=t0)


def glyph_argv(wt: Path, run_dir: Path, args: list[str]) -> tuple[list[str], dict]:
    """(the virtual cluster's arguments, the environment) of a glyph run of the pinned tree."""
    argv = ["--config", str(wt / "jobs" / "glyphs.toml"), *args, "--threads", "1", "--run-dir", str(run_dir)]
    return argv, dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(wt / "src"))


def _emptied(run_dir: Path) -> Path:
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    return run_dir


def shown_argv(wt: Path, argv: list[str]) -> list[str]:
    """A run's arguments as recorded (``scalesgd.virtual`` and its arguments): no local paths."""
    return ["scalesgd.virtual"] + [a.replace(str(wt) + "/", "").replace(str(S.ROOT) + "/", "") for a in argv]


def clock_trace(wt: Path, run_dir: Path, args: list[str]) -> dict:
    """The glyph run ``args`` as a clock-only run of the pinned tree (``clock_trace.py``):
    ``history`` [[samples, seconds]] at its validations, ``trace`` its event order's digest,
    ``seconds`` of this machine it took; ``run_dir`` removed after."""
    argv, env = glyph_argv(wt, _emptied(run_dir), args)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("clock_trace.py")), *argv], cwd=wt,
                          capture_output=True, text=True, env=env)
    shutil.rmtree(run_dir, ignore_errors=True)
    if proc.returncode:
        raise RuntimeError(f"clock-only run {' '.join(argv)} failed:\n{proc.stderr[-3000:]}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]), seconds=time.perf_counter() - t0)


def execute(run: S.Run, sha: str, wt: Path, dirs: dict[str, Path], scratch: Path) -> dict:
    """One virtual run from the pinned tree; re-timed under every (network, condition) if its
    arithmetic ignores the clock; writes and returns its record."""
    run_dir = scratch / run.key
    args = ["--data", str(dirs[run.kind]), *S.flags(run.method, run.config, run.workers),
            "--seed", str(run.seed), "--workers", str(run.workers), "--epochs", str(run.epochs),
            "--eval-every", str(S.EVAL_EVERY), "--profile", run.network, "--condition", run.condition]
    # (P3's runs go their whole horizon: its exchanges, its final error)
    if run.kind not in ("time", "extra"):
        args += ["--stop-at-error", str(S.TARGET)]
    got = glyph_run(wt, run.key, run_dir, args)
    diverged = got["diverged"]
    rec = summarize(run, run_dir, got["argv"], diverged, got["why"])
    if S.is_sync(run.method) and run.kind != "time" and not diverged:
        rec["retimed"] = retime(run_dir, wt, got["env"])
    rec.update(commit=sha, real_seconds=time.perf_counter() - got["t0"])
    store.write(S.RESULTS, run.key, rec)
    shutil.rmtree(run_dir, ignore_errors=True)
    return rec


def retime(run_dir: Path, wt: Path, env: dict, networks=S.NETWORKS,
           conditions=S.CONDITIONS) -> dict[str, list[float]]:
    """The validations' training seconds under every (network, condition) (exact re-timing)."""
    out = {}
    for n in networks:
        for cond in conditions:
            dst = run_dir.parent / f"{run_dir.name}-rt"
            shutil.rmtree(dst, ignore_errors=True)
            subprocess.run([sys.executable, "-m", "scalesgd.virtual", "retime", str(run_dir), "--profile", n,
                            "--condition", cond, "--run-dir", str(dst)], cwd=wt, env=env, check=True,
                           capture_output=True)
            out[f"{n}/{cond}"] = [v["train_seconds"] for v in vals(dst)]
            shutil.rmtree(dst, ignore_errors=True)
    return out


def vals(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics" / "rank-0.jsonl"
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if '"kind": "val"' in x]


def summarize(run: S.Run, run_dir: Path, argv: list[str], diverged: bool, why: list[str]) -> dict:
    """The committed record: the validation curve (samples, seconds, error, the method's own
    statistics), samples and seconds to target, seconds per sample, worker-steps."""
    extra = ("consensus_distance", "staleness_mean", "staleness_max", "worker_distance", "server_version")
    curve = [dict(samples=v["global_samples"], seconds=v["train_seconds"],
                  error=1.0 - v["val_top1_accuracy"], **{k: v[k] for k in extra if k in v})
             for v in vals(run_dir)]
    s = load(run_dir / "summary.json") or {}
    virt = s.get("virtual", {})
    samples = s.get("samples", curve[-1]["samples"] if curve else 0)
    secs = s.get("train_seconds", curve[-1]["seconds"] if curve else 0.0)
    return dict(key=run.key, kind=run.kind, method=run.method, workers=run.workers, config=run.config,
                seed=run.seed, network=run.network, condition=run.condition, epochs=run.epochs,
                argv=argv, target_error=S.TARGET, diverged=diverged, diverged_why=why,
                samples_to_target=S.interpolate(curve, "samples"),
                seconds_to_target=S.interpolate(curve, "seconds"),
                final_error=curve[-1]["error"] if curve else 0.9,
                samples=samples, train_seconds=secs, seconds_per_sample=secs / max(samples, 1),
                worker_steps=virt.get("worker_steps"), curve=curve)


def run_pool(jobs: int, minutes: float, ready, start, cost, name, said) -> int:
    """Runs what ``ready()`` lists (read again after every finish, so a run's record can open the
    next), at most ``jobs`` at a time, and none that would end past ``minutes`` from now (its
    ``cost(run)`` seconds, with a fifth to spare): ``start(run)`` does one and returns its record;
    ``name(run)`` and ``said(run, record)`` are its start and end lines.  Runs must compare equal
    when they are the same run (a frozen dataclass, a tuple).  Returns the runs finished."""
    deadline = time.monotonic() + 60 * minutes
    done = 0
    with ThreadPoolExecutor(jobs) as pool:
        running: dict = {}
        while True:
            taken = list(running.values())
            todo = [r for r in ready() if r not in taken]
            while todo and len(running) < jobs:
                r = todo.pop(0)
                if time.monotonic() + 1.2 * cost(r) > deadline:
                    continue
                running[pool.submit(start, r)] = r
                print(f"[{time.strftime('%H:%M:%S')}] start {name(r)}", flush=True)
            if not running:
                return done
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for f in finished:
                r = running.pop(f)
                rec = f.result()
                done += 1
                print(f"[{time.strftime('%H:%M:%S')}] done  {said(r, rec)}", flush=True)


def piece(minutes: float, jobs: int, data: Path, scratch: Path) -> int:
    sha = S.commit()
    wt = tree(sha)
    dirs = data_dirs(data)
    run_pool(jobs, minutes, lambda: S.Study().plan()[0],
             lambda r: execute(r, sha, wt, dirs, scratch), lambda r: r.cost,
             lambda r: f"{r.key} ({r.epochs} epochs)",
             lambda r, rec: (f"{r.key}: error {rec['final_error']:.3f}, samples to target "
                             f"{rec['samples_to_target']}, {rec['real_seconds']:.0f} s real"
                             + (" (diverged)" if rec["diverged"] else "")))
    status()
    return 0


def status() -> int:
    st = S.Study()
    by: dict[str, list] = {}
    for r in st.recs.values():
        d = by.setdefault(r["kind"], [0, 0.0])
        d[0] += 1
        d[1] += r.get("real_seconds", 0.0)
    for k, (n, real) in sorted(by.items()):
        print(f"{k:6s} {n:5d} runs done, {real / 3600:.2f} machine-hours")
    ready, waiting = st.plan()
    total = sum(d[1] for d in by.values()) / 3600
    print(f"ready now: {len(ready)} runs (about {sum(r.cost for r in ready) / 3600:.1f} machine-hours); "
          f"waiting: {len(waiting)}; total so far {total:.2f} machine-hours")
    print(projection(st, ready, waiting, total))
    return 0


def projection(st: S.Study, ready: list[S.Run], waiting: list[str], total: float) -> str:
    """Per p (tuning and reported runs): runs and machine-hours so far, open or complete; then the
    whole study projected.  A p's cost is its samples to target (its horizons are multiples of
    them: measured where its pilots have run, else grown from the last measured p by the last
    doubling's growth) times its real cost per worker-step (the ``time`` runs: the same workload
    at every p; it grows with p) times the machine-hours each complete p spent per sample to
    target per millisecond of a worker-step: the lowest and highest of them give the range.  The
    authors' rows and P3 at the mean cost of a reported run.  A planning figure, not a
    measurement."""
    hours: dict[int, float] = {}
    runs: dict[int, int] = {}
    timing: dict[int, list[float]] = {}           # p -> [real seconds, worker-steps] of its time runs
    sweep = [r["real_seconds"] for r in st.recs.values() if r["kind"] == "sweep"]
    for r in st.recs.values():
        if r["kind"] in ("tune", "time", "sweep"):
            hours[r["workers"]] = hours.get(r["workers"], 0.0) + r["real_seconds"] / 3600
            runs[r["workers"]] = runs.get(r["workers"], 0) + 1
        if r["kind"] == "time" and r.get("worker_steps"):
            tm = timing.setdefault(r["workers"], [0.0, 0.0])
            tm[0] += r["real_seconds"]
            tm[1] += r["worker_steps"]
    open_p = {r.workers for r in ready if r.kind in ("tune", "time", "sweep")}
    open_p |= {int(m.group(1)) for w in waiting if not w.startswith("authors")
               for m in [re.search(r"(?:-| )p(\d+)[- ]", w)] if m}
    # a reopened p (complete once, its cells all swept, then given more to do: a wider search, more
    # seeds) counts as measured: its own cost stands for the basis, and its runs ready now are its
    # part of what is left (a lower bound: a choice the new runs change asks for new sweeps)
    sweeps = collections.Counter((r["workers"], r["method"], *(() if r["method"] in S.SYNC else
                                                                (r["network"], r["condition"])))
                                 for r in st.recs.values() if r["kind"] == "sweep")
    swept = {p for p in (1, *S.WORKERS) if all(sweeps[(p, m) if m in S.SYNC else (p, m, n, c)] >= len(S.SEEDS)
                                             for m in (S.METHODS if p > 1 else ("single",))
                                             for n in S.NETWORKS for c in S.CONDITIONS)}
    reopened = {p: h for p in swept & open_p
                for h in [sum(r.cost for r in ready if r.workers == p and r.kind != "authors") / 3600] if h}
    done_p = [p for p in (1, *S.WORKERS) if p in hours and (p not in open_p or p in reopened) and p > 1]
    mean_p = sum(hours[p] for p in done_p) / len(done_p) if done_p else None
    lines = [f"p = {p:3d}: {runs.get(p, 0):4d} runs, {hours.get(p, 0.0):5.2f} machine-hours, "
             + (f"reopened (at least {reopened[p]:.2f} machine-hours ready now)" if p in reopened else
                'open' if p in open_p or p not in hours else 'complete') for p in (1, *S.WORKERS)]
    if mean_p is None or not sweep:
        return "\n".join(lines)
    todo = [p for p in S.WORKERS if (p in open_p or p not in hours) and p not in reopened]
    best = {p: st.best_samples(p) for p in S.WORKERS}
    measured = [p for p in S.WORKERS if p in timing]

    def source(p: int) -> int | None:
        """The p whose time runs stand for p's: p itself, else the nearest measured below (above)."""
        return max((q for q in measured if q <= p), default=min(measured, default=None))

    def ms(p: int) -> float | None:
        """Real milliseconds per worker-step at p (``source(p)``'s time runs)."""
        q = source(p)
        return None if q is None else 1e3 * timing[q][0] / timing[q][1]
    per = {p: hours[p] / best[p] for p in done_p if best[p] and ms(p)}
    if not per:
        return "\n".join(lines)
    unit = {p: per[p] / ms(p) for p in per}                 # machine-hours per sample per ms
    u_lo, u_hi = min(unit.values()), max(unit.values())
    k_mean, k_top = sum(per.values()) / len(per), max(per.values())
    top = max(per, key=per.get)
    known = [p for p in S.WORKERS if best[p]]
    grow = ((best[known[-1]] / best[known[-2]]) ** (1 / math.log2(known[-1] / known[-2]))   # per doubling
            if len(known) >= 2 else 1.0)
    need = {p: best[p] or best[known[-1]] * grow ** math.log2(p / known[-1]) for p in todo}
    again = sum(reopened.values())
    left = again + sum(max(0.0, u_lo * ms(p) * need[p] - hours.get(p, 0.0)) for p in todo)
    left_hi = again + sum(max(0.0, u_hi * ms(p) * need[p] - hours.get(p, 0.0)) for p in todo)
    kinds = [r["kind"] for r in st.recs.values()]
    authors_left = (max(0, len(S.AUTHORS) * len(S.WORKERS) * len(S.SEEDS) * 2 - kinds.count("authors"))
                    + sum(r.kind == "authors" and r.seed in S.MORE_SEEDS for r in ready))   # (extra seeds)
    own_h = authors_left * sum(sweep) / len(sweep) / 3600
    if "extra" not in kinds:                 # P3's runs: their whole horizon, at the planning cost
        p3 = S.Run("extra", "asgd", S.NSYNC_P, "", 0, "", "", S.NSYNC_EPOCHS)
        own_h += len(S.NSYNC) * len(S.NSYNC_SEEDS) * p3.cost / 3600
    said = ", ".join(f"p = {p}: {need[p] / 1e3:.0f}k{'' if best[p] else ' (grown)'} at {ms(p):.2f} ms"
                     + ("" if p in timing else f" (p = {source(p)}'s)")
                     for p in todo)
    growth = (f"x{grow:.2f} a doubling past p = {known[-1]}" if len(known) >= 2 else
              "as at the last measured p: one p measured, no growth to go by, so larger p will cost more")
    grown = any(not best[p] for p in todo)
    need_said = (f"the open p need {said} (samples to target{f', {growth}' if grown else ''}; real cost of a "
                 "worker-step); " if todo else "")
    steps = f"{', '.join(f'{ms(p):.2f}' for p in per)} ms at p = {', '.join(map(str, per))}"
    again_said = (f"the reopened p at least {again:.1f} (their runs ready now; the sweeps of a choice they "
                  "change follow); " if reopened else "")
    lines.append(f"projection: a p swept in full has cost {mean_p:.2f} machine-hours on average "
                 f"({len(done_p)} of them), {k_mean * 1e5:.2f} per 100k samples to target (the costliest "
                 f"{k_top * 1e5:.2f}, p = {top}), a worker-step costing {steps}; {need_said}{again_said}the "
                 f"authors' rows and P3 about {own_h:.1f}: the study about "
                 f"{total + left + own_h:.1f}–{total + left_hi + own_h:.1f} machine-hours in all")
    return "\n".join(lines)


def pin(sha: str, results: Path | None = None, pinned: str | None = None, label: str = "crossover") -> int:
    """Pins the commit every run of a study uses (``results``/pin.json; default the crossover
    study's).  A study runs from one commit: refused while records of another pinned one exist."""
    results = S.RESULTS if results is None else results
    old = S.pinned() if pinned is None and results == S.RESULTS else pinned
    full = subprocess.run(["git", "rev-parse", sha], cwd=S.ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()
    if old is not None and old != full and store.any_records(results):
        sys.exit(f"{label}: records of {old[:12]} exist; "
                 "a study runs from one commit (move them away to start another)")
    results.mkdir(parents=True, exist_ok=True)
    (results / S.PIN.name).write_text(json.dumps({"commit": full}) + "\n")
    print(f"pinned {full}")
    return 0


def study_main(argv, doc: str, label: str, results: Path, pinned, piece, summary, out: Path, status,
               scratch: str, also=None) -> int:
    """The command line a study built on this driver shares (``final_study.py``, ``final_map.py``):
    ``pin [COMMIT]``, ``run [--minutes M] [--jobs J]`` (a resumable piece), ``status``, ``report``
    (``summary()`` written to ``out``, then given to ``also`` where there is one)."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("what", choices=("pin", "run", "status", "report"))
    ap.add_argument("commit", nargs="?", default="HEAD")
    ap.add_argument("--minutes", type=float, default=55.0)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--data", type=Path, default=S.ROOT / "data" / "glyphs")
    ap.add_argument("--scratch", type=Path, default=S.ROOT / "runs" / scratch)
    a = ap.parse_args(argv)
    if a.what == "pin":
        return pin(a.commit, results, pinned(), label)
    if a.what == "run":
        return piece(a.minutes, a.jobs, a.data, a.scratch)
    if a.what == "report":
        d = summary()
        out.write_text(json.dumps(d, indent=1) + "\n")
        print(f"wrote {out.relative_to(S.ROOT)}")
        if also is not None:
            also(d)
        return 0
    return status()
