#!/usr/bin/env python3
"""Accuracy and cost of BatchNorm's per-channel float32 sums: plain vs two-stage (``layers._FOLD``).

"plain" is the former implementation, kept here as the baseline: one float32 GEMV ``ones @ x`` for
the column sums and one float32 ``einsum("ij,ij->j")`` for the sums of products, whose error grows
with the number of rows M.  "two-stage" is what ``scalesgd.nn.layers`` does now.

1. Accuracy: relative error (max over channels) of the column sum and of the centred sum of squares
   against float64, at M = 1,024 / 65,536 / 802,816 rows (802,816 = ImageNet batch 64 at the
   112x112 stem), C = 64, data N(1, 2^2).
2. Cost: BN forward (train) + backward on two layer shapes, both implementations measured in the
   same run, interleaved (median of ``--repeats`` blocks of ``--iters`` calls):
   ResNet-20's first stage (batch 64, 32x32x16) and ResNet-18's stem at 64x64 input (batch 16,
   32x32x64).

Usage (from the repository root)::

    PYTHONPATH=src python benchmarks/bn_accuracy.py [--repeats 7] [--iters 20] [--threads 1]
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from scalesgd.nn import layers as L

ROWS = (1024, 65536, 802816)
SHAPES = {"resnet20 32x32x16, batch 64": (64, 32, 32, 16),
          "resnet18 stem 32x32x64, batch 16": (16, 32, 32, 64)}


def plain_colsum(a2):
    return np.ones(a2.shape[0], dtype=a2.dtype) @ a2


def plain_coldot(a2, b2):
    return np.einsum("ij,ij->j", a2, b2)


def accuracy_table(c: int = 64) -> list[tuple]:
    """(rows, plain sum err, two-stage sum err, plain sumsq err, two-stage sumsq err) per M."""
    out = []
    for m in ROWS:
        x = (np.random.default_rng(m).standard_normal((m, c)) * 2 + 1).astype(np.float32)
        x64 = x.astype(np.float64)
        s64 = x64.sum(axis=0)
        xc = x - (s64 / m).astype(np.float32)                 # same centred input for both
        xc64 = xc.astype(np.float64)
        ss64 = np.einsum("ij,ij->j", xc64, xc64)

        def rel(got, ref):
            return float(np.max(np.abs(got.astype(np.float64) - ref) / np.abs(ref)))
        out.append((m, rel(plain_colsum(x), s64), rel(L._colsum(x), s64),
                    rel(plain_coldot(xc, xc), ss64), rel(L._coldot(xc, xc), ss64)))
    return out


def _bn_step(x, dy, gamma, beta):
    rm, rv = np.zeros_like(gamma), np.ones_like(gamma)
    _, cache = L.batchnorm_forward(x, gamma, beta, rm, rv, True)
    dg, db = np.empty_like(gamma), np.empty_like(gamma)
    L.batchnorm_backward(dy, cache, dg, db)


def _time(fn, iters: int) -> float:
    t = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t) / iters


def cost_table(repeats: int, iters: int) -> list[tuple]:
    """(shape name, plain ms, two-stage ms, ratio) for BN forward+backward, interleaved medians."""
    rows = []
    for name, shape in SHAPES.items():
        rng = np.random.default_rng(0)
        x = rng.standard_normal(shape).astype(np.float32)
        dy = rng.standard_normal(shape).astype(np.float32)
        c = shape[-1]
        gamma, beta = np.ones(c, np.float32), np.zeros(c, np.float32)
        times = {"plain": [], "two-stage": []}
        new = (L._colsum, L._coldot)
        for _ in range(repeats):
            for impl in ("plain", "two-stage"):
                L._colsum, L._coldot = (plain_colsum, plain_coldot) if impl == "plain" else new
                try:
                    _bn_step(x, dy, gamma, beta)             # warm
                    times[impl].append(_time(lambda: _bn_step(x, dy, gamma, beta), iters))
                finally:
                    L._colsum, L._coldot = new
        p, t = np.median(times["plain"]) * 1e3, np.median(times["two-stage"]) * 1e3
        rows.append((name, p, t, t / p))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1, help="BLAS threads (threadpoolctl)")
    a = ap.parse_args()
    from threadpoolctl import threadpool_limits
    with threadpool_limits(a.threads):
        print("relative error vs float64 (max over 64 channels), float32 data N(1, 4)")
        print(f"{'rows':>8} {'sum plain':>10} {'sum 2-stage':>12} {'sumsq plain':>12} {'sumsq 2-stage':>14}")
        for m, sp, sn, qp, qn in accuracy_table():
            print(f"{m:>8} {sp:>10.1e} {sn:>12.1e} {qp:>12.1e} {qn:>14.1e}")
        print(f"\nBN forward+backward, float32, {a.threads} BLAS thread(s), median of {a.repeats}x{a.iters}")
        print(f"{'layer':<34} {'plain ms':>9} {'2-stage ms':>11} {'ratio':>6}")
        for name, p, t, r in cost_table(a.repeats, a.iters):
            print(f"{name:<34} {p:>9.3f} {t:>11.3f} {r:>6.2f}")


if __name__ == "__main__":
    main()
