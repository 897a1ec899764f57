"""Experiment 6: EASGD's communication period tau and moving rate beta."""
from __future__ import annotations

import numpy as np

from .base import Experiment
from .figures import fmt, new_figure
from .stats import measures, read_rank0_server


class EasgdSweep(Experiment):
    name = "easgd"

    def run(self) -> dict:
        w = 2 if self.quick else 4
        taus = [1] if self.quick else [1, 4, 16]     # (quick: a smoke test of the path)
        betas = [0.8] if self.quick else [0.8, 0.9]
        table, fig, ax = {}, *new_figure(1, 2)
        from replicas import evaluate_checkpoint  # noqa: PLC0415  (benchmarks/replicas.py)
        for beta in betas:
            row = []
            for tau in taus:
                default = (tau, beta) == (1, 0.8)           # the config's: experiment 2's run
                res = self.method_run("easgd", w, 0,
                                      [] if default else ["--tau", str(tau), "--beta", f"{beta:g}"],
                                      tag="" if default else f"-tau{tau}-beta{beta:g}")
                server = [r for r in read_rank0_server(res)]
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
            ax[0, 0].plot([r["comm_megabytes"] for r in row],
                          [100 * np.mean(r["worker_errors"]) for r in row],
                          "s--", label=f"workers (mean), beta {beta:g}")
            for r in row:
                ax[0, 0].annotate(f"tau {r['tau']}", (r["comm_megabytes"], 100 * r["center_error"]),
                                  fontsize=7)
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
                print(f"{r['beta']:>5} {r['tau']:>4} {r['exchanges']:>6} "
                      f"{fmt(r['comm_megabytes'], '.0f'):>8} "
                      f"{100 * r['center_error']:>9.2f}% "
                      f"{' '.join(f'{100 * e:.2f}' for e in r['worker_errors']):>24}")
        return self.save(fig, dict(workers=w, runs=table))
