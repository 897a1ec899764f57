"""Experiment 8: the project's extensions against the papers' versions."""
from __future__ import annotations

from . import runner
from .base import Experiment
from .figures import fmt, new_figure
from .methods import MethodsSweep
from .runner import ranks_for
from .stats import mean_curve, measures, read_rank0_server


class ExtensionsSweep(Experiment):
    """The project's extensions against the papers' versions, on the runs of experiment 2's setup (seed
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
                epochs = MethodsSweep.EPOCHS.get(w) if not self.quick else None
                if epochs:
                    flags, tag = ([*flags, "--epochs", str(epochs)],
                                  f"{tag}-e{epochs}" if tag else f"-e{epochs}")
                res = self.method_run(method, w, 0, flags, tag=tag)
                srv = read_rank0_server(res)
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
        return self.save(fig, dict(target_error=runner.TARGET_ERROR, max_staleness=self.STALENESS,
                                   runs=table))
