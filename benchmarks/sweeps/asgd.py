"""Experiment 7: A-SGD (Paine et al.): n_sync, clients, cold and warm start."""
from __future__ import annotations

from .base import Experiment
from .figures import fmt, new_figure
from .runner import Result
from .stats import measures, merged_training_error, minibatches_to_train_error, read_rank0_server, \
    time_to_train_error


class AsgdSweep(Experiment):
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
                    table[f"k{k}/nsync{ns}/{start}"] = self.one(k, ns, start, common, warm, ax[:, j])
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
        add_speedups(table)
        print_table(table)
        return self.save(fig, dict(batch=self.BATCH, lr=self.LR, window=self.WINDOW,
                                   warm_epochs=self.WARM_EPOCHS, train_target=self.TRAIN_TARGET,
                                   warm_val_error=float(warm.val_error[-1]), runs=table))

    def one(self, k: int, ns: int, start: str, common: list[str], warm: Result, col) -> dict:
        """The run of k clients at n_sync ns from a cold or warm start, its row of the table; plots
        its training error (col[0] cold, col[1] warm) and, cold with k > 1, its staleness (col[2])."""
        flags = [*common, "--n-sync", str(ns), "--lr", f"{self.LR / k:.4g}"]
        deps = []
        if start == "warm":
            flags += ["--init-from", str(warm.data.path)]
            deps = [warm.data.path / "summary.json"]          # a new warm-up: rerun
        res = self.r.run(f"asgd-k{k}-nsync{ns}-{start}", "asgd", k, flags, deps=deps)
        t, _, e = merged_training_error(res, self.WINDOW)
        server = read_rank0_server(res)
        hist = server[-1].get("staleness_histogram", {}) if server else {}
        row = dict(k=k, n_sync=ns, start=start,
                   train_target=self.TRAIN_TARGET[start],
                   time_to_train_target=time_to_train_error(res, self.TRAIN_TARGET[start], self.WINDOW),
                   minibatches_to_train_target=minibatches_to_train_error(
                       res, self.TRAIN_TARGET[start], self.WINDOW),
                   staleness_histogram=hist,
                   exchanges=server[-1]["served"] if server else None, **measures(res))
        col[0 if start == "cold" else 1].plot(t, 100 * e, lw=1, label=f"{k} client{'s' if k > 1 else ''}")
        if start == "cold" and k > 1 and hist:
            h = {int(a): b for a, b in hist.items()}
            n = sum(h.values())
            xs = sorted(h)
            col[2].plot(xs, [h[x] / n for x in xs], "o-", ms=3, label=f"{k} clients")
        return row


def add_speedups(table: dict) -> None:
    """Each row's speed-up over the one client at the same n_sync and start: measured, and on k nodes."""
    for row in table.values():
        one = table[f"k1/nsync{row['n_sync']}/{row['start']}"]
        base = one["time_to_train_target"]
        row["speedup"] = base / row["time_to_train_target"] if base and row["time_to_train_target"] else None
        # with k clients each as fast as the lone one (k GPUs, a server that keeps up), the time to
        # the target scales with minibatches / k: speed-up = k * minibatches(1) / minibatches(k)
        mb1, mbk = one["minibatches_to_train_target"], row["minibatches_to_train_target"]
        row["speedup_k_nodes"] = row["k"] * mb1 / mbk if mb1 and mbk else None


def print_table(table: dict) -> None:
    """Prints the table, adding each row's mean staleness."""
    print(f"{'run':>20} {'t to train err':>14} {'speed-up':>8} {'k-node':>7} {'final val err':>13} "
          f"{'stale mean':>10}")
    for key, row in table.items():
        h = {int(a): b for a, b in row["staleness_histogram"].items()}
        mean = sum(a * b for a, b in h.items()) / max(sum(h.values()), 1)
        row["staleness_mean"] = mean
        print(f"{key:>20} {fmt(row['time_to_train_target'], '.1f'):>14} {fmt(row['speedup'], '.2f'):>8} "
              f"{fmt(row['speedup_k_nodes'], '.2f'):>7} "
              f"{100 * row['final_error']:>12.2f}% {mean:>10.2f}")
