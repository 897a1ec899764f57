"""Launching the sweeps' training runs: the constants they share, the emulated cluster (``--net``),
one finished run (``Result``) and the ``Runner`` that launches or reuses run directories."""
from __future__ import annotations

import hashlib
import json
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from benchlib import ROOT, mpi_launcher, rank_env, run_checked

from scalesgd.choices import ranks_for as job_ranks
from scalesgd.io.runs import RunData, load_run

JOB = ROOT / "jobs" / "experiments.toml"
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
# (a module global: experiments.py --target replaces it, so read it as runner.TARGET_ERROR at call time)


def ranks_for(method: str, workers: int, flags=()) -> int:
    """Ranks of a run: the workers, plus the server shards (``--servers K``, default 1)."""
    flags = list(flags)
    servers = int(flags[flags.index("--servers") + 1]) if "--servers" in flags else 1
    return job_ranks(method, workers, servers)


# ----------------------------------------------------------------------------- emulated cluster
# The papers' regime as a ratio: one transfer of the model over one link against one step's compute,
# on an A100 cluster (docs/results.md, section 8): ResNet-18 (46.8 MB of float32) over 100 Gb/s
# InfiniBand at 80% efficiency (10 GB/s) is 4.68 ms, against 30.2 ms of A100 compute per step
# (batch 64: the published 938 img/s of ResNet-50 in TF32, scaled by the two models' FLOPs)  ->
# r = 0.155.
RESNET18_PARAMS = 11_689_512                  # torchvision's resnet18
RESNET50_GMAC, RESNET18_GMAC = 4.09, 1.81      # multiply-accumulates per 224 px image


def papers_ratio() -> float:
    step = 64 / 938.0 * RESNET18_GMAC / RESNET50_GMAC          # s: the stated A100 step
    return RESNET18_PARAMS * 4 / (100e9 / 8 * 0.8) / step


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
            shm = ROOT / "results" / "methods.json"
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
                             f"workers in results/methods.json (has {sorted(self.step)})")
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


# --quick: a smoke test of the whole path, whose numbers mean nothing: one epoch, 16-pixel crops
# (the digits are 8 x 8 images; a quarter of the 32-pixel job's arithmetic)
QUICK = ["--epochs", "1", "--eval-every", "0.5", "--image-size", "16", "--scale", "16,20"]


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
                "--run-dir", str(run_dir), *(QUICK if self.quick else []),
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
