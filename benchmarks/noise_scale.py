"""The crossover study's gradient noise scale, measured directly (McCandlish et al. 2018, "An
empirical model of large-batch training", appendix A): B_simple = tr(Sigma) / |G|^2.

The study (``crossover/report.py``) fits the tuned all-reduce's steps to the target against the
global batch, S = S_min (1 + B_crit / B): McCandlish et al.'s critical batch, the noise scale as the
whole run averages it.  This measures the noise scale itself, at the weights a real training run
passes through:

1. one worker trains the proxy (``jobs/glyphs.toml`` on ``data/glyphs/main``) with the study's
   chosen one-worker configuration and seed (its own run: the study's command from the pinned tree,
   without the stop at the target), writing a checkpoint and a validation every ``--every`` epochs;
2. at each checkpoint, ``--batches`` gradients of the training loss, each over one worker's batch
   of 8 augmented training images with batch normalisation in training mode (what a worker computes
   in every method of the study: a global batch of 8p is p such gradients averaged), give
   * tr(Sigma_8) = sum_i |g_i - mean|^2 / (N - 1), the noise of one worker's gradient, and
   * |G|^2 = |mean|^2 - tr(Sigma_8) / N, unbiased for the squared true gradient,
   so B_simple = 8 tr(Sigma_8) / |G|^2 in images, with a 95% interval from a delete-a-group
   jackknife over the N gradients.  (The batches are disjoint draws of one epoch, 8,192 of 51,200
   images: without replacement, which makes B_simple about 1% high.)
3. the value at the study's target (validation error 0.40) is interpolated in log B_simple between
   the two checkpoints around the run's first crossing of the target (its bounds likewise: an
   interpolation, not an interval measured at any one set of weights).

B_simple equals the noise scale B_noise = tr(H Sigma) / G^T H G when the loss's Hessian H is a
multiple of the identity, and approximates it otherwise (McCandlish et al.): an assumption stated
with the number (docs/results.md, section 11).  Output: ``results/noise-scale.json``
(seed 0; ``noise-scale-s<seed>.json`` for the others: the report gives each and their mean).

    python benchmarks/noise_scale.py                 # ~3 min on one core (seed 0)
    python benchmarks/noise_scale.py --seed 1        # another seed's run: noise-scale-s1.json
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from crossover import study as X
from crossover import claims as C
from scalesgd.config import values as V
from scalesgd.data.pipeline import Loader
from scalesgd.data.shards import ShardSet
from scalesgd.io import checkpoint as ckpt
from scalesgd.nn.kernels import Kernels
from scalesgd.nn.resnet import ResNet
from scalesgd.train.step import train_step

ROOT = X.ROOT

OUT = ROOT / "results" / "noise-scale.json"
TARGET = 0.40
GROUPS = 32


def estimate(grads: np.ndarray, batch: int, groups: int = GROUPS) -> dict:
    """B_simple from N gradients (rows of ``grads``), each over ``batch`` samples: the unbiased
    estimates of tr(Sigma_batch) and |G|^2 (McCandlish et al., appendix A, with the per-batch
    gradients' own spread in place of a second batch size), and a 95% interval from a delete-a-group
    jackknife over ``groups`` groups of rows (a bootstrap's repeated rows would bias both
    estimates) of its inverse, r = |G|^2 / (batch tr(Sigma)), which stays smooth where |G|^2 nears 0:
    [1 / r_hi, 1 / r_lo].  Where r_lo is not above 0 the gradient does not stand out of its noise:
    ``b_simple`` is None (``b_simple_point``: the point estimate, if finite) and ``hi`` inf, ``lo``
    still a lower bound."""
    g = np.asarray(grads, np.float64)
    n = len(g)
    parts = np.array_split(np.arange(n), groups)
    sums = np.array([g[q].sum(0) for q in parts])          # each group's sum of gradients
    sqs = np.array([(g[q] ** 2).sum() for q in parts])     # and of their squared norms

    def of(total: np.ndarray, sq: float, k: int) -> tuple[float, float]:
        m2 = float(total @ total) / k ** 2                 # |mean|^2
        tr = (sq - k * m2) / (k - 1)
        return tr, m2 - tr / k                             # tr(Sigma_batch), |G|^2

    tr, g2 = of(sums.sum(0), sqs.sum(), n)
    r = g2 / (batch * tr)
    loo = np.array([(lambda t, q: q / (batch * t))(*of(sums.sum(0) - sums[j], sqs.sum() - sqs[j], n - len(q)))
                    for j, q in enumerate(parts)])
    se = math.sqrt((groups - 1) / groups * float(((loo - loo.mean()) ** 2).sum()))
    t = C.t975(groups - 1)
    r_lo, r_hi = r - t * se, r + t * se
    resolved = r_lo > 0
    return dict(b_simple=1 / r if resolved else None, b_simple_point=1 / r if r > 0 else None,
                lo=1 / r_hi if r_hi > 0 else math.inf, hi=1 / r_lo if resolved else math.inf,
                trace_sigma=float(tr), grad_sq=float(g2), gradients=n, batch=batch, groups=groups)


def at_target(points: list[dict], target: float = TARGET) -> dict | None:
    """B_simple (and its bounds) where the run's validation error first reaches ``target``:
    log-linear in the error between the checkpoints on either side; None if it never does."""
    for a, b in zip(points, points[1:]):
        if a["val_error"] > target >= b["val_error"]:
            w = (a["val_error"] - target) / (a["val_error"] - b["val_error"])
            out = {"samples": a["samples"] + w * (b["samples"] - a["samples"])}
            for k in ("b_simple", "lo", "hi"):
                x, y = a[k], b[k]
                out[k] = (None if x is None or y is None or not (math.isfinite(x) and math.isfinite(y))
                          else float(math.exp((1 - w) * math.log(x) + w * math.log(y))))
            return out
    return None


def gradients(cfg, shards: ShardSet, params: np.ndarray, buffers: np.ndarray, n: int,
              epoch: int) -> np.ndarray:
    """``n`` gradients of the training loss at (params, buffers), each over one batch of the
    training loader's epoch ``epoch`` (its own shuffle and augmentation), BN in training mode."""
    m, d = cfg.model, cfg.data
    model = ResNet(m.model, shards.num_classes, m.width, m.zero_init_residual, np, m.dtype,
                   seed=cfg.train.seed, conv_algo=m.conv_algo, kernels=Kernels(m.kernels))
    out = np.empty((n, model.ps.params.size), np.float32)
    loader = Loader(shards, train=True, augment=d.augment, scale=d.scale, flip=d.flip, lighting=d.lighting,
                    batch_size=d.batch_size, image_size=d.image_size, mean=d.mean, std=d.std, num_threads=1,
                    device_id=None, dtype="float32", val_resize=d.val_resize or None, rank=0, world=1,
                    seed=cfg.train.seed)
    with loader:
        i = 0
        for e in itertools.count(epoch):              # (the next epoch's batches when one is short)
            for x, y in loader.epoch(e):
                model.ps.params[...] = params
                model.ps.buffers[...] = buffers       # (a training-mode forward moves BN's running stats)
                train_step(model, x, y)
                out[i] = model.ps.grads
                i += 1
                if i == n:
                    return out


def train(run_dir: Path, data: Path, config: str, epochs: int, every: float, seed: int,
          tree: Path | None = None) -> list[str]:
    """The study's own one-worker run of ``config`` and ``seed`` (its command, from the pinned
    tree or ``tree``, without the stop at the target), with a checkpoint at each of its validations."""
    wt = tree or X.tree(X.commit())
    argv = [sys.executable, "-m", "scalesgd.virtual", "--config", str(wt / "jobs" / "glyphs.toml"),
            "--data", str(data), *X.flags("single", config, 1), "--seed", str(seed), "--workers", "1",
            "--epochs", str(epochs), "--eval-every", f"{every:g}", "--profile", X.TUNE_NETWORK,
            "--condition", X.TUNE_CONDITION, "--threads", "1", "--checkpoint-every", f"{every:g}",
            "--keep-checkpoints", "1000", "--run-dir", str(run_dir)]
    env = {**os.environ, "PYTHONPATH": str(wt / "src")}
    subprocess.run(argv, check=True, env=env, cwd=wt, stdout=subprocess.DEVNULL)
    return argv[1:]


def history(run_dir: Path) -> dict[int, float]:
    """Global samples -> validation error, from the run's summary."""
    s = json.loads((run_dir / "summary.json").read_text())
    return {int(h["global_samples"]): 1.0 - h["val_top1_accuracy"] for h in s["history"]}


def measure(run_dir: Path, data: Path, batches: int) -> list[dict]:
    cfg = V.build(V.load_toml(ROOT / "jobs" / "glyphs.toml"))
    shards = ShardSet.open(data, "train")
    shards.load()
    errs = history(run_dir)
    points = []
    for path in ckpt.listing(ckpt.checkpoint_dir(run_dir)):
        meta, arrays, _ = ckpt.read_rank(path, 0)
        samples = int(meta["global_samples"])
        if samples not in errs:
            continue
        t = time.monotonic()
        g = gradients(cfg, shards, arrays["params"], arrays["buffers"], batches, epoch=1000)
        e = estimate(g, cfg.data.batch_size)
        points.append(dict(samples=samples, val_error=errs[samples], seconds=time.monotonic() - t, **e))
        b = e["b_simple"]
        print(f"{samples:7d} samples, error {errs[samples]:.3f}: B_simple "
              f"{'unresolved' if b is None else f'{b:.0f}'} [{e['lo']:.0f}–{e['hi']:.0f}]", flush=True)
    return points


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=ROOT / "data" / "glyphs" / "main")
    ap.add_argument("--epochs", type=int, default=2, help="one worker's run (the target: ~1.6)")
    ap.add_argument("--every", type=float, default=X.EVAL_EVERY, help="epochs between checkpoints")
    ap.add_argument("--batches", type=int, default=1024, help="gradients of 8 images per checkpoint")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, help="default: noise-scale.json for seed 0, "
                    "noise-scale-s<seed>.json for another (the report reads them all)")
    a = ap.parse_args()
    a.out = a.out or (OUT if a.seed == 0 else OUT.with_name(f"{OUT.stem}-s{a.seed}.json"))
    st = X.Study()
    config = st.chosen("single", 1, X.TUNE_NETWORK)
    if config is None:
        sys.exit("noise_scale: the study has no one-worker choice yet (run the crossover study first)")
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        t = time.monotonic()
        command = train(run, a.data, config, a.epochs, a.every, a.seed)
        trained = time.monotonic() - t
        points = measure(run, a.data, a.batches)
    sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                         text=True).stdout.strip()
    rec = st.get(X.Run("sweep", "single", 1, config, a.seed, X.TUNE_NETWORK, X.TUNE_CONDITION))
    same = None                     # (the study's record of this seed: its validations, to the target)
    if rec is not None:
        theirs = {round(c["samples"]): c["error"] for c in rec["curve"]}
        ours = {p["samples"]: p["val_error"] for p in points}
        common = sorted(set(theirs) & set(ours))
        same = dict(validations=len(common), equal=all(abs(theirs[k] - ours[k]) < 1e-9 for k in common))
    out = dict(what="B_simple = tr(Sigma) / |G|^2 of one worker's batch-8 gradients (McCandlish et al. 2018, "
                    "appendix A), at checkpoints of one worker's run of the crossover proxy",
               config=config, command=" ".join(os.path.relpath(x, ROOT) if x.startswith(f"{ROOT}/") else x
                                               for x in command[:-2]),
               pinned=X.commit(), seed=a.seed, epochs=a.epochs, every=a.every, target=TARGET,
               batch=8, commit=sha, train_seconds=trained, same_as_study_run=same, points=points,
               at_target=at_target(points))
    a.out.write_text(json.dumps(out, indent=1) + "\n")
    t = out["at_target"]
    print(f"at the target: {t}" if t else "the run did not reach the target")
    return 0


if __name__ == "__main__":
    sys.exit(main())
