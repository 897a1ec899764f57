#!/usr/bin/env python3
"""CPU training-step throughput of scalesgd's NumPy ResNets, side by side with PyTorch when importable.

One training step = forward (train mode) + softmax cross-entropy + backward + Nesterov SGD update, on
synthetic random data (fixed seed, never zeros).  Configurations (``--models``):

- ``resnet20``: ResNet-20 (CIFAR stem, projection shortcuts), 32x32, batch 64, 10 classes;
- ``resnet18``: ResNet-18 (ImageNet stem), 64x64, batch 16, 1000 classes;
- ``proxy``: the crossover study's worker (ResNet-8 at width 0.5, 16x16, batch 8, 10 classes): a
  small model, small images and a small per-worker batch, where per-call overhead dominates;

each at every ``--threads`` count (BLAS threads for scalesgd via threadpoolctl, ``torch.set_num_threads``
for PyTorch).  scalesgd runs twice: with ``model.conv_algo = auto`` (what a run uses) and with
``im2col`` (the whole-batch algorithm every run used before ``blocked``), as a baseline in the same run.
Measurements are interleaved (each runner's block of steps in turn, ``--repeats`` times) so that the
host's noise hits all of them alike.

If ``torch`` imports, the same networks run in plain ``torch.nn`` (``torch_resnet.py``; parameter counts
are asserted equal to scalesgd's), NCHW and channels_last.  torch is not a dependency of scalesgd:
without it that column is skipped.

Usage (from the repository root)::

    .venv/bin/python benchmarks/bench_cpu.py [--threads 1 2] [--repeats 5] [--json out.json]

``--end-to-end`` also trains the built-in digits the way ``make demo`` does (4 MPI ranks, all-reduce,
``jobs/digits-allreduce.toml``) and on one rank (``jobs/demo.toml``), ``--e2e-epochs`` epochs each, and
records each run's images/s, accuracy and the peak resident memory of its largest rank; ``--src DIR``
runs them from another source tree (an older commit's ``src``, for a before/after).

Also profiles one scalesgd step per configuration on one thread (``cpu_profile.py``: per conv
geometry, GEMM against copies against Python, and the OpenBLAS rate of the same GEMM shapes alone;
``--no-profile`` to skip), and runs the core-to-core placement probe (``benchmarks/c2c.c``, or
``--c2c PATH``) before, between and after the configurations when gcc is available.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import cpu_profile
import numpy as np
from benchlib import C2C_SRC, OursRunner, Probe, fmt_probe, timed
from threadpoolctl import threadpool_info
from torch_resnet import TorchRunner, torch

CONFIGS = {
    # key: (scalesgd model name, width, image size, batch, classes, expected parameter count)
    "resnet20": ("resnet20", 1.0, 32, 64, 10, 272_474),
    "resnet18": ("resnet18", 1.0, 64, 16, 1000, 11_689_512),
    "proxy": ("resnet8", 0.5, 16, 8, 10, 19_954),
}
TARGETS = {"resnet20": 0.7, "resnet18": 0.9, "proxy": 0.7}   # scalesgd / faster torch layout: the goals
OURS = {"scalesgd": "auto", "scalesgd_im2col": "im2col"}     # runner name -> model.conv_algo
LR = 0.01


# ============================================================================ runners
def ours_runner(key: str, conv_algo: str = "auto") -> OursRunner:
    name, width, size, batch, classes, nparams = CONFIGS[key]
    runner = OursRunner(name, classes, size, batch, lr=LR, width=width, conv_algo=conv_algo)
    assert runner.model.num_params == nparams, (key, runner.model.num_params, nparams)
    return runner


def torch_runner(key: str, channels_last: bool) -> TorchRunner:
    """The same network, batch and optimizer as ``ours_runner(key)`` in PyTorch on the CPU."""
    name, width, size, batch, classes, nparams = CONFIGS[key]
    return TorchRunner(name, classes, size, batch, nparams, channels_last=channels_last, lr=LR, width=width)


def timed_block(runner, nsteps: int, threads: int) -> list[float]:
    """Seconds of each of ``nsteps`` steps with the runner's library limited to ``threads``."""
    with runner.threads(threads):
        return timed(runner, nsteps)


# ============================================================================ load meter
class LoadMeter:
    """CPU seconds burnt by OTHER processes per wall second (from /proc/stat minus our own os.times()).

    ~0 on an idle machine; ~1 means another process kept one core busy while we measured.
    """

    def __init__(self):
        self.t0 = self._read()

    @staticmethod
    def _read():
        try:
            f = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
            busy = (f[0] + f[1] + f[2] + f[5] + f[6] + (f[7] if len(f) > 7 else 0)) / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError):
            return None
        t = os.times()
        return busy, t.user + t.system + t.children_user + t.children_system, time.perf_counter()

    def foreign(self) -> float | None:
        t1 = self._read()
        if t1 is None or self.t0 is None:
            return None
        (b0, o0, w0), (b1, o1, w1) = self.t0, t1
        return max(0.0, ((b1 - b0) - (o1 - o0)) / max(w1 - w0, 1e-9))


# ============================================================================ main
def blas_info() -> str:
    out = []
    for d in threadpool_info():
        out.append(f"{d.get('internal_api')} {d.get('version')} ({d.get('user_api')}, "
                   f"{d.get('threading_layer', '')}, {d.get('architecture', '')}, "
                   f"max {d.get('num_threads')} threads)")
    return "; ".join(out)


def summarise(step_times: list[list[float]], batch: int) -> dict:
    """step_times: one list per repeat.  Median = median of the per-repeat medians (range = their min
    and max); best = fastest step."""
    per_rep = [batch / statistics.median(r) for r in step_times]
    flat = [t for r in step_times for t in r]
    return {"median_img_s": statistics.median(per_rep), "range_img_s": [min(per_rep), max(per_rep)],
            "best_img_s": batch / min(flat), "repeat_median_img_s": per_rep, "step_s": step_times}


def measure(key: str, threads: int, args, layouts: list[str], use_torch: bool, probe) -> dict:
    """One configuration at one thread count: every runner warmed up, then interleaved blocks."""
    name, width, size, batch, classes, _ = CONFIGS[key]
    runners = [(n, ours_runner(key, algo)) for n, algo in OURS.items()]
    if use_torch:
        runners += [(f"torch_{lay}", torch_runner(key, lay == "channels_last")) for lay in layouts]
    for _, r in runners:                      # warm-up (allocator, oneDNN primitive caches)
        timed_block(r, args.warmup, threads)
    times = {n: [] for n, _ in runners}
    probes = [probe.run(200_000)]
    meter, load0 = LoadMeter(), os.getloadavg()[0]
    for _ in range(args.repeats):
        for n, r in runners:
            times[n].append(timed_block(r, args.steps, threads))
    res = {"model": key, "arch": name, "width": width, "input": f"{size}x{size}", "batch": batch,
           "classes": classes, "threads": threads, "foreign_cpu": meter.foreign(),
           "loadavg_before": load0, "c2c_ns": probes + [probe.run(200_000)]}
    for n, r in runners:
        res[n] = summarise(times[n], batch)
        res[n]["final_loss"] = r.loss
        assert np.isfinite(r.loss), f"{n} {key}: loss {r.loss}"
    tl = {lay: res[f"torch_{lay}"]["median_img_s"] for lay in layouts if f"torch_{lay}" in res}
    res["torch_faster_layout"] = max(tl, key=tl.get) if tl else None
    for n in OURS:
        res[f"ratio_{n}"] = res[n]["median_img_s"] / max(tl.values()) if tl else None
    res["ratio"] = res["ratio_scalesgd"]
    res["speedup_vs_im2col"] = res["scalesgd"]["median_img_s"] / res["scalesgd_im2col"]["median_img_s"]
    return res


E2E_JOBS = {"make demo (4 ranks, all-reduce)": ("jobs/digits-allreduce.toml", 4),
            "one rank (jobs/demo.toml)": ("jobs/demo.toml", 1)}
_MAXRSS = ("import resource, subprocess, sys; rc = subprocess.run(sys.argv[1:]).returncode; "
           "print('maxrss_kib', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(rc)")


def end_to_end(src: Path, epochs: int) -> dict:
    """Trains the digits as ``make demo`` and on one rank from the source tree ``src``; per job the
    summary's images/s and accuracy, and the peak RSS of its largest process (kernel's RUSAGE_CHILDREN
    maximum over the launcher and every rank, measured in a wrapper process of its own)."""
    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(src)}
    mpiexec = shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or "mpiexec"
    out = {}
    for name, (job, ranks) in E2E_JOBS.items():
        with tempfile.TemporaryDirectory() as tmp:
            run = [sys.executable, "-m", "scalesgd", "--config", str(repo / job), "--epochs",
                   str(epochs), "--progress", "off", "--run-dir", tmp]
            cmd = [sys.executable, "-c", _MAXRSS] + ([mpiexec, "-n", str(ranks)] if ranks > 1 else []) + run
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=repo, timeout=1800)
            if proc.returncode != 0:
                raise RuntimeError(f"{name}: exit {proc.returncode}\n"
                                   f"{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
            s = json.loads((Path(tmp) / "summary.json").read_text())
        rss = [int(w.split()[1]) for w in proc.stdout.splitlines() if w.startswith("maxrss_kib")]
        out[name] = {"job": job, "ranks": ranks, "epochs": epochs,
                     "images_per_second": s["images_per_second"],
                     "val_top1_accuracy": s["val_top1_accuracy"], "train_seconds": s["train_seconds"],
                     "wall_seconds_with_start": time.perf_counter() - t0,
                     "peak_rss_mib_largest_process": rss[-1] / 1024 if rss else None}
        print(f"  {name}: {s['images_per_second']:.0f} img/s, top-1 {s['val_top1_accuracy']:.4f}, peak RSS "
              f"{out[name]['peak_rss_mib_largest_process']:.0f} MiB (largest process)", flush=True)
    return out


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--models", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    ap.add_argument("--repeats", type=int, default=5, help="interleaved blocks per configuration")
    ap.add_argument("--steps", type=int, default=4, help="timed steps per block")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps per runner before timing")
    ap.add_argument("--no-torch", action="store_true", help="skip PyTorch even if importable")
    ap.add_argument("--no-channels-last", action="store_true", help="torch: NCHW only")
    ap.add_argument("--no-profile", action="store_true", help="skip the per-geometry profiles")
    ap.add_argument("--profile-steps", type=int, default=4)
    ap.add_argument("--c2c", type=Path, default=C2C_SRC, help="placement probe source")
    ap.add_argument("--json", type=Path, help="write all results (raw step times too) here")
    ap.add_argument("--end-to-end", action="store_true", help="also train the digits (make demo, 1 rank)")
    ap.add_argument("--e2e-epochs", type=int, default=12, help="epochs of each end-to-end run")
    ap.add_argument("--src", type=Path, default=Path(__file__).resolve().parents[1] / "src",
                    help="source tree the end-to-end runs import scalesgd from")
    ap.add_argument("--only-end-to-end", action="store_true", help="skip the step benchmark")
    return ap


def _header(args, use_torch: bool) -> dict:
    """Prints what the numbers were measured on and returns it (the JSON's ``info``)."""
    info = {"date": datetime.date.today().isoformat(), "python": platform.python_version(),
            "numpy": np.__version__, "blas": blas_info(), "cpus": os.cpu_count(),
            "cpu_model": _cpu_model(), "torch": torch.__version__ if use_torch else None,
            "repeats": args.repeats, "steps": args.steps, "warmup": args.warmup}
    print(f"scalesgd CPU benchmark  {info['date']}  python {info['python']}  numpy {info['numpy']}"
          f"  torch {info['torch'] or '(not importable/skipped)'}")
    print(f"CPU: {info['cpu_model']} x{info['cpus']}  BLAS: {info['blas']}")
    env = {k: v for k, v in os.environ.items() if k.startswith(("OPENBLAS_", "OMP_", "MKL_", "GOTO"))}
    info["env"] = env
    print(f"BLAS env: {env or '(none)'}  (OPENBLAS_CORETYPE forces the GEMM kernel; unset = CPU autodetect)")
    if use_torch:
        print(f"torch: {torch.__config__.parallel_info().splitlines()[0]} "
              f"mkldnn={torch.backends.mkldnn.is_available()}")
    la = os.getloadavg()
    if la[0] > 0.5:
        print(f"WARNING: load average {la[0]:.2f} before start: other processes compete for the CPUs")
    return info


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    if args.only_end_to_end:
        args.models, args.no_profile, args.end_to_end = [], True, True
    use_torch = torch is not None and not args.no_torch
    layouts = ["nchw"] + ([] if args.no_channels_last else ["channels_last"])
    probe = Probe(args.c2c)
    t_start = time.perf_counter()
    info = _header(args, use_torch)
    c2c_before = probe.run()
    print(f"placement probe before: {fmt_probe(c2c_before)}")
    print(f"timing: {args.warmup} warm-up steps per runner, then {args.repeats} interleaved blocks of "
          f"{args.steps} steps; median = median of block medians [range], best = fastest single step\n")

    results = []
    for key in args.models:
        for threads in args.threads:
            results.append(measure(key, threads, args, layouts, use_torch, probe))
            _print_row(results[-1], layouts, use_torch, header=len(results) == 1)
    c2c_after = probe.run()
    print(f"\nplacement probe after: {fmt_probe(c2c_after)}")
    _print_summary(results, layouts, use_torch)

    profiles = {}
    if not args.no_profile:
        for key in args.models:
            profiles[key] = cpu_profile.profile(ours_runner(key), 1, args.profile_steps, args.warmup)
            cpu_profile.print_profile(key, profiles[key])

    e2e = None
    if args.end_to_end:
        print(f"\nEnd to end, {args.e2e_epochs} epochs, scalesgd from {args.src}:")
        e2e = end_to_end(args.src, args.e2e_epochs)

    elapsed = time.perf_counter() - t_start
    print(f"\ntotal wall time {elapsed:.0f} s")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"info": info, "c2c_before_ns": c2c_before,
                                         "c2c_after_ns": c2c_after, "results": results,
                                         "targets": TARGETS, "profiles": profiles,
                                         "end_to_end": e2e, "src": _describe(args.src),
                                         "elapsed_s": elapsed}, indent=1))
        print(f"wrote {args.json}")
    return 0


def _print_summary(results, layouts, use_torch) -> None:
    print("\nSummary (img/s, median of block medians [range]; ratio vs the faster torch layout)")
    hdr = "| model | input | batch | threads | scalesgd img/s | scalesgd im2col |"
    if use_torch:
        hdr += "".join(f" torch {lay} |" for lay in layouts) + " ratio (target) | ratio im2col |"
    hdr += " other-procs CPU |"
    print(hdr)
    print("|" + "---|" * (hdr.count("|") - 1))
    for r in results:
        line = f"| {r['model']} | {r['input']} | {r['batch']} | {r['threads']} |"
        for n in ("scalesgd", "scalesgd_im2col", *(f"torch_{lay}" for lay in layouts if use_torch)):
            s = r[n]
            line += f" {s['median_img_s']:.0f} [{s['range_img_s'][0]:.0f}-{s['range_img_s'][1]:.0f}] |"
        if use_torch:
            line += f" {r['ratio']:.2f} ({TARGETS[r['model']]}) | {r['ratio_scalesgd_im2col']:.2f} |"
        line += " n/a |" if r["foreign_cpu"] is None else f" {r['foreign_cpu']:.2f} |"
        print(line)


def _print_row(res, layouts, use_torch, header):
    if header:
        h = f"{'model':<9} {'input':<6} {'batch':>5} {'thr':>3} {'scalesgd':>9} {'im2col':>7}"
        if use_torch:
            h += "".join(f" {'torch ' + lay[:6]:>13}" for lay in layouts) + f" {'ratio':>6}"
        print(h + "   c2c ns (before/after)  other-procs CPU")
    line = (f"{res['model']:<9} {res['input']:<6} {res['batch']:>5} {res['threads']:>3} "
            f"{res['scalesgd']['median_img_s']:9.1f} {res['scalesgd_im2col']['median_img_s']:7.1f}")
    if use_torch:
        line += "".join(f" {res[f'torch_{lay}']['median_img_s']:13.1f}" for lay in layouts)
        line += f" {res['ratio']:6.2f}"
    c = "/".join("n/a" if v is None else f"{v:.0f}" for v in res["c2c_ns"])
    fl = "n/a" if res["foreign_cpu"] is None else f"{res['foreign_cpu']:.2f}"
    print(line + f"   {c:<22} {fl}", flush=True)


def _describe(src: Path) -> str:
    """Which source tree the end-to-end runs used, without a path of this machine: this checkout's,
    or another tree's git commit."""
    if src.resolve() == (Path(__file__).resolve().parents[1] / "src"):
        return "src (this checkout)"
    p = subprocess.run(["git", "-C", str(src), "rev-parse", "--short", "HEAD"], capture_output=True,
                       text=True)
    return f"src of commit {p.stdout.strip()}" if p.returncode == 0 else "src of another tree"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


if __name__ == "__main__":
    sys.exit(main())
