#!/usr/bin/env python3
"""CPU training-step throughput of scalesgd's NumPy ResNets, side by side with PyTorch when importable.

One training step = forward (train mode) + softmax cross-entropy + backward + Nesterov SGD update, on
synthetic random data (fixed seed, never zeros).  Configurations:

- ResNet-20 (CIFAR stem, projection shortcuts), 32x32, batch 64, 10 classes;
- ResNet-18 (ImageNet stem), 64x64, batch 16, 1000 classes;

each at every ``--threads`` count (BLAS threads for scalesgd via threadpoolctl, ``torch.set_num_threads``
for PyTorch).  Measurements are interleaved (scalesgd block, torch NCHW block, torch channels_last block,
then again ``--repeats`` times) so that the host's placement noise hits all of them alike.

If ``torch`` imports, the same networks run in plain ``torch.nn`` (``torch_resnet.py``; parameter counts
are asserted equal to scalesgd's).  torch is not a dependency of scalesgd: without it that column is skipped.

Usage (from the repository root)::

    .venv/bin/python benchmarks/bench_cpu.py [--threads 1 2] [--repeats 3] [--json out.json]

Also prints a per-layer-type profile of one scalesgd ResNet-20 step on one thread (``--no-profile`` to
skip), and runs the core-to-core placement probe (``benchmarks/c2c.c``, or ``--c2c PATH``) before,
between and after the configurations when gcc is available.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
from benchlib import C2C_SRC, OursRunner, Probe, fmt_probe, timed
from threadpoolctl import threadpool_info, threadpool_limits
from torch_resnet import TorchRunner, torch

from scalesgd.nn import layers as L
from scalesgd.nn import resnet as R
from scalesgd.optim.sgd import SGD

CONFIGS = {
    # key: (scalesgd model name, image size, batch, classes, expected parameter count)
    "resnet20": ("resnet20", 32, 64, 10, 272_474),
    "resnet18": ("resnet18", 64, 16, 1000, 11_689_512),
}
LR = 0.01
TARGET_IMG_S, TARGET_RATIO = 130.0, 0.5      # ResNet-20, batch 64, 1 thread


# ============================================================================ runners
def ours_runner(key: str) -> OursRunner:
    name, size, batch, classes, nparams = CONFIGS[key]
    runner = OursRunner(name, classes, size, batch, lr=LR)
    assert runner.model.num_params == nparams, (key, runner.model.num_params, nparams)
    return runner


def torch_runner(key: str, channels_last: bool) -> TorchRunner:
    """The same network, batch and optimizer as ``ours_runner(key)`` in PyTorch on the CPU."""
    name, size, batch, classes, nparams = CONFIGS[key]
    return TorchRunner(name, classes, size, batch, nparams, channels_last=channels_last, lr=LR)


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


# ============================================================================ per-layer profile
class LayerProfiler:
    """Exclusive wall time per call path of the functions in ``scalesgd.nn.layers`` (and a few more).

    Wraps module attributes / methods in place (restored by ``restore()``); resnet.py calls layers through
    the module (``L.conv2d_forward``), so wrapping the module attributes catches every call, including the
    nested ones (``conv2d_backward`` -> ``conv2d_forward`` -> ``im2col``), which are keyed by their path.
    """

    FUNCS = ["im2col", "col2im", "conv2d_forward", "conv2d_backward", "batchnorm_forward",
             "batchnorm_backward", "relu_forward", "relu_backward", "maxpool_forward", "maxpool_backward",
             "avgpool_forward", "avgpool_backward", "linear_forward", "linear_backward",
             "softmax_cross_entropy"]

    def __init__(self):
        self.excl = defaultdict(float)
        self.calls = defaultdict(int)
        self.flops = defaultdict(float)
        self.stack: list[list] = []          # [key, child_time]
        self.saved = []

    def _wrap(self, owner, attr, label, flop_fn=None):
        orig = getattr(owner, attr)
        prof = self

        def wrapper(*a, **k):
            parent = prof.stack[-1][0] if prof.stack else ""
            key = f"{parent}>{label}" if parent else label
            frame = [key, 0.0]
            prof.stack.append(frame)
            t0 = time.perf_counter()
            try:
                return orig(*a, **k)
            finally:
                dt = time.perf_counter() - t0
                prof.stack.pop()
                if prof.stack:
                    prof.stack[-1][1] += dt
                prof.excl[key] += dt - frame[1]
                prof.calls[key] += 1
                if flop_fn is not None:
                    prof.flops[key] += flop_fn(*a, **k)

        self.saved.append((owner, attr, orig))
        setattr(owner, attr, wrapper)

    @staticmethod
    def _conv_fwd_flops(x, w, stride=1, pad=0, ws=None):
        n, h, wd, _ = x.shape
        kh, kw, c, f = w.shape
        ho, wo = (h + 2 * pad - kh) // stride + 1, (wd + 2 * pad - kw) // stride + 1
        return 2.0 * n * ho * wo * kh * kw * c * f

    @staticmethod
    def _conv_bwd_flops(dout, cache, dw, need_dx=True, ws=None):
        cols, _, w, stride, pad = cache[:5]       # (cols, x shape, w, stride, pad, freshness stamp)
        kh, kw, c, f = w.shape
        fl = 2.0 * cols.shape[0] * cols.shape[1] * f                  # dW GEMM
        same = stride == 1 and kh == kw and kh % 2 == 1 and pad == kh // 2 and kh > 1
        if need_dx and not same:                                      # dcols GEMM done here
            fl += 2.0 * cols.shape[0] * cols.shape[1] * f
        return fl

    def install(self):
        for fn in self.FUNCS:
            fl = {"conv2d_forward": self._conv_fwd_flops, "conv2d_backward": self._conv_bwd_flops}.get(fn)
            self._wrap(L, fn, fn, fl)
        self._wrap(R.ResidualBlock, "forward", "block.forward(add+relu)")
        self._wrap(R.ResidualBlock, "backward", "block.backward(relu_bwd+add)")
        self._wrap(SGD, "step", "sgd.step")

    def restore(self):
        for owner, attr, orig in reversed(self.saved):
            setattr(owner, attr, orig)
        self.saved = []

    def reset(self):
        self.excl.clear()
        self.calls.clear()
        self.flops.clear()


PROFILE_LABELS = {
    "conv2d_forward>im2col": "conv fwd: im2col (pad + strided copy)",
    "conv2d_forward": "conv fwd: GEMM (+1x1 gather)",
    "conv2d_backward": "conv bwd: dW GEMM (+dX GEMM of 1x1/strided)",
    "conv2d_backward>conv2d_forward>im2col": "conv bwd dX: im2col of dout",
    "conv2d_backward>conv2d_forward": "conv bwd dX: GEMM (+flipped w copy)",
    "conv2d_backward>col2im": "conv bwd dX: col2im (strided 3x3)",
    "batchnorm_forward": "BN fwd",
    "batchnorm_backward": "BN bwd",
    "relu_forward": "ReLU fwd (after BN)",
    "relu_backward": "ReLU bwd (before BN)",
    "block.forward(add+relu)>relu_forward": "ReLU fwd (block output)",
    "block.backward(relu_bwd+add)>relu_backward": "ReLU bwd (block output)",
    "block.forward(add+relu)": "residual add fwd (+dispatch)",
    "block.backward(relu_bwd+add)": "residual add bwd (+dispatch)",
    "sgd.step": "SGD update (flat, 4-6 passes)",
    "softmax_cross_entropy": "softmax cross-entropy",
}


def _strip_block(key: str) -> str:
    """Drops the residual-block frames from a path (keeps the block's own exclusive time separate)."""
    parts = key.split(">")
    if len(parts) > 1 and parts[0].startswith("block."):
        rest = ">".join(parts[1:])
        if rest in ("relu_forward", "relu_backward"):
            return key
        return rest
    return key


def run_profile(threads: int, steps: int, warmup: int) -> dict:
    runner = ours_runner("resnet20")
    with threadpool_limits(limits=threads, user_api="blas"):
        for _ in range(warmup):
            runner.step()
        prof = LayerProfiler()
        prof.install()
        meter = LoadMeter()
        try:
            totals = []
            for _ in range(steps):
                t0 = time.perf_counter()
                runner.step()
                totals.append(time.perf_counter() - t0)
        finally:
            prof.restore()
        foreign = meter.foreign()
    agg, fl = defaultdict(float), defaultdict(float)
    for k, v in prof.excl.items():
        agg[_strip_block(k)] += v
    for k, v in prof.flops.items():
        fl[_strip_block(k)] += v
    total = sum(totals)
    rows = []
    for k, v in sorted(agg.items(), key=lambda kv: -kv[1]):
        gf = fl.get(k, 0.0) / v / 1e9 if fl.get(k) else None
        rows.append({"key": k, "label": PROFILE_LABELS.get(k, k), "ms_per_step": 1e3 * v / steps,
                     "percent": 100.0 * v / total, "gflops": gf})
    accounted = sum(agg.values())
    rows.append({"key": "other", "label": "other (Python glue, reshapes, Sequence loops)",
                 "ms_per_step": 1e3 * (total - accounted) / steps,
                 "percent": 100.0 * (total - accounted) / total, "gflops": None})
    return {"threads": threads, "steps": steps, "ms_per_step": 1e3 * total / steps,
            "img_s": runner.batch * steps / total, "rows": rows,
            "foreign_cpu": foreign}


def print_profile(p: dict) -> None:
    print(f"\nPer-layer-type profile: scalesgd ResNet-20, batch 64, {p['threads']} thread(s), "
          f"{p['steps']} steps, {p['ms_per_step']:.1f} ms/step ({p['img_s']:.0f} img/s with timers), "
          f"other-procs CPU {p['foreign_cpu'] if p['foreign_cpu'] is None else round(p['foreign_cpu'], 2)}")
    print(f"  {'part':<46} {'ms/step':>8} {'%':>6} {'GFLOP/s':>8}")
    for r in p["rows"]:
        gf = f"{r['gflops']:.1f}" if r["gflops"] else ""
        print(f"  {r['label']:<46} {r['ms_per_step']:8.2f} {r['percent']:6.1f} {gf:>8}")


# ============================================================================ main
def blas_info() -> str:
    out = []
    for d in threadpool_info():
        out.append(f"{d.get('internal_api')} {d.get('version')} ({d.get('user_api')}, "
                   f"{d.get('threading_layer', '')}, {d.get('architecture', '')}, "
                   f"max {d.get('num_threads')} threads)")
    return "; ".join(out)


def summarise(step_times: list[list[float]], batch: int) -> dict:
    """step_times: one list per repeat.  Median = median of the per-repeat medians; best = fastest step."""
    per_rep = [batch / statistics.median(r) for r in step_times]
    flat = [t for r in step_times for t in r]
    return {"median_img_s": statistics.median(per_rep), "best_img_s": batch / min(flat),
            "repeat_median_img_s": per_rep, "step_s": step_times}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--models", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    ap.add_argument("--repeats", type=int, default=3, help="interleaved blocks per configuration")
    ap.add_argument("--steps", type=int, default=4, help="timed steps per block")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps per runner before timing")
    ap.add_argument("--no-torch", action="store_true", help="skip PyTorch even if importable")
    ap.add_argument("--no-channels-last", action="store_true", help="torch: NCHW only")
    ap.add_argument("--no-profile", action="store_true", help="skip the per-layer profile")
    ap.add_argument("--profile-steps", type=int, default=4)
    ap.add_argument("--c2c", type=Path, default=C2C_SRC, help="placement probe source")
    ap.add_argument("--json", type=Path, help="write all results (raw step times too) here")
    args = ap.parse_args(argv)

    use_torch = torch is not None and not args.no_torch
    layouts = ["nchw"] + ([] if args.no_channels_last else ["channels_last"])
    probe = Probe(args.c2c)
    t_start = time.perf_counter()

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
    la = os.getloadavg() if hasattr(os, "getloadavg") else None
    if la and la[0] > 0.5:
        print(f"WARNING: load average {la[0]:.2f} before start: other processes compete for the CPUs")
    c2c_before = probe.run()
    print(f"placement probe before: {fmt_probe(c2c_before)}")
    print(f"timing: {args.warmup} warm-up steps per runner, then {args.repeats} interleaved blocks of "
          f"{args.steps} steps; median = median of block medians, best = fastest single step\n")

    results = []
    for key in args.models:
        for threads in args.threads:
            name, size, batch, classes, _ = CONFIGS[key]
            ours = ours_runner(key)
            runners = [("scalesgd", ours)]
            if use_torch:
                for lay in layouts:
                    runners.append((f"torch_{lay}", torch_runner(key, lay == "channels_last")))
            for _, r in runners:                      # warm-up (allocator, oneDNN primitive caches)
                timed_block(r, args.warmup, threads)
            times = {n: [] for n, _ in runners}
            probes = [probe.run(200_000)]
            meter = LoadMeter()
            for _ in range(args.repeats):
                for n, r in runners:
                    times[n].append(timed_block(r, args.steps, threads))
            foreign = meter.foreign()
            probes.append(probe.run(200_000))
            res = {"model": key, "input": f"{size}x{size}", "batch": batch, "classes": classes,
                   "threads": threads, "c2c_ns": probes,
                   "foreign_cpu": foreign}
            for n, r in runners:
                res[n] = summarise(times[n], batch)
                res[n]["final_loss"] = r.loss
                assert np.isfinite(r.loss), f"{n} {key}: loss {r.loss}"
            tl = [res[f"torch_{lay}"]["median_img_s"] for lay in layouts if f"torch_{lay}" in res]
            res["torch_best_median_img_s"] = max(tl) if tl else None
            res["ratio"] = res["scalesgd"]["median_img_s"] / max(tl) if tl else None
            results.append(res)
            _print_row(res, layouts, use_torch, header=len(results) == 1)

    c2c_after = probe.run()
    print(f"\nplacement probe after: {fmt_probe(c2c_after)}")

    print("\nSummary (img/s, median of block medians; best step in brackets; ratio vs the faster torch layout)")
    hdr = "| model | input | batch | threads | scalesgd img/s |"
    if use_torch:
        hdr += "".join(f" torch {lay} |" for lay in layouts) + " ratio scalesgd/torch |"
    hdr += " other-procs CPU |"
    print(hdr)
    print("|" + "---|" * (hdr.count("|") - 1))
    for r in results:
        s = r["scalesgd"]
        line = (f"| {r['model']} | {r['input']} | {r['batch']} | {r['threads']} | "
                f"{s['median_img_s']:.0f} ({s['best_img_s']:.0f}) |")
        if use_torch:
            for lay in layouts:
                t = r[f"torch_{lay}"]
                line += f" {t['median_img_s']:.0f} ({t['best_img_s']:.0f}) |"
            line += f" {r['ratio']:.2f} |"
        line += " n/a |" if r["foreign_cpu"] is None else f" {r['foreign_cpu']:.2f} |"
        print(line)

    target = next((r for r in results if r["model"] == "resnet20" and r["threads"] == 1), None)
    verdict = None
    if target is not None:
        ok_speed = target["scalesgd"]["median_img_s"] >= TARGET_IMG_S
        ok_ratio = None if target["ratio"] is None else target["ratio"] >= TARGET_RATIO
        verdict = {"img_s": target["scalesgd"]["median_img_s"], "ok_img_s": ok_speed,
                   "ratio": target["ratio"], "ok_ratio": ok_ratio}
        rtxt = "n/a (no torch)" if ok_ratio is None else \
            f"{target['ratio']:.2f} {'OK' if ok_ratio else 'BELOW'} (>= {TARGET_RATIO})"
        print(f"\nTarget ResNet-20 b64 1 thread: {target['scalesgd']['median_img_s']:.0f} img/s "
              f"{'OK' if ok_speed else 'BELOW'} (>= {TARGET_IMG_S:.0f}); ratio {rtxt}")

    prof = None
    if not args.no_profile:
        prof = run_profile(1, args.profile_steps, args.warmup)
        print_profile(prof)

    elapsed = time.perf_counter() - t_start
    print(f"\ntotal wall time {elapsed:.0f} s")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"info": info, "c2c_before_ns": c2c_before,
                                         "c2c_after_ns": c2c_after, "results": results,
                                         "target": verdict, "profile": prof,
                                         "elapsed_s": elapsed}, indent=1))
        print(f"wrote {args.json}")
    return 0


def _print_row(res, layouts, use_torch, header):
    if header:
        h = f"{'model':<9} {'input':<6} {'batch':>5} {'thr':>3} {'scalesgd':>9}"
        if use_torch:
            h += "".join(f" {'torch ' + lay[:6]:>13}" for lay in layouts) + f" {'ratio':>6}"
        print(h + "   c2c ns (before/after)  other-procs CPU")
    s = res["scalesgd"]
    line = f"{res['model']:<9} {res['input']:<6} {res['batch']:>5} {res['threads']:>3} {s['median_img_s']:9.1f}"
    if use_torch:
        line += "".join(f" {res[f'torch_{lay}']['median_img_s']:13.1f}" for lay in layouts)
        line += f" {res['ratio']:6.2f}"
    c = "/".join("n/a" if v is None else f"{v:.0f}" for v in res["c2c_ns"])
    fl = "n/a" if res["foreign_cpu"] is None else f"{res['foreign_cpu']:.2f}"
    print(line + f"   {c:<22} {fl}", flush=True)


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
