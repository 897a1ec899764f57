#!/usr/bin/env python3
"""The measured table behind ``model.conv_algo = auto``: forward + backward time of the four shipped
convolution algorithms (im2col, blocked, taps, winograd) per 3x3 stride-1 layer of ResNet-20 (batch
64) and ResNet-18 (64x64 input, batch 16), with the one ``auto`` picks; and the forward alone of the
first three and of Winograd at both tile sizes:

- ``winograd_f2``, ``winograd_f4``: ``nn/winograd.py``'s F(2x2, 3x3) and F(4x4, 3x3) forward (weight
  transform included), where the image holds at least 2x2 tiles.

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
from threadpoolctl import threadpool_limits

from scalesgd.nn import conv as CV

GEOMETRIES = [(64, 32, 16, 16), (64, 16, 32, 32), (64, 8, 64, 64),      # (N, H=W, C, F): ResNet-20
              (16, 16, 64, 64), (16, 8, 128, 128), (16, 4, 256, 256), (16, 2, 512, 512)]  # ResNet-18
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
    print(f"{'geometry (N, HxW, C->F)':<26}" + "".join(f"{k:>9}" for k in shipped)
          + f"{'auto':>9}   fwd+bwd ms"
          + "".join(f"{k:>13}" for k in (*shipped[:3], "winograd_f2", "winograd_f4"))
          + "   fwd ms (1 thread)")
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
                if h >= 2 * m:
                    fwd[f"winograd_f{m}"] = lambda m=m: CV.conv2d_forward(x, w, 1, 1, None,
                                                                          ("winograd", m))[0]
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
