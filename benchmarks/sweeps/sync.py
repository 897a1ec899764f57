"""Experiment 1: synchronous all-reduce against one rank with the global batch."""
from __future__ import annotations

import numpy as np

from .base import Experiment
from .figures import new_figure
from .runner import COLORS


class SyncSweep(Experiment):
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
