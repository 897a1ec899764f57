"""The crossover study's analysis: ``benchmarks/results/crossover/**/*.json`` -> ``crossover.json``
and ``docs/figures/crossover.png`` (``python benchmarks/crossover_report.py``).

Per method and p: samples (epochs) to the target error over the seeds (statistical efficiency),
seconds per training sample under each profile (the timing runs: goodput), their product (time to
target, per seed), the method's own statistics (staleness, consensus distance); for all-reduce the
gradient-noise-scale fit steps = S_min (1 + B_noise / B) (McCandlish et al. 2018); per profile the
fastest method at each p ("win" only when its interval does not overlap the next one's, else
"tie") and the crossover points between the best synchronous and the best asynchronous method,
with bootstrap intervals over the seeds.  Works on a partial study (what is missing is listed).
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np

import crossover as X
from crossover_verdicts import verdicts

SYNC = ("allreduce", "allreduce-lsw", "localsgd")
ASYNC = ("easgd", "asgd", "gossip-pull", "pushsum-ov")
BOOT = 2000
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def interval(xs: list[float]) -> dict:
    """Mean and a 95% t-interval over seeds (a single value: no interval)."""
    a = np.asarray(xs, float)
    if a.size == 0:
        return dict(mean=None, lo=None, hi=None, n=0)
    m = float(a.mean())
    if a.size == 1:
        return dict(mean=m, lo=None, hi=None, n=1)
    h = T95.get(a.size - 1, 1.96) * float(a.std(ddof=1)) / math.sqrt(a.size)
    return dict(mean=m, lo=m - h, hi=m + h, n=int(a.size))


def records(kind: str) -> list[dict]:
    d = X.RESULTS / kind
    return [json.loads(p.read_text()) for p in sorted(d.glob("*.json"))] if d.is_dir() else []


def analyse(target: float = X.TARGET_ERROR) -> dict:
    sweep, timing, tune = records("sweep"), records("timing"), records("tune")
    single = records("single")
    out = dict(target_error=target, epochs=X.EPOCHS, tune_epochs=X.TUNE_EPOCHS, seeds=list(X.SEEDS),
               workers=list(X.WORKERS), stats_profile=X.STATS_PROFILE, profiles=list(X.PROFILES),
               grids={m: [name for name, _ in g] for m, (_, g) in X.METHODS.items()},
               machine_hours={k: sum(r["real_seconds"] for r in recs) / 3600 for k, recs in
                              (("tune", tune), ("sweep", sweep), ("timing", timing), ("single", single),
                               ("extra", records("extra")))})
    spe = 51_200 // 8 * 8
    out["single"] = dict(seeds=len(single), epochs_to_target=_epochs([X.samples_to(r["curve"], target)
                                                                      for r in single], spe),
                         final_error=interval([r["final_error"] for r in single]),
                         curve=_mean_curve(single))
    out["tuning"] = _tuning(tune, target)
    single_s2t = [X.samples_to(r["curve"], target) for r in single]
    out["single"]["time_to_target"] = {}
    for prof in X.PROFILES:
        t = next((r for r in timing if r["method"] == X.SINGLE and r["profile"] == prof), None)
        if t is not None:
            per = [None if s is None else s * t["seconds_per_sample"] for s in single_s2t]
            out["single"]["time_to_target"][prof] = dict(interval([v for v in per if v is not None]),
                                                         per_seed=per)
    methods = {}
    for m in X.METHODS:
        for p in X.WORKERS:
            runs = [r for r in sweep if r["method"] == m and r["workers"] == p]
            if not runs:
                continue
            s2t = [X.samples_to(r["curve"], target) for r in runs]
            reached = [s for s in s2t if s is not None]
            row = dict(method=m, workers=p, config=runs[0]["config"], seeds=[r["seed"] for r in runs],
                       reached=len(reached), samples_to_target=s2t,
                       epochs_to_target=_epochs(s2t, runs[0]["samples_per_epoch"]),
                       final_error=interval([r["final_error"] for r in runs]),
                       stats=_stats(runs), time_to_target={}, seconds_per_sample={})
            for prof in X.PROFILES:
                t = next((r for r in timing if r["method"] == m and r["workers"] == p
                          and r["profile"] == prof), None)
                if t is None:
                    continue
                sps = t["seconds_per_sample"]
                row["seconds_per_sample"][prof] = sps
                row["time_to_target"][prof] = dict(
                    interval([s * sps for s in reached]), missing=len(s2t) - len(reached),
                    per_seed=[None if s is None else s * sps for s in s2t])
            full = [r["seconds_per_sample"] for r in runs]      # the stats profile's own timeline
            row["seconds_per_sample_full_run"] = float(np.mean(full))
            methods[f"{m}/p{p}"] = row
    out["runs"] = methods
    out["noise_scale"] = _noise_scale(methods)
    out["winners"] = {prof: _winners(methods, prof) for prof in X.PROFILES}
    out["crossovers"] = {prof: _crossover(methods, prof) for prof in X.PROFILES}
    out["extras"] = _extras(records("extra"), target)
    out["p1"] = {prof: _speedup(out["single"]["time_to_target"].get(prof),
                                methods.get(f"asgd/p{P1_WORKERS}", {}).get("time_to_target", {}).get(prof))
                 for prof in X.PROFILES}
    out["verdicts"] = verdicts(out)
    plan = X.plan()
    out["missing"] = [r.key for r in plan if not r.record.exists()]
    out.update(planned_runs=len(plan), planned_hours=sum(r.cost for r in plan) / 3600,
               finished_runs=len(plan) - len(out["missing"]),
               machine_hours_total=sum(out["machine_hours"].values()))
    return out


P1_WORKERS = 8          # Paine et al.'s A-SGD speed-up was measured on 8 GPUs


def _speedup(one: dict | None, many: dict | None, resamples: int = 2000) -> dict | None:
    """Wall-clock speed-up to the target, one worker's mean time over the many's, with a
    bootstrap 95% interval over both seed sets (seeds that never reached it are left out)."""
    if not one or not many:
        return None
    a = [v for v in one["per_seed"] if v is not None]
    b = [v for v in many["per_seed"] if v is not None]
    if not a or not b:
        return None
    rng = np.random.default_rng(0)
    boot = [float(np.mean(rng.choice(a, len(a))) / np.mean(rng.choice(b, len(b))))
            for _ in range(resamples)]
    return dict(speedup=float(np.mean(a) / np.mean(b)), lo=float(np.percentile(boot, 2.5)),
                hi=float(np.percentile(boot, 97.5)), workers=P1_WORKERS, seeds=[len(a), len(b)],
                one_seconds=float(np.mean(a)), many_seconds=float(np.mean(b)))


def _extras(recs: list[dict], target: float) -> dict:
    """The papers' other claims (``crossover.EXTRAS``): per test and setting, over the seeds."""
    out = {}
    for name, (workers, epochs, configs) in X.EXTRAS.items():
        rows = {}
        for c, flags in configs.items():
            runs = [r for r in recs if r["method"] == name and r["config"] == c]
            if not runs:
                continue
            s2t = [X.samples_to(r["curve"], target) for r in runs]
            last = [r["curve"][-1] for r in runs if r["curve"]]
            rows[c] = dict(flags=flags, seeds=[r["seed"] for r in runs],
                           epochs_to_target=_epochs(s2t, runs[0]["samples_per_epoch"]),
                           final_error=interval([r["final_error"] for r in runs]), stats=_stats(runs),
                           exchanges_per_worker=float(np.mean([c_["server_version"] / workers for c_ in last]))
                           if last and all("server_version" in c_ for c_ in last) else None)
        out[name] = dict(workers=workers, epochs=epochs, configs=rows)
    return out


def _epochs(s2t: list, spe: int) -> dict:
    reached = [s / spe for s in s2t if s is not None]
    return dict(interval(reached), missing=len(s2t) - len(reached))


def _mean_curve(runs: list[dict]) -> list[dict]:
    if not runs:
        return []
    n = min(len(r["curve"]) for r in runs)
    return [dict(samples=runs[0]["curve"][i]["samples"],
                 error=float(np.mean([r["curve"][i]["error"] for r in runs]))) for i in range(n)]


def _stats(runs: list[dict]) -> dict:
    """The method's own statistics, mean over validations and seeds (rank 0's records)."""
    out = {}
    for k in ("consensus_distance", "staleness_mean", "staleness_max", "worker_distance"):
        v = [c[k] for r in runs for c in r["curve"] if c.get(k) is not None]
        if v:
            out[k] = float(np.mean(v))
    return out


def _tuning(tune: list[dict], target: float) -> dict:
    out = {}
    for r in tune:
        key = f"{r['method']}/p{r['workers']}"
        out.setdefault(key, {"configs": {}})["configs"][r["config"]] = dict(
            samples_to_target=X.samples_to(r["curve"], target), final_error=r["final_error"])
    for key, d in out.items():
        m, p = key.split("/p")
        d["chosen"] = X.chosen(m, int(p))
    return out


def _noise_scale(methods: dict) -> dict:
    """Fit steps = S_min + S_min B_noise / B over p (B = 8 p) to all-reduce's steps to target (at
    each p the faster of the fixed-rate and the linearly scaled rule: the model assumes a tuned
    rate); bootstrap over seeds for the interval."""
    pts = []                                   # (B, [steps of each seed that reached])
    for p in X.WORKERS:                        # per p the better tuned of the two all-reduce rules
        cands = []
        for m in ("allreduce", "allreduce-lsw"):
            r = methods.get(f"{m}/p{p}")
            if r is not None and r["reached"] and r["reached"] == len(r["samples_to_target"]):
                cands.append([s / (8 * p) for s in r["samples_to_target"]])
        if cands:
            pts.append((8 * p, min(cands, key=np.mean)))
    data = [dict(batch=b, steps=float(np.mean(s)), seeds=len(s)) for b, s in pts]
    if len(pts) < 3:
        return dict(points=len(pts), b_noise=None, s_min=None, data=data,
                    note="the fit needs all-reduce at 3 or more p")

    def fit(sample):
        inv = np.array([1.0 / b for b, _ in sample])
        steps = np.array([np.mean(s) for _, s in sample])
        slope, icpt = np.polyfit(inv, steps, 1)
        return (slope / icpt if icpt > 0 else float("nan")), icpt
    b_noise, s_min = fit(pts)
    if not (s_min > 0 and math.isfinite(b_noise)):
        return dict(points=len(pts), b_noise=None, s_min=float(s_min), data=data,
                    note="no fit: steps to target fall faster than 1/B allows (S_min <= 0)")
    rng = np.random.default_rng(0)
    boots = []
    for _ in range(BOOT):
        sample = [(b, list(rng.choice(s, len(s)))) for b, s in pts]
        boots.append(fit(sample)[0])
    boots = np.array([b for b in boots if np.isfinite(b)])
    return dict(points=len(pts), b_noise=float(b_noise), s_min=float(s_min),
                b_noise_lo=float(np.percentile(boots, 2.5)) if boots.size else None,
                b_noise_hi=float(np.percentile(boots, 97.5)) if boots.size else None, data=data)


def _winners(methods: dict, prof: str) -> list[dict]:
    """Per p: methods by mean time to target (all seeds reached); the first 'wins' when its 95%
    interval lies below the second's, else it ties with every method whose interval overlaps;
    'incomplete' while some method has not run at that p; ``never``: methods that ran but not every
    seed reached the target (they lose to any method whose seeds all did)."""
    out = []
    for p in X.WORKERS:
        rows = [r for r in methods.values() if r["workers"] == p and prof in r["time_to_target"]
                and r["time_to_target"][prof]["missing"] == 0 and r["time_to_target"][prof]["n"]]
        if not rows:
            continue
        rows.sort(key=lambda r: r["time_to_target"][prof]["mean"])
        best = rows[0]["time_to_target"][prof]
        hi = best["hi"] if best["hi"] is not None else best["mean"]
        ties = [r["method"] for r in rows[1:]
                if (r["time_to_target"][prof]["lo"] if r["time_to_target"][prof]["lo"] is not None
                    else r["time_to_target"][prof]["mean"]) <= hi]
        ran = {r["method"] for r in methods.values() if r["workers"] == p and prof in r["time_to_target"]}
        verdict = "incomplete" if len(ran) < len(X.METHODS) else "tie" if ties else "win"
        out.append(dict(workers=p, fastest=rows[0]["method"], verdict=verdict, ties=ties,
                        seconds=best["mean"], order=[r["method"] for r in rows],
                        never=sorted(ran - {r["method"] for r in rows})))
    return out


def _family_best(methods: dict, prof: str, family, p: int, rng=None):
    """The family's fastest mean time to target at p (seeds resampled when ``rng``)."""
    best = None
    for m in family:
        r = methods.get(f"{m}/p{p}")
        if r is None or prof not in r["time_to_target"]:
            continue
        per = r["time_to_target"][prof]["per_seed"]
        if not per or any(t is None for t in per):
            continue
        v = float(np.mean(rng.choice(per, len(per)) if rng is not None else per))
        best = v if best is None else min(best, v)
    return best


def _crossover(methods: dict, prof: str) -> dict:
    """The p where the best synchronous method's time to target crosses the best asynchronous
    one's (log-linear between measured p), with a bootstrap interval over seeds."""
    def find(rng=None):
        prev = None
        for p in X.WORKERS:
            s, a = _family_best(methods, prof, SYNC, p, rng), _family_best(methods, prof, ASYNC, p, rng)
            if s is None or a is None:
                continue
            d = math.log(s) - math.log(a)          # > 0: asynchronous faster
            if prev is not None and (prev[1] > 0) != (d > 0):
                lp0, lp1 = math.log2(prev[0]), math.log2(p)
                return 2 ** (lp0 + (lp1 - lp0) * prev[1] / (prev[1] - d)), ("async->sync" if prev[1] > 0
                                                                              else "sync->async")
            prev = (p, d)
        return None, None
    at, direction = find()
    rng = np.random.default_rng(1)
    boots = [find(rng)[0] for _ in range(BOOT)]
    found = [b for b in boots if b is not None]
    return dict(workers=at, direction=direction, bootstrap_found=len(found) / BOOT,
                lo=float(np.percentile(found, 2.5)) if found else None,
                hi=float(np.percentile(found, 97.5)) if found else None)


def figure(res: dict, path: Path) -> None:
    import matplotlib  # noqa: PLC0415
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415
    profs = list(X.PROFILES)
    fig, axes = plt.subplots(1, len(profs) + 1, figsize=(4.6 * (len(profs) + 1), 3.8))
    colors = dict(zip(X.METHODS, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    for ax, prof in zip(axes, profs):
        for m in X.METHODS:
            rows = [r for r in res["runs"].values() if r["method"] == m and prof in r["time_to_target"]
                    and r["time_to_target"][prof]["n"] and not r["time_to_target"][prof]["missing"]]
            if not rows:
                continue
            p = [r["workers"] for r in rows]
            t = [r["time_to_target"][prof] for r in rows]
            ax.plot(p, [x["mean"] for x in t], "o-", color=colors[m], label=m, ms=3)
            lo = [x["lo"] if x["lo"] is not None else x["mean"] for x in t]
            hi = [x["hi"] if x["hi"] is not None else x["mean"] for x in t]
            ax.fill_between(p, lo, hi, color=colors[m], alpha=0.2)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("workers p")
        ax.set_ylabel(f"seconds to {100 * res['target_error']:g}% error")
        ax.set_title(prof, fontsize=9)
    ax = axes[-1]
    for m in X.METHODS:
        rows = [r for r in res["runs"].values() if r["method"] == m and r["epochs_to_target"]["n"]]
        if rows:
            ax.plot([r["workers"] for r in rows], [r["epochs_to_target"]["mean"] for r in rows], "o-",
                    color=colors[m], label=m, ms=3)
    if res["single"]["epochs_to_target"]["mean"] is not None:
        ax.axhline(res["single"]["epochs_to_target"]["mean"], color="k", lw=0.8, ls=":",
                   label="one worker")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("workers p")
    ax.set_ylabel("epochs to target (reaching seeds)")
    ax.set_title("statistical efficiency", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report() -> int:
    res = analyse()
    (X.RESULTS.parent / "crossover.json").write_text(json.dumps(res, indent=1, allow_nan=False) + "\n")
    figure(res, X.ROOT / "docs" / "figures" / "crossover.png")
    for prof, ws in res["winners"].items():
        print(prof)
        for w in ws:
            print(f"  p={w['workers']:4d} {w['verdict']:4s} {w['fastest']:14s} {w['seconds']:.4g} s"
                  f"  ties: {', '.join(w['ties']) or '-'}")
        print(f"  crossover: {res['crossovers'][prof]}")
    print(f"noise scale: {res['noise_scale']}")
    print(f"missing runs: {len(res['missing'])}; machine hours so far: {res['machine_hours']}")
    return 0


if __name__ == "__main__":
    sys.exit(report())
