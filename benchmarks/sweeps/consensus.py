"""Experiment 5: gossip with gradients off (benchmarks/consensus.py) on p ranks."""
from __future__ import annotations

import json
import sys

import numpy as np
from benchlib import ROOT, mpi_launcher, run_checked

from .base import Experiment
from .figures import fmt, new_figure


class ConsensusSweep(Experiment):
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
                ax[i, j].set(yscale="log", xlabel="exchanges per rank",
                             ylabel="consensus distance (relative)",
                             title=f"gossip {variant}, {graph} graph, no gradients", ylim=(1e-12, 2))
                ax[i, j].legend(fontsize=8)
        print(f"{'run':>22} {'rate/exchange':>14} {'exchanges to 1e-3':>18} {'mean drift':>11}")
        for k, d in table.items():
            print(f"{k:>22} {d['rate_per_exchange']:>14.3f} {fmt(d['exchanges_to_1e-3']):>18} "
                  f"{d['mean_drift']:>11.2e}")
        return self.save(fig, dict(rounds=rounds, repeats=reps, runs=table))
