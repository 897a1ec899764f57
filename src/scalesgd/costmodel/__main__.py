"""``python -m scalesgd.costmodel``: validate the cost model on this machine's runs, then project.

    python -m scalesgd.costmodel [--calibration results/calibration-cpu.json]
                             [--measured results/methods.json]
                             [--stragglers results/stragglers.json]
                             [--bandwidth-gbps 100] [--latency-us 5] [--link-efficiency 0.8]
                             [--workers 8 16 32 64 128] [--figure docs/figures/model.png] [--json OUT]

1. **Validation**: for every run of experiment 2 (``benchmarks/experiments.py methods``) it
   predicts seconds per local step from the calibration alone: the end-to-end one-rank step time
   (plus, once every core runs a rank, the loader's own CPU time per batch, which a one-rank run
   hides on the idle core) stretched by the measured contention of that many processes computing at
   once (or, without that measurement, by max(1, ranks / cores)), plus each method's exchange from
   the measured operation tables at that rank count (all-reduce; Get + mixing; Accumulate + 2
   passes; the server by mean-value analysis with the measured service time), and prints the error
   against the measured step time.  With ``--stragglers`` it also compares the simulated slow-down
   under a straggler with the measured one (experiment 3).
2. **Projection** to a cluster of GPU nodes with the stated link (default 100 Gb/s InfiniBand at
   80% efficiency, 5 us per message) and GPU step times (default: ResNet-50 at the published
   A100 TF32 938 img/s, ResNet-18 scaled by FLOPs; no GPU was measured by this project yet): time per
   ImageNet epoch, scaling efficiency and server utilisation for p workers, analytic (no
   stragglers) and simulated (1 straggler per 16 workers sleeping U[0, 300 ms] per step, plus 5%
   jitter), and the answers: where the server saturates, where all-reduce overtakes it, how
   gossip's per-step cost depends on p.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

from . import calibration as cal_mod
from . import cost, sim
from .projection import answers, cluster_workloads, draw, project
from .validation import validate, validate_net, validate_stragglers

ROOT = Path(__file__).resolve().parents[3]


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m scalesgd.costmodel", description=__doc__.split("\n")[0])
    ap.add_argument("--calibration", type=Path,
                    default=ROOT / "results" / "calibration-cpu.json")
    ap.add_argument("--measured", type=Path, default=ROOT / "results" / "methods.json")
    ap.add_argument("--stragglers", type=Path, default=ROOT / "results" / "stragglers.json")
    ap.add_argument("--net-measured", type=Path, nargs="*",
                    default=[ROOT / "results" / f"{n}.json"
                             for n in ("methods-net", "methods-net-papersx4", "extensions-net")],
                    help="emulated-cluster sweeps (experiments.py --net) to validate the link model on")
    ap.add_argument("--net-efficiency", type=float, default=0.9,
                    help="fraction of an emulated link's tbf rate that MPI reaches (measured 0.86-0.95)")
    ap.add_argument("--bandwidth-gbps", type=float, default=100.0)
    ap.add_argument("--link-efficiency", type=float, default=0.8)
    ap.add_argument("--latency-us", type=float, default=5.0)
    ap.add_argument("--mem-gbps", type=float, default=20.0,
                    help="GB/s of element-wise passes over the parameters (server apply, mixing)")
    ap.add_argument("--gpu-img-s-resnet50", type=float, default=938.0,
                    help="training images/s of one GPU on ResNet-50 (default: published A100 TF32)")
    ap.add_argument("--batch", type=int, default=64, help="per-GPU batch of the projection")
    ap.add_argument("--workers", type=int, nargs="+", default=[8, 16, 32, 64, 128])
    ap.add_argument("--straggler-ms", type=float, default=300.0)
    ap.add_argument("--stragglers-per-16", type=float, default=1.0,
                    help="straggling workers per 16 (rounded up: 1 of 8 too)")
    ap.add_argument("--jitter", type=float, default=0.05)
    ap.add_argument("--sim-steps", type=int, default=200)
    ap.add_argument("--figure", type=Path, default=ROOT / "docs" / "figures" / "model.png")
    ap.add_argument("--json", type=Path, default=None)
    return ap


def _this_machine(a, cal, out: dict) -> None:
    """The calibration's link fit, then the validation of the step-time model on this machine's
    one-node runs (experiment 2) and stragglers (experiment 3)."""
    p0 = cal_mod.ranks_measured(cal)[0]
    alpha, bw, misfit = cal_mod.fit_link(cal_mod.table(cal, "get", p0))
    print(f"calibration ({a.calibration.name}, {cal.get('machine', '?')}): one-rank step "
          f"{1e3 * cal['end_to_end']['resnet20_b16']['seconds']:.1f} ms (ResNet-20, batch 16, "
          f"data included); Get at {p0} ranks: alpha {1e6 * alpha:.1f} us, {bw / 1e9:.1f} GB/s "
          f"(max misfit {100 * misfit:.0f}%)")
    where = a.calibration.resolve()          # recorded relative to the repository when inside it
    out["calibration"] = dict(file=str(where.relative_to(ROOT)) if where.is_relative_to(ROOT) else str(where),
                              get_alpha=alpha, get_bandwidth=bw, get_misfit=misfit)
    if a.measured.exists():
        rows = validate(cal, json.loads(a.measured.read_text()))
        print("\nvalidation: seconds per local step, measured (experiment 2) vs predicted from the "
              "calibration")
        print(f"{'run':>18} {'ranks':>5} {'measured':>9} {'predicted':>9} {'error':>7}")
        for r in rows:
            print(f"{r['run']:>18} {r['ranks']:>5} {r['measured']:>9.4f} {r['predicted']:>9.4f} "
                  f"{100 * r['error']:>+6.0f}%")
        errs = np.abs([r["error"] for r in rows])
        if len(errs):
            print(f"|error|: median {100 * np.median(errs):.0f}%, max {100 * errs.max():.0f}% "
                  f"over {len(errs)} runs")
            out["validation"] = dict(rows=rows, median_abs_error=float(np.median(errs)),
                                     max_abs_error=float(errs.max()))
    else:
        print(f"\n(no {a.measured}: run benchmarks/experiments.py methods to validate)")
    if a.stragglers.exists():
        rows = validate_stragglers(cal, json.loads(a.stragglers.read_text()))
        print("\nstragglers: throughput slow-down (x) with one worker sleeping U[0, D] per step")
        print(f"{'method':>12} {'D ms':>5} {'measured':>9} {'simulated':>9}")
        for r in rows:
            print(f"{r['method']:>12} {r['delay_ms']:>5} {r['measured']:>9.2f} {r['simulated']:>9.2f}")
        out["straggler_validation"] = rows


def _emulated_nodes(a, cal, out: dict) -> None:
    """Validation of the link model on the emulated-cluster sweeps (``--net-measured``)."""
    net_rows = []
    nbytes = cal["compute"]["resnet20_b16"]["num_params"] * 4          # the sweeps' ResNet-20
    mix_mem = 3 * nbytes / cal_mod.at({float(k): v for k, v in cal["compute"]["mix"].items()}, nbytes)
    for path in a.net_measured:
        if path.exists():
            net_rows += validate_net(json.loads(path.read_text()), a.net_efficiency, 20e-6, mix_mem,
                                     nbytes=nbytes)
    if net_rows:
        print(f"\nvalidation on emulated nodes: seconds per local step, measured vs predicted from the run's "
              f"compute and the link (tbf rate x {a.net_efficiency:g}); blocking gossip waits for its target")
        print(f"{'run':>30} {'Mbit/s':>7} {'compute':>8} {'measured':>9} {'predicted':>9} {'error':>7}")
        for r in net_rows:
            print(f"{r['run']:>30} {r['rate_mbit']:>7.0f} {r['compute']:>8.3f} {r['measured']:>9.3f} "
                  f"{r['predicted']:>9.3f} {100 * r['error']:>+6.0f}%")
        errs = np.abs([r["error"] for r in net_rows])
        print(f"|error|: median {100 * np.median(errs):.0f}%, max {100 * errs.max():.0f}% "
              f"over {len(errs)} runs")
        # scored on communication + waiting alone (the step minus the run's own compute, which is
        # an input of the prediction): runs that spent at least 1 ms a step on it
        cw = np.abs([(r["predicted"] - r["compute"]) / (r["measured"] - r["compute"]) - 1
                     for r in net_rows if r["measured"] - r["compute"] >= 1e-3])
        print(f"comm + wait alone, |error|: median {100 * np.median(cw):.0f}%, max {100 * cw.max():.0f}% "
              f"over {len(cw)} runs")
        out["net_validation"] = dict(rows=net_rows, efficiency=a.net_efficiency,
                                     median_abs_error=float(np.median(errs)), max_abs_error=float(errs.max()),
                                     comm_wait_runs=int(len(cw)),
                                     comm_wait_median_abs_error=float(np.median(cw)),
                                     comm_wait_max_abs_error=float(cw.max()))


def _cluster(a, out: dict) -> dict:
    """The projection to a GPU cluster and its answers, per workload: {workload: {method: rows}}."""
    net = cost.Net(alpha=a.latency_us * 1e-6, bandwidth=a.bandwidth_gbps / 8 * 1e9 * a.link_efficiency,
                   mem=a.mem_gbps * 1e9)
    out["cluster"] = dict(bandwidth_gbps=a.bandwidth_gbps, link_efficiency=a.link_efficiency,
                          latency_us=a.latency_us, mem_gbps=a.mem_gbps, batch=a.batch,
                          gpu_img_s_resnet50=a.gpu_img_s_resnet50, jitter=a.jitter,
                          straggler_ms=a.straggler_ms, stragglers_per_16=a.stragglers_per_16)
    projections, out["projection"], out["answers"] = {}, {}, {}
    for w in cluster_workloads(a):
        print(f"\nprojection: {w.name}, batch {w.batch}/GPU, compute {1e3 * w.step_seconds:.1f} ms/step, "
              f"{w.param_bytes / 1e6:.0f} MB of parameters; {a.bandwidth_gbps:g} Gb/s "
              f"x {a.link_efficiency:g}, "
              f"{a.latency_us:g} us")
        rows_by_m = {}
        for p in a.workers:
            st = sim.Straggle(jitter_cv=a.jitter, stragglers=math.ceil(p * a.stragglers_per_16 / 16),
                              max_delay=a.straggler_ms / 1000)
            pr = project(w, net, [p], st, a.sim_steps)
            for m, rows in pr.items():
                rows_by_m.setdefault(m, []).extend(rows)
        projections[w.name] = rows_by_m
        print(f"{'method':>12} " + " ".join(f"{'p=' + str(p):>21}" for p in a.workers))
        print(f"{'':>12} " + " ".join(f"{'min/epoch eff  strag':>21}" for _ in a.workers))
        for m, rows in rows_by_m.items():
            print(f"{m:>12} " + " ".join(f"{r['epoch_minutes']:>7.1f} {r['efficiency']:>5.2f} "
                                         f"{r['sim_efficiency']:>5.2f}  " for r in rows))
        ans = answers(w, net, rows_by_m)
        print(f"server: {ans['server_service_ms']:.1f} ms per exchange, saturates at "
              f"{ans['server_saturates_at_workers']:.1f} workers (tau = 1); all-reduce overtakes it at "
              f"{ans['allreduce_overtakes_server_at_workers']} workers; tau (or n_sync) that keeps "
              f"one server below saturation: "
              + ", ".join(f"p={p}: {t}" for p, t in ans["easgd_tau_to_keep_up"].items()))
        print("server shards (tau = 1): saturate at " + ", ".join(
            f"K={k}: {v:.1f}" for k, v in ans["shards_saturate_at_workers"].items())
            + " workers; shards to keep up: "
            + ", ".join(f"p={p}: {k}" for p, k in ans["shards_to_keep_up"].items()))
        print(f"asgd --max-staleness {ans['max_staleness']}: rejected fraction " + ", ".join(
            f"p={p}: {v:.2f}" for p, v in ans["asgd_rejected_fraction"].items())
            + "; overlapped gossip ms/step: "
            + ", ".join(f"{p}: {v:.1f}" for p, v in ans["gossip_overlap_step_ms"].items()))
        print("gossip pull ms/step by p: "
              + ", ".join(f"{p}: {v:.1f}" for p, v in ans["gossip_step_ms"].items())
              + " (simulated with stragglers: "
              + ", ".join(f"{v:.1f}" for v in ans["gossip_sim_step_ms"].values())
              + ")")
        out["projection"][w.name] = rows_by_m
        out["answers"][w.name] = ans
    return projections


def main(argv=None) -> int:
    a = _parser().parse_args(argv)
    out: dict = {}
    try:
        cal = cal_mod.load(a.calibration)
    except cal_mod.CalibrationError as exc:
        print(f"scalesgd.costmodel: {exc}", file=sys.stderr)
        return 2
    _this_machine(a, cal, out)
    _emulated_nodes(a, cal, out)
    projections = _cluster(a, out)
    draw(a.figure, projections, a.workers)
    print(f"\nwrote {a.figure}")
    if a.json:
        a.json.write_text(json.dumps(out, indent=1, default=float) + "\n")
        print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
