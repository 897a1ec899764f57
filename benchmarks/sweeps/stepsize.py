"""Experiment 4: the methods across learning rates."""
from __future__ import annotations

import numpy as np

from . import runner
from .base import Experiment
from .figures import fmt, new_figure
from .runner import COLORS
from .stats import measures


class StepSizeSweep(Experiment):
    name = "lr"

    def run(self) -> dict:
        w = 2 if self.quick else 4
        lrs = [0.4, 0.1] if self.quick else [0.4, 0.2, 0.1, 0.05]
        ms = (["allreduce", "gossip-pull"] if self.quick
              else ["allreduce", "easgd", "gossip-pull", "gossip-push", "asgd lr/p"])
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
                     ylabel=f"seconds to {100 * runner.TARGET_ERROR:g}% error (gap = never)")
        ax[0, 0].legend(fontsize=8)
        print(f"{'method':>12} " + " ".join(f"{'lr=' + str(lr):>20}" for lr in lrs))
        for m, row in table.items():
            print(f"{m:>12} " + " ".join(f"{100 * r['final_error']:>6.2f}% "
                                         f"{fmt(r['time_to_target'], '.1f'):>6}s"
                                         f"{'':>6}" for r in row))
        return self.save(fig, dict(workers=w, lrs=lrs, target_error=runner.TARGET_ERROR, runs=table))
