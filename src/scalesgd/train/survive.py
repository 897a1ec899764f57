"""Training on after a rank died (``train.on_failure = "continue"``, under an MPI with ULFM).

The survivors notice the failure at their next communication or at the per-step check
(``comm/failures.Detector``), and each calls ``survive`` with the run it was in:

1. **local**: the method ``abandon``s what was in flight (gossip's courier stops; push-sum folds
   its inbox); the survivor's ``RankState`` is taken (``rankstate.py``);
2. **shrink** (collective among the survivors, the transport's ``shrunk``): every communicator
   of the job is revoked and the world shrunk; the ranks are renumbered in their old order, so
   server shards keep their ranks;
3. **rebuild** on the shrunk communicator what depends on it: topology, control plane, method (new
   windows, ports, buckets, graph), this worker's part of the data; the model, the optimizer and
   the run's files stay;
4. **continue** (collective): the agreed global count (the largest any survivor knew), the last
   phase every survivor completed (an evaluation or checkpoint the failure interrupted is done
   again), the method's and the loop's state (an ``Origin`` of kind "survive", taken by
   the codec's ``adopt`` and ``Run.adopt``, as a resume takes a checkpoint's).  All-reduce's
   replicas become rank 0's (momentum included): a failure inside a step can leave some ranks
   with its update and others without.  Every other method keeps each survivor's own replica.

What is lost: the dead rank's replica, the samples it took since its last report to the global
count, and, for push-sum, its weight and what was pushed to it (reported, then the survivors'
weights are renormalised).  What cannot be survived ends the job with a message naming it: a
server rank died (the center or a shard of it is gone), or too few ranks are left for the method.
The data order is the one the new worker count deals from the global count, as on a resume onto
another rank count: not bitwise.
"""
from __future__ import annotations

import logging
import time

import numpy as np

from ..backend import to_numpy
from ..comm import watchdog
from ..comm.topology import Topology
from ..errors import LostRankError, MethodError
from ..methods import create
from .assemble import Setup, loaders
from .control import Control
from .rankstate import Origin, RankState
from .resuming import data_position

log = logging.getLogger("scalesgd")


def rebuilt(old: Setup, topo: Topology) -> Setup:
    """Collective: ``old``'s run on ``topo``; the same model, optimizer, signals and data."""
    control = Control(topo.transport, topo.size)
    control.signals = old.control.signals        # (the stop relay holds them)
    control.trace = old.control.trace
    method = create(old.cfg, topo, control.signals, control.trace)
    for loader in (old.train_data, old.val_data):
        if loader is not None:
            loader.close()
    train, val = loaders(old.cfg, old.splits, method.roles, old.backend, old.data_threads)
    s = Setup(old.cfg, topo, old.backend, method, control, old.model, old.opt, train, val,
              old.data_root, old.train_samples, old.fast_paths, old.splits, old.data_threads,
              old.blas_threads)
    s.model.set_grad_hook(None)                  # (the old all-reducer's; attach sets its own)
    method.gradients.attach(s.model)
    old_red, new_red = old.method.gradients.engine, method.gradients.engine
    if old_red is not None and new_red is not None and new_red.transport != old_red.transport:
        method.gradients.use_host_transport()              # the start-up check's fallback holds
    return s


def survive(run, cause: BaseException):
    """Collective among the survivors of ``run`` (a ``loop.Run``): the run goes on, bound to the
    shrunk job, with the failure recorded (``run.failures``); returns it."""
    old, t0 = run.s, time.perf_counter()
    m_old, ps = old.method, old.model.ps
    detected = run.train_seconds()
    watchdog.doing("recovering from a lost rank (revoke, shrink)")
    if m_old.gradients.engine is not None and m_old.gradients.engine.transport == "nccl":
        old.topo.transport.shrunk()      # (auto chose NCCL, whose kernels wait on the dead peer)
        raise LostRankError("a rank died and the all-reduce runs on NCCL, which cannot survive it; "
                            "--allreduce-transport host survives; --resume RUN_DIR continues")
    m_old.codec.abandon(ps)
    own = RankState.of_run(run)                      # local: this survivor's state, host copies
    oc = old.control
    phase = (run.boundaries[oc.phase_done] if oc.phase_done >= 0 else -1, oc.ckpt_done, run.saving)
    topo, dead_now, shrink_s = old.topo.transport.shrunk()
    dead = sorted(run.world_ranks[r] for r in dead_now)
    world_ranks = [run.world_ranks[r] for r in range(len(run.world_ranks)) if r not in dead_now]
    servers, method = old.roles.num_servers, old.cfg.train.method
    if any(r < servers for r in dead_now):
        _end(topo.transport, f"{method}: server rank(s) {dead} died, and the center "
                   f"{'shards are' if servers > 1 else 'is'} gone with them: a lost server cannot be "
                   "survived; --resume RUN_DIR continues from the last checkpoint")
    try:                               # too few ranks left, or node groups the method cannot use
        s = rebuilt(old, topo)         # (``create`` checks, on every survivor alike)
    except MethodError as exc:
        _end(topo.transport, f"rank(s) {dead} died and the survivors cannot go on: {exc}")
    if topo.rank == 0:
        log.warning("warning: rank(s) %s of the job died (%s); %d ranks train on (on_failure = "
                    "continue)", dead, _describe(cause), topo.size)
    s.method.start(ps)                               # new windows / ports; replicas = rank 0's
    o = Origin("survive", own, agreed_count(s, m_old.global_samples), old.topo.size,
               old.roles.num_workers)
    if s.method.traits.replicas_identical and topo.size > 1:   # rank 0's replica (``start``) and momentum
        s.method.comm.broadcast(own.momentum, 0)
        o = o.with_replica(to_numpy(ps.params).copy(), own.momentum, to_numpy(ps.buffers).copy())
    loop = o.own.loop                                # this worker's data position: the new
    if not s.roles.is_server and s.samples_per_epoch:   # worker count's order, from the count
        loop.local_epoch, loop.step_in_epoch = data_position(
            o.global_samples, s.samples_per_epoch, s.cfg.data.batch_size * s.roles.num_workers)
    if s.method.traits.lockstep:              # a step's collective may have completed on some ranks only
        loop.step = int(s.control.max_over_ranks([loop.step])[0])
    extra = s.method.codec.adopt(ps, s.opt, o)
    run.bind(s)
    run.adopt(o)
    run.world_ranks = world_ranks
    run.agree_phases(*phase)
    took = float(s.control.max_over_ranks([int(1e6 * (time.perf_counter() - t0))])[0]) / 1e6
    record = dict(ranks=dead, global_samples=o.global_samples, train_seconds=detected,
                  workers=s.roles.num_workers, shrink_seconds=shrink_s, recovery_seconds=took,
                  cause=_describe(cause), **extra)
    run.failures.append(record)
    run.metrics.write("failure", **record)
    run.pending_recovery = t0                        # the next completed step closes it
    watchdog.doing("continuing after a lost rank")
    # the same signals everywhere: the phase the caller runs next (``loop.train``) is due on every
    # rank alike (a worker must not push to a server that is in a phase)
    s.control.signals.merge(s.control.max_over_ranks(s.control.signals.seen))
    return run


def agreed_count(s, mine: int) -> int:
    """Collective on the shrunk job: the global count it continues from: the largest any survivor
    knew, or, where the replicas are identical (all-reduce), rank 0's, whose replica they take."""
    if s.method.traits.replicas_identical and s.topo.size > 1:
        got = np.array([mine], np.int64)
        s.method.comm.broadcast(got, 0)
        return int(got[0])
    return int(s.control.max_over_ranks([mine])[0])


def _end(transport, message: str) -> None:
    """Ends the job from the survivors: their rank 0 raises (its error handler aborts every
    process); the others wait for that abort, so the message is printed once."""
    if transport.rank == 0:
        raise LostRankError(message)
    transport.barrier()
    raise LostRankError(message)        # (not reached: rank 0's abort ends this process)


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:160]
