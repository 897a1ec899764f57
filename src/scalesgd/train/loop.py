"""The training loop: (data -> step -> method exchange -> update), evaluation, summary.

Everything here is the same for every method; the method object (``methods/``) is the only part
that communicates.  Progress is counted in global samples (all workers together): the learning rate
is ``lr_at(schedule, global_samples / samples_per_epoch)``, validation happens when the global count
reaches each boundary of ``eval_boundaries``, and training stops at ``epochs * samples_per_epoch``.
Evaluation time (including waiting for the other ranks to reach the boundary) is excluded from the
training time that throughput and time-to-accuracy are computed from, as in Jin et al.
"""
from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import numpy as np

from ..comm import watchdog
from ..data.pipeline import Loader
from ..errors import DataError, Diverged, RunDirError, UserError
from ..io.files import write_json_atomic
from ..io.metrics import MetricsWriter
from ..io.progress import TrainLog
from ..io.summary import time_to_targets
from ..methods import evaluated
from ..optim.schedule import lr_at
from . import checkpointing, resuming
from .assemble import Setup
from .bad_samples import BadSamples
from .rankstate import LoopState
from .faults import Faults, Straggler
from .phases import Phases, Stopped, eval_boundaries  # noqa: F401 - Stopped: re-exported
from .graphstep import stepper_for
from .step import eval_step


def evaluate_local(model, loader: Loader | None) -> np.ndarray:
    """(top-1 correct, top-5 correct, samples) of ``model`` in eval mode on this rank's val part."""
    n = c1 = c5 = 0
    if loader is not None:
        for x, y in loader.epoch(0):
            a, b = eval_step(model, x, y, crops=loader.crops)
            c1, c5, n = c1 + int(a), c5 + int(b), n + len(y)
    return np.array([c1, c5, n], dtype=np.float64)


class Run:
    """One rank's part of a training run (worker or server): the loop, the phases' actions
    (evaluation, checkpoints) and the summary.  The counters a checkpoint keeps are ``self.st``."""

    def __init__(self, s: Setup, run_dir: Path):
        self.run_dir = run_dir
        self.trace = s.control.trace.open(run_dir, s.topo.rank)   # (goes on after a lost rank)
        self.metrics = MetricsWriter(run_dir, s.topo.rank, s.metrics_observer)
        self.progress = TrainLog(s.roles.worker_index == 0, s.topo.is_root, s.cfg.train.log_every,
                                 s.cfg.train.epochs, s.cfg.train.progress)
        self.bind(s)
        self.straggle = Straggler(s.cfg.dist.straggler, s.topo.rank, s.cfg.train.seed, self.net.sleep)
        self.faults = Faults()
        self.st = LoopState()
        self.st.add_blas_threads(s.blas_threads)
        # time of this allocation: a resumed run adds its checkpoint's train and wall seconds
        self.t_start, self.t_excluded = self.clock(), 0.0
        self.train_offset = self.wall_offset = 0.0
        self.last_ckpt_clock = self.clock()
        self.history: list[dict] = []
        self.world_rank = s.topo.rank                     # rank in the job as launched
        self.world_ranks = list(range(s.topo.size))       # ... of each rank now (a rank may die)
        self.failures: list[dict] = []                    # ranks lost and survived (survive.py)
        self.pending_recovery = None                      # clock of a recovery not closed by a step
        self.stopped_at = None                            # global samples where stop_at_error ended it

    def bind(self, s: Setup) -> None:
        """What depends on the job's ranks: its ``Setup``, the epoch's samples and the phase
        boundaries, the clock, the failure detector, the bad-sample tracker, who prints.  Called
        again, with the survivors' ``Setup``, after a lost rank (``survive.py``); the run's files,
        counters, history and clocks go on."""
        self.s, self.cfg = s, s.cfg
        self.spe = s.samples_per_epoch                   # global samples per epoch
        self.total = s.cfg.train.epochs * self.spe
        evals = eval_boundaries(self.total, int(round(s.cfg.dist.eval_every * self.spe)))
        every = s.cfg.train.checkpoint_every
        ckpts = eval_boundaries(self.total, int(round(every * self.spe))) if every else [self.total]
        self.eval_at, self.ckpt_at = set(evals), set(ckpts)
        self.boundaries = sorted(self.eval_at | self.ckpt_at)
        self.phases = Phases(s.control, self.boundaries, self.on_boundary, self.on_checkpoint,
                             poll=s.method.server.poll_in_phase if s.method.server else None,
                             tick=self.tick)
        self.net = s.topo.transport                      # its clock is the run's (virtual: simulated)
        self.clock = self.net.clock
        self.detector = (s.topo.transport.failure_detector()   # (collective) a dead rank, each step
                         if s.cfg.train.on_failure == "continue" and s.topo.size > 1 else None)
        # a collective a rank died in may complete with garbage; None once no peer is left (the
        # signals carry over from a job that had one: survive.rebuilt)
        s.control.signals.check_alive = self.detector.check if self.detector is not None else None
        self.bad = BadSamples(s.topo.transport, s.topo.rank, s.train_data, s.val_data, s.train_samples)
        # the step: eager, or captured in a CUDA graph (train.cuda_graph; the start-up check's say)
        self.step = stepper_for(s.cfg, s.model, s.backend, s.method.gradients.grad_scale, s.fast_paths)
        self.progress.enabled = s.topo.is_root
        self.progress.show_steps(s.roles.worker_index == 0)     # (the first worker may have died)
        self.saving = False                               # inside on_checkpoint

    def adopt(self, o) -> None:
        """The loop's part of a change of the job's ranks (``rankstate.Origin``, after the
        method's ``adopt``): the counters, straggler generator and bad samples of ``o.own``; a
        resume is a new allocation, whose clocks continue the saved ones."""
        own = o.own
        self.st = own.loop
        if o.kind != "survive":
            self.train_offset, self.wall_offset = self.st.train_seconds, self.st.wall_seconds
            self.st.allocations += 1
            self.st.add_blas_threads(self.s.blas_threads)
        if own.straggler is not None:
            self.straggle.rng.bit_generator.state = own.straggler
        self.bad.restore(own.bad_samples)             # counted and warned about once per job
        if o.kind == "same" and own.trace_lines is not None:   # the events after the checkpoint
            self.trace.truncate(int(own.trace_lines))           # never happened

    # ------------------------------------------------------------------ after a lost rank
    def agree_phases(self, done: int, ckpt_done: int, cut: bool) -> None:
        """Collective, continuing on the shrunk job (``done``: the last boundary this rank
        processed, -1 none; ``ckpt_done``: the checkpoint generations it wrote; ``cut``: a
        checkpoint was being written): every survivor continues after the last boundary all of
        them processed (a phase the failure cut short is run again), as this run's boundaries
        (the epoch is whole global batches of the new worker count) place it; history entries past
        it are dropped, and a checkpoint generation not written is due."""
        c = self.s.control
        v = c.max_over_ranks([-done, -ckpt_done, int(cut)])
        done, ckpt, cut = -int(v[0]), -int(v[1]), bool(v[2])
        self.history = [h for h in self.history if h["global_samples"] <= done]
        c.phase_done = self.phases.reached(done) if done >= 0 else -1
        # a checkpoint the death cut short (its phase had counted it done) is due again
        c.ckpt_done = ckpt - 1 if cut else ckpt

    # ------------------------------------------------------------------ evaluation
    def evaluate(self, boundary: int) -> None:
        """Collective over all ranks at a global-sample boundary."""
        s, st = self.s, self.st
        t = self.clock()
        self.faults.inject(self.world_rank, st.step, self.net, "evaluation")
        with evaluated(s.method, s.model.ps) as extra:
            counts = s.control.sum_over_ranks(np.append(evaluate_local(s.model, s.val_data),
                                                        self.bad.report()))
        self.step.invalidate()                       # (evaluation may have regrown a workspace)
        st.eval_seconds += self.clock() - t
        top1, top5 = counts[0] / max(counts[2], 1), counts[1] / max(counts[2], 1)
        rec = dict(epoch=boundary / self.spe, global_samples=boundary, val_top1_accuracy=top1,
                   val_top5_accuracy=top5, val_samples=int(counts[2]), bad_samples=int(counts[3]),
                   train_seconds=st.train_seconds, eval_seconds=st.eval_seconds,
                   workers=s.roles.num_workers, **extra)   # (a resume may change the rank count)
        if s.roles.is_server:                        # the server's own counters, per boundary
            self.metrics.write("server", global_samples=boundary, **s.method.server.stats())
        self.history.append(rec)
        self.metrics.write("val", **rec)
        self.progress.evaluation(boundary / self.spe, self.cfg.train.epochs, top1, top5,
                                 st.train_seconds, st.eval_seconds, extra)

    # ------------------------------------------------------------------ phases
    def train_seconds(self) -> float:
        """Training time so far: wall time of this run (and of the runs it resumes) minus the time
        spent in phases (evaluations, checkpoints, waiting for the other ranks to get there)."""
        return self.train_offset + self.clock() - self.t_start - self.t_excluded

    def wall_seconds(self) -> float:
        """Wall time of this run so far, earlier allocations of a resumed run included."""
        return self.wall_offset + self.clock() - self.t_start

    def on_boundary(self, i: int) -> bool:
        """Phase action for boundary i (collective): evaluates if it is an evaluation boundary;
        True if a checkpoint is due at it (``Phases`` writes it once the phase is complete)."""
        b, t = self.boundaries[i], self.clock()
        self.st.train_seconds = self.train_seconds()
        if b in self.eval_at:
            watchdog.doing(f"evaluating at global sample {b}")
            self.evaluate(b)
            stop, err = self.cfg.train.stop_at_error, 1.0 - self.history[-1]["val_top1_accuracy"]
            if stop and err <= stop and i < len(self.boundaries) - 1:
                self.phases.end_at(i)            # (the same value on every rank: a collective's)
                self.stopped_at = b
                self.t_excluded += self.clock() - t
                return True                      # its final checkpoint
        self.t_excluded += self.clock() - t
        return b in self.ckpt_at

    def on_checkpoint(self, reason: str) -> None:
        """Phase action (collective), after every boundary of the phase was processed."""
        self.saving = True                # (a rank dying meanwhile: the survivors write it again)
        t, done = self.clock(), self.s.control.phase_done
        self.st.train_seconds = self.train_seconds()
        self.st.wall_seconds = self.wall_seconds()
        watchdog.doing(f"writing a checkpoint ({reason}) after boundary {done}")
        self.faults.inject(self.world_rank, self.st.step, self.net, "checkpoint")
        checkpointing.save(self, self.boundaries[done] if done >= 0 else -1, reason)
        self.last_ckpt_clock = self.clock()
        self.t_excluded += self.clock() - t
        self.saving = False

    def tick(self) -> None:
        """Rank 0's clock asks for a checkpoint every ``checkpoint_minutes``.  (Server 0 calls it
        after each push it served: a fault injected on a server counts those as its steps.)"""
        if self.s.roles.is_server:
            self.faults.inject(self.world_rank, self.s.method.server.exchanges, self.net)
        minutes = self.cfg.train.checkpoint_minutes
        if minutes and self.s.topo.is_root and self.clock() - self.last_ckpt_clock > 60 * minutes:
            self.s.control.signals.request_checkpoint()
            self.last_ckpt_clock = self.clock()

    def resume(self, path: Path) -> None:
        """After ``method.start``: continues checkpoint ``path`` (digests checked): the method's
        and the loop's state (``resuming.origin``, then ``adopt``), the history, the phases."""
        s = self.s
        meta, o = resuming.origin(s, path)
        s.method.codec.adopt(s.model.ps, s.opt, o)
        self.adopt(o)
        self.history = meta["history"]
        # boundaries may differ in the resumed run (e.g. more epochs): continue after the last one
        # that was processed, by its global-sample count
        done = meta["boundary_done"]
        s.control.restored(self.phases.reached(done) if done >= 0 else -1, meta["ckpt_done"])
        self.phases.reconcile(path, s.method.global_samples, reshaped=o.old_size != s.topo.size)

    # ------------------------------------------------------------------ worker
    def work(self) -> None:
        s, cfg, ps, m, st = self.s, self.cfg, self.s.model.ps, self.s.method, self.st
        seen = s.control.signals.seen
        gs, batch = m.global_samples, cfg.data.batch_size * s.roles.num_workers
        while not self.phases.finished:          # (a resumed run may already be past its end)
            td = self.clock()
            for x, y in epoch_from(s.train_data, st.local_epoch, st.step_in_epoch):
                tc = self.clock()
                st.data_seconds += tc - td
                lr = lr_at(cfg.schedule, gs / self.spe, batch)
                watchdog.doing(f"training step {st.step}")
                loss, errors = self.step(x, y)
                loss, errors = self.host_values(loss, errors)   # (the GPU's one wait per step)
                finite = math.isfinite(loss)
                if not finite and not m.traits.replicas_identical:
                    raise self.diverged(loss, gs, lr)
                self.straggle()
                self.net.step_done()                 # (virtual: the step's compute time passes)
                diverged = m.gradients.after_backward(st.step, ps, finite)
                if m.traits.check_after == "backward":
                    self.check_alive()
                if diverged:
                    raise self.diverged(loss, gs, lr)
                s.opt.step(ps.params, ps.grads, lr)
                gs = m.exchange.after_update(st.step, ps, len(y), lr)
                st.step += 1
                st.step_in_epoch += 1
                st.local_samples += len(y)
                st.compute_seconds += self.clock() - tc
                self.log_step(gs, loss, errors / len(y), lr)
                self.faults.inject(self.world_rank, st.step, self.net)
                if m.traits.check_after == "update":
                    self.check_alive()
                if self.phases.check(gs, seen):
                    return
                td = self.clock()
            st.local_epoch += 1
            st.step_in_epoch = 0

    def lost_rank(self, exc: BaseException) -> bool:
        """Whether ``exc`` means a rank died and this run survives it (``train.on_failure``)."""
        if self.detector is None or isinstance(exc, (RunDirError, DataError)):
            return False                  # (the user's errors: never a consequence of a death)
        if self.detector.is_failure(exc):
            return True
        try:                              # e.g. a torn read of a dead peer's half-written vector, or
            self.detector.check()         # a "diverged" flag summed by a collective a rank died in
        except Exception:  # noqa: BLE001
            return True
        return False

    def host_values(self, loss, errors) -> tuple[float, int]:
        """``float(loss), int(errors)``.  On a GPU the step's kernels are still running: until they
        are done the method's communication keeps moving (the gradient role's ``progress``: the all-reduce
        starts each bucket's sum as its copy lands), so the sums overlap backward."""
        cupy = None if isinstance(loss, (float, np.generic, np.ndarray)) else sys.modules.get("cupy")
        if cupy is not None:
            done = cupy.cuda.Event(disable_timing=True)
            done.record()
            while not done.done:
                self.s.method.gradients.progress()
                time.sleep(50e-6)
        return float(loss), int(errors)

    def check_alive(self) -> None:
        """Once per step, after the step's last collective (``traits.check_after``): a rank that
        died raises here (``on_failure = continue``), before what a collective it died in returned
        (garbage, under Open MPI over TCP) is used."""
        if self.detector is not None:
            self.detector.check()

    def diverged(self, loss: float, gs: int, lr: float) -> Diverged:
        """The error for a non-finite loss.  Where the replicas are identical (all-reduce), every
        rank learns it at the same step (``gradients.SummedGradients``): a shared error, so rank 0
        alone reports it, naming its own loss."""
        s, st = self.s, self.st
        same = s.method.traits.replicas_identical and s.topo.size > 1
        where = (f"(here, on rank {s.topo.rank}: {loss}; the replicas are identical, so every rank "
                 "stops)" if same else f"on rank {s.topo.rank}")
        exc = Diverged("the training loss became " + ("non-finite" if same else str(loss)) +
                       f" at step {st.step} (epoch {gs / self.spe:.2f}, lr {lr:.4g}) {where}: training "
                       "diverged; lower --lr (or --warmup-epochs) and start again, or --resume from "
                       "an earlier checkpoint with a lower --lr")
        exc.shared = same
        return exc

    def log_step(self, gs: int, loss: float, err: float, lr: float) -> None:
        s, st, timers = self.s, self.st, self.s.method.timers
        if self.pending_recovery is not None:        # the first step after a lost rank
            self.failures[-1]["first_step_seconds"] = self.clock() - self.pending_recovery
            self.metrics.write("recovered", **self.failures[-1])
            self.pending_recovery = None
        s.method.gradients.settle()
        train_s = self.train_seconds()
        self.metrics.write("step", step=st.step, global_samples=gs, epoch=gs / self.spe,
                           samples=st.local_samples, loss=loss, top1_error=err, lr=lr,
                           train_seconds=train_s, data_seconds=st.data_seconds,
                           compute_seconds=st.compute_seconds - sum(timers.values()),
                           **{f"{k}_seconds": v for k, v in timers.items()}, **s.method.exchange.stats())
        self.progress.step(gs / self.spe, st.step, loss, err, lr,
                           st.local_samples * s.roles.num_workers / max(train_s, 1e-9))

    # ------------------------------------------------------------------ server
    def serve(self) -> None:
        if not self.phases.finished:
            self.s.method.server.serve(self.s.model.ps, self.phases)

    # ------------------------------------------------------------------ whole run
    def summary(self, wall: float) -> dict:
        s, cfg, st = self.s, self.cfg, self.st
        last = self.history[-1]
        g = self.total if self.stopped_at is None else self.stopped_at
        s.method.gradients.settle(wait=True)
        timers = s.method.timers
        return dict(
            method=cfg.train.method, ranks=s.topo.size, workers=s.roles.num_workers,
            model=cfg.model.model, width=cfg.model.width, num_params=s.model.num_params,
            dataset=str(s.data_root), device=s.backend.name, epochs=cfg.train.epochs,
            stopped_at_error=None if self.stopped_at is None else dict(
                error=cfg.train.stop_at_error, global_samples=self.stopped_at,
                epochs=self.stopped_at / self.spe),
            samples=g, global_batch=cfg.data.batch_size * s.roles.num_workers,
            val_top1_accuracy=last["val_top1_accuracy"], val_top5_accuracy=last["val_top5_accuracy"],
            best_val_top1_accuracy=max(h["val_top1_accuracy"] for h in self.history),
            bad_samples=last["bad_samples"], time_to_targets=time_to_targets(self.history),
            images_per_second=g / max(st.train_seconds, 1e-9),
            train_seconds=st.train_seconds, eval_seconds=st.eval_seconds, wall_seconds=wall,
            allocations=st.allocations, failures=self.failures, **st.blas_summary(),
            fast_paths=s.fast_paths.to_dict(),
            cuda_graph=dict(captures=self.step.captures, replays=self.step.replays),   # (rank 0's)
            time_split_rank0=dict(data=st.data_seconds,   # (a server computes nothing: its timers)
                                  compute=0.0 if s.roles.is_server else
                                  st.compute_seconds - sum(timers.values()),
                                  **timers),
            history=self.history)


def epoch_from(loader: Loader, epoch: int, start_step: int):
    """Batches ``start_step``.. of ``epoch`` (a resumed run continues mid-epoch)."""
    return loader.epoch(epoch, start_step=start_step) if start_step else loader.epoch(epoch)


def train(s: Setup, run_dir: Path, resume: Path | None = None) -> dict:
    """Runs the schedule on this rank (from checkpoint ``resume`` if given); rank 0 writes
    ``summary.json``; returns the summary.  Raises ``Stopped`` after a stop checkpoint."""
    run = Run(s, run_dir)
    s.method.start(s.model.ps)
    if resume is not None:
        run.resume(resume)
    try:
        recovered = False
        while True:
            try:
                if recovered:                 # a phase the survivors' count calls for, first
                    recovered = False
                    run.phases.check(run.s.method.global_samples, run.s.control.signals.seen)
                run.serve() if run.s.roles.is_server else run.work()
                break
            except Exception as exc:
                if not run.lost_rank(exc):
                    raise
                from .survive import survive  # noqa: PLC0415
                run, recovered = survive(run, exc), True     # the survivors go on: a shrunk job
        run.s.method.close()              # collective (frees windows): only on a path all ranks take
    except Stopped:
        run.s.method.close()
        raise
    except UserError as exc:              # every rank hit it alike: once they all know it (comm/abort),
        if exc.shared:                    # the method frees its windows and communicators
            exc.release = run.s.method.close
        raise
    finally:                              # local only: on an error, MPI_Abort must not be delayed
        run.metrics.close()
        run.progress.close()
        run.trace.close()
        if run.detector is not None:
            run.detector.free()
    s = run.s
    summary = run.summary(run.wall_seconds())
    # rank 0 is a worker or the server; either way it has every evaluation (they are collective)
    if s.topo.is_root:
        try:
            write_json_atomic(run_dir / "summary.json", summary)
        except OSError as exc:
            raise RunDirError(f"{run_dir}/summary.json: cannot write the summary ({exc.strerror or exc}); "
                              "the final checkpoint is in RUN_DIR/checkpoints") from exc
    return summary
