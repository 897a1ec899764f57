"""The cost model against this machine's measured runs: one-node steps, emulated links, stragglers."""
from __future__ import annotations

import math

from . import calibration as cal_mod
from . import cost, sim
from .workloads import METHOD_OF


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
