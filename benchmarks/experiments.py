"""The seed papers' claims as experiments anyone can rerun (issue 7; results in docs/results.md).

    python benchmarks/experiments.py EXPERIMENT [--quick] [--seeds N] [--out DIR] [--no-publish]
                                     [--data DIR --tag NAME] [--image-size N] [--model NAME]
                                     [--workers P ...]

EXPERIMENT is one of sync, methods, stragglers, lr, consensus, easgd, asgd, or all.  Each runs its
sweep with real ``mpiexec`` launches of ``python -m scalesgd`` (base config ``jobs/experiments.toml``),
writes every run directory under ``OUT/runs/`` (default ``runs/experiments``; a run whose directory
already holds a ``summary.json`` for the same argv is reused, so an interrupted sweep continues),
prints a table, and writes ``benchmarks/results/EXPERIMENT.json`` and ``docs/figures/EXPERIMENT.png``
(``--quick`` or ``--no-publish``: both under ``OUT/`` instead).  ``--quick`` shrinks every sweep to a
smoke test of the whole path (1 epoch, fewest settings); its numbers mean nothing.  ``--data``
(a directory made by ``python -m scalesgd.data.make_shards``), ``--image-size`` and ``--model`` are
passed to every training run, to repeat the sweeps on your own data (their run directories then go
to ``runs/experiments-NAME`` and the published files get ``--tag``: ``EXPERIMENT-TAG.json``).
``--workers`` restricts experiment 2 to the worker counts given.  The launcher is ``$MPIEXEC`` (else
the ``mpiexec`` beside this Python, else the one on PATH) with ``$MPIEXEC_ARGS`` before ``-n``, as
for the tests (docs/cli.md: launchers).

"p workers" means p ranks computing gradients; easgd and asgd add one server rank (p + 1 ranks).
Every rank is one single-threaded process: on this 2-core machine ``-n 9`` is 4.5 processes per core,
so the absolute times are those of an oversubscribed machine, not of p nodes (docs/results.md).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from benchlib import ROOT, mpi_launcher, rank_env, run_checked

from scalesgd.io.runs import RunData, load_run, sliding_mean, time_split

JOB = ROOT / "jobs" / "experiments.toml"
SERVER_METHODS = ("easgd", "asgd")
METHODS = {                                          # label -> command-line flags
    "allreduce": ["--method", "allreduce"],
    "easgd": ["--method", "easgd"],
    "asgd": ["--method", "asgd"],
    "gossip-pull": ["--method", "gossip", "--gossip", "pull"],
    "gossip-push": ["--method", "gossip", "--gossip", "push"],
    "gossip-pull-ov": ["--method", "gossip", "--gossip", "pull", "--gossip-overlap"],
    "gossip-push-ov": ["--method", "gossip", "--gossip", "push", "--gossip-overlap"],
}
COLORS = {"allreduce": "#4C72B0", "easgd": "#DD8452", "asgd": "#55A868", "gossip-pull": "#C44E52",
          "gossip-push": "#8172B3", "single": "#333333", "asgd lr/p": "#8C564B",
          "gossip-pull-ov": "#E377C2", "gossip-push-ov": "#17BECF"}
# on emulated nodes (--net): the best version of each method (asgd at lr 0.1 diverged on one node;
# gossip blocking and overlapped, since across nodes a blocking one-sided call waits for its target)
NET_METHODS = ("allreduce", "easgd", "asgd lr/p", "gossip-pull", "gossip-pull-ov", "gossip-push-ov")
RESNET20_BYTES = 272_474 * 4    # the sweeps' model (jobs/experiments.toml), float32
TARGET_ERROR = 0.10            # validation top-1 error for "time to target" (digits: 90% accuracy)


def ranks_for(method: str, workers: int, flags=()) -> int:
    """Ranks of a run: the workers, plus the server shards (``--servers K``, default 1)."""
    flags = list(flags)
    servers = int(flags[flags.index("--servers") + 1]) if "--servers" in flags else 1
    return workers + (servers if method in SERVER_METHODS else 0)


# ----------------------------------------------------------------------------- emulated cluster
# The papers' regime as a ratio: one transfer of the model over one link against one step's compute,
# on the cluster the cost model projects to (docs/results.md): ResNet-18 (46.8 MB of float32) over
# 100 Gb/s InfiniBand at 80% efficiency (10 GB/s) is 4.68 ms, against 30.2 ms of A100 compute per
# step (batch 64)  ->  r = 0.155.  scalesgd.costmodel holds those constants.
def papers_ratio() -> float:
    from scalesgd.costmodel.workloads import PARAMS, RESNET18_GMAC, RESNET50_GMAC  # noqa: PLC0415
    step = 64 / 938.0 * RESNET18_GMAC / RESNET50_GMAC          # s: the model's stated A100 step
    return PARAMS["resnet18"] * 4 / (100e9 / 8 * 0.8) / step


class Net:
    """Where the runs go when the sweep is on an emulated cluster (``--net``): one rank per node
    (a server shard on a node of its own), every node's NIC limited to ``rate_for(workers)``.

    ``--net papers[xF]``: the link rate that gives ResNet-20 on this machine the papers' ratio r of
    transfer time to step time, r x F with the suffix (F = 4: a network four times slower).  A node
    here computes a step in t(p) seconds -- the shared-memory all-reduce step of experiment 2 at p
    workers, which grows with p because p ranks share the cores -- so its link must be slowed by
    the same factor: rate(p) = 8 S / (r F t(p)) bit/s, S = 1.09 MB.  ``--net 300mbit``: one fixed
    rate for every p."""

    def __init__(self, spec: str):
        import netcluster  # noqa: PLC0415   (sibling module; needs root and iproute2 to run)
        self.nc, self.spec = netcluster, spec
        missing = netcluster.requirements_missing()
        if missing:
            raise SystemExit(f"experiments --net: {missing}")
        head, _, factor = spec.partition("x")
        if head == "papers":
            self.factor = float(factor or 1)
            self.ratio = papers_ratio() * self.factor
            self.fixed = None
            shm = ROOT / "benchmarks" / "results" / "methods.json"
            if not shm.exists():
                raise SystemExit(f"experiments --net papers: needs {shm.relative_to(ROOT)} "
                                 "(the shared-memory sweep: experiments.py methods)")
            self.step = {int(v["workers"]): v["step_seconds"]["mean"]
                         for v in json.loads(shm.read_text())["runs"].values() if v["method"] == "allreduce"}
        else:
            self.fixed, self.ratio, self.factor = netcluster.parse_rate(spec), None, None

    @property
    def tag(self) -> str:
        return "net" if self.spec == "papers" else "net-" + self.spec.replace(".", "p")

    def rate_for(self, workers: int) -> int:
        if self.fixed:
            return self.fixed
        if workers not in self.step:
            raise SystemExit(f"experiments --net papers: no shared-memory allreduce step at {workers} "
                             f"workers in benchmarks/results/methods.json (has {sorted(self.step)})")
        return int(round(8 * RESNET20_BYTES / (self.ratio * self.step[workers]) / 1e6)) * 10**6

    def describe(self) -> dict:
        return dict(spec=self.spec, ratio=self.ratio, factor=self.factor, fixed_rate=self.fixed,
                    shared_memory_step_seconds=getattr(self, "step", None))

    def launch(self, n: int, argv: list[str], workers: int, run_dir: Path, timeout: float) -> None:
        """Runs the job on n fresh nodes, one rank each; fails unless every node's interface sent
        and received at least one model's worth of bytes; writes run_dir/netcluster.json."""
        rate = self.rate_for(workers)
        # node k on core k mod cores: one BLAS thread per rank, as the ranks of a one-node run have
        # (unpinned, every rank counts all cores and starts that many threads: steps took 2.7x as long)
        with self.nc.NetCluster(n, rate=rate, cpus_per_node=1) as c:
            res = c.run([sys.executable, *argv], env=rank_env(), timeout=timeout, capture=True, cwd=ROOT)
        if res.timed_out or res.returncode:
            raise SystemExit(f"experiments: {run_dir.name} on {n} emulated nodes "
                             f"{'did not finish' if res.timed_out else f'failed (exit {res.returncode})'}:"
                             f"\n{(res.stderr or '')[-3000:]}")
        low = [k for k, t in res.traffic.items() if min(t.sent, t.received) < RESNET20_BYTES // n]
        if low:
            raise SystemExit(f"experiments: {run_dir.name}: nodes {low} carried less than a model's "
                             "worth of bytes: the MPI library did not use the emulated links\n"
                             + self.nc.format_traffic(res.traffic, c.rates()))
        (run_dir / "netcluster.json").write_text(json.dumps(dict(
            rate_bits=rate, nodes=n, seconds=res.seconds,
            traffic={k: dict(sent=t.sent, received=t.received) for k, t in res.traffic.items()}), indent=1))


# ----------------------------------------------------------------------------- runs
@dataclass
class Result:
    """One finished run: its records and summary."""

    name: str
    method: str
    workers: int
    data: RunData
    summary: dict

    @property
    def val_error(self) -> np.ndarray:
        return 1.0 - np.array([r["val_top1_accuracy"] for r in self.data.val])

    @property
    def val_time(self) -> np.ndarray:
        return np.array([r["train_seconds"] for r in self.data.val])

    @property
    def val_epoch(self) -> np.ndarray:
        return np.array([r["epoch"] for r in self.data.val])


class Runner:
    """Launches (or reuses) runs; every run directory lives in ``out/runs/NAME``."""

    def __init__(self, out: Path, quick: bool, timeout: float = 900.0, extra: list[str] = (),
                 net: Net | None = None):
        self.out, self.quick, self.timeout, self.extra = out, quick, timeout, list(extra)
        self.net = net
        (out / "runs").mkdir(parents=True, exist_ok=True)
        self.launched = self.reused = 0
        self.keys: dict[str, str] = {}           # name -> argv key asked for in this invocation

    @staticmethod
    def inputs(deps: list[Path]) -> str:
        """Digest of what the argv only names: the job file's contents and the dependencies'."""
        h = hashlib.blake2b(JOB.read_bytes(), digest_size=8)
        for d in deps:
            h.update(Path(d).read_bytes())
        return h.hexdigest()

    def run(self, name: str, method: str, workers: int, flags: list[str] = (), ranks: int | None = None,
            label: str | None = None, deps: list[Path] = ()) -> Result:
        """Runs (or reuses) one training run.  A finished run directory is reused when its argv and
        the digest of the job file and ``deps`` (e.g. the warm-start run's summary) are unchanged;
        otherwise it is deleted and run again.  Asking for one name with two different argvs in
        the same invocation is a bug of the sweep (two settings would share a directory)."""
        method_flags = METHODS.get(method, ["--method", method])
        n = ranks or ranks_for(method, workers, flags)
        run_dir = self.out / "runs" / name
        argv = ["-m", "scalesgd", "--config", str(JOB.relative_to(ROOT)), *method_flags,
                "--run-dir", str(run_dir), *(["--epochs", "1", "--eval-every", "0.5"] if self.quick else []),
                *self.extra, *flags]
        key = json.dumps({"ranks": n, "argv": argv,
                          **({"net_rate": self.net.rate_for(workers)} if self.net else {})})
        if self.keys.setdefault(name, key) != key:
            raise SystemExit(f"experiments: run name {name} asked for with two different settings:\n"
                             f"  {self.keys[name]}\n  {key}")
        saved, digest = run_dir / "argv.json", run_dir / "inputs.digest"
        inputs = self.inputs(list(deps))
        same_inputs = not digest.exists() or digest.read_text() == inputs   # (older runs: no digest)
        if (run_dir / "summary.json").exists() and saved.exists() and saved.read_text() == key \
                and same_inputs:
            self.reused += 1
        else:
            if run_dir.exists():
                shutil.rmtree(run_dir)
            self._launch(n, argv, name, workers, run_dir)
            saved.write_text(key)
            self.launched += 1
        digest.write_text(inputs)
        summary = json.loads((run_dir / "summary.json").read_text())
        return Result(name, label or method, workers, load_run(run_dir), summary)

    def _launch(self, n: int, argv: list[str], name: str, workers: int, run_dir: Path) -> None:
        t = time.perf_counter()
        if self.net:
            rate = self.net.rate_for(workers)
            print(f"  run {name}: {n} emulated nodes at {rate / 1e6:g} Mbit/s ... ", end="", flush=True)
            self.net.launch(n, argv, workers, run_dir, self.timeout)
        else:
            print(f"  run {name}: mpiexec -n {n} ... ", end="", flush=True)
            run_checked([*mpi_launcher(n), sys.executable, *argv], f"experiments: run {name}",
                        self.timeout, cwd=ROOT)
        print(f"{time.perf_counter() - t:.0f}s", flush=True)


# ----------------------------------------------------------------------------- measures
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
    target = TARGET_ERROR if target is None else target
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
    srv = _read_rank0_server(res) if (res.data.path / "metrics" / "rank-0.jsonl").exists() else []
    if srv and "service_seconds" in srv[-1]:
        last = srv[-1]
        busy, idle = last["service_seconds"], last["idle_seconds"]
        out.update(server_service_ms=1e3 * busy / max(last["served"], 1),
                   server_utilization=busy / max(busy + idle, 1e-9))
    net = res.data.path / "netcluster.json"
    if net.exists():
        out["net"] = json.loads(net.read_text())
    return out


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
    nets = [m["net"] for m in ms if "net" in m]
    if nets:                          # the proof the traffic crossed the links: least bytes per node
        out["net"] = dict(rate_bits=nets[0]["rate_bits"], nodes=nets[0]["nodes"],
                          min_sent_mb=min(t["sent"] for n in nets for t in n["traffic"].values()) / 1e6,
                          min_received_mb=min(t["received"] for n in nets for t in n["traffic"].values()) / 1e6)
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


# ----------------------------------------------------------------------------- figures
def new_figure(rows: int, cols: int, w: float = 4.2, h: float = 3.2):
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415
    from matplotlib.figure import Figure  # noqa: PLC0415
    fig = Figure(figsize=(w * cols, h * rows), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax in axes.flat:
        ax.grid(alpha=0.3)
    return fig, axes


class Experiment:
    """Shared plumbing: the runner, the output paths, the note on oversubscription."""

    name = ""

    def __init__(self, runner: Runner, seeds: int, publish: bool, tag: str = "", workers=()):
        self.r, self.seeds, self.publish = runner, seeds, publish
        self.quick = runner.quick
        self.only_workers = tuple(workers)          # methods: --workers overrides 2, 4, 8
        if tag:
            self.name = f"{self.name}-{tag}"

    @property
    def figure_path(self) -> Path:
        return (ROOT / "docs" / "figures" if self.publish else self.r.out) / f"{self.name}.png"

    @property
    def result_path(self) -> Path:
        return (ROOT / "benchmarks" / "results" if self.publish else self.r.out) / f"{self.name}.json"

    def save(self, fig, data: dict) -> dict:
        self.figure_path.parent.mkdir(parents=True, exist_ok=True)
        self.result_path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(self.figure_path, dpi=110)
        data = dict(experiment=self.name, quick=self.quick, cores=os.cpu_count(),
                    date=time.strftime("%Y-%m-%d"), figure=str(self.figure_path.relative_to(ROOT))
                    if self.publish else str(self.figure_path),
                    net=self.r.net.describe() if self.r.net else None, **data)
        self.result_path.write_text(json.dumps(data, indent=1) + "\n")
        print(f"wrote {self.result_path} and {self.figure_path}")
        return data

    def seed_list(self) -> list[int]:
        return list(range(1 if self.quick else self.seeds))

    def method_run(self, method: str, workers: int, seed: int = 0, flags: list[str] = (),
                   tag: str = "") -> Result:
        """One run of a METHODS label, or of "asgd lr/p" (asgd with the learning rate divided by the
        workers: the server sums every worker's update)."""
        if method == "asgd lr/p":
            res = self.method_run("asgd", workers, seed, ["--lr", f"{0.1 / workers:.4g}", *flags],
                                  tag="-lrp" + tag)
            res.method = method
            return res
        name = f"{method}-w{workers}-s{seed}{tag}"
        return self.r.run(name, method, workers, ["--seed", str(seed), *flags])


def fmt(x, spec=".3g", none="—"):
    return none if x is None or (isinstance(x, float) and np.isnan(x)) else format(x, spec)


def pm(agg: dict, scale: float = 1.0, spec: str = ".3g") -> str:
    """'mean [min, max]' of one aggregated measure."""
    if agg["mean"] is None:
        return "never"
    s = fmt(agg["mean"] * scale, spec)
    if agg["n"] > 1:
        s += f" [{fmt(agg['min'] * scale, spec)}, {fmt(agg['max'] * scale, spec)}]"
    if agg.get("missing"):
        s += f" ({agg['missing']} never)"
    return s


# ----------------------------------------------------------------------------- 1. sync equivalence
class Sync(Experiment):
    """allreduce with p ranks x batch b against one rank with batch p*b on the same samples."""

    name = "sync"

    def run(self) -> dict:
        p, b = (2, 16) if self.quick else (4, 16)
        single = self.r.run(f"single-b{p * b}", "single", 1, ["--batch-size", str(p * b)], ranks=1)
        sync = self.r.run(f"allreduce-w{p}-s0", "allreduce", p, ["--seed", "0"])
        a = sync.val_error
        s = single.val_error
        n = min(len(a), len(s))
        # every rank's loss is over its 16 samples; their mean is the loss over the global batch
        la = np.mean([[r["loss"] for r in recs] for recs in sync.data.steps.values()], axis=0)
        ls = np.array([r["loss"] for r in single.data.steps[0]])
        m = min(len(la), len(ls))
        rel = np.abs(la[:m] - ls[:m]) / np.abs(ls[:m])
        fig, ax = new_figure(1, 2)
        ax[0, 0].plot(single.val_epoch, s, "o-", color=COLORS["single"], label=f"1 rank, batch {p * b}")
        ax[0, 0].plot(sync.val_epoch, a, "s--", color=COLORS["allreduce"], label=f"allreduce {p} x {b}")
        ax[0, 0].set(xlabel="epoch", ylabel="validation top-1 error", yscale="log",
                     title="validation error")
        ax[0, 1].plot(ls[:m], color=COLORS["single"], label=f"1 rank, batch {p * b}")
        ax[0, 1].plot(la[:m], "--", color=COLORS["allreduce"], label=f"allreduce {p} x {b} (mean over ranks)")
        ax[0, 1].set(xlabel="step", ylabel="training loss", title="per-step training loss")
        for a_ in ax.flat:
            a_.legend(fontsize=8)
        # the trained weights themselves (BN-free): relative distance of the final parameters
        from scalesgd.io import checkpoint as ckpt  # noqa: PLC0415
        w1 = ckpt.read_rank(ckpt.latest_good(ckpt.checkpoint_dir(single.data.path)), 0)[1]["params"]
        wp = ckpt.read_rank(ckpt.latest_good(ckpt.checkpoint_dir(sync.data.path)), 0)[1]["params"]
        w0 = ckpt.read_rank(ckpt.latest_good(ckpt.checkpoint_dir(self.r.run(
            f"allreduce-w{p}-s1", "allreduce", p, ["--seed", "1"]).data.path)), 0)[1]["params"]
        param_diff = float(np.linalg.norm(wp - w1) / np.linalg.norm(w1))
        seed_diff = float(np.linalg.norm(w0 - w1) / np.linalg.norm(w1))
        out = dict(workers=p, batch=b, val_error_single=s.tolist(), val_error_allreduce=a.tolist(),
                   final_param_rel_diff=param_diff, other_seed_param_rel_diff=seed_diff,
                   max_abs_val_error_diff=float(np.abs(a[:n] - s[:n]).max()),
                   loss_rel_diff_first_step=float(rel[0]), loss_rel_diff_median=float(np.median(rel)),
                   steps_compared=int(m))
        print(f"sync: max |val error diff| {out['max_abs_val_error_diff']:.4f}; per-step loss rel. diff "
              f"step 0 {rel[0]:.2e}, median {np.median(rel):.3f} over {m} steps; final weights differ by "
              f"{param_diff:.3f} (relative; another seed: {seed_diff:.3f})")
        return self.save(fig, out)


# ----------------------------------------------------------------------------- 2. methods
class Methods(Experiment):
    """Every method at 2, 4, 8 workers, same hyper-parameters (lr 0.1, batch 16 per worker), plus
    asgd with lr 0.1/p ("asgd lr/p": at lr 0.1 the summed updates of p workers diverge).  8 workers
    train 6 epochs instead of 3 (3 epochs are only ~100 steps of a 128-sample global batch)."""

    name = "methods"
    EPOCHS = {8: 6}

    def workers(self) -> list[int]:
        if self.only_workers:
            return list(self.only_workers)
        return [2] if self.quick else [2, 4, 8]

    def methods(self, w: int) -> list[str]:
        if self.quick:
            return ["allreduce", "gossip-pull"]
        if self.r.net:
            return list(NET_METHODS)
        ms = [m for m in METHODS if not (m == "asgd" and w >= 8) and not m.endswith("-ov")]
        return ms + ["asgd lr/p"]

    def one(self, label: str, w: int, seed: int) -> Result:
        flags, tag = [], ""
        if w in self.EPOCHS and not self.quick:
            flags, tag = ["--epochs", str(self.EPOCHS[w])], f"-e{self.EPOCHS[w]}"
        return self.method_run(label, w, seed, flags, tag=tag)

    def run(self) -> dict:
        ws = self.workers()
        runs = {(m, w): [self.one(m, w, s) for s in self.seed_list()] for w in ws for m in self.methods(w)}
        fig, ax = new_figure(2, len(ws))
        table = {}
        for j, w in enumerate(ws):
            for m in self.methods(w):
                rs = runs[(m, w)]
                t, e, lo, hi = mean_curve(rs, "time")
                ax[0, j].plot(t, e, "-", color=COLORS[m], label=m)
                ax[0, j].fill_between(t, lo, hi, color=COLORS[m], alpha=0.15)
                ep, e2, lo2, hi2 = mean_curve(rs, "epoch")
                ax[1, j].plot(ep, e2, "-", color=COLORS[m], label=m)
                ax[1, j].fill_between(ep, lo2, hi2, color=COLORS[m], alpha=0.15)
                table[f"{m}/w{w}"] = dict(method=m, workers=w, ranks=ranks_for(m.split()[0], w),
                                          epochs=rs[0].summary["epochs"], **aggregate(rs))
            ax[0, j].set(title=f"{w} workers, {table[f'{m}/w{w}']['epochs']} epochs",
                         xlabel="training seconds (evaluation excluded)",
                         ylabel="validation top-1 error", yscale="log")
            ax[1, j].set(xlabel="epochs (global samples / train set)", ylabel="validation top-1 error",
                         yscale="log")
            ax[0, j].axhline(TARGET_ERROR, color="k", lw=0.6, ls=":")
        ax[0, 0].legend(fontsize=8)
        print_table(table)
        return self.save(fig, dict(target_error=TARGET_ERROR, seeds=len(self.seed_list()),
                                   runs=table))


def print_table(table: dict) -> None:
    print(f"{'run':>22} {'ranks':>5} {'final err %':>22} {'t to ' + str(TARGET_ERROR) + ' (s)':>22} "
          f"{'img/s':>18} {'s/step':>8}")
    for k, v in table.items():
        print(f"{k:>22} {v.get('ranks', ''):>5} {pm(v['final_error'], 100):>22} "
              f"{pm(v['time_to_target']):>22} {pm(v['images_per_second']):>18} "
              f"{fmt(v['step_seconds']['mean']):>8}")


# ----------------------------------------------------------------------------- 3. stragglers
class Stragglers(Experiment):
    """The last worker rank sleeps U[0, D] ms after each backward pass (seeded), D in delays."""

    name = "stragglers"

    def run(self) -> dict:
        w = 2 if self.quick else 4
        # on emulated nodes: D = 0 and 300 ms with every seed of experiment 2 (whose runs are D = 0)
        delays = [0, 300] if self.quick or self.r.net else [0, 100, 300]
        seeds = self.seed_list() if self.r.net else [0]
        ms = ["allreduce", "gossip-pull"] if self.quick else list(NET_METHODS) if self.r.net else \
            [*(m for m in METHODS if not m.endswith("-ov")), "asgd lr/p"]
        table, fig, ax = {}, *new_figure(1, 2)
        for m in ms:
            last = ranks_for(m.split()[0], w) - 1
            row = []
            for d in delays:
                flags = ["--straggler", f"{last}:{d / 2:g}:{d / 2:g}"] if d else []
                runs = [measures(self.method_run(m, w, s, flags, tag=f"-strag{d}" if d else "")) for s in seeds]
                row.append(dict(delay_ms=d, seeds=len(seeds), **seed_mean(runs)))
            base = row[0]
            for r in row:
                r["slowdown_step"] = r["step_seconds"] / base["step_seconds"]
                r["slowdown_images_per_second"] = base["images_per_second"] / r["images_per_second"]
                r["slowdown_time_to_target"] = (r["time_to_target"] / base["time_to_target"]
                                                if r["time_to_target"] and base["time_to_target"] else None)
            table[m] = row
            ax[0, 0].plot(delays, [r["slowdown_images_per_second"] for r in row], "o-", color=COLORS[m], label=m)
            ax[0, 1].plot(delays, [100 * r["final_error"] for r in row], "o-", color=COLORS[m], label=m)
        ax[0, 0].set(xlabel="straggler delay D (ms, U[0, D] per step on one worker)",
                     ylabel="slow-down of throughput (x)", title=f"{w} workers, one straggler")
        ax[0, 1].set(xlabel="straggler delay D (ms)", ylabel="final validation error (%)")
        ax[0, 0].legend(fontsize=8)
        print(f"{'method':>12} " + " ".join(f"{'D=' + str(d):>26}" for d in delays))
        for m, row in table.items():
            print(f"{m:>12} " + " ".join(
                f"{r['slowdown_images_per_second']:>6.2f}x thr {fmt(r['slowdown_time_to_target'], '.2f'):>5}x tt "
                f"{100 * r['final_error']:>5.2f}%" for r in row))
        return self.save(fig, dict(workers=w, delays_ms=delays, target_error=TARGET_ERROR, runs=table))


# ----------------------------------------------------------------------------- 4. step size
class StepSize(Experiment):
    name = "lr"

    def run(self) -> dict:
        w = 2 if self.quick else 4
        lrs = [0.4, 0.1] if self.quick else [0.4, 0.2, 0.1, 0.05]
        ms = ["allreduce", "gossip-pull"] if self.quick else ["allreduce", "easgd", "gossip-pull", "gossip-push",
                                                               "asgd lr/p"]
        table, fig, ax = {}, *new_figure(1, 2)
        for m in ms:
            row = []
            for lr in lrs:
                if m == "asgd lr/p":                     # the server sums p updates: lr / p each
                    res = self.method_run("asgd", w, 0, ["--lr", f"{lr / w:.4g}"],
                                          tag="-lrp" if lr == 0.1 else f"-lrp{lr:g}")   # = experiment 2's
                    res.method = m
                else:      # lr 0.1 is the config's: the same argv (and run directory) as experiment 2's
                    res = self.method_run(m, w, 0, [] if lr == 0.1 else ["--lr", f"{lr:g}"],
                                          tag="" if lr == 0.1 else f"-lr{lr:g}")
                row.append(dict(lr=lr, **measures(res)))
            table[m] = row
            ax[0, 0].plot(lrs, [100 * r["final_error"] for r in row], "o-", color=COLORS[m], label=m)
            ax[0, 1].plot(lrs, [r["time_to_target"] or np.nan for r in row], "o-", color=COLORS[m], label=m)
        ax[0, 0].set(xscale="log", xlabel="learning rate", ylabel="final validation error (%)",
                     title=f"{w} workers")
        ax[0, 1].set(xscale="log", xlabel="learning rate",
                     ylabel=f"seconds to {100 * TARGET_ERROR:g}% error (gap = never)")
        ax[0, 0].legend(fontsize=8)
        print(f"{'method':>12} " + " ".join(f"{'lr=' + str(lr):>20}" for lr in lrs))
        for m, row in table.items():
            print(f"{m:>12} " + " ".join(f"{100 * r['final_error']:>6.2f}% {fmt(r['time_to_target'], '.1f'):>6}s"
                                         f"{'':>6}" for r in row))
        return self.save(fig, dict(workers=w, lrs=lrs, target_error=TARGET_ERROR, runs=table))


# ----------------------------------------------------------------------------- 5. consensus
class Consensus(Experiment):
    """Gossip with gradients off: benchmarks/consensus.py under mpiexec for each p and variant."""

    name = "consensus"

    def run(self) -> dict:
        ps = [2, 4] if self.quick else [2, 4, 8]
        rounds, reps = (10, 1) if self.quick else (40, 5)
        graphs = ["uniform"] if self.quick else ["uniform", "exponential", "ring"]
        table, fig, ax = {}, *new_figure(len(graphs), 2)
        for i, graph in enumerate(graphs):
            for j, variant in enumerate(("pull", "push")):
                for p in ps:
                    key = f"{variant}/p{p}" if graph == "uniform" else f"{variant}/{graph}/p{p}"
                    out = self.r.out / "runs" / f"consensus-{key.replace('/', '-')}.json"
                    cmd = [*mpi_launcher(p), sys.executable, str(ROOT / "benchmarks" / "consensus.py"),
                           "--variant", variant, "--graph", graph, "--rounds", str(rounds),
                           "--repeats", str(reps), "--json", str(out)]
                    run_checked(cmd, "experiments: consensus", 600)
                    d = json.loads(out.read_text())
                    table[key] = d
                    ax[i, j].plot(np.arange(len(d["distance"])), d["distance"], "o-", ms=3, label=f"p = {p}")
                ax[i, j].set(yscale="log", xlabel="exchanges per rank", ylabel="consensus distance (relative)",
                             title=f"gossip {variant}, {graph} graph, no gradients", ylim=(1e-12, 2))
                ax[i, j].legend(fontsize=8)
        print(f"{'run':>22} {'rate/exchange':>14} {'exchanges to 1e-3':>18} {'mean drift':>11}")
        for k, d in table.items():
            print(f"{k:>22} {d['rate_per_exchange']:>14.3f} {fmt(d['exchanges_to_1e-3']):>18} "
                  f"{d['mean_drift']:>11.2e}")
        return self.save(fig, dict(rounds=rounds, repeats=reps, runs=table))


# ----------------------------------------------------------------------------- 6. easgd
class EASGD(Experiment):
    name = "easgd"

    def run(self) -> dict:
        w = 2 if self.quick else 4
        taus = [1, 4] if self.quick else [1, 4, 16]
        betas = [0.8] if self.quick else [0.8, 0.9]
        table, fig, ax = {}, *new_figure(1, 2)
        from replicas import evaluate_checkpoint  # noqa: PLC0415  (benchmarks/replicas.py)
        for beta in betas:
            row = []
            for tau in taus:
                default = (tau, beta) == (1, 0.8)           # the config's: experiment 2's run
                res = self.method_run("easgd", w, 0, [] if default else ["--tau", str(tau), "--beta", f"{beta:g}"],
                                      tag="" if default else f"-tau{tau}-beta{beta:g}")
                server = [r for r in _read_rank0_server(res)]
                served = server[-1]["served"] if server else None
                nbytes = res.summary["num_params"] * 4
                ev = evaluate_checkpoint(res.data.path)
                row.append(dict(tau=tau, beta=beta, exchanges=served,
                                comm_megabytes=2 * served * nbytes / 1e6 if served else None,
                                center_error=ev["errors"][0], worker_errors=ev["errors"][1:],
                                worker_distance=res.data.val[-1].get("worker_distance"),
                                **measures(res)))
            table[f"beta{beta:g}"] = row
            ax[0, 0].plot([r["comm_megabytes"] for r in row], [100 * r["center_error"] for r in row], "o-",
                          label=f"center, beta {beta:g}")
            ax[0, 0].plot([r["comm_megabytes"] for r in row], [100 * np.mean(r["worker_errors"]) for r in row],
                          "s--", label=f"workers (mean), beta {beta:g}")
            for r in row:
                ax[0, 0].annotate(f"tau {r['tau']}", (r["comm_megabytes"], 100 * r["center_error"]), fontsize=7)
            ax[0, 1].plot(taus, [r["worker_distance"] for r in row], "o-", label=f"beta {beta:g}")
        ax[0, 0].set(xscale="log", xlabel="MB moved through the server", ylabel="final validation error (%)",
                     title=f"EASGD, {w} workers")
        ax[0, 1].set(xscale="log", xlabel="tau", ylabel="mean ||x_i - center|| at the end")
        from matplotlib.ticker import NullFormatter  # noqa: PLC0415
        for a in ax.flat:
            a.xaxis.set_minor_formatter(NullFormatter())
        for a in ax.flat:
            a.legend(fontsize=8)
        print(f"{'beta':>5} {'tau':>4} {'exch':>6} {'MB':>8} {'center err':>10} {'worker errs':>24}")
        for row in table.values():
            for r in row:
                print(f"{r['beta']:>5} {r['tau']:>4} {r['exchanges']:>6} {fmt(r['comm_megabytes'], '.0f'):>8} "
                      f"{100 * r['center_error']:>9.2f}% "
                      f"{' '.join(f'{100 * e:.2f}' for e in r['worker_errors']):>24}")
        return self.save(fig, dict(workers=w, runs=table))


def _read_rank0_server(res: Result) -> list[dict]:
    from scalesgd.io.runs import read_jsonl  # noqa: PLC0415
    return [r for r in read_jsonl(res.data.path / "metrics" / "rank-0.jsonl") if r.get("kind") == "server"]


# ----------------------------------------------------------------------------- 7. A-SGD (Paine)
class ASGD(Experiment):
    """n_sync x clients x cold/warm; warm = from one rank trained for WARM_EPOCHS.  Batch 8, lr
    0.05 / k with k clients (the server adds every client's accumulated update, so k clients step k
    times as often; at lr 0.1 and batch 16 asgd diverged already with 2 clients, experiment 2)."""

    name = "asgd"
    BATCH, LR, EPOCHS, WARM_EPOCHS, WINDOW = 8, 0.05, 3, 1, 50
    TRAIN_TARGET = {"cold": 0.15, "warm": 0.06}   # warm runs start near 12%: a lower target

    def run(self) -> dict:
        syncs = [1, 10] if self.quick else [1, 10, 100]
        ks = [1, 2] if self.quick else [1, 2, 4, 7]
        common = ["--batch-size", str(self.BATCH), "--log-every", "100000"]
        if not self.quick:
            common += ["--epochs", str(self.EPOCHS)]
        warm = self.r.run("asgd-warmup", "single", 1, [*common, "--lr", f"{self.LR:g}",
                                                      "--epochs", str(self.WARM_EPOCHS),
                                                      "--schedule", "constant"], ranks=1)
        table = {}
        fig, ax = new_figure(3, len(syncs))
        for j, ns in enumerate(syncs):
            for start in ("cold", "warm"):
                for k in ks:
                    flags = [*common, "--n-sync", str(ns), "--lr", f"{self.LR / k:.4g}"]
                    deps = []
                    if start == "warm":
                        flags += ["--init-from", str(warm.data.path)]
                        deps = [warm.data.path / "summary.json"]          # a new warm-up: rerun
                    res = self.r.run(f"asgd-k{k}-nsync{ns}-{start}", "asgd", k, flags, deps=deps)
                    t, _, e = merged_training_error(res, self.WINDOW)
                    server = _read_rank0_server(res)
                    hist = server[-1].get("staleness_histogram", {}) if server else {}
                    row = dict(k=k, n_sync=ns, start=start,
                               train_target=self.TRAIN_TARGET[start],
                               time_to_train_target=time_to_train_error(res, self.TRAIN_TARGET[start],
                                                                        self.WINDOW),
                               minibatches_to_train_target=minibatches_to_train_error(
                                   res, self.TRAIN_TARGET[start], self.WINDOW),
                               staleness_histogram=hist,
                               exchanges=server[-1]["served"] if server else None, **measures(res))
                    table[f"k{k}/nsync{ns}/{start}"] = row
                    i = 0 if start == "cold" else 1
                    ax[i, j].plot(t, 100 * e, lw=1, label=f"{k} client{'s' if k > 1 else ''}")
                    if start == "cold" and k > 1 and hist:
                        h = {int(a): b for a, b in hist.items()}
                        n = sum(h.values())
                        xs = sorted(h)
                        ax[2, j].plot(xs, [h[x] / n for x in xs], "o-", ms=3, label=f"{k} clients")
                ax[2, j].set(title=f"n_sync {ns}: staleness (cold)", xlabel="staleness (server updates)",
                             ylabel="fraction of pushes")
                ax[0 if start == "cold" else 1, j].set(
                    title=f"n_sync {ns}, {start} start", xlabel="training seconds",
                    ylabel=f"training error % ({self.WINDOW}-minibatch window)")
        for a in ax.flat:
            a.legend(fontsize=8)
        for i, start in enumerate(("cold", "warm")):
            for a in ax[i]:
                a.axhline(100 * self.TRAIN_TARGET[start], color="k", lw=0.6, ls=":")
        for key, row in table.items():
            one = table[f"k1/nsync{row['n_sync']}/{row['start']}"]
            base = one["time_to_train_target"]
            row["speedup"] = base / row["time_to_train_target"] if base and row["time_to_train_target"] else None
            # with k clients each as fast as the lone one (k GPUs, a server that keeps up), the time to
            # the target scales with minibatches / k: speed-up = k * minibatches(1) / minibatches(k)
            mb1, mbk = one["minibatches_to_train_target"], row["minibatches_to_train_target"]
            row["speedup_k_nodes"] = row["k"] * mb1 / mbk if mb1 and mbk else None
        print(f"{'run':>20} {'t to train err':>14} {'speed-up':>8} {'k-node':>7} {'final val err':>13} "
              f"{'stale mean':>10}")
        for key, row in table.items():
            h = {int(a): b for a, b in row["staleness_histogram"].items()}
            mean = sum(a * b for a, b in h.items()) / max(sum(h.values()), 1)
            row["staleness_mean"] = mean
            print(f"{key:>20} {fmt(row['time_to_train_target'], '.1f'):>14} {fmt(row['speedup'], '.2f'):>8} "
                  f"{fmt(row['speedup_k_nodes'], '.2f'):>7} "
                  f"{100 * row['final_error']:>12.2f}% {mean:>10.2f}")
        return self.save(fig, dict(batch=self.BATCH, lr=self.LR, window=self.WINDOW,
                                   warm_epochs=self.WARM_EPOCHS, train_target=self.TRAIN_TARGET,
                                   warm_val_error=float(warm.val_error[-1]), runs=table))


# ----------------------------------------------------------------------------- 8. past the papers
class Extensions(Experiment):
    """Issue 15's extensions against the papers' versions, on the runs of experiment 2's setup (seed
    0): easgd with K = 2 server shards (each on its own node with --net) at 2, 4, 8 workers and
    K = 4 at 8; asgd (lr/p) with --max-staleness S at 8 workers; overlapped pull gossip on the
    exponential and ring graphs at 8 workers.  K = 1, unbounded staleness and the uniform graph are
    experiment 2's runs (reused when the same run directory exists).  Reports per run the server's
    service time per exchange and utilisation, the worker's wait per step, rejections and the
    staleness histogram, and time and epochs to the target error."""

    name = "extensions"
    STALENESS = 4

    def workers(self) -> list[int]:
        return list(self.only_workers) or ([2] if self.quick else [2, 4, 8])

    def settings(self, w: int) -> list[tuple[str, str, list[str], str]]:
        """(row label, METHODS label, extra flags, run-name tag) at w workers."""
        top = max(self.workers())
        rows = [("easgd K=1", "easgd", [], ""), ("easgd K=2", "easgd", ["--servers", "2"], "-k2")]
        if w == top and not self.quick:
            s = str(self.STALENESS)
            rows += [("easgd K=4", "easgd", ["--servers", "4"], "-k4"),
                     ("asgd lr/p", "asgd lr/p", [], ""),
                     (f"asgd lr/p S={s}", "asgd lr/p", ["--max-staleness", s], f"-s{s}"),
                     ("gossip-pull-ov uniform", "gossip-pull-ov", [], "")]
            rows += [(f"gossip-pull-ov {g}", "gossip-pull-ov", ["--gossip-graph", g], f"-{g}")
                     for g in ("exponential", "ring")]
        return rows

    def run(self) -> dict:
        table, fig, ax = {}, *new_figure(1, 2)
        for w in self.workers():
            for label, method, flags, tag in self.settings(w):
                epochs = Methods.EPOCHS.get(w) if not self.quick else None
                if epochs:
                    flags, tag = [*flags, "--epochs", str(epochs)], f"{tag}-e{epochs}" if tag else f"-e{epochs}"
                res = self.method_run(method, w, 0, flags, tag=tag)
                srv = _read_rank0_server(res)
                last = srv[-1] if srv else {}
                row = dict(label=label, workers=w, epochs=res.summary["epochs"],
                           servers=ranks_for(method.split()[0], w, flags) - w or 1, **measures(res),
                           served=last.get("served"), rejected=last.get("rejected"),
                           staleness_max=last.get("staleness_max"),
                           staleness_histogram=last.get("staleness_histogram"))
                table[f"{label}/w{w}"] = row
                t, e, _, _ = mean_curve([res], "time")
                if w == max(self.workers()):
                    ax[0, 0].plot(t, e, "-", label=label)
        ws = self.workers()
        for k in ("easgd K=1", "easgd K=2"):
            xs = [w for w in ws if f"{k}/w{w}" in table]
            ax[0, 1].plot(xs, [table[f"{k}/w{w}"].get("server_service_ms") for w in xs], "o-", label=k)
        ax[0, 0].set(title=f"{max(ws)} workers", xlabel="training seconds", ylabel="validation top-1 error",
                     yscale="log")
        ax[0, 1].set(xlabel="workers", ylabel="server 0: ms of service per exchange")
        for a in ax[0]:
            a.legend(fontsize=7)
        print(f"{'run':>28} {'final err %':>11} {'t to target':>11} {'s/step':>7} {'wait/step':>9} "
              f"{'service ms':>10} {'util':>5} {'rejected':>8}")
        for k, v in table.items():
            print(f"{k:>28} {100 * v['final_error']:>11.1f} {fmt(v['time_to_target']):>11} "
                  f"{fmt(v['step_seconds']):>7} {fmt(v['split_per_step'].get('wait')):>9} "
                  f"{fmt(v.get('server_service_ms')):>10} {fmt(v.get('server_utilization'), '.2f'):>5} "
                  f"{fmt(v['rejected']):>8}")
        return self.save(fig, dict(target_error=TARGET_ERROR, max_staleness=self.STALENESS, runs=table))


EXPERIMENTS = {"sync": Sync, "methods": Methods, "stragglers": Stragglers, "lr": StepSize,
               "consensus": Consensus, "easgd": EASGD, "asgd": ASGD, "extensions": Extensions}


def main(argv=None) -> int:
    global TARGET_ERROR
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("experiment", choices=[*EXPERIMENTS, "all"])
    ap.add_argument("--quick", action="store_true", help="smoke test: smallest sweep, 1 epoch")
    ap.add_argument("--seeds", type=int, default=2, help="seeds per setting in 'methods' (default 2)")
    ap.add_argument("--out", type=Path, help="default runs/experiments (runs/experiments-quick with --quick)")
    ap.add_argument("--no-publish", action="store_true",
                    help="write results and figures under --out, not benchmarks/results and docs/figures")
    ap.add_argument("--data", default="", help="a dataset directory (make_shards) instead of the digits")
    ap.add_argument("--image-size", type=int, default=0, help="with --data: crop side (default: the config's)")
    ap.add_argument("--model", default="", help="override the config's model (e.g. resnet18)")
    ap.add_argument("--epochs", type=int, default=0, help="with --data: epochs of every run (default 3)")
    ap.add_argument("--target", type=float, default=0.0,
                    help=f"validation error of 'time to target' (default {TARGET_ERROR})")
    ap.add_argument("--tag", default="", help="suffix of the published files (EXPERIMENT-TAG.json/.png)")
    ap.add_argument("--workers", type=int, nargs="+", default=[], help="methods: these worker counts only")
    ap.add_argument("--net", default="", metavar="papers[xF]|RATE",
                    help="run every training on an emulated cluster (benchmarks/netcluster.py; root): one "
                         "rank per node, links at the papers' ratio of transfer to step time (x F), or "
                         "at a fixed RATE such as 300mbit; results are published as EXPERIMENT-net*")
    ap.set_defaults(out=None)
    a = ap.parse_args(argv)
    if a.data:
        a.data = str(Path(a.data).resolve())            # the runs start in the repository root
    if a.out is None:                                   # quick runs never replace the full ones
        a.out = ROOT / "runs" / ("experiments-quick" if a.quick else "experiments")
    a.out = a.out.resolve()
    extra = (["--data", a.data] if a.data else []) + (["--image-size", str(a.image_size)] if a.image_size else []) \
        + (["--model", a.model] if a.model else []) + (["--epochs", str(a.epochs)] if a.epochs else [])
    if a.target:
        TARGET_ERROR = a.target
    if extra and a.out == (ROOT / "runs" / "experiments").resolve():
        a.out = ROOT / "runs" / f"experiments-{Path(a.data).name or a.model}"
    publish = not (a.quick or a.no_publish)
    if extra and publish and not a.tag:
        ap.error("with --data/--image-size/--model, give --tag NAME (or --no-publish): the published "
                 "results of the built-in sweeps would be replaced")
    net = Net(a.net) if a.net else None
    if net:
        a.tag = a.tag or net.tag
        if a.out == (ROOT / "runs" / "experiments").resolve():
            a.out = ROOT / "runs" / f"experiments-{net.tag}"
    runner = Runner(a.out, a.quick, extra=extra, net=net)
    names = list(EXPERIMENTS) if a.experiment == "all" else [a.experiment]
    t = time.perf_counter()
    for name in names:
        print(f"== {name}", flush=True)
        t0 = time.perf_counter()
        EXPERIMENTS[name](runner, a.seeds, publish=publish, tag=a.tag, workers=a.workers).run()
        print(f"== {name}: {time.perf_counter() - t0:.0f}s", flush=True)
    print(f"{runner.launched} runs launched, {runner.reused} reused, {time.perf_counter() - t:.0f}s "
          f"({os.cpu_count()} cores)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
