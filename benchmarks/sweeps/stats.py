"""The measures of finished runs: time and epochs to a target error, the per-step time split, the
server's service time, and their means and spreads over seeds."""
from __future__ import annotations

import json

import numpy as np

from scalesgd.io.runs import read_jsonl, sliding_mean, time_split

from . import runner
from .runner import Result


def first_reach(err: np.ndarray, x: np.ndarray, target: float) -> float | None:
    """x at the first point where err <= target (None if never)."""
    hit = np.nonzero(np.asarray(err) <= target)[0]
    return float(np.asarray(x)[hit[0]]) if len(hit) else None


def worker_step_seconds(res: Result) -> float:
    """Median over workers of (training seconds between the first and last step) / steps."""
    per = []
    for recs in res.data.steps.values():
        if len(recs) > 2:
            per.append((recs[-1]["train_seconds"] - recs[0]["train_seconds"]) / (len(recs) - 1))
    return float(np.median(per)) if per else float("nan")


def measures(res: Result, target: float | None = None) -> dict:
    target = runner.TARGET_ERROR if target is None else target
    err, t = res.val_error, res.val_time
    s = res.summary
    return dict(
        final_error=float(err[-1]), best_error=float(err.min()),
        time_to_target=first_reach(err, t, target),
        epochs_to_target=first_reach(err, res.val_epoch, target),
        train_seconds=float(s["train_seconds"]), images_per_second=float(s["images_per_second"]),
        step_seconds=worker_step_seconds(res), time_split=time_split(res.data),   # workers, not a server
        **exchange_costs(res))


def exchange_costs(res: Result) -> dict:
    """Per local step of a worker (mean over workers): seconds computing, communicating and waiting
    (``split_per_step``); for the server methods, server 0's service seconds per exchange and the
    fraction of its time it was serving (its last ``server`` record); the bytes every emulated
    node carried (``netcluster.json``, --net runs)."""
    steps = [len(r) for r in res.data.steps.values() if r]
    split = time_split(res.data)
    out = dict(split_per_step={k: v / max(np.mean(steps), 1) for k, v in split.items()} if steps else {})
    srv = read_rank0_server(res) if (res.data.path / "metrics" / "rank-0.jsonl").exists() else []
    if srv and "service_seconds" in srv[-1]:
        last = srv[-1]
        busy, idle = last["service_seconds"], last["idle_seconds"]
        out.update(server_service_ms=1e3 * busy / max(last["served"], 1),
                   server_utilization=busy / max(busy + idle, 1e-9))
    net = res.data.path / "netcluster.json"
    if net.exists():
        out["net"] = json.loads(net.read_text())
    out["compute_spread"] = compute_spread(res)
    return out


def compute_spread(res: Result) -> dict:
    """How a worker's compute (+ data) seconds vary from step to step and between workers, from
    the step records (cumulative ``compute_seconds`` and ``data_seconds``; the first step, which
    builds the data pipeline, left out): ``cv`` the median over workers of each one's coefficient
    of variation; ``p50``, ``p90``, ``p99``, ``max`` of every step over its own worker's mean (the
    shape: a log-normal's right tail); ``rank_ratio`` the slowest worker's mean over the fastest's
    (a persistently slow node); ``mean`` the seconds per step over all workers, ``fastest`` the
    fastest worker's, ``slow_share`` the share of workers more than 25% slower than it and
    ``slow_factor`` their mean over it (on 2 cores: the workers that share a core with another
    rank)."""
    per, rel, cvs = [], [], []
    for recs in res.data.steps.values():
        c = np.array([r.get("compute_seconds", 0.0) + r.get("data_seconds", 0.0) for r in recs])
        d = np.diff(c)[1:]
        if len(d) < 3:
            continue
        m = float(d.mean())
        per.append(m)
        cvs.append(float(d.std() / m))
        rel.extend(d / m)
    if not per:
        return {}
    rel = np.array(rel)
    return dict(mean=float(np.mean(per)), cv=float(np.median(cvs)), p50=float(np.percentile(rel, 50)),
                p90=float(np.percentile(rel, 90)), p99=float(np.percentile(rel, 99)),
                max=float(rel.max()), rank_ratio=float(max(per) / min(per)), workers=len(per),
                fastest=float(min(per)), slow_share=float(np.mean(np.array(per) > 1.25 * min(per))),
                slow_factor=float(np.mean([m for m in per if m > 1.25 * min(per)] or [min(per)]) / min(per)))


def read_rank0_server(res: Result) -> list[dict]:
    """The ``server`` records of rank 0 (server shard 0) of a run."""
    return [r for r in read_jsonl(res.data.path / "metrics" / "rank-0.jsonl") if r.get("kind") == "server"]


# the scalar measures of a run that are averaged over seeds
MEASURE_KEYS = ("final_error", "best_error", "time_to_target", "epochs_to_target", "train_seconds",
                "images_per_second", "step_seconds", "server_service_ms", "server_utilization")
SPLIT_KEYS = ("compute", "comm", "wait", "data")


def mean_split(ms: list[dict]) -> dict:
    """The per-step time split averaged over runs."""
    return {k: float(np.mean([m["split_per_step"].get(k, 0.0) for m in ms])) for k in SPLIT_KEYS}


def seed_mean(runs: list[dict]) -> dict:
    """The measures of one setting averaged over seeds (a time to target: over the seeds that
    reached it, None if none did); the first run's other entries."""
    out = dict(runs[0])
    for k in MEASURE_KEYS:
        vals = [r[k] for r in runs if r.get(k) is not None]
        out[k] = float(np.mean(vals)) if vals else None
    out["split_per_step"] = mean_split(runs)
    return out


def mean_spread(values) -> dict:
    """{mean, min, max, n} of the non-None values (None entries counted in ``missing``)."""
    v = np.array([x for x in values if x is not None], dtype=np.float64)
    missing = sum(1 for x in values if x is None)
    if not len(v):
        return dict(mean=None, min=None, max=None, n=0, missing=missing)
    return dict(mean=float(v.mean()), min=float(v.min()), max=float(v.max()), n=int(len(v)),
                missing=missing)


def aggregate(results: list[Result], target: float | None = None) -> dict:
    """Mean and spread over seeds of each measure."""
    ms = [measures(r, target) for r in results]
    out = {k: mean_spread([m.get(k) for m in ms]) for k in MEASURE_KEYS}
    out["split_per_step"] = mean_split(ms)
    spreads = [m["compute_spread"] for m in ms if m.get("compute_spread")]
    if spreads:                       # (means over seeds)
        out["compute_spread"] = {k: float(np.mean([sp[k] for sp in spreads])) for k in spreads[0]}
    nets = [m["net"] for m in ms if "net" in m]
    if nets:                          # the proof the traffic crossed the links: least bytes per node
        out["net"] = dict(rate_bits=nets[0]["rate_bits"], nodes=nets[0]["nodes"],
                          min_sent_mb=min(t["sent"] for n in nets for t in n["traffic"].values()) / 1e6,
                          min_received_mb=min(t["received"] for n in nets
                                              for t in n["traffic"].values()) / 1e6)
    return out


def mean_curve(results: list[Result], x: str = "time"):
    """Validation error averaged over seeds at each evaluation (same boundaries in every seed), with
    the mean x (training seconds or epochs) and the min/max error band."""
    n = min(len(r.data.val) for r in results)
    err = np.stack([r.val_error[:n] for r in results])
    xs = np.stack([(r.val_time if x == "time" else r.val_epoch)[:n] for r in results])
    return xs.mean(0), err.mean(0), err.min(0), err.max(0)


def merged_training_error(res: Result, window: int):
    """Every worker's per-minibatch training error merged in time order and smoothed over the last
    ``window`` minibatches (Paine et al.: 400): (train_seconds, global minibatch index, error)."""
    recs = sorted((r for rs in res.data.steps.values() for r in rs), key=lambda r: r["train_seconds"])
    t = np.array([r["train_seconds"] for r in recs])
    e = sliding_mean(np.array([r["top1_error"] for r in recs]), window)
    return t, np.arange(1, len(recs) + 1), e


def minibatches_to_train_error(res: Result, target: float, window: int) -> int | None:
    """Merged minibatches (all workers) until the smoothed training error first reaches ``target``."""
    _, idx, e = merged_training_error(res, window)
    if len(e) <= window:
        return None
    hit = first_reach(e[window:], idx[window:], target)
    return None if hit is None else int(hit)


def time_to_train_error(res: Result, target: float, window: int) -> float | None:
    """Training seconds at which the smoothed merged training error first reaches ``target``
    (ignoring the first ``window`` minibatches, whose mean is over fewer points)."""
    t, _, e = merged_training_error(res, window)
    if len(e) <= window:
        return None
    return first_reach(e[window:], t[window:], target)
