"""The self-check's framework (``fastpaths/``): a ``Component`` (a fast twin and its reference),
comparing them, ``validate`` (run, compare, agree across ranks, turn the failures off, speak once)
and the run's ``Report``.  The components themselves are built in ``fastpaths/parts.py``."""
from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..choices import FAST_PATH_MODES
from ..errors import BackendError

log = logging.getLogger("scalesgd")

CHECK_BATCH = 2                      # batch of the cuDNN checks (real H, W, C of each layer)
# ||fast - ref|| / ||ref|| per output.  A wrong layout, stride or unwritten output is off by ~1; TF32
# (10-bit mantissa) is ~5e-4 off, which precision tf32 allows and fp32 (its graphs exclude tensor-core
# plans, nn/cudnn_conv.build_conv) must not: a float32 summation-order difference is ~1e-6
CONV_TOL = {"fp32": 1e-4, "tf32": 5e-3, "bf16": 3e-2}
KERNEL_TOL = {"float32": 1e-5, "float64": 1e-12, "bfloat16": 1e-2}
# the whole model (logits, gradients) against its reference layers: per-layer errors compound over
# depth, so wider than CONV_TOL; a stale or wrong weight copy is off by O(1).  Estimates, under a
# floor measured as the check runs (FLOOR_FACTOR): the one GPU run (H200) measured 1.8e-2 in fp32
# gradients, within the float32 noise of the ResNet-50 step
MODEL_TOL = {"fp32": 1e-3, "tf32": 5e-2, "bf16": 0.25}
# A floor under a component's tolerance, measured when its fixed one fails: the reference again on
# inputs moved by the precision's rounding unit (MOVE: 2^-23, one or two float32 ulps; TF32's and
# bfloat16's unit roundoff); how far that moves each output is the rounding noise of the
# computation itself, and any implementation at that precision differs from the reference by about
# as much.  A ResNet-50 training step at init amplifies it through depth ("shattered" gradients; BN
# on batch statistics cancels at every layer): on CPU (float32 reference layers, batch 8, 64 px)
# its gradients moved 2.0e-2 against float64, and 3.3e-2 / 1.2e-1 / 8.2e-1 / 1.2 under moves of
# 2^-23 / 2^-16 / 2^-10 / 2^-8 (logits 1.2e-4 .. 2.4e-1), most in the first layers (fc 6e-5);
# ResNet-20 2.4e-4.  The one GPU run (H200) measured 1.8e-2 (fp32) and 1.22 (bf16) against fixed
# 1e-3 and 0.25: within that noise.  The training step is compared per tensor (logits, each
# gradient), each with its own floor, so one layer's wrong gradient stays far above its own noise;
# a floor above FLOOR_CAP means that output cannot be told from rounding at this precision (bf16's
# first layers): it is reported as inconclusive and only checked for existence, shape and
# non-finite values.
FLOOR_FACTOR = 4.0
FLOOR_CAP = 0.5      # a floor above it: the output cannot be told from rounding (reported, not judged)
MOVE = {"fp32": 2.0 ** -23, "tf32": 2.0 ** -11, "bf16": 2.0 ** -8}
ULP = MOVE["fp32"]
EVAL_ROWS = 2                        # rows of an evaluation batch compared (eval rows are independent)
TRANSPORT_TOL = 1e-6                 # float32 sums of a few ranks: only the summation order differs
DECODE_TOL = 0.05                    # nvJPEG vs libjpeg-turbo: IDCT and chroma upsampling differ
DECODE_SAMPLES = 4


@dataclass
class Component:
    """One fast path: ``run()`` and ``reference()`` compute the same outputs (an array or a tuple
    of arrays, any xp) on the same small inputs; ``disable()`` makes the run use ``fallback``."""

    name: str                        # unique, the same on every rank (it is what ranks agree on)
    run: Callable[[], object]
    reference: Callable[[], object]
    tol: float                       # allowed ||fast - ref|| / ||ref|| of each output
    fallback: str                    # what runs instead, in words
    disable: Callable[[], None]
    outputs: tuple = ()              # names of the outputs, for messages
    # the reference on inputs moved by the precision's rounding unit (MOVE), run when the fixed
    # tolerance fails: each output's is then at least FLOOR_FACTOR times how far that moved it
    floor: Callable[[], object] | None = None


# ----------------------------------------------------------------------------- the outcome
class Report:
    """One run's outcome, for summary.json (owned by the run's set-up, ``Setup.fast_paths``):
    the mode, the seconds the checks took, and per component its status (``used``, ``fell back``,
    ``off``), error, fallback, relative error and seconds."""

    def __init__(self, mode: str | None = None):
        if mode is not None and mode not in FAST_PATH_MODES:
            raise ValueError(f"model.fast_paths: expected one of {', '.join(FAST_PATH_MODES)}, "
                             f"got {mode!r}")
        self.mode, self.seconds, self.components, self.gflops = mode, 0.0, {}, 0.0

    def to_dict(self) -> dict:
        return json.loads(json.dumps({"mode": self.mode, "seconds": self.seconds,
                                      "gflops": round(self.gflops, 3), "components": self.components}))


# ----------------------------------------------------------------------------- comparing
def _host64(a) -> np.ndarray:
    """A float64 NumPy copy of an xp array (CuPy: ``get()``; bf16: widened)."""
    if not isinstance(a, np.ndarray) and hasattr(a, "get"):
        a = a.get()
    return np.asarray(a).astype(np.float64)


def compare(got, want, tol, names: tuple = ()) -> tuple[float, str | None]:
    """(worst relative error, None) when every output of ``got`` is within ``tol`` of ``want``
    (``||a - b|| / ||b||``), else (error, what is wrong: the output, its shape or values; with
    several outputs beyond their tolerance, the first and how many more, the worst named).
    ``tol``: one tolerance, or one per output; None: that output's values cannot be judged (only
    that it exists, has the shape and the same non-finite values)."""
    got, want = (tuple(v) if isinstance(v, (tuple, list)) else (v,) for v in (got, want))
    if len(got) != len(want):
        return math.inf, f"{len(got)} outputs, the reference has {len(want)}"
    tols = tuple(tol) if isinstance(tol, (tuple, list)) else (tol,) * len(got)
    worst, beyond = 0.0, []
    for i, (a, b) in enumerate(zip(got, want)):
        what, tol = (names[i] if i < len(names) else f"output {i}"), tols[i]
        if a is None:
            return math.inf, f"{what}: missing"
        a, b = _host64(a), _host64(b)
        if a.shape != b.shape:
            return math.inf, f"{what}: shape {a.shape}, the reference's is {b.shape}"
        bad, want_bad = ~np.isfinite(a), ~np.isfinite(b)
        if (bad & ~want_bad).any():
            return math.inf, f"{what}: {int((bad & ~want_bad).sum())} non-finite values (unwritten?)"
        if (want_bad & ~bad).any():
            return math.inf, (f"{what}: {int((want_bad & ~bad).sum())} finite values where the "
                              "reference has NaN or inf (a NaN turned into a number hides divergence)")
        if not np.array_equal(a[bad], b[bad], equal_nan=True):
            return math.inf, (f"{what}: non-finite values differ from the reference's (NaN vs inf, "
                              "or inf signs)")
        if tol is None:
            continue
        err = _relerr(a[~bad], b[~bad])
        worst = max(worst, err)
        if not err <= tol:
            beyond.append((err, what, tol))
    if not beyond:
        return worst, None
    err, what, tol = beyond[0]
    why = f"{what}: relative error {err:.2e} > tolerance {_short(tol)}"
    if len(beyond) > 1:
        top = sorted(beyond, key=lambda r: r[0] / r[2], reverse=True)[:3]
        why += (f"; {len(beyond) - 1} more beyond theirs, the furthest "
                + ", ".join(f"{w} {e:.1e} ({_short(t)})" for e, w, t in top))
    return max(r[0] for r in beyond), why


def _relerr(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def _short(tol: float) -> str:
    """1e-03 as before; a measured floor with its two digits (7.3e-02)."""
    return f"{tol:.0e}" if float(f"{tol:.0e}") == tol else f"{tol:.1e}"


def floor_tolerances(ref, moved, tol: float) -> tuple:
    """Per output: ``max(tol, FLOOR_FACTOR * noise)``, the noise being how far ``moved`` (the
    reference on inputs moved by the precision's rounding unit) is from ``ref`` over the finite
    values; None where that exceeds FLOOR_CAP (the output cannot be told from rounding)."""
    ref, moved = (tuple(v) if isinstance(v, (tuple, list)) else (v,) for v in (ref, moved))
    out = []
    for a, b in zip(moved, ref):
        a, b = _host64(a), _host64(b)
        ok = np.isfinite(a) & np.isfinite(b)
        t = max(tol, FLOOR_FACTOR * _relerr(a[ok], b[ok]))
        out.append(t if t <= FLOOR_CAP else None)
    return tuple(out)


def _check(c: Component, floored: dict | None = None) -> tuple[float | None, str | None]:
    """Runs one component and its reference: (relative error, None) or (error or None, why).
    The reference runs even when the fast path raised: for a collective component (the all-reduce
    transport) both are collectives, and a rank that skipped the reference would enter the next
    collective while the others sit in it.  A component with a ``floor`` that fails its fixed
    tolerance runs it and is judged again; ``floored`` then gets the raised tolerances by output
    name, and the names that cannot be judged (``inconclusive``)."""
    out = ref = None
    try:
        out = c.run()
    except Exception as exc:  # noqa: BLE001 - any failure of a fast path means "do not use it"
        failed = exc
    else:
        failed = None
    try:
        ref = c.reference()
    except Exception as exc:  # noqa: BLE001
        failed = failed or exc
    if failed is not None:
        return None, _why(failed)
    try:
        err, why = compare(out, ref, c.tol, c.outputs)
    except Exception as exc:  # noqa: BLE001
        return None, _why(exc)
    if why is None or c.floor is None or not math.isfinite(err):
        return err, why
    try:
        tols = floor_tolerances(ref, c.floor(), c.tol)
    except Exception as exc:  # noqa: BLE001
        return None, f"{why} (its floor could not be measured: {_why(exc)})"
    if floored is not None:
        names = c.outputs or tuple(f"output {i}" for i in range(len(tols)))
        floored["tolerance"] = {n: float(f"{t:.3g}") for n, t in zip(names, tols)
                                if t is not None and t > c.tol}
        floored["inconclusive"] = [n for n, t in zip(names, tols) if t is None]
    try:
        return compare(out, ref, tols, c.outputs)
    except Exception as exc:  # noqa: BLE001
        return None, _why(exc)


def _why(exc: BaseException) -> str:
    text = " ".join(str(exc).split())[:300]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


# ----------------------------------------------------------------------------- the check
def validate(components, mode: str, agree=None, speak: bool = True, report: Report | None = None,
             tally: bool = True) -> dict:
    """Checks ``components`` as ``mode`` says; records and returns each outcome ({name: dict}).

    ``agree(failed) -> failed``: this rank's {name: (error, fallback)} -> every rank's, merged in
    rank order (a collective: every rank calls it once per ``validate``, with or without
    components; None on one rank).  ``speak``: this rank writes the log lines (rank 0).  In
    ``strict`` mode a failure anywhere raises BackendError on every rank, after the agreement.
    ``tally``: end with the line counting the components checked (a caller that validates in
    rounds says it once itself)."""
    if mode not in FAST_PATH_MODES:
        raise ValueError(f"model.fast_paths: expected one of {', '.join(FAST_PATH_MODES)}, got {mode!r}")
    report = report if report is not None else Report(mode)
    if mode == "off":
        return _turn_off(components, speak, report)
    t0, measured, failed = time.perf_counter(), {}, {}
    for c in components:
        t, floored = time.perf_counter(), {}
        err, why = _check(c, floored)
        measured[c.name] = {"rel_error": err if err is not None and math.isfinite(err) else None,
                            "seconds": round(time.perf_counter() - t, 6),   # (JSON has no inf)
                            **floored}   # a floor was measured: the raised and unjudged outputs
        if why is not None:
            failed[c.name] = (why, c.fallback)
    if agree is not None:
        failed = agree(failed)
    strict = bool(failed) and mode == "strict"    # nothing turned off; the evidence kept with the error
    out = {}
    for c in components:
        out[c.name] = dict(status="passed" if strict else "used", **measured[c.name])
        if c.name in failed:
            out[c.name].update(status="failed" if strict else "fell back", error=failed[c.name][0])
            if not strict:
                c.disable()
        if c.name in failed or strict:
            out[c.name]["fallback"] = c.fallback
    if not strict:
        _say(failed, components, time.perf_counter() - t0, speak, tally)
    if components:                   # nothing to check (NumPy): no time is spent, none reported
        report.seconds = round(report.seconds + time.perf_counter() - t0, 6)
    report.components.update(out)
    if strict:
        err = _strict_error(failed, shared=agree is not None)
        err.report = report
        raise err
    return out


def _turn_off(components, speak: bool, report: Report) -> dict:
    """``off``: every component disabled unchecked (only the references run)."""
    out = {}
    for c in components:
        c.disable()
        out[c.name] = {"status": "off", "fallback": c.fallback}
    if components and speak:
        log.info("fast paths off (model.fast_paths = off): %d not checked, their references run",
                 len(components))
    report.components.update(out)
    return out


def _say(failed: dict, components, seconds: float, speak: bool, tally: bool = True) -> None:
    """Rank 0's lines: one warning per component that failed (on any rank), and the tally."""
    if not speak:
        return
    for name, (why, fallback) in failed.items():
        log.warning("warning: fast path %s failed its start-up check (%s): using %s instead",
                    name, why, fallback)
    if components and tally:
        log.info("fast paths: %d checked against their references in %.2f s, %d fell back",
                 len(components), seconds, len(failed))


def _strict_error(failed: dict, shared: bool) -> BackendError:
    """The one-line error of ``strict`` mode: the first failure, and how many more."""
    (name, (why, fallback)), more = next(iter(failed.items())), list(failed)[1:]
    err = BackendError(
        f"model.fast_paths = strict: fast path {name} failed its start-up check ({why})"
        + (f"; {len(more)} more failed: {', '.join(more)}" if more else "")
        + f"; --fast-paths auto would use {fallback} instead, --fast-paths off only the references")
    err.shared = shared              # the ranks agreed: every rank raises it, rank 0 reports it once
    return err


def agree_over(net):
    """``agree`` for :func:`validate` over the transport ``net``: every rank's failures, merged in
    rank order (the first rank's error for a name wins, prefixed with its rank), as JSON text (no
    pickle)."""

    def agree(failed: dict) -> dict:
        merged: dict = {}
        for rank, text in enumerate(net.allgather_text(json.dumps(failed))):
            for name, (why, fallback) in json.loads(text).items():
                merged.setdefault(name, (f"rank {rank}: {why}", fallback))
        return merged
    return agree
