"""Experiment 2: every method at 2, 4 and 8 workers, mean and spread over seeds."""
from __future__ import annotations

from . import runner
from .base import Experiment
from .figures import fmt, new_figure, pm
from .runner import COLORS, METHODS, NET_METHODS, Result, ranks_for
from .stats import aggregate, mean_curve


class MethodsSweep(Experiment):
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
            ax[0, j].axhline(runner.TARGET_ERROR, color="k", lw=0.6, ls=":")
        ax[0, 0].legend(fontsize=8)
        print_table(table)
        return self.save(fig, dict(target_error=runner.TARGET_ERROR, seeds=len(self.seed_list()),
                                   runs=table))


def print_table(table: dict) -> None:
    print(f"{'run':>22} {'ranks':>5} {'final err %':>22} {'t to ' + str(runner.TARGET_ERROR) + ' (s)':>22} "
          f"{'img/s':>18} {'s/step':>8}")
    for k, v in table.items():
        print(f"{k:>22} {v.get('ranks', ''):>5} {pm(v['final_error'], 100):>22} "
              f"{pm(v['time_to_target']):>22} {pm(v['images_per_second']):>18} "
              f"{fmt(v['step_seconds']['mean']):>8}")
