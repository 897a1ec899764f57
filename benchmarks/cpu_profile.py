"""Where one scalesgd CPU training step spends its time: per conv geometry (GEMM against im2col/col2im
copying against the conv's own Python), BN, ReLU, the residual add, the optimizer and the rest.

``StepProfiler`` wraps functions of ``scalesgd.nn.conv`` and ``scalesgd.nn.layers`` (and a few
methods) in place for the duration of a profile and times them exclusively (a callee's time is not its
caller's).  Calls inside a convolution (the im2col copies, ``col2im``, ``gemm``) are charged to the
outermost conv call's geometry and pass, so the dX convolution that a "same" conv's backward runs
counts as that conv's backward.  Every GEMM's shape is recorded; :func:`attainable` times each shape
alone on fresh operands of the same layout (the OpenBLAS rate an im2col design can reach at those
shapes), so a profile says how far each geometry's GEMMs are from that ceiling.

Used by ``bench_cpu.py`` (``--profile``); the wrappers cost ~1 us per call, which shows up in the
profile's total (the table reports both).
"""
from __future__ import annotations

import time
from collections import defaultdict

import numpy as np
from threadpoolctl import threadpool_limits

from scalesgd.nn import conv as CV
from scalesgd.nn import layers as L
from scalesgd.nn import winograd as WG
from scalesgd.nn import resnet as R
from scalesgd.optim.sgd import SGD

# functions of nn.layers timed as their own part (outside convolutions)
PARTS = {
    "batchnorm_forward": "BN forward", "batchnorm_backward": "BN backward",
    "relu_forward": "ReLU forward", "relu_backward": "ReLU backward",
    "maxpool_forward": "max pool", "maxpool_backward": "max pool",
    "avgpool_forward": "avg pool + linear + loss", "avgpool_backward": "avg pool + linear + loss",
    "linear_forward": "avg pool + linear + loss", "linear_backward": "avg pool + linear + loss",
    "softmax_cross_entropy": "avg pool + linear + loss",
}
CONV_INNER = {"im2col": "im2col", "col2im": "col2im", "gemm": "GEMM"}


def geometry(x_shape, w_shape, stride: int) -> str:
    """'3x3/1 32x32 16->16' (kernel/stride, input size, channels in->out)."""
    _, h, w, c = x_shape
    kh, kw, _, f = w_shape
    return f"{kh}x{kw}/{stride} {h}x{w} {c}->{f}"


class StepProfiler:
    def __init__(self):
        self.stack: list[list] = []                   # frames: [charge key, child seconds]
        self.seconds = defaultdict(float)             # (group, part) -> exclusive seconds
        self.calls = defaultdict(int)                 # conv (geometry, pass) -> calls
        self.gemms = defaultdict(lambda: [0.0, 0])    # (geometry, pass, shape/layout) -> [s, calls]
        self.saved = []

    # ------------------------------------------------------------------ wrapping
    def _conv_frame(self):
        return next((f for f in self.stack if f[0][0].startswith("conv ")), None)

    def _wrap(self, owner, attr, key_fn):
        orig = getattr(owner, attr)
        prof = self

        def wrapper(*a, **k):
            key = key_fn(a, k)
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
                prof.seconds[key] += dt - frame[1]
                if key[1] == "GEMM":
                    g = prof.gemms[(key[0], _gemm_layout(a, k))]
                    g[0] += dt
                    g[1] += 1

        self.saved.append((owner, attr, orig))
        setattr(owner, attr, wrapper)

    def install(self) -> None:
        def conv_key(pass_, shape_of):
            def key(a, k):
                outer = self._conv_frame()
                if outer is not None:                  # the dX conv of a backward: the outer's
                    return outer[0][0], "conv (own Python)"
                xs, ws, stride = shape_of(a, k)
                g = f"conv {pass_} {geometry(xs, ws, stride)}"
                self.calls[g] += 1
                return g, "conv (own Python)"
            return key

        def fwd_shapes(a, k):
            stride = a[2] if len(a) > 2 else k.get("stride", 1)
            return a[0].shape, a[1].shape, stride

        def bwd_shapes(a, k):
            cache = a[1]
            return cache[1], cache[2].shape, cache[3]

        self._wrap(CV._Taps, "load", lambda a, k: ((self._conv_frame() or [("outside convs",)])[0][0],
                                                  "im2col"))           # taps: the width-tap copy
        for fn in ("forward", "backward"):       # Winograd: transforms and point GEMMs, whole
            self._wrap(WG, fn, lambda a, k: ((self._conv_frame() or [("outside convs",)])[0][0], "Winograd"))
        self._wrap(CV, "conv2d_forward", conv_key("fwd", fwd_shapes))
        self._wrap(CV, "conv2d_backward", conv_key("bwd", bwd_shapes))
        for fn, part in CONV_INNER.items():
            self._wrap(CV, fn, lambda a, k, part=part: ((self._conv_frame() or [("outside convs",)])[0][0],
                                                       part))
        for fn, part in PARTS.items():
            self._wrap(L, fn, lambda a, k, part=part: ("other layers", part))
        self._wrap(R.ResidualBlock, "forward", lambda a, k: ("other layers", "residual add + ReLU"))
        self._wrap(R.ResidualBlock, "backward", lambda a, k: ("other layers", "residual add + ReLU"))
        self._wrap(SGD, "step", lambda a, k: ("other layers", "SGD update"))

    def restore(self) -> None:
        for owner, attr, orig in reversed(self.saved):
            setattr(owner, attr, orig)
        self.saved = []


def _gemm_layout(a, k) -> tuple:
    """(M, K, N, A transposed, B transposed) of gemm(A, B)."""
    x, y = a[0], a[1]
    return (x.shape[0], x.shape[1], y.shape[1], not x.flags.c_contiguous, not y.flags.c_contiguous)


def _operand(rng, rows, cols, transposed):
    m = rng.standard_normal((cols, rows) if transposed else (rows, cols), dtype=np.float32)
    return m.T if transposed else m


def attainable(layouts, threads: int, repeats: int = 5) -> dict:
    """Seconds of one GEMM of each (M, K, N, tA, tB) alone, fresh operands, best of ``repeats``."""
    rng = np.random.default_rng(0)
    out = {}
    with threadpool_limits(limits=threads, user_api="blas"):
        for lay in layouts:
            m, kk, n, ta, tb = lay
            a, b = _operand(rng, m, kk, ta), _operand(rng, kk, n, tb)
            c = np.empty((m, n), np.float32)
            np.matmul(a, b, out=c)
            best = float("inf")
            for _ in range(repeats):
                t0 = time.perf_counter()
                np.matmul(a, b, out=c)
                best = min(best, time.perf_counter() - t0)
            out[lay] = best
    return out


def profile(runner, threads: int, steps: int, warmup: int) -> dict:
    """Profiles ``steps`` training steps of an OursRunner; returns the table as JSON-able rows."""
    with threadpool_limits(limits=threads, user_api="blas"):
        for _ in range(warmup):
            runner.step()
        plain = []
        for _ in range(steps):                       # unwrapped steps: the profile's overhead
            t0 = time.perf_counter()
            runner.step()
            plain.append(time.perf_counter() - t0)
        prof = StepProfiler()
        prof.install()
        try:
            totals = []
            for _ in range(steps):
                t0 = time.perf_counter()
                runner.step()
                totals.append(time.perf_counter() - t0)
        finally:
            prof.restore()
    best = attainable({lay for (_, lay) in prof.gemms}, threads)
    total = sum(totals)
    per = 1e3 / steps
    convs = []
    for g in sorted(prof.calls, key=lambda g: (g.split()[1], g)):
        parts = {p: prof.seconds.get((g, p), 0.0) * per
                 for p in ("GEMM", "im2col", "col2im", "Winograd", "conv (own Python)")}
        gem = [(lay, s, c) for (gg, lay), (s, c) in prof.gemms.items() if gg == g]
        flops = sum(2.0 * lay[0] * lay[1] * lay[2] * c for lay, _, c in gem)
        ideal = sum(best[lay] * c for lay, _, c in gem) * per
        convs.append({"conv": g[5:], "calls_per_step": prof.calls[g] / steps,
                      "gemm_ms": parts["GEMM"], "im2col_ms": parts["im2col"], "col2im_ms": parts["col2im"],
                      "winograd_ms": parts["Winograd"],
                      "own_python_ms": parts["conv (own Python)"],
                      "gemm_gflops": flops / steps / (parts["GEMM"] / 1e3) / 1e9 if parts["GEMM"] else None,
                      "openblas_alone_ms": ideal,
                      "openblas_alone_gflops": flops / steps / (ideal / 1e3) / 1e9 if ideal else None,
                      "gemm_shapes": sorted({f"{m}x{k}x{n}{'ᵀA' if ta else ''}{'ᵀB' if tb else ''}"
                                             for (m, k, n, ta, tb), _, _ in gem})})
    others = defaultdict(float)
    for (grp, part), s in prof.seconds.items():
        if grp == "other layers":
            others[part] += s * per
    accounted = sum(prof.seconds.values()) * per
    others["Python glue (the rest of the step)"] = total * per - accounted
    return {"threads": threads, "steps": steps, "ms_per_step": total * per,
            "ms_per_step_unprofiled": sum(plain) * per, "img_s": runner.batch * steps / total,
            "convs": convs, "others": dict(sorted(others.items(), key=lambda kv: -kv[1])),
            "summary": {
                "GEMM": sum(c["gemm_ms"] for c in convs),
                "GEMM if every shape ran at its alone rate": sum(c["openblas_alone_ms"] for c in convs),
                "im2col + col2im copies": sum(c["im2col_ms"] + c["col2im_ms"] for c in convs),
                "Winograd (transforms and point GEMMs)": sum(c["winograd_ms"] for c in convs),
                "conv own Python": sum(c["own_python_ms"] for c in convs),
                **{k: v for k, v in others.items()}}}


def print_profile(name: str, p: dict) -> None:
    print(f"\nProfile {name}, {p['threads']} thread(s), {p['steps']} steps: {p['ms_per_step']:.1f} ms/step "
          f"profiled ({p['ms_per_step_unprofiled']:.1f} unprofiled)")
    print(f"  {'conv (pass k/stride HxW C->F)':<34} {'calls':>5} {'GEMM ms':>8} {'GF/s':>6} {'alone ms':>8} "
          f"{'GF/s':>6} {'im2col':>7} {'col2im':>7} {'Winogr':>7} {'Python':>7}")
    for c in p["convs"]:
        gf = f"{c['gemm_gflops']:.0f}" if c["gemm_gflops"] else ""
        ga = f"{c['openblas_alone_gflops']:.0f}" if c["openblas_alone_gflops"] else ""
        print(f"  {c['conv']:<34} {c['calls_per_step']:5.0f} {c['gemm_ms']:8.2f} {gf:>6} "
              f"{c['openblas_alone_ms']:8.2f} {ga:>6} {c['im2col_ms']:7.2f} {c['col2im_ms']:7.2f} "
              f"{c['winograd_ms']:7.2f} {c['own_python_ms']:7.2f}")
    print("  totals (ms/step): " + "; ".join(f"{k} {v:.1f}" for k, v in p["summary"].items()))
