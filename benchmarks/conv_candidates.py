#!/usr/bin/env python3
"""The measured table behind ``model.conv_algo = auto``: forward + backward time of the three shipped
convolution algorithms (im2col, blocked, taps) per 3x3 stride-1 layer of ResNet-20 (batch 64) and
ResNet-18 (64x64 input, batch 16), with the one ``auto`` picks; and, forward only, two candidates that
were measured and not shipped (a candidate that loses its forward cannot win the step, whose backward
is two more products of the same shape):

- ``winograd_f2``, ``winograd_f4``: Winograd F(2x2, 3x3) and F(4x4, 3x3) (Lavin & Gray 2016) as batched
  GEMMs in NumPy: tiles gathered by one strided copy, the input transform B^T d B and the output
  transform A^T m A as small GEMMs over the tile axis, one GEMM per transform point.  The weight
  transform G g G^T is done once outside the timing (as a per-step cache would), which favours them.

Usage: ``.venv/bin/python benchmarks/conv_candidates.py [--repeats 9] [--json OUT]``.  One thread.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from numpy.lib.stride_tricks import as_strided
from threadpoolctl import threadpool_limits

from scalesgd.nn import conv as CV

GEOMETRIES = [(64, 32, 16, 16), (64, 16, 32, 32), (64, 8, 64, 64),      # (N, H=W, C, F): ResNet-20
              (16, 16, 64, 64), (16, 8, 128, 128), (16, 4, 256, 256), (16, 2, 512, 512)]  # ResNet-18
WINOGRAD = {
    2: dict(BT=[[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]],
            G=[[1, 0, 0], [.5, .5, .5], [.5, -.5, .5], [0, 0, 1]],
            AT=[[1, 1, 1, 0], [0, 1, -1, -1]]),
    4: dict(BT=[[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0], [0, -2, -1, 2, 1, 0],
                [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]],
            G=[[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6], [1 / 24, 1 / 12, 1 / 6],
               [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]],
            AT=[[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]]),
}


def winograd_weights(w, m: int):
    """U[(b, a)] = (G g G^T)^T per (C, F) pair, laid out (alpha*alpha, C, F) in the order used below."""
    g = np.asarray(WINOGRAD[m]["G"], w.dtype)
    a = m + 2
    return np.einsum("ik,klcf,jl->jicf", g, w, g).reshape(a * a, w.shape[2], w.shape[3]).astype(w.dtype)


def winograd_forward(x, u, m: int, pad_buf):
    """Stride-1, pad-1 3x3 convolution of x (N, H, W, C) by Winograd F(m x m, 3x3); H, W multiples of m."""
    dt, a = x.dtype, m + 2
    bt, at = (np.asarray(WINOGRAD[m][k], dt) for k in ("BT", "AT"))
    n, h, wd, c = x.shape
    f = u.shape[2]
    th, tw = h // m, wd // m
    pad_buf[:, 1:1 + h, 1:1 + wd] = x
    s = pad_buf.strides
    rows = as_strided(pad_buf, (n, th, a, pad_buf.shape[2] * c), (s[0], m * s[1], s[1], s[3]))
    t1 = np.matmul(bt, rows).reshape(n, th, a, pad_buf.shape[2], c)        # transform along rows
    s = t1.strides
    tiles = np.empty((a, a, n, th, tw, c), dt)                              # (b, a', tiles, C)
    tiles[...] = as_strided(t1, tiles.shape, (s[3], s[2], s[0], s[1], m * s[3], s[4]))
    v = (bt @ tiles.reshape(a, -1)).reshape(a * a, n * th * tw, c)          # and along columns
    mw = np.matmul(v, u).reshape(a, a, -1)                                  # one GEMM per point
    y = (at @ np.matmul(at, mw).reshape(a, -1)).reshape(m, m, n, th, tw, f)
    out = np.empty((n, h, wd, f), dt)
    out.reshape(n, th, m, tw, m, f)[...] = y.transpose(2, 3, 1, 4, 0, 5)
    return out


def median_ms(fn, repeats: int) -> float:
    fn()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(ts)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    rows = []
    shipped = ("im2col", "blocked", "taps", "winograd")
    print(f"{'geometry (N, HxW, C->F)':<26}" + "".join(f"{k:>9}" for k in shipped) + f"{'auto':>9}   fwd+bwd ms"
          + "".join(f"{k:>13}" for k in (*shipped[:3], "winograd_f2", "winograd_f4")) + "   fwd ms (1 thread)")
    with threadpool_limits(limits=1, user_api="blas"):
        for n, h, c, f in GEOMETRIES:
            x = rng.standard_normal((n, h, h, c)).astype(np.float32)
            w = (rng.standard_normal((3, 3, c, f)) / np.sqrt(9 * c)).astype(np.float32)
            dy = rng.standard_normal((n, h, h, f)).astype(np.float32)
            ref = CV.conv2d_forward(x.astype(np.float64), w.astype(np.float64), 1, 1)[0]
            plans = {"im2col": None, "blocked": CV.conv_plan("blocked", np, x.shape, 3, 3, 1, 1, 4, f),
                     "taps": ("taps", 1), "winograd": CV.conv_plan("winograd", np, x.shape, 3, 3, 1, 1, 4, f)}
            auto = CV.conv_plan("auto", np, x.shape, 3, 3, 1, 1, 4, f)
            row = {"geometry": f"{n}, {h}x{h}, {c}->{f}", "auto": auto[0] if auto else "im2col",
                   "fwd_bwd_ms": {}, "ms": {}, "max_rel_error": {}}
            fwd = {}
            for name, plan in plans.items():     # forward + backward (dX and dW) of each
                ws, dw = CV.Workspace(), np.empty_like(w)

                def step(plan=plan, ws=ws, dw=dw):
                    _, cache = CV.conv2d_forward(x, w, 1, 1, ws, plan)
                    CV.conv2d_backward(dy, cache, dw, True, ws)
                row["fwd_bwd_ms"][name] = median_ms(step, args.repeats)
                if name != "winograd":           # its forward: the F2/F4 columns below
                    fwd[name] = lambda plan=plan, ws=ws: CV.conv2d_forward(x, w, 1, 1, ws, plan)[0]
            for m in (2, 4):
                if h % m == 0 and h >= 2 * m:
                    u, buf = winograd_weights(w, m), np.zeros((n, h + 2, h + 2, c), np.float32)
                    fwd[f"winograd_f{m}"] = lambda u=u, buf=buf, m=m: winograd_forward(x, u, m, buf)
            for name, fn in fwd.items():
                row["max_rel_error"][name] = float(np.abs(fn() - ref).max() / np.abs(ref).max())
                row["ms"][name] = median_ms(fn, args.repeats)
            rows.append(row)
            print(f"{row['geometry']:<26}" + "".join(f"{row['fwd_bwd_ms'][k]:9.2f}" for k in shipped)
                  + f"{row['auto']:>9}   " + "".join(f"{row['ms'].get(k, float('nan')):13.2f}" for k in
                                                     (*shipped[:3], "winograd_f2", "winograd_f4")))
    names = sorted({k for r in rows for k in r["max_rel_error"]})
    print("max |error| / max |output| against float64: " + "; ".join(
        f"{k} {max(r['max_rel_error'].get(k, 0.0) for r in rows):.1e}" for k in names))
    if args.json:
        args.json.write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "repeats": args.repeats,
                                         "rows": rows}, indent=1))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
