"""ONE script for a lent GPU: every number the first GPU contact should give, within a stated time
budget (8 minutes by default), keeping what it measured if it is stopped.

    PYTHONPATH=src python3 benchmarks/gpu_check.py [--batches 128] [--precisions fp32 bf16] [--out DIR]
    .venv/bin/python benchmarks/gpu_check.py --dry-run      # CPU: every section on a tiny model

Cases, in this order (``gpu_budget.py``: the cost estimates, which cases are planned and which run
only if time is left); each case's failure is recorded in the JSON and does not stop the others:

1. ``env`` (always): GPU, driver, CUDA, CuPy, cuDNN (frontend + backend), NCCL, MPI, PyTorch, DALI
   and the CUDA majors of the wheels found, each probe guarded;
2. ``selfcheck fp32``: the start-up self-validation (fastpaths.check) in ``strict`` mode on ResNet-50
   at 224 px, training batch 64, ten-crop evaluation batches: every component's status and error,
   its seconds and estimated GFLOPs, against the budget (6 s: 10% of a ResNet-50 epoch's first minute);
3. ``parity fp32``: every fused kernel (nn/kernels.py) and the cuDNN graphs of 3 conv geometries and
   BN against their reference twins, on fresh random data, outputs poisoned with NaN first;
4. ``results fp32 BATCH``: ResNet-50 training steps (forward + loss + backward + Nesterov SGD),
   synthetic data in device memory: our cuDNN path, the same with forward, loss and backward
   captured in a CUDA graph (``cudnn-graph``; and im2col with ``--paths``) against a
   torchvision-free PyTorch ResNet-50 (torch_resnet.py; channels_last, same precision and batch);
   interleaved blocks, median images/s, ratios, the host's time per step, and each runner's own
   peak device memory;
   ``graph fp32``: the captured step against the uncaptured one (ResNet-50 at batch 32, two
   batches, each output's relative difference: ``train/graphstep.py``);
5. ``nccl``: a one-rank NCCL communicator through comm/mpi/device.py: created, one all-reduce, destroyed;
6. ``allreduce``: a 2-rank all-reduce on this one GPU through each transport ($MPIEXEC
   $MPIEXEC_ARGS, tests/gpu/allreduce_parity.py), sums checked, one ResNet-50 gradient timed;
7. ``dali``: DALI decode + resize + crop/normalize of JPEGs on the GPU ("mixed") against the CPU;
8. bf16, if time is left: ``parity bf16``, ``results bf16 BATCH``, ``selfcheck bf16``.

Every line is printed as it is produced; gpu_check.json and gpu_check.md are rewritten in $OUT (or
--out) after every case, so a run stopped at its limit keeps what it measured.
Targets: ours >= 0.8x PyTorch images/s, peak memory <= 1.5x PyTorch's; self-check <= 6 s.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import gpu_budget as B
import gpu_parts as G
import numpy as np

from scalesgd.nn import cudnn_conv as CC

TARGET_CHECK_S = G.TARGET_CHECK_S
SECTIONS = ("selfcheck", "train", "parity", "results", "graph", "nccl", "allreduce", "dali", "doctor")
HEADER, table_rows = G.HEADER, G.table_rows


def table(results: list[dict]) -> str:
    return "\n".join(HEADER + table_rows(results))


def _parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="CPU: tiny model, doubles for the device parts")
    ap.add_argument("--batches", type=int, nargs="+", default=[128])
    ap.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], choices=CC.PRECISIONS)
    ap.add_argument("--paths", nargs="+", default=["cudnn", "cudnn-graph", "torch"])
    ap.add_argument("--sections", nargs="+", default=list(SECTIONS), choices=list(SECTIONS))
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--blocks", type=int, default=3)
    ap.add_argument("--budget-s", type=float, default=B.BUDGET_S,
                    help="seconds the whole check may take (default 480: 8 minutes)")
    ap.add_argument("--out", default=os.environ.get("OUT", ""))
    args = ap.parse_args(argv)
    if min(args.batches) < 1 or args.budget_s <= 0 or min(args.steps, args.warmup, args.blocks) < 1:
        ap.error("--batches, --steps, --warmup, --blocks and --budget-s must be positive")
    return args


# ----------------------------------------------------------------------------- the run
def run_case(case: B.Case, args, xp, rep: dict) -> None:
    """Runs one case and files its outcome where the report keeps that section."""
    fn = {"selfcheck": lambda: G.selfcheck_case(args, xp, case.precision),
          "parity": lambda: G.parity_case(args, xp, case.precision),
          "results": lambda: G.results_case(args, xp, case.precision, case.batch),
          "nccl": lambda: G.nccl_case(args, xp), "allreduce": lambda: G.allreduce_case(args, xp),
          "dali": lambda: G.dali_case(args, xp), "doctor": lambda: G.doctor_case(args, xp),
          "train": lambda: G.train_case(args, xp, case.precision),
          "graph": lambda: G.graph_case(args, xp, case.precision)}[case.section]
    try:
        out = fn()
    except Exception as exc:  # noqa: BLE001 - this case alone; the rest still run
        out = {"error": G.err_text(exc)}
        print(f"{case.name} failed: {out['error']}", flush=True)
    if case.section == "selfcheck":
        rep.setdefault("selfcheck", {"model": out.get("model"), "budget_s": TARGET_CHECK_S,
                                     "precisions": {}})["precisions"][case.precision] = out
    elif case.section == "parity":
        par = rep.setdefault("parity", {"errors": {}, "failed": [], "raised": {}})
        out = out if "error" not in out else {"errors": {}, "failed": [case.name],
                                              "raised": {case.name: out["error"]}}
        par["errors"].update(out["errors"])
        par["raised"].update(out["raised"])
        par["failed"] += out["failed"]
    elif case.section in ("train", "graph"):
        rep.setdefault(case.section, {})[case.precision] = out
    elif case.section == "results":
        rep.setdefault("results", {"results": []})["results"].append(
            out if "runs" in out else {"precision": case.precision, "batch": case.batch, "runs": {},
                                       "errors": {"case": out.get("error", "?")}})
    else:
        rep[case.section] = out


def main(argv=None) -> int:
    args = _parse(argv)
    clock = B.Clock(args.budget_s)
    rep = {"date": time.strftime("%Y-%m-%d %H:%M"), "dry_run": args.dry_run, "precisions": args.precisions,
           "batches": args.batches, "budget_s": args.budget_s, "seconds": {}, "table": ""}
    xp = np
    if not args.dry_run:
        from scalesgd import backend
        backend.set_precision(args.precisions[0])
        try:
            xp = backend.select("gpu").xp
        except backend.BackendError as exc:       # no GPU: the environment says why, then stop
            rep["env"], rep["error"] = G.guarded(G.env_report, np), f"no GPU: {exc}"
            rep["table"] = f"failures: {rep['error']}"
            _write(rep, args.out)
            print(json.dumps(rep["env"], indent=1, default=str), rep["table"], sep="\n", flush=True)
            return 1
    t0 = time.perf_counter()
    rep["env"] = G.guarded(G.env_report, xp)
    rep["seconds"]["env"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(rep["env"], indent=1, default=str), flush=True)
    todo, target = B.plan(args.precisions, args.batches, args.sections, args.budget_s,
                          args.warmup + args.blocks * args.steps, runners=len(args.paths))
    for line in B.plan_lines(todo, target, args.budget_s):
        print(line, flush=True)
    rep["plan"] = {"budget_s": args.budget_s, "target_s": target, "unit_costs": B.UNIT, "cases": []}
    _write(rep, args.out)
    print("\n".join(HEADER), flush=True)
    for case in todo:
        entry = {"case": case.name, "estimate_s": case.estimate_s, "planned": case.planned}
        rep["plan"]["cases"].append(entry)
        if not args.dry_run and not clock.fits(case):     # a dry run runs every case, on the CPU
            entry["ran"] = False
            entry["why"] = (f"not started: {case.estimate_s * clock.scale():.0f} s estimated, "
                            f"{args.budget_s - clock.elapsed():.0f} s of the budget left")
            print(f"{case.name}: {entry['why']}", flush=True)
            _write(rep, args.out)
            continue
        t = time.perf_counter()
        run_case(case, args, xp, rep)
        took = time.perf_counter() - t
        clock.done(case, took)
        entry.update(ran=True, seconds=round(took, 1))
        rep["seconds"][case.section] = round(rep["seconds"].get(case.section, 0.0) + took, 1)
        rep["table"] = report_table(rep)
        _write(rep, args.out)                         # after every case: a stopped run keeps it
    rep["seconds"]["total"] = round(clock.elapsed(), 1)
    rep["table"] = report_table(rep)
    _write(rep, args.out)
    print(rep["table"], flush=True)
    return 1 if failures(rep) else 0


def failures(rep: dict) -> list[str]:
    """What makes the script exit non-zero: a parity beyond tolerance or raised, a case that
    raised, a self-check that failed (strict), a results path that failed, a transport whose sums
    were wrong, a NCCL step that failed.  A case not started for lack of time is not a failure."""
    out = [f"parity {k}" for k in rep.get("parity", {}).get("failed", [])]
    out += [f"selfcheck {p}" for p, v in rep.get("selfcheck", {}).get("precisions", {}).items()
            if v.get("error")]
    out += [f"results {r.get('precision')} {r.get('batch')} {k}"
            for r in rep.get("results", {}).get("results", [])
            for k, v in r.get("errors", {}).items() if not str(v).startswith("skipped")]
    out += [f"section {k}" for k in SECTIONS if isinstance(rep.get(k), dict) and "error" in rep[k]]
    out += [f"train {p}" + ("" if "error" in v else ": the loss did not go down")
            for p, v in rep.get("train", {}).items() if "error" in v or not v.get("loss_down")]
    out += [f"graph {p}" + ("" if "error" in v else ": the captured step differs from the eager one")
            for p, v in rep.get("graph", {}).items() if "error" in v or not v.get("ok")]
    out += [f"allreduce {k}" for k, v in rep.get("allreduce", {}).get("transports", {}).items()
            if v.get("sums") == "wrong"]
    nccl = rep.get("nccl", {}).get("steps", {})
    return out + [f"nccl {k}" for k, v in nccl.items() if "FAILED" in v or v.startswith("sums wrong")]


def report_table(rep: dict) -> str:
    """The throughput table, then one line per other case and the plan's outcome."""
    lines = [table(rep.get("results", {}).get("results", []))]
    for prec, sc in rep.get("selfcheck", {}).get("precisions", {}).items():
        if "components" not in sc:
            lines.append(f"self-check {prec}: FAILED {sc.get('error')}")
            continue
        lines.append(f"self-check {prec}: {len(sc['components'])} components, {sc['seconds']:.2f} s "
                     f"(budget {TARGET_CHECK_S:.0f} s: {'met' if sc['within_budget'] else 'MISSED'})"
                     + (f", FAILED: {sc['error']}" if sc["error"] else ""))
    for prec, tr in rep.get("train", {}).items():
        lines.append(f"train {prec}: FAILED {tr['error']}" if "error" in tr else
                     f"train {prec}: {len(tr['losses'])} steps, {tr['images_per_second'] or 0:.1f} images/s, "
                     f"loss {'down' if tr['loss_down'] else 'NOT down'}; fast paths "
                     f"{sum(v == 'used' for v in tr['fast_paths'].values())} used of {len(tr['fast_paths'])}")
    for prec, g in rep.get("graph", {}).items():
        lines.append(f"graph {prec}: FAILED {g['error']}" if "error" in g else
                     f"graph {prec}: captured step vs eager, largest relative difference "
                     f"{max(g['rel_error'].values()):.2e} (tolerance {g['tol']:g}): "
                     + ("same" if g["ok"] else "DIFFERENT"))
    par = rep.get("parity")
    if par:
        lines.append(f"parity: {len(par['errors'])} compared, {len(par['failed'])} failed"
                     + (f" ({', '.join(par['failed'][:4])})" if par["failed"] else ""))
    for step, what in rep.get("nccl", {}).get("steps", {}).items():
        lines.append(f"nccl {step}: {what}")
    if "error" in rep.get("nccl", {}):
        lines.append(f"nccl: FAILED {rep['nccl']['error'][-200:]}")
    for name, t in rep.get("allreduce", {}).get("transports", {}).items():
        lines.append(f"all-reduce {name}: " + (
            f"skipped ({t['skipped']})" if "skipped" in t else
            f"sums {t.get('sums', '?')}, {t.get('ms', float('nan')):.2f} ms per {t.get('mb', 0):.0f} MB"))
    if "skipped" in rep.get("allreduce", {}):
        lines.append(f"all-reduce: skipped ({rep['allreduce']['skipped']})")
    d = rep.get("dali", {})
    if d:
        lines.append("dali: " + (d.get("skipped") or d.get("error") or
                                 ", ".join(f"{k} {v:.1f}" for k, v in d.items())))
    for c in rep.get("plan", {}).get("cases", []):
        if not c.get("ran", True):
            lines.append(f"{c['case']}: {c['why']}")
    bad = failures(rep)
    lines.append("failures: " + (", ".join(bad) if bad else "none"))
    return "\n".join(lines)


def _write(rep: dict, out: str) -> None:
    """gpu_check.json and gpu_check.md in ``out``, each replaced whole (written aside, renamed)."""
    if not out:
        return
    d = Path(out)
    d.mkdir(parents=True, exist_ok=True)
    gpu = rep.get("env", {}).get("gpu", "no GPU")
    for name, text in (("gpu_check.json", json.dumps(rep, indent=1, default=str)),
                       ("gpu_check.md", f"# gpu_check {rep['date']} ({', '.join(rep['precisions'])})\n\n"
                                        f"{gpu}\n\n{rep['table']}\n")):
        tmp = d / f".{name}.tmp"
        tmp.write_text(text)
        os.replace(tmp, d / name)


if __name__ == "__main__":
    sys.exit(main())
