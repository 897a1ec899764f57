"""The training loop: (data -> step -> method exchange -> update), evaluation, summary.

Everything here is the same for every method; the method object (``methods/``) is the only part
that communicates.  Progress is counted in global samples (all workers together): the learning rate
is ``lr_at(schedule, global_samples / samples_per_epoch)``, validation happens when the global count
reaches each boundary of ``eval_boundaries``, and training stops at ``epochs * samples_per_epoch``.
Evaluation time (including waiting for the other ranks to reach the boundary) is excluded from the
training time that throughput and time-to-accuracy are computed from, as in Jin et al.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..config import Config, parse_straggler
from ..data.pipeline import Loader
from ..data.shards import ShardSet
from ..io.files import write_json_atomic
from ..io.metrics import MetricsWriter
from ..methods import eval_boundaries
from ..nn.resnet import ResNet
from ..optim.schedule import lr_at
from ..optim.sgd import SGD
from .step import eval_step, train_step


@dataclass
class Setup:
    """Everything a run needs, built (and validated) before anything is written to disk."""

    cfg: Config
    topo: object
    backend: object
    method: object
    model: ResNet
    opt: SGD
    train_data: Loader | None      # None on a server rank
    val_data: Loader | None
    data_root: Path
    train_samples: int             # size of the training split


def build(cfg: Config, topo, backend, method, data_root: Path, data_threads: int) -> Setup:
    """Opens the shards, builds the model (identical init from the seed), optimizer and loaders."""
    train_shards, val_shards = ShardSet.open(data_root, "train"), ShardSet.open(data_root, "val")
    m, d = cfg.model, cfg.data
    model = ResNet(m.model, train_shards.num_classes, m.width, m.zero_init_residual, backend.xp, m.dtype)
    model.ps.initialize(cfg.train.seed)
    opt = SGD(model.ps.params, cfg.optim, model.ps.decay_mask())
    if hasattr(method, "attach"):
        method.attach(model)
    steps = train_shards.num_samples // (d.batch_size * method.num_workers)
    if steps < 1:
        raise ValueError(f"data.batch_size: {d.batch_size} x {method.num_workers} workers exceeds the "
                         f"{train_shards.num_samples} training samples in {data_root}")
    train = val = None
    if not method.is_server:
        common = dict(batch_size=d.batch_size, image_size=d.image_size, mean=d.mean, std=d.std,
                      num_threads=data_threads, device_id=backend.device_id, dtype=m.dtype,
                      val_resize=d.val_resize or None, rank=method.worker_index,
                      world=method.num_workers, seed=cfg.train.seed)
        train = Loader(train_shards, train=True, augment=d.augment, scale=d.scale, flip=d.flip, **common)
        val = Loader(val_shards, train=False, augment="center", flip=False, **common)
    return Setup(cfg, topo, backend, method, model, opt, train, val, data_root, train_shards.num_samples)


class Straggler:
    """Sleeps ``delay +- jitter`` ms after each backward pass on the chosen ranks (seeded)."""

    def __init__(self, spec: str, rank: int, seed: int):
        ranks, self.delay, self.jitter = parse_straggler(spec) if spec else ((), 0.0, 0.0)
        self.active = rank in ranks
        self.rng = np.random.default_rng([seed, rank, 0x57A6])

    def __call__(self) -> None:
        if self.active:
            ms = self.delay + (self.rng.uniform(-self.jitter, self.jitter) if self.jitter else 0.0)
            time.sleep(ms / 1000.0)


def evaluate_local(model, loader: Loader | None) -> np.ndarray:
    """(top-1 correct, top-5 correct, samples) of ``model`` in eval mode on this rank's val part."""
    n = c1 = c5 = 0
    if loader is not None:
        for x, y in loader.epoch(0):
            a, b = eval_step(model, x, y)
            c1, c5, n = c1 + int(a), c5 + int(b), n + len(y)
    return np.array([c1, c5, n], dtype=np.float64)


class Progress:
    """Log lines: per-step loss/error/throughput from the first worker, validation from rank 0
    (with a parameter server these are two different ranks)."""

    def __init__(self, steps: bool, evaluations: bool, every: int):
        self.steps, self.enabled, self.every = steps, evaluations, every

    def step(self, epoch, epochs, step, loss, err, lr, ips):
        if self.steps and step % self.every == 0:
            print(f"epoch {epoch:.2f}/{epochs} step {step} loss {loss:.4f} "
                  f"top1-err {100 * err:5.1f}% lr {lr:.4g} {ips:7.1f} img/s", flush=True)

    def evaluation(self, epoch, epochs, top1, top5, t_train, t_eval, extra):
        if self.enabled:
            more = "".join(f", {k} {v:.4g}" for k, v in extra.items())
            print(f"epoch {epoch:.2f}/{epochs} validation top-1 {100 * top1:.2f}% top-5 {100 * top5:.2f}% "
                  f"(train {t_train:.1f}s, eval {t_eval:.1f}s{more})", flush=True)


class Run:
    """One rank's part of a training run (worker or server)."""

    def __init__(self, s: Setup, run_dir: Path):
        self.s, self.cfg = s, s.cfg
        d = s.cfg.data
        self.spe = (s.train_samples // (d.batch_size * s.method.num_workers)) * d.batch_size \
            * s.method.num_workers                       # global samples per epoch
        self.total = s.cfg.train.epochs * self.spe
        self.boundaries = eval_boundaries(self.total, int(round(s.cfg.dist.eval_every * self.spe)))
        self.metrics = MetricsWriter(run_dir, s.topo.rank)
        self.progress = Progress(s.method.worker_index == 0, s.topo.is_root, s.cfg.train.log_every)
        self.history: list[dict] = []
        self.t_train = self.t_eval = self.t_data = self.t_compute = 0.0
        self.local_samples = 0

    # ------------------------------------------------------------------ evaluation
    def evaluate(self, boundary: int) -> None:
        """Collective over all ranks at a global-sample boundary."""
        s = self.s
        t = time.perf_counter()
        with s.method.evaluation(s.model.ps) as extra:
            counts = s.method.reduce_counts(evaluate_local(s.model, s.val_data))
        self.t_eval += time.perf_counter() - t
        top1, top5 = counts[0] / max(counts[2], 1), counts[1] / max(counts[2], 1)
        rec = dict(epoch=boundary / self.spe, global_samples=boundary, val_top1_accuracy=top1,
                   val_top5_accuracy=top5, val_samples=int(counts[2]), train_seconds=self.t_train,
                   eval_seconds=self.t_eval, **extra)
        if s.method.is_server:                       # the server's own counters, per boundary
            self.metrics.write("server", global_samples=boundary, **s.method.stats())
        self.history.append(rec)
        self.metrics.write("val", **rec)
        self.progress.evaluation(boundary / self.spe, self.cfg.train.epochs, top1, top5, self.t_train,
                                 self.t_eval, extra)

    # ------------------------------------------------------------------ worker
    def work(self) -> None:
        s, cfg, ps = self.s, self.cfg, self.s.model.ps
        straggle = Straggler(cfg.dist.straggler, s.topo.rank, cfg.train.seed)
        gs, step, local_epoch, nxt = 0, 0, 0, 0
        t0 = time.perf_counter()
        while nxt < len(self.boundaries):
            td = time.perf_counter()
            for x, y in s.train_data.epoch(local_epoch):
                tc = time.perf_counter()
                self.t_data += tc - td
                lr = lr_at(cfg.schedule, gs / self.spe, s.method.lr_batch)
                loss, errors = train_step(s.model, x, y, cfg.train.label_smoothing, s.method.grad_scale)
                straggle()
                s.method.after_backward(step, ps)
                s.opt.step(ps.params, ps.grads, lr)
                gs = s.method.after_update(step, ps, len(y))
                loss, err = float(loss), int(errors) / len(y)
                step += 1
                self.local_samples += len(y)
                now = time.perf_counter()
                self.t_compute += now - tc
                train_s = self.t_train + now - t0
                timers = s.method.timers
                self.metrics.write("step", step=step, global_samples=gs, epoch=gs / self.spe,
                                   samples=self.local_samples, loss=loss, top1_error=err, lr=lr,
                                   train_seconds=train_s, data_seconds=self.t_data,
                                   compute_seconds=self.t_compute - sum(timers.values()),
                                   **{f"{k}_seconds": v for k, v in timers.items()},
                                   **s.method.stats())
                self.progress.step(gs / self.spe, cfg.train.epochs, step, loss, err, lr,
                                   self.local_samples * s.method.num_workers / train_s)
                if gs >= self.boundaries[nxt]:
                    self.t_train += time.perf_counter() - t0
                    while nxt < len(self.boundaries) and gs >= self.boundaries[nxt]:
                        self.evaluate(self.boundaries[nxt])
                        nxt += 1
                    t0 = time.perf_counter()
                    if nxt == len(self.boundaries):
                        break
                td = time.perf_counter()
            local_epoch += 1
        self.global_samples = gs

    # ------------------------------------------------------------------ server
    def serve(self) -> None:
        t0 = time.perf_counter()

        def on_boundary(b: int) -> None:
            self.t_train = time.perf_counter() - t0 - self.t_eval     # serving time, evaluations excluded
            self.evaluate(b)

        self.s.method.serve(self.s.model.ps, self.boundaries, on_boundary)
        self.global_samples = self.total

    # ------------------------------------------------------------------ whole run
    def summary(self, wall: float) -> dict:
        s, cfg = self.s, self.cfg
        last = self.history[-1]
        return dict(
            method=cfg.train.method, ranks=s.topo.size, workers=s.method.num_workers,
            model=cfg.model.model, width=cfg.model.width, num_params=s.model.num_params,
            dataset=str(s.data_root), device=s.backend.name, epochs=cfg.train.epochs,
            samples=self.global_samples, global_batch=cfg.data.batch_size * s.method.num_workers,
            val_top1_accuracy=last["val_top1_accuracy"], val_top5_accuracy=last["val_top5_accuracy"],
            best_val_top1_accuracy=max(h["val_top1_accuracy"] for h in self.history),
            images_per_second=self.global_samples / max(self.t_train, 1e-9),
            train_seconds=self.t_train, eval_seconds=self.t_eval, wall_seconds=wall,
            time_split_rank0=dict(data=self.t_data,
                                  compute=self.t_compute - sum(s.method.timers.values()),
                                  **s.method.timers),
            history=self.history)


def train(s: Setup, run_dir: Path) -> dict:
    """Runs the whole schedule on this rank; rank 0 writes ``summary.json``; returns the summary."""
    run = Run(s, run_dir)
    t = time.perf_counter()
    s.method.start(s.model.ps)
    if s.method.is_server:
        run.serve()
    else:
        run.work()
    s.method.close()
    run.metrics.close()
    summary = run.summary(time.perf_counter() - t)
    # rank 0 is a worker or the server; either way it has every evaluation (they are collective)
    if s.topo.is_root:
        write_json_atomic(run_dir / "summary.json", summary)
    return summary
