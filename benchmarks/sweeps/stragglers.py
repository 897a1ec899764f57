"""Experiment 3: one straggling worker (a random sleep after each backward pass)."""
from __future__ import annotations

from . import runner
from .base import Experiment
from .figures import fmt, new_figure
from .runner import COLORS, METHODS, NET_METHODS, ranks_for
from .stats import measures, seed_mean


class StragglersSweep(Experiment):
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
                runs = [measures(self.method_run(m, w, s, flags, tag=f"-strag{d}" if d else ""))
                        for s in seeds]
                row.append(dict(delay_ms=d, seeds=len(seeds), **seed_mean(runs)))
            base = row[0]
            for r in row:
                r["slowdown_step"] = r["step_seconds"] / base["step_seconds"]
                r["slowdown_images_per_second"] = base["images_per_second"] / r["images_per_second"]
                r["slowdown_time_to_target"] = (r["time_to_target"] / base["time_to_target"]
                                                if r["time_to_target"] and base["time_to_target"] else None)
            table[m] = row
            ax[0, 0].plot(delays, [r["slowdown_images_per_second"] for r in row], "o-", color=COLORS[m],
                          label=m)
            ax[0, 1].plot(delays, [100 * r["final_error"] for r in row], "o-", color=COLORS[m], label=m)
        ax[0, 0].set(xlabel="straggler delay D (ms, U[0, D] per step on one worker)",
                     ylabel="slow-down of throughput (x)", title=f"{w} workers, one straggler")
        ax[0, 1].set(xlabel="straggler delay D (ms)", ylabel="final validation error (%)")
        ax[0, 0].legend(fontsize=8)
        print(f"{'method':>12} " + " ".join(f"{'D=' + str(d):>26}" for d in delays))
        for m, row in table.items():
            print(f"{m:>12} " + " ".join(
                f"{r['slowdown_images_per_second']:>6.2f}x thr "
                f"{fmt(r['slowdown_time_to_target'], '.2f'):>5}x tt "
                f"{100 * r['final_error']:>5.2f}%" for r in row))
        return self.save(fig, dict(workers=w, delays_ms=delays, target_error=runner.TARGET_ERROR, runs=table))
