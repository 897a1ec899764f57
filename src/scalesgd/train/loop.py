"""The training loop: epochs of (data -> step -> method exchange -> update), evaluation, summary.

Everything here is the same for every method; the method object (``methods/``) is the only part
that communicates.  Wall time is split into training time (what throughput is computed from) and
evaluation time, which is excluded, as in Jin et al.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from ..config import Config
from ..data.pipeline import Loader
from ..data.shards import ShardSet
from ..io.files import write_json_atomic
from ..io.metrics import MetricsWriter
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
    train_data: Loader
    val_data: Loader
    data_root: Path


def build(cfg: Config, topo, backend, method, data_root: Path, data_threads: int) -> Setup:
    """Opens the shards, builds the model (identical init from the seed), optimizer and loaders."""
    train_shards, val_shards = ShardSet.open(data_root, "train"), ShardSet.open(data_root, "val")
    m, d = cfg.model, cfg.data
    model = ResNet(m.model, train_shards.num_classes, m.width, m.zero_init_residual, backend.xp, m.dtype)
    model.ps.initialize(cfg.train.seed)
    opt = SGD(model.ps.params, cfg.optim, model.ps.decay_mask())
    common = dict(batch_size=d.batch_size, image_size=d.image_size, mean=d.mean, std=d.std,
                  num_threads=data_threads, device_id=backend.device_id, dtype=m.dtype,
                  val_resize=d.val_resize or None)
    train = Loader(train_shards, train=True, augment=d.augment, scale=d.scale, flip=d.flip,
                   rank=method.worker_index, world=method.num_workers, seed=cfg.train.seed, **common)
    val = Loader(val_shards, train=False, augment="center", flip=False, rank=0, world=1,
                 seed=cfg.train.seed, **common)
    if train.steps_per_epoch < 1:
        raise ValueError(f"data.batch_size: {d.batch_size} x {method.num_workers} workers exceeds the "
                         f"{train_shards.num_samples} training samples in {data_root}")
    return Setup(cfg, topo, backend, method, model, opt, train, val, data_root)


def evaluate(model, loader: Loader) -> tuple[float, float, int]:
    """(top-1 accuracy, top-5 accuracy, samples) of ``model`` in eval mode over the loader."""
    n = c1 = c5 = 0
    for x, y in loader.epoch(0):
        a, b = eval_step(model, x, y)
        c1, c5, n = c1 + int(a), c5 + int(b), n + len(y)
    return c1 / max(n, 1), c5 / max(n, 1), n


class Progress:
    """Rank 0's log lines: per-step loss/error/throughput, per-epoch validation."""

    def __init__(self, enabled: bool, every: int):
        self.enabled, self.every = enabled, every

    def step(self, epoch, epochs, step, steps, loss, err, lr, ips):
        if self.enabled and (step % self.every == 0 or step == steps):
            print(f"epoch {epoch + 1}/{epochs} step {step}/{steps} loss {loss:.4f} "
                  f"top1-err {100 * err:5.1f}% lr {lr:.4g} {ips:7.1f} img/s", flush=True)

    def epoch(self, epoch, epochs, top1, top5, t_train, t_eval):
        if self.enabled:
            print(f"epoch {epoch + 1}/{epochs} validation top-1 {100 * top1:.2f}% top-5 {100 * top5:.2f}% "
                  f"(train {t_train:.1f}s, eval {t_eval:.1f}s)", flush=True)


def train(s: Setup, run_dir: Path) -> dict:
    """Runs the whole schedule; writes metrics and ``summary.json``; returns the summary."""
    cfg, ps = s.cfg, s.model.ps
    epochs, steps = cfg.train.epochs, s.train_data.steps_per_epoch
    global_batch = cfg.data.batch_size * s.method.num_workers
    metrics = MetricsWriter(run_dir, s.topo.rank)
    progress = Progress(s.topo.is_root, cfg.train.log_every)
    s.method.start(ps)
    t_train = t_eval = 0.0
    samples, history = 0, []
    t_start = time.perf_counter()
    for epoch in range(epochs):
        t0, t_data = time.perf_counter(), 0.0
        seen = loss_sum = err_sum = 0.0
        td = time.perf_counter()
        for i, (x, y) in enumerate(s.train_data.epoch(epoch)):
            t_data += time.perf_counter() - td
            lr = lr_at(cfg.schedule, epoch + i / steps, global_batch)
            loss, errors = train_step(s.model, x, y, cfg.train.label_smoothing)
            s.method.after_backward(i, ps)
            s.opt.step(ps.params, ps.grads, lr)
            s.method.after_update(i, ps)
            loss, err, n = float(loss), int(errors) / len(y), len(y)
            samples += n
            seen, loss_sum, err_sum = seen + n, loss_sum + loss * n, err_sum + err * n
            elapsed = t_train + time.perf_counter() - t0
            metrics.write("step", epoch=epoch, step=epoch * steps + i + 1, samples=samples, loss=loss,
                          top1_error=err, lr=lr, train_seconds=elapsed)
            progress.step(epoch, epochs, i + 1, steps, loss, err, lr, samples / elapsed)
            td = time.perf_counter()
        t_train += time.perf_counter() - t0
        te = time.perf_counter()
        top1, top5, nval = evaluate(s.model, s.val_data)
        t_eval += time.perf_counter() - te
        rec = dict(epoch=epoch + 1, train_loss=loss_sum / seen, train_top1_error=err_sum / seen,
                   val_top1_accuracy=top1, val_top5_accuracy=top5, val_samples=nval,
                   train_seconds=t_train, data_seconds=t_data)
        history.append(rec)
        metrics.write("val", **rec)
        progress.epoch(epoch, epochs, top1, top5, t_train, t_eval)
    s.method.close()
    metrics.close()
    last = history[-1]
    summary = dict(
        method=cfg.train.method, ranks=s.topo.size, workers=s.method.num_workers, model=cfg.model.model,
        width=cfg.model.width, num_params=s.model.num_params, dataset=str(s.data_root),
        device=s.backend.name, epochs=epochs, samples=samples, global_batch=global_batch,
        val_top1_accuracy=last["val_top1_accuracy"], val_top5_accuracy=last["val_top5_accuracy"],
        best_val_top1_accuracy=max(h["val_top1_accuracy"] for h in history),
        final_train_loss=last["train_loss"], images_per_second=samples / t_train,
        train_seconds=t_train, eval_seconds=t_eval, wall_seconds=time.perf_counter() - t_start,
        history=history)
    if s.topo.is_root:
        write_json_atomic(run_dir / "summary.json", summary)
    return summary
