"""The training loop: (data -> step -> method exchange -> update), evaluation, summary.

Everything here is the same for every method; the method object (``methods/``) is the only part
that communicates.  Progress is counted in global samples (all workers together): the learning rate
is ``lr_at(schedule, global_samples / samples_per_epoch)``, validation happens when the global count
reaches each boundary of ``eval_boundaries``, and training stops at ``epochs * samples_per_epoch``.
Evaluation time (including waiting for the other ranks to reach the boundary) is excluded from the
training time that throughput and time-to-accuracy are computed from, as in Jin et al.
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..backend import to_numpy
from ..comm import watchdog
from ..config import Config, parse_straggler
from ..data.pipeline import Loader
from ..data.shards import ShardSet
from ..errors import DataError, Diverged, RunDirError
from ..io import checkpoint as ckpt
from ..io.files import write_json_atomic
from ..io.metrics import MetricsWriter
from ..io.progress import ProgressLine
from ..io.summary import time_to_targets
from ..methods import Phases, Stopped, eval_boundaries
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
    if getattr(backend, "is_gpu", False):          # GPU only: precision and conv path (logged once)
        from .. import backend as backend_mod  # noqa: PLC0415
        from ..nn import cudnn_conv  # noqa: PLC0415
        backend_mod.set_precision(m.precision)
    model = ResNet(m.model, train_shards.num_classes, m.width, m.zero_init_residual, backend.xp, m.dtype,
                   seed=cfg.train.seed)
    if getattr(backend, "is_gpu", False):
        cudnn_conv.attach(model, m.conv_impl, m.precision, backend, m.dtype)
    opt = SGD(model.ps.params, cfg.optim, model.ps.decay_mask())
    steps = train_shards.num_samples // (d.batch_size * method.num_workers)
    if steps < 1:
        raise DataError(f"data.batch_size: {d.batch_size} x {method.num_workers} workers exceeds the "
                        f"{train_shards.num_samples} training samples in {data_root}")
    if steps < 10 and topo.is_root:            # warned once; an explicit batch is kept as set
        logging.warning("warning: an epoch is only %d step(s) (%d training samples / global batch %d "
                        "= %d workers x data.batch_size %d): too few updates to train well; a smaller "
                        "--batch-size gives more", steps, train_shards.num_samples,
                        d.batch_size * method.num_workers, method.num_workers, d.batch_size)
    train = val = None
    if not method.is_server:
        common = dict(batch_size=d.batch_size, image_size=d.image_size, mean=d.mean, std=d.std,
                      num_threads=data_threads, device_id=backend.device_id, dtype=_input_dtype(cfg),
                      val_resize=d.val_resize or None, rank=method.worker_index,
                      world=method.num_workers, seed=cfg.train.seed)
        train = Loader(train_shards, train=True, augment=d.augment, scale=d.scale, flip=d.flip,
                       lighting=d.lighting, **common)
        val = Loader(val_shards, train=False, augment="center", flip=False, ten_crop=d.ten_crop, **common)
    return Setup(cfg, topo, backend, method, model, opt, train, val, data_root, train_shards.num_samples)


def _input_dtype(cfg: Config) -> str:
    """data.output_dtype, or the model's dtype when it is 'model' (float32 unless float16)."""
    want = cfg.data.output_dtype
    return want if want != "model" else ("float16" if cfg.model.dtype == "float16" else "float32")


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
            a, b = eval_step(model, x, y, crops=loader.crops)
            c1, c5, n = c1 + int(a), c5 + int(b), n + len(y)
    return np.array([c1, c5, n], dtype=np.float64)


class Progress:
    """Log lines: per-step progress from the first worker (an updating line on a terminal, plain
    lines every ``log_every`` steps otherwise, as ``train.progress`` says: ``io/progress.py``),
    validation from rank 0 (with a parameter server these are two different ranks)."""

    def __init__(self, steps: bool, evaluations: bool, every: int, epochs: float, mode: str = "auto"):
        self.bar = ProgressLine(epochs, every=every, mode=mode) if steps else None
        self.enabled = evaluations

    def step(self, epoch, step, loss, err, lr, ips):
        if self.bar is not None:
            self.bar.update(step, epoch, loss, err, ips, lr)

    def evaluation(self, epoch, epochs, top1, top5, t_train, t_eval, extra):
        if not self.enabled:
            return
        more = "".join(f", {k} {v:.4g}" for k, v in extra.items())
        line = (f"epoch {epoch:.2f}/{epochs} validation top-1 {100 * top1:.2f}% top-5 {100 * top5:.2f}% "
                f"(train {t_train:.1f}s, eval {t_eval:.1f}s{more})")
        if self.bar is not None:
            self.bar.message(line)
        else:
            print(line, flush=True)

    def close(self):
        if self.bar is not None:
            self.bar.close()


class Run:
    """One rank's part of a training run (worker or server)."""

    def __init__(self, s: Setup, run_dir: Path):
        self.s, self.cfg = s, s.cfg
        d = s.cfg.data
        self.spe = (s.train_samples // (d.batch_size * s.method.num_workers)) * d.batch_size \
            * s.method.num_workers                       # global samples per epoch
        self.total = s.cfg.train.epochs * self.spe
        evals = eval_boundaries(self.total, int(round(s.cfg.dist.eval_every * self.spe)))
        every = s.cfg.train.checkpoint_every
        ckpts = eval_boundaries(self.total, int(round(every * self.spe))) if every else [self.total]
        self.eval_at, self.ckpt_at = set(evals), set(ckpts)
        self.boundaries = sorted(self.eval_at | self.ckpt_at)
        self.phases = Phases(s.method, self.boundaries, self.on_boundary, self.on_checkpoint)
        self.run_dir = run_dir
        self.straggle = Straggler(s.cfg.dist.straggler, s.topo.rank, s.cfg.train.seed)
        self.step = self.local_epoch = self.step_in_epoch = 0
        self.t_start, self.t_excluded, self.train_offset = time.perf_counter(), 0.0, 0.0
        self.wall_offset, self.allocations = 0.0, 1     # earlier allocations of a resumed run
        self.last_ckpt_clock = time.perf_counter()
        self.metrics = MetricsWriter(run_dir, s.topo.rank)
        self.progress = Progress(s.method.worker_index == 0, s.topo.is_root, s.cfg.train.log_every,
                                 s.cfg.train.epochs, s.cfg.train.progress)
        self.history: list[dict] = []
        self.t_train = self.t_eval = self.t_data = self.t_compute = 0.0
        self.local_samples = 0
        self._bad_reported: dict[str, int] = {}

    # ------------------------------------------------------------------ evaluation
    def evaluate(self, boundary: int) -> None:
        """Collective over all ranks at a global-sample boundary."""
        s = self.s
        t = time.perf_counter()
        with s.method.evaluation(s.model.ps) as extra:
            counts = s.method.reduce_counts(np.append(evaluate_local(s.model, s.val_data),
                                                      self.report_bad()))
        self.t_eval += time.perf_counter() - t
        top1, top5 = counts[0] / max(counts[2], 1), counts[1] / max(counts[2], 1)
        rec = dict(epoch=boundary / self.spe, global_samples=boundary, val_top1_accuracy=top1,
                   val_top5_accuracy=top5, val_samples=int(counts[2]), bad_samples=int(counts[3]),
                   train_seconds=self.t_train,
                   eval_seconds=self.t_eval, **extra)
        if s.method.is_server:                       # the server's own counters, per boundary
            self.metrics.write("server", global_samples=boundary, **s.method.stats())
        self.history.append(rec)
        self.metrics.write("val", **rec)
        self.progress.evaluation(boundary / self.spe, self.cfg.train.epochs, top1, top5, self.t_train,
                                 self.t_eval, extra)

    def report_bad(self) -> int:
        """Bad samples (undecodable or corrupt images the loaders skipped and replaced).

        Collective, at each evaluation (every rank, server included): the ranks
        gather the ids of the samples they found since the last evaluation (int64 buffers); each
        distinct sample is warned about once per job, on stderr, by the lowest rank that found it,
        and counted by that rank. Returns this rank's count so far: summed over the ranks it is
        the number of distinct bad samples met. The ranks then merge which training samples they
        have checked (``Loader.merge_checks``): a sample is decoded strictly by one rank, not by
        each (unless two meet it between the same evaluations), and one found bad is skipped
        everywhere without a second warning.
        """
        from ..comm import collectives  # noqa: PLC0415 - only this method talks to MPI directly
        s, rank, comm = self.s, self.s.topo.rank, self.s.method.comm
        new = {sid: (where, why) for ld in (s.train_data, s.val_data) if ld is not None
               for sid, where, why in ld.take_new_bad()}
        ids, src = collectives.allgather_int64(comm, np.fromiter(new, np.int64, len(new)))
        uniq, first = np.unique(ids, return_index=True)     # rank order: first = lowest finder
        for sid in uniq[src[first] == rank].tolist():       # one write per line: lines of
            where, why = new[sid]                           # several ranks never interleave
            sys.stderr.write(f"scalesgd: warning: rank {rank}: skipped undecodable sample {where} "
                             f"({why}; replaced by the next good one)\n")
            sys.stderr.flush()
            self._bad_reported["owned"] = self._bad_reported.get("owned", 0) + 1
        train = s.train_data
        checks = train.checks if train is not None else np.zeros(s.train_samples, np.uint8)
        checks = collectives.allreduce_max_host(comm, checks)
        if train is not None:
            train.merge_checks(checks)
        return self._bad_reported.get("owned", 0)

    # ------------------------------------------------------------------ phases
    def train_seconds(self) -> float:
        """Training time so far: wall time of this run (and of the runs it resumes) minus the time
        spent in phases (evaluations, checkpoints, waiting for the other ranks to get there)."""
        return self.train_offset + time.perf_counter() - self.t_start - self.t_excluded

    def on_boundary(self, i: int) -> bool:
        """Phase action for boundary i (collective): evaluates if it is an evaluation boundary;
        True if a checkpoint is due at it (``Phases`` writes it once the phase is complete)."""
        b, t = self.boundaries[i], time.perf_counter()
        self.t_train = self.train_seconds()
        if b in self.eval_at:
            watchdog.doing(f"evaluating at global sample {b}")
            self.evaluate(b)
        self.t_excluded += time.perf_counter() - t
        return b in self.ckpt_at

    def on_checkpoint(self, reason: str) -> None:
        """Phase action (collective), after every boundary of the phase was processed."""
        t = time.perf_counter()
        self.t_train = self.train_seconds()
        watchdog.doing(f"writing a checkpoint ({reason}) after boundary {self.s.method.phase_done}")
        self.checkpoint(reason)
        self.t_excluded += time.perf_counter() - t

    def tick(self) -> None:
        """Rank 0's clock asks for a checkpoint every ``checkpoint_minutes``."""
        minutes = self.cfg.train.checkpoint_minutes
        if minutes and self.s.topo.is_root and time.perf_counter() - self.last_ckpt_clock > 60 * minutes:
            self.s.method.request_checkpoint()
            self.last_ckpt_clock = time.perf_counter()

    # ------------------------------------------------------------------ checkpoints
    def checkpoint(self, reason: str) -> None:
        """Collective: every rank's state into one file (rank 0 writes), then keep the newest K."""
        s, m, ps = self.s, self.s.method, self.s.model.ps
        m.quiesce(ps)
        g = int(m.max_over_ranks(np.array([m.global_samples], dtype=np.int64))[0])
        arrays, scalars = m.state(ps)
        arrays = {"params": ps.params, "momentum": s.opt.momentum, "buffers": ps.buffers, **arrays}
        arrays = {k: to_numpy(v) for k, v in arrays.items()}
        state = json.dumps({"loop": self.loop_state(), "method": scalars,
                            "straggler": self.straggle.rng.bit_generator.state})
        writer = None
        if s.topo.is_root:
            meta = dict(config=self.cfg.to_dict(), method=m.name, ranks=s.topo.size,
                        model=self.cfg.model.model, num_params=s.model.num_params,
                        layout=layout_signature(ps), global_samples=g,
                        boundary_done=self.boundaries[m.phase_done] if m.phase_done >= 0 else -1,
                        ckpt_done=int(m.seen[1]), reason=reason, history=self.history,
                        created=time.strftime("%Y-%m-%dT%H:%M:%S"))
            writer = ckpt.Writer(ckpt.checkpoint_dir(self.run_dir), g, meta)
        try:
            m.funnel(arrays, state, writer.add_rank if writer else None)
            if writer:
                path = writer.commit()
                ckpt.prune(path.parent, self.cfg.train.keep_checkpoints)
                logging.getLogger("scalesgd").info("checkpoint %s (%s)", path, reason)
        except BaseException:
            if writer:
                writer.abort()
            raise
        self.last_ckpt_clock = time.perf_counter()

    def loop_state(self) -> dict:
        return dict(step=self.step, local_epoch=self.local_epoch, step_in_epoch=self.step_in_epoch,
                    local_samples=self.local_samples, train_seconds=self.t_train,
                    eval_seconds=self.t_eval, data_seconds=self.t_data,
                    compute_seconds=self.t_compute, global_samples=self.s.method.global_samples,
                    wall_seconds=self.wall_seconds(), allocations=self.allocations)

    def wall_seconds(self) -> float:
        """Wall time of this run so far, earlier allocations of a resumed run included."""
        return self.wall_offset + time.perf_counter() - self.t_start

    def restore(self, path: Path) -> None:
        """After ``method.start``: this rank's state from checkpoint ``path`` (digests checked)."""
        s, m, ps = self.s, self.s.method, self.s.model.ps
        meta, arrays, state = ckpt.read_rank(path, s.topo.rank)
        xp = s.backend.xp
        ps.params[...] = xp.asarray(arrays.pop("params"))
        s.opt.momentum[...] = xp.asarray(arrays.pop("momentum"))
        ps.buffers[...] = xp.asarray(arrays.pop("buffers"))
        m.load_state(ps, arrays, state["method"])
        loop = state["loop"]
        self.step, self.local_epoch = loop["step"], loop["local_epoch"]
        self.step_in_epoch, self.local_samples = loop["step_in_epoch"], loop["local_samples"]
        self.train_offset = self.t_train = loop["train_seconds"]
        self.t_eval, self.t_data = loop["eval_seconds"], loop["data_seconds"]
        self.t_compute = loop["compute_seconds"]
        self.wall_offset = loop.get("wall_seconds", loop["train_seconds"] + loop["eval_seconds"])
        self.allocations = loop.get("allocations", 1) + 1
        self.straggle.rng.bit_generator.state = state["straggler"]
        self.history = meta["history"]
        # boundaries may differ in the resumed run (e.g. more epochs): continue after the last one
        # that was processed, by its global-sample count
        m.phase_done = self.phases.reached(meta["boundary_done"]) if meta["boundary_done"] >= 0 else -1
        m.ckpt_done = meta["ckpt_done"]
        m.raised[1] = m.seen[1] = m.ckpt_done       # the clock's next request is a new generation
        self.phases.reconcile(path)

    # ------------------------------------------------------------------ worker
    def work(self) -> None:
        s, cfg, ps, m = self.s, self.cfg, self.s.model.ps, self.s.method
        gs = m.global_samples
        while not self.phases.finished:          # (a resumed run may already be past its end)
            td = time.perf_counter()
            for x, y in epoch_from(s.train_data, self.local_epoch, self.step_in_epoch):
                tc = time.perf_counter()
                self.t_data += tc - td
                lr = lr_at(cfg.schedule, gs / self.spe, m.lr_batch)
                watchdog.doing(f"training step {self.step}")
                loss, errors = train_step(s.model, x, y, cfg.train.label_smoothing, m.grad_scale)
                loss = float(loss)
                if not math.isfinite(loss):
                    raise Diverged(f"the training loss became {loss} at step {self.step} (epoch "
                                   f"{gs / self.spe:.2f}, lr {lr:.4g}) on rank {s.topo.rank}: training "
                                   "diverged; lower --lr (or --warmup-epochs) and start again, or "
                                   "--resume from an earlier checkpoint with a lower --lr")
                self.straggle()
                m.after_backward(self.step, ps)
                s.opt.step(ps.params, ps.grads, lr)
                gs = m.after_update(self.step, ps, len(y))
                self.step += 1
                self.step_in_epoch += 1
                self.local_samples += len(y)
                self.t_compute += time.perf_counter() - tc
                self.log_step(gs, loss, int(errors) / len(y), lr)
                self.tick()
                self.inject_fault()
                if self.phases.check(gs):
                    return
                td = time.perf_counter()
            self.local_epoch += 1
            self.step_in_epoch = 0

    def inject_fault(self) -> None:
        """Testing aid: ``SCALESGD_INJECT_FAULT=RANK:STEP[:MODE]`` acts on that rank after that step,
        to check that a failing rank ends the whole job, never a hang.  MODE ``raise`` (default):
        an exception; ``hang``: this rank blocks for ever in an MPI receive nobody sends (a
        deadlock; only a stop's deadline ends it)."""
        spec = os.environ.get("SCALESGD_INJECT_FAULT")
        if not spec:
            return
        rank, step, *mode = spec.split(":")
        if (int(rank), int(step)) != (self.s.topo.rank, self.step):
            return
        mode = mode[0] if mode else "raise"
        if mode == "hang":
            watchdog.doing(f"hung on purpose (SCALESGD_INJECT_FAULT={spec})")
            self.s.topo.comm.Recv(np.empty(1), source=self.s.topo.rank, tag=32000)
        raise RuntimeError(f"injected fault (SCALESGD_INJECT_FAULT={spec})")

    def log_step(self, gs: int, loss: float, err: float, lr: float) -> None:
        s, timers = self.s, self.s.method.timers
        train_s = self.train_seconds()
        self.metrics.write("step", step=self.step, global_samples=gs, epoch=gs / self.spe,
                           samples=self.local_samples, loss=loss, top1_error=err, lr=lr,
                           train_seconds=train_s, data_seconds=self.t_data,
                           compute_seconds=self.t_compute - sum(timers.values()),
                           **{f"{k}_seconds": v for k, v in timers.items()}, **s.method.stats())
        self.progress.step(gs / self.spe, self.step, loss, err, lr,
                           self.local_samples * s.method.num_workers / max(train_s, 1e-9))

    # ------------------------------------------------------------------ server
    def serve(self) -> None:
        if not self.phases.finished:
            self.s.method.serve(self.s.model.ps, self.boundaries, self.phases.run, self.tick)

    # ------------------------------------------------------------------ whole run
    def summary(self, wall: float) -> dict:
        s, cfg = self.s, self.cfg
        last = self.history[-1]
        g = self.total
        return dict(
            method=cfg.train.method, ranks=s.topo.size, workers=s.method.num_workers,
            model=cfg.model.model, width=cfg.model.width, num_params=s.model.num_params,
            dataset=str(s.data_root), device=s.backend.name, epochs=cfg.train.epochs,
            samples=g, global_batch=cfg.data.batch_size * s.method.num_workers,
            val_top1_accuracy=last["val_top1_accuracy"], val_top5_accuracy=last["val_top5_accuracy"],
            best_val_top1_accuracy=max(h["val_top1_accuracy"] for h in self.history),
            bad_samples=last["bad_samples"], time_to_targets=time_to_targets(self.history),
            images_per_second=g / max(self.t_train, 1e-9),
            train_seconds=self.t_train, eval_seconds=self.t_eval, wall_seconds=wall,
            allocations=self.allocations,
            time_split_rank0=dict(data=self.t_data,      # (a server computes nothing: its timers)
                                  compute=0.0 if s.method.is_server else
                                  self.t_compute - sum(s.method.timers.values()),
                                  **s.method.timers),
            history=self.history)


def epoch_from(loader: Loader, epoch: int, start_step: int):
    """Batches ``start_step``.. of ``epoch`` (a resumed run continues mid-epoch)."""
    return loader.epoch(epoch, start_step=start_step) if start_step else loader.epoch(epoch)


def layout_signature(ps) -> str:
    """A short hash of the parameter layout (names and shapes): checkpoints fit only its model."""
    text = ";".join(f"{sp.name}:{sp.shape}" for sp in ps.layout.specs)
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def warm_start(s: Setup, path: Path) -> None:
    """Every rank takes the weights and BN statistics of ``path``'s rank 0 (the replica, or the
    server's center/master), before ``method.start``; the optimizer state stays fresh.  ``path``
    is a checkpoint file or a run directory (its newest good checkpoint)."""
    if path.is_dir():                                 # a run directory: its newest good checkpoint
        path = ckpt.latest_good(ckpt.checkpoint_dir(path))
    meta, arrays, _ = ckpt.read_rank(path, 0)
    _check_layout(s, path, meta)
    ps = s.model.ps
    ps.params[...] = s.backend.xp.asarray(arrays["params"])
    ps.buffers[...] = s.backend.xp.asarray(arrays["buffers"])


def check_fits(s: Setup, path: Path) -> None:
    """Refuses a checkpoint written for another model (before anything is written or changed)."""
    _check_layout(s, path, ckpt.read_meta(path))


def _check_layout(s: Setup, path: Path, meta: dict) -> None:
    if meta.get("layout") != layout_signature(s.model.ps):
        n = meta.get("num_params")
        raise ckpt.CheckpointError(
            f"{path}: its model ({meta.get('model')}, {n:,} parameters) is not this run's "
            f"({s.cfg.model.model}, {s.model.num_params:,} parameters)" if isinstance(n, int) else
            f"{path}: written for another model than this run's ({s.cfg.model.model})")


def train(s: Setup, run_dir: Path, resume: Path | None = None) -> dict:
    """Runs the schedule on this rank (from checkpoint ``resume`` if given); rank 0 writes
    ``summary.json``; returns the summary.  Raises ``Stopped`` after a stop checkpoint."""
    run = Run(s, run_dir)
    s.method.start(s.model.ps)
    if resume is not None:
        run.restore(resume)
    try:
        run.serve() if s.method.is_server else run.work()
        s.method.close()                  # collective (frees windows): only on a path all ranks take
    except Stopped:
        s.method.close()
        raise
    finally:                              # local only: on an error, MPI_Abort must not be delayed
        run.metrics.close()
        run.progress.close()
    summary = run.summary(run.wall_seconds())
    # rank 0 is a worker or the server; either way it has every evaluation (they are collective)
    if s.topo.is_root:
        try:
            write_json_atomic(run_dir / "summary.json", summary)
        except OSError as exc:
            raise RunDirError(f"{run_dir}/summary.json: cannot write the summary ({exc.strerror or exc}); "
                              "the final checkpoint is in RUN_DIR/checkpoints") from exc
    return summary
