#!/usr/bin/env python3
"""Forward time of candidate CPU convolution algorithms per ResNet-20 geometry (3x3, stride 1, batch 64),
against the two that ship (``model.conv_algo`` = im2col, blocked): the measurement behind the choice.

Candidates, forward only (a candidate that loses its forward cannot win the step, whose backward is two
more products of the same shape):

- ``winograd_f2``, ``winograd_f4``: Winograd F(2x2, 3x3) and F(4x4, 3x3) (Lavin & Gray 2016) as batched
  GEMMs in NumPy: tiles gathered by one strided copy, the input transform B^T d B and the output
  transform A^T m A as small GEMMs over the tile axis, one GEMM per transform point.  The weight
  transform G g G^T is done once outside the timing (as a per-step cache would), which favours them.
- ``width_taps``: im2col over the kernel's width taps only (3x less copying) and one GEMM per kernel row
  on row-shifted views of that matrix, summed (one image per block).

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

GEOMETRIES = [(64, 32, 16, 16), (64, 16, 32, 32), (64, 8, 64, 64)]       # (N, H=W, C, F)
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


def width_taps_forward(x, w, bufs):
    """Stride-1, pad-1 3x3 convolution: per image, im2col over width taps, one GEMM per kernel row."""
    n, h, wd, c = x.shape
    f = w.shape[3]
    rows = [w[i].reshape(3 * c, f) for i in range(3)]
    xpad, taps, part = bufs
    out = np.empty((n, h, wd, f), x.dtype)
    s = xpad.strides
    win = as_strided(xpad, (h + 2, wd, 3 * c), (s[0], s[1], s[2]))
    t2 = taps.reshape(-1, 3 * c)
    for i in range(n):
        xpad[1:1 + h, 1:1 + wd] = x[i]
        taps[...] = win
        y = out[i].reshape(h * wd, f)
        np.matmul(t2[:h * wd], rows[0], out=y)
        for k in (1, 2):
            np.matmul(t2[k * wd:k * wd + h * wd], rows[k], out=part)
            y += part
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
    print(f"{'geometry (N, HxW, C->F)':<26}" + "".join(f"{k:>13}" for k in
          ("im2col", "blocked", "winograd_f2", "winograd_f4", "width_taps")) + "   (ms, forward, 1 thread)")
    with threadpool_limits(limits=1, user_api="blas"):
        for n, h, c, f in GEOMETRIES:
            x = rng.standard_normal((n, h, h, c)).astype(np.float32)
            w = (rng.standard_normal((3, 3, c, f)) / np.sqrt(9 * c)).astype(np.float32)
            ref = CV.conv2d_forward(x.astype(np.float64), w.astype(np.float64), 1, 1)[0]
            ws, plan = CV.Workspace(), CV.conv_plan("blocked", np, x.shape, 3, 3, 1, 1, 4)
            cands = {"im2col": lambda: CV.conv2d_forward(x, w, 1, 1, ws)[0],
                     "blocked": lambda: CV.conv2d_forward(x, w, 1, 1, ws, plan)[0]}
            for m in (2, 4):
                u, buf = winograd_weights(w, m), np.zeros((n, h + 2, h + 2, c), np.float32)
                cands[f"winograd_f{m}"] = lambda u=u, buf=buf, m=m: winograd_forward(x, u, m, buf)
            bufs = (np.zeros((h + 2, h + 2, c), np.float32), np.empty((h + 2, h, 3 * c), np.float32),
                    np.empty((h * h, f), np.float32))
            cands["width_taps"] = lambda: width_taps_forward(x, w, bufs)
            row = {"geometry": f"{n}, {h}x{h}, {c}->{f}", "ms": {}, "max_rel_error": {}}
            for name, fn in cands.items():
                err = float(np.abs(fn() - ref).max() / np.abs(ref).max())
                row["ms"][name], row["max_rel_error"][name] = median_ms(fn, args.repeats), err
            rows.append(row)
            print(f"{row['geometry']:<26}" + "".join(f"{row['ms'][k]:13.2f}" for k in cands))
    print("max |error| / max |output| against float64: " + "; ".join(
        f"{k} {max(r['max_rel_error'][k] for r in rows):.1e}" for k in rows[0]["ms"]))
    if args.json:
        args.json.write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "repeats": args.repeats,
                                         "rows": rows}, indent=1))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
