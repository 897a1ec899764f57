"""The base of every sweep: the runner, where the results and figures go, the seeds and one run of a
method label."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

from benchlib import ROOT

from .runner import Result, Runner


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
        return (ROOT / "results" if self.publish else self.r.out) / f"{self.name}.json"

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
