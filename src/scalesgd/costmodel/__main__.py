"""``python -m scalesgd.costmodel``: validate the cost model on this machine's runs, then project.

    python -m scalesgd.costmodel [--calibration benchmarks/results/calibration-cpu.json]
                             [--measured benchmarks/results/methods.json]
                             [--stragglers benchmarks/results/stragglers.json]
                             [--bandwidth-gbps 100] [--latency-us 5] [--link-efficiency 0.8]
                             [--workers 8 16 32 64 128] [--figure docs/figures/model.png] [--json OUT]

1. **Validation**: for every run of experiment 2 (``benchmarks/experiments.py methods``) it
   predicts seconds per local step from the calibration alone: the end-to-end one-rank step time
   (plus, once every core runs a rank, the loader's own CPU time per batch, which a one-rank run
   hides on the idle core) stretched by the measured contention of that many processes computing at
   once (or, without that measurement, by max(1, ranks / cores)), plus each method's exchange from the measured
   operation tables at that rank count (all-reduce; Get + mixing; Accumulate + 2 passes; the server
   by mean-value analysis with the measured service time), and prints the error against the
   measured step time.  With ``--stragglers`` it also compares the simulated slow-down under a
   straggler with the measured one (experiment 3).
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

ROOT = Path(__file__).resolve().parents[3]
IMAGENET_TRAIN = 1_281_167
RESNET50_GMAC, RESNET18_GMAC = 4.09, 1.81
PARAMS = {"resnet18": 11_689_512, "resnet50": 25_557_032}
METHOD_OF = {"allreduce": ("allreduce", "pull"), "easgd": ("easgd", "pull"), "asgd": ("asgd", "pull"),
             "asgd lr/p": ("asgd", "pull"),
             "gossip-pull": ("gossip", "pull"), "gossip-push": ("gossip", "push")}


# ----------------------------------------------------------------------------- validation
def predict_machine_step(cal: dict, label: str, workers: int, ranks: int, batch: int = 16) -> dict:
    """Predicted seconds per local step of one experiment-2 run on the calibrated machine."""
    cores = int(cal.get("cores") or 2)
    t1 = cal["end_to_end"][f"resnet20_b{batch}"]["seconds"]
    nbytes = cal["compute"][f"resnet20_b{batch}"]["num_params"] * 4
    cc = cal.get("contended_compute", {})
    # a one-rank run decodes its data on the idle second core for free; with a rank on every core
    # that work is CPU time of its own (measured: the loader alone, one thread)
    td = cal.get("data_seconds", {}).get(f"resnet20_b{batch}", 0.0) if ranks >= cores else 0.0
    if str(ranks) in cc and "1" in cc:      # measured: R processes computing at once
        tc = (t1 + td) * cc[str(ranks)] / cc["1"]
    else:                                   # ideal time-slicing
        tc = (t1 + td) * max(1.0, ranks / cores)
    mix = cal_mod.at({float(k): v for k, v in cal["compute"]["mix"].items()}, nbytes)
    method, variant = METHOD_OF[label]
    if method == "allreduce":
        comm = cal_mod.at(cal_mod.table(cal, "allreduce", ranks), nbytes)
        return dict(step=tc + comm, compute=tc, comm=comm)
    if method == "gossip":                  # a rank picks itself with probability 1/p: no exchange
        if variant == "pull":
            one = cal_mod.at(cal_mod.table(cal, "get", ranks), nbytes) + mix
        else:
            one = cal_mod.at(cal_mod.table(cal, "accumulate", ranks), nbytes) + 2 * mix
        comm = (1 - 1 / ranks) * one
        return dict(step=tc + comm, compute=tc, comm=comm, exchange=one)
    ts = cal_mod.at(cal_mod.table(cal, "server", ranks), nbytes)
    x, r = cost.server_throughput(workers, tc, ts)
    return dict(step=workers / x, compute=tc, comm=workers / x - tc, service=ts)


def validate(cal: dict, measured: dict) -> list[dict]:
    rows = []
    for key, run in measured["runs"].items():
        label, w, ranks = run["method"], run["workers"], run["ranks"]
        meas = run["step_seconds"]["mean"]
        try:
            pred = predict_machine_step(cal, label, w, ranks)
        except cal_mod.CalibrationError as exc:
            print(f"  skip {key}: {exc}")
            continue
        rows.append(dict(run=key, method=label, workers=w, ranks=ranks, measured=meas,
                         predicted=pred["step"], error=(pred["step"] - meas) / meas))
    return rows


# --------------------------------------------------------------------- validation on emulated nodes
NET_LABELS = {"gossip-pull-ov": ("gossip", "pull", True), "gossip-push-ov": ("gossip", "push", True)}


def predict_net_step(label: str, workers: int, compute: float, nbytes: float, net: cost.Net,
                     shards: int = 1, passive_target: bool = True) -> dict:
    """Seconds per local step of one run on emulated nodes (``experiments.py --net``), from the
    run's own compute per step (its ``compute + data`` split: the model is checked on the
    communication, not on how fast 2 cores compute) and the link.  ``passive_target``: a blocking
    one-sided call across nodes completes only when its target next enters MPI (docs/cluster.md),
    on average half of the target's step later; the overlapped gossip's thread keeps MPI
    progressing, so its calls do not wait."""
    method, variant, overlap = NET_LABELS[label] if label in NET_LABELS else (*METHOD_OF[label], False)
    w = cost.Work(label, compute, 16, nbytes)
    an = cost.step_seconds(method, workers, w, net, variant=variant, shards=shards, overlap=overlap)
    step = an["step"]
    if method == "gossip" and not overlap and passive_target:
        step += (1 - 1 / workers) * compute / 2
    return dict(step=step, compute=compute, comm=step - compute)


def validate_net(measured: dict, efficiency: float, alpha: float, mem: float,
                 passive_target: bool = True, nbytes: float = 272_474 * 4) -> list[dict]:
    """Measured seconds per step of every emulated-cluster run against ``predict_net_step``; the
    link of a run is its tbf rate x ``efficiency`` (all-reduce reached 86-95% of it)."""
    rows = []
    for key, run in measured["runs"].items():
        net_info = run.get("net")
        label = run.get("method") or run.get("label", "").split()[0]
        if not net_info or label not in {**METHOD_OF, **NET_LABELS}:
            continue
        split = run["split_per_step"]
        compute = split["compute"] + split.get("data", 0.0)
        net = cost.Net(alpha=alpha, bandwidth=net_info["rate_bits"] / 8 * efficiency, mem=mem)
        shards = int(run.get("servers", 1))
        pred = predict_net_step(label, run["workers"], compute, nbytes, net, shards, passive_target)
        meas = run["step_seconds"]["mean"] if isinstance(run["step_seconds"], dict) else run["step_seconds"]
        rows.append(dict(run=key, method=label, workers=run["workers"], shards=shards,
                         rate_mbit=net_info["rate_bits"] / 1e6, measured=meas, predicted=pred["step"],
                         compute=compute, error=(pred["step"] - meas) / meas))
    return rows


def validate_stragglers(cal: dict, strag: dict, seed: int = 0) -> list[dict]:
    """Measured throughput slow-down with one worker sleeping U[0, D] vs the simulated one."""
    rows = []
    w = strag["workers"]
    for label, runs in strag["runs"].items():
        method, variant = METHOD_OF[label]
        ranks = w + (1 if method in ("easgd", "asgd") else 0)
        base = predict_machine_step(cal, label, w, ranks)
        nbytes = cal["compute"]["resnet20_b16"]["num_params"] * 4
        for r in runs:
            d = r["delay_ms"] / 1000.0
            res = []
            for st in (sim.Straggle(), sim.Straggle(stragglers=1, max_delay=d)):
                if method == "allreduce":
                    work = cost.Work(label, base["compute"], 16, nbytes)
                    s = sim.simulate("allreduce", w, work, _fixed_net(base["comm"], "allreduce", w),
                                     steps=600, straggle=st, seed=seed)
                elif method == "gossip":
                    work = cost.Work(label, base["compute"], 16, nbytes)
                    s = sim.simulate("gossip", w, work, _fixed_net(base["exchange"], "gossip", w), steps=600,
                                     straggle=st, seed=seed)
                else:
                    work = cost.Work(label, base["compute"], 16, nbytes)
                    s = sim.simulate(method, w, work, _fixed_net(base["service"], "server", w), steps=600,
                                     straggle=st, seed=seed)
                res.append(s.samples_per_second)
            rows.append(dict(method=label, delay_ms=r["delay_ms"], measured=r["slowdown_images_per_second"],
                             simulated=res[0] / res[1]))
    return rows


def _fixed_net(seconds: float, kind: str, p: int) -> cost.Net:
    """A link whose formulas give exactly ``seconds`` for this machine's measured operation (so the
    simulation reuses the measured cost): pure latency, infinite bandwidth and memory."""
    if kind == "allreduce":
        alpha = seconds / (2 * (p - 1)) if p > 1 else 0.0
    elif kind == "server":
        alpha = seconds / 2
    else:
        alpha = seconds
    return cost.Net(alpha=alpha, bandwidth=math.inf, mem=math.inf)


# ----------------------------------------------------------------------------- projection
def cluster_workloads(a) -> list[cost.Work]:
    t50 = a.batch / a.gpu_img_s_resnet50
    t18 = t50 * RESNET18_GMAC / RESNET50_GMAC
    return [cost.Work("resnet18", t18, a.batch, PARAMS["resnet18"] * 4),
            cost.Work("resnet50", t50, a.batch, PARAMS["resnet50"] * 4)]


def project(w: cost.Work, net: cost.Net, workers: list[int], straggle: sim.Straggle, steps: int) -> dict:
    out = {}
    single = w.batch / w.step_seconds
    for m in ("allreduce", "easgd", "asgd", "gossip-pull", "gossip-push"):
        method, variant = METHOD_OF[m]
        rows = []
        for p in workers:
            an = cost.step_seconds(method, p, w, net, variant=variant)
            st = sim.simulate(method, p, w, net, steps=steps, variant=variant, straggle=straggle,
                              seed=p)
            rows.append(dict(workers=p, step=an["step"], comm=an["comm"],
                             samples_per_second=an["samples_per_second"],
                             efficiency=an["samples_per_second"] / (p * single),
                             epoch_minutes=IMAGENET_TRAIN / an["samples_per_second"] / 60,
                             server_utilization=an.get("server_utilization"),
                             sim_samples_per_second=st.samples_per_second,
                             sim_efficiency=st.samples_per_second / (p * single),
                             sim_epoch_minutes=IMAGENET_TRAIN / st.samples_per_second / 60,
                             sim_server_utilization=st.server_utilization if method in ("easgd", "asgd")
                             else None, sim_staleness_mean=st.staleness_mean,
                             sim_wait=st.wait_mean))
        out[m] = rows
    return out


def answers(w: cost.Work, net: cost.Net, proj: dict) -> dict:
    ts = cost.server_service_seconds(w.param_bytes, net)
    sat = cost.saturation_workers(w.step_seconds, ts)
    crossover = None
    for ar, es in zip(proj["allreduce"], proj["easgd"]):
        if ar["samples_per_second"] > es["samples_per_second"]:
            crossover = ar["workers"]
            break
    # finer: the smallest p (1..1024) where all-reduce's analytic throughput beats the server's
    fine = next((p for p in range(2, 1025)
                 if cost.step_seconds("allreduce", p, w, net)["samples_per_second"]
                 > cost.step_seconds("easgd", p, w, net)["samples_per_second"]), None)
    g = proj["gossip-pull"]
    return dict(server_service_ms=1e3 * ts, server_saturates_at_workers=sat,
                allreduce_overtakes_server_at_workers=fine, allreduce_overtakes_in_table_at=crossover,
                gossip_step_ms={r["workers"]: 1e3 * r["step"] for r in g},
                gossip_sim_step_ms={r["workers"]: 1e3 * w.batch * r["workers"] / r["sim_samples_per_second"]
                                    for r in g},
                allreduce_comm_ms={r["workers"]: 1e3 * r["comm"] for r in proj["allreduce"]},
                easgd_tau_to_keep_up={r["workers"]: cost.tau_to_keep_up(r["workers"], w.step_seconds, ts)
                                      for r in proj["easgd"]},
                **extensions(w, net, [r["workers"] for r in g]))


def extensions(w: cost.Work, net: cost.Net, workers: list[int], bound: int = 4) -> dict:
    """Issue 15's extensions projected (tau = 1): where K server shards saturate and the shards a
    server needs at p workers; the fraction of pushes asgd rejects with --max-staleness ``bound``
    (simulated, FIFO server); overlapped gossip's ms per step next to blocking gossip's."""
    sat = {k: cost.step_seconds("easgd", 1, w, net, shards=k)["saturation_workers"] for k in (1, 2, 4, 8, 16)}
    need = {p: next((k for k in range(1, 257)
                     if cost.step_seconds("easgd", 1, w, net, shards=k)["saturation_workers"] >= p), None)
            for p in workers}
    rejected = {}
    for p in workers:
        r = sim.simulate("asgd", p, w, net, steps=100, max_staleness=bound, seed=p)
        rejected[p] = r.rejected / max(r.exchanges, 1)
    return dict(shards_saturate_at_workers=sat, shards_to_keep_up=need, max_staleness=bound,
                asgd_rejected_fraction=rejected,
                gossip_overlap_step_ms={p: 1e3 * cost.step_seconds("gossip", p, w, net, overlap=True)["step"]
                                        for p in workers})


# ----------------------------------------------------------------------------- output
def draw(path: Path, projections: dict, workers: list[int]) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415
    from matplotlib.figure import Figure  # noqa: PLC0415
    fig = Figure(figsize=(4.4 * len(projections), 3.4), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(projections), squeeze=False)[0]
    colors = {"allreduce": "#4C72B0", "easgd": "#DD8452", "asgd": "#55A868", "gossip-pull": "#C44E52",
              "gossip-push": "#8172B3"}
    for ax, (name, proj) in zip(axes, projections.items()):
        for m, rows in proj.items():
            if m == "asgd":                        # same server cost as easgd at tau = n_sync = 1
                continue
            label = "easgd = asgd (tau 1)" if m == "easgd" else m
            ax.plot(workers, [r["efficiency"] for r in rows], "-", color=colors[m], label=label)
            ax.plot(workers, [r["sim_efficiency"] for r in rows], "o--", ms=3, color=colors[m])
        ax.set(xscale="log", xlabel="workers (GPUs)", ylabel="scaling efficiency", ylim=(0, 1.05),
               title=name)
        ax.set_xticks(workers, [str(p) for p in workers])
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("solid: analytic, no stragglers; dashed: simulated with stragglers", fontsize=10)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m scalesgd.costmodel", description=__doc__.split("\n")[0])
    ap.add_argument("--calibration", type=Path, default=ROOT / "benchmarks" / "results" / "calibration-cpu.json")
    ap.add_argument("--measured", type=Path, default=ROOT / "benchmarks" / "results" / "methods.json")
    ap.add_argument("--stragglers", type=Path, default=ROOT / "benchmarks" / "results" / "stragglers.json")
    ap.add_argument("--net-measured", type=Path, nargs="*",
                    default=[ROOT / "benchmarks" / "results" / f"{n}.json"
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
    a = ap.parse_args(argv)
    out: dict = {}
    try:
        cal = cal_mod.load(a.calibration)
    except cal_mod.CalibrationError as exc:
        print(f"scalesgd.costmodel: {exc}", file=sys.stderr)
        return 2
    # --- this machine
    p0 = cal_mod.ranks_measured(cal)[0]
    alpha, bw, misfit = cal_mod.fit_link(cal_mod.table(cal, "get", p0))
    print(f"calibration ({a.calibration.name}, {cal.get('machine', '?')}): one-rank step "
          f"{1e3 * cal['end_to_end']['resnet20_b16']['seconds']:.1f} ms (ResNet-20, batch 16, data included); "
          f"Get at {p0} ranks: alpha {1e6 * alpha:.1f} us, {bw / 1e9:.1f} GB/s (max misfit {100 * misfit:.0f}%)")
    where = a.calibration.resolve()          # recorded relative to the repository when inside it
    out["calibration"] = dict(file=str(where.relative_to(ROOT)) if where.is_relative_to(ROOT) else str(where), get_alpha=alpha, get_bandwidth=bw, get_misfit=misfit)
    if a.measured.exists():
        rows = validate(cal, json.loads(a.measured.read_text()))
        print("\nvalidation: seconds per local step, measured (experiment 2) vs predicted from the calibration")
        print(f"{'run':>18} {'ranks':>5} {'measured':>9} {'predicted':>9} {'error':>7}")
        for r in rows:
            print(f"{r['run']:>18} {r['ranks']:>5} {r['measured']:>9.4f} {r['predicted']:>9.4f} "
                  f"{100 * r['error']:>+6.0f}%")
        errs = np.abs([r["error"] for r in rows])
        if len(errs):
            print(f"|error|: median {100 * np.median(errs):.0f}%, max {100 * errs.max():.0f}% over {len(errs)} runs")
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
        print(f"|error|: median {100 * np.median(errs):.0f}%, max {100 * errs.max():.0f}% over {len(errs)} runs")
        out["net_validation"] = dict(rows=net_rows, efficiency=a.net_efficiency,
                                     median_abs_error=float(np.median(errs)), max_abs_error=float(errs.max()))
    # --- the cluster
    net = cost.Net(alpha=a.latency_us * 1e-6, bandwidth=a.bandwidth_gbps / 8 * 1e9 * a.link_efficiency,
                   mem=a.mem_gbps * 1e9)
    out["cluster"] = dict(bandwidth_gbps=a.bandwidth_gbps, link_efficiency=a.link_efficiency,
                          latency_us=a.latency_us, mem_gbps=a.mem_gbps, batch=a.batch,
                          gpu_img_s_resnet50=a.gpu_img_s_resnet50, jitter=a.jitter,
                          straggler_ms=a.straggler_ms, stragglers_per_16=a.stragglers_per_16)
    projections, out["projection"], out["answers"] = {}, {}, {}
    for w in cluster_workloads(a):
        print(f"\nprojection: {w.name}, batch {w.batch}/GPU, compute {1e3 * w.step_seconds:.1f} ms/step, "
              f"{w.param_bytes / 1e6:.0f} MB of parameters; {a.bandwidth_gbps:g} Gb/s x {a.link_efficiency:g}, "
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
            print(f"{m:>12} " + " ".join(f"{r['epoch_minutes']:>7.1f} {r['efficiency']:>5.2f} {r['sim_efficiency']:>5.2f}  "
                                         for r in rows))
        ans = answers(w, net, rows_by_m)
        print(f"server: {ans['server_service_ms']:.1f} ms per exchange, saturates at "
              f"{ans['server_saturates_at_workers']:.1f} workers (tau = 1); all-reduce overtakes it at "
              f"{ans['allreduce_overtakes_server_at_workers']} workers; tau (or n_sync) that keeps one server "
              f"below saturation: " + ", ".join(f"p={p}: {t}" for p, t in ans["easgd_tau_to_keep_up"].items()))
        print("server shards (tau = 1): saturate at " + ", ".join(
            f"K={k}: {v:.1f}" for k, v in ans["shards_saturate_at_workers"].items()) + " workers; shards to keep up: "
            + ", ".join(f"p={p}: {k}" for p, k in ans["shards_to_keep_up"].items()))
        print(f"asgd --max-staleness {ans['max_staleness']}: rejected fraction " + ", ".join(
            f"p={p}: {v:.2f}" for p, v in ans["asgd_rejected_fraction"].items())
            + "; overlapped gossip ms/step: " + ", ".join(f"{p}: {v:.1f}" for p, v in ans["gossip_overlap_step_ms"].items()))
        print("gossip pull ms/step by p: " + ", ".join(f"{p}: {v:.1f}" for p, v in ans["gossip_step_ms"].items())
              + " (simulated with stragglers: " + ", ".join(f"{v:.1f}" for v in ans["gossip_sim_step_ms"].values())
              + ")")
        out["projection"][w.name] = rows_by_m
        out["answers"][w.name] = ans
    draw(a.figure, projections, a.workers)
    print(f"\nwrote {a.figure}")
    if a.json:
        a.json.write_text(json.dumps(out, indent=1, default=float) + "\n")
        print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
