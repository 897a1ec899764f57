"""easgd / asgd invariants with fake training, run as ``mpiexec -n P python tests/mpi/server_check.py``.

No model: a replica is a flat float64 array, "training" adds a known integer-valued vector, and a
small driver mirrors ``train/loop.py`` (workers: step -> after_update -> evaluate every boundary the
returned count reached; server: ``serve`` with the same evaluation collective as ``on_boundary``).
"""
import sys
import time
import traceback

from collections import Counter

import numpy as np
from mpi4py import MPI

from scalesgd import config as C
from scalesgd.comm import topology
from scalesgd.methods import Phases
from scalesgd.methods.asgd import ASGD
from scalesgd.methods.easgd import EASGD

TOPO = topology.init()
N = 1000                                   # parameters of the fake replica


class FakePS:
    """What the methods touch of a ParamSet: flat ``params`` and ``buffers``."""

    def __init__(self, n, nb=7, dtype=np.float64):
        self.params = np.arange(n, dtype=dtype) % 13 - 6.0
        self.buffers = np.zeros(nb, dtype=dtype)


def make(cls, **dist):
    name = cls.name
    return cls(C.build(overrides={"train": {"method": name}, "dist": dist}), TOPO)


def fake_grad(rank, step, n):
    """Integer-valued, so sums in float64 are exact."""
    return (np.arange(n) % 7 - 3.0) * rank + (step % 5 + 1)


def drive(comm, method, ps, boundaries, samples=4, jitter=0.0, rng=None):
    """One run; returns (boundaries evaluated in order, [extras], total fake gradient added)."""
    done, extras = [], []
    added = np.zeros_like(ps.params)

    def evaluate(b):
        own_p, own_b = ps.params.copy(), ps.buffers.copy()
        with method.evaluation(ps) as extra:
            ref = ps.params.copy()
            comm.Bcast(ref, root=0)
            assert np.array_equal(ps.params, ref), "evaluated params differ from the server's"
            mean_b = (comm.size) / 2                            # mean of worker buffers 1..p-1
            assert np.allclose(ps.buffers, mean_b), (ps.buffers, mean_b)
            d = 0.0 if method.is_server else float(np.linalg.norm(own_p - ps.params))
            dsum = comm.allreduce(d)
            assert np.isclose(extra["worker_distance"], dsum / (comm.size - 1)), (extra, dsum)
            method.reduce_counts([0, 0, 0])
        assert np.array_equal(ps.params, own_p) and np.array_equal(ps.buffers, own_b), "not restored"
        done.append(b)
        extras.append(extra)

    method.start(ps)
    ps.buffers[...] = -100.0 if method.is_server else comm.rank   # the server's must not count
    phases = Phases(method, boundaries, lambda i: evaluate(boundaries[i]))

    def server_phase(want):
        # the server enters only once every worker was told the first new boundary
        assert method.told.min() >= boundaries[method.phase_done + 1], (method.told, boundaries)
        return phases.run(want)

    if method.is_server:
        method.serve(ps, boundaries, server_phase)
    else:
        gs, step, finished = 0, 0, False
        while not finished:
            g = fake_grad(comm.rank, step, ps.params.size)
            ps.params += g
            added += g
            if jitter and rng.random() < 0.3:
                time.sleep(jitter)
            gs = method.after_update(step, ps, samples)
            step += 1
            finished = phases.check(gs)
        method.samples_fed = step * samples
    method.close()
    all_done = comm.allgather(done)
    assert all(d == all_done[0] for d in all_done), all_done
    assert done == list(boundaries), (done, boundaries)
    comm.Barrier()
    if method.is_server:
        time.sleep(0.001)
        assert not method.port.anything_pending(), "a message was left in flight"
    return done, extras, added


def reduce_sum(comm, a):
    out = np.zeros_like(a)
    comm.Reduce(a, out, op=MPI.SUM, root=0)
    return out


def asgd_applies_every_update_exactly(comm):
    """Final master = initial + every pushed update (bitwise); pushes counted; samples counted."""
    for n_sync in (1, 2, 3):
        ps = FakePS(N)
        w0 = ps.params.copy()
        m = make(ASGD, n_sync=n_sync)
        total = 4 * 6 * m.num_workers
        _, extras, added = drive(comm, m, ps, [total // 2, total])
        pushes = comm.reduce(0 if m.is_server else m.exchanges)
        hists = comm.gather(m.staleness)
        fed = comm.reduce(0 if m.is_server else m.samples_fed)
        added_all = reduce_sum(comm, added)
        if m.is_server:
            assert np.array_equal(ps.params, w0 + added_all), "master != initial + sum of updates"
            assert m.exchanges == m.version == pushes == sum(m.staleness.values()), pushes
            assert sum(hists[1:], Counter()) == m.staleness, "worker and server histograms differ"
            assert m.global_samples == fed >= total, (m.global_samples, fed)
            assert min(m.staleness) >= 0 and m.stats()["staleness_mean"] >= 0
            if m.num_workers == 1:
                assert set(m.staleness) == {0}, m.staleness
            st = m.stats()
            assert st["served"] == pushes and st["staleness_max"] == max(m.staleness)
            assert extras[-1]["server_version"] == m.version
        else:
            assert np.array_equal(ps.params, m.base.arr), "worker did not take the fetched w"
            assert sum(m.staleness.values()) == m.exchanges and min(m.staleness) >= 0
            if m.num_workers == 1:
                assert set(m.staleness) == {0}
            assert m.stats()["exchanges"] == m.exchanges
        # the final replica of each worker is the master of its last fetch; the last fetch
        # overall equals the final master
        last = comm.gather((m.version, ps.params.copy()) if not m.is_server else None)
        if m.is_server:
            v, p = max((x for x in last if x is not None), key=lambda t: t[0])
            assert np.array_equal(p, ps.params)


def easgd_hand_computed_two_ranks(comm):
    """One worker, tau = 1, g = 1 per step: x + c is conserved by each exchange and the gap
    d = x - c after exchange k is r (1 - r^k) / (1 - r), r = 1 - 2 alpha."""
    if comm.size != 2:
        return
    beta, k_steps = 0.3, 9
    ps = FakePS(N)
    x0 = ps.params.copy()
    m = make(EASGD, tau=1, beta=beta)
    assert m.alpha == beta
    total = 4 * k_steps
    boundaries = [12, 20, total]
    if m.is_server:
        m.start(ps)
        ps.buffers[...] = -100.0
        m.serve(ps, boundaries, Phases(m, boundaries, lambda i: _eval_only(comm, m, ps)).run)
        x = np.empty_like(ps.params)
        comm.Recv(x, source=1)
        r = 1 - 2 * beta
        d = r * (1 - r ** k_steps) / (1 - r)
        s = 2 * x0 + k_steps
        np.testing.assert_allclose(x, (s + d) / 2, rtol=1e-13)
        np.testing.assert_allclose(ps.params, (s - d) / 2, rtol=1e-13)
        assert m.exchanges == k_steps and set(m.staleness) == {0}
    else:
        m.start(ps)
        ps.buffers[...] = 1.0
        phases = Phases(m, boundaries, lambda i: _eval_only(comm, m, ps))
        step, finished = 0, False
        while not finished:
            ps.params += 1.0
            gs = m.after_update(step, ps, 4)
            step += 1
            assert gs == 4 * step
            finished = phases.check(gs)
        comm.Send(ps.params, dest=0)
        assert m.exchanges == k_steps and m.stats()["staleness"] == 0


def _eval_only(comm, m, ps):
    with m.evaluation(ps):
        m.reduce_counts([0, 0, 0])


def easgd_conserves_mass(comm):
    """Any tau, any number of workers, any arrival order: sum_i x_i + x~ = p x0 + sum of g
    (each exchange moves e from a worker to the center); staleness >= 0, every push served."""
    for tau in (1, 2, 3):
        ps = FakePS(N)
        x0 = ps.params.copy()
        m = make(EASGD, tau=tau, beta=0.8)
        total = 4 * 7 * m.num_workers
        _, _, added = drive(comm, m, ps, [total // 3, total // 2, total])
        mass = reduce_sum(comm, ps.params)
        added_all = reduce_sum(comm, added)
        stale = comm.gather(m.staleness)
        if m.is_server:
            np.testing.assert_allclose(mass, comm.size * x0 + added_all, rtol=1e-12, atol=1e-9)
            assert all(s >= 0 for h in stale for s in h)
            assert m.exchanges == m.version == sum(sum(h.values()) for h in stale[1:])
            assert sum(stale[1:], Counter()) == m.staleness, "worker and server histograms differ"
            if m.num_workers == 1:
                assert set(m.staleness) == {0}


def repeated_short_runs_terminate(comm):
    """20 short runs per method, random period, batch per worker, boundaries, jitter, sizes."""
    for cls, knob in ((EASGD, "tau"), (ASGD, "n_sync")):
        for run in range(20):
            rng = np.random.default_rng([run, comm.rank])
            shared = np.random.default_rng(run)                 # same on every rank
            period = int(shared.integers(1, 4))
            n = int(shared.choice([10, 1000, 300_000]))          # 2.4 MB: the rendezvous path
            samples = 2 + comm.rank % 3
            total = int(shared.integers(1, 40)) * (comm.size - 1)
            every = int(shared.integers(1, total + 1))
            bounds = list(range(every, total, every)) + [total]
            m = make(cls, **{knob: period})
            drive(comm, m, FakePS(n), bounds, samples=samples, jitter=0.0005, rng=rng)


def run_checks(*checks):
    """Like harness.run_checks, but a failing rank aborts the job at once: the peers of a
    failed parameter-server rank are usually blocked in a point-to-point call, not in a
    collective where they could learn the verdict."""
    comm = MPI.COMM_WORLD
    for check in checks:
        try:
            check(comm)
        except Exception:
            print(f"[rank {comm.rank}] {check.__name__} FAILED:\n{traceback.format_exc()}",
                  file=sys.stderr, flush=True)
            comm.Abort(1)
        comm.Barrier()
        if comm.rank == 0:
            print(f"{check.__name__}: ok", flush=True)


if __name__ == "__main__":
    assert MPI.COMM_WORLD.size >= 2
    run_checks(asgd_applies_every_update_exactly, easgd_hand_computed_two_ranks,
               easgd_conserves_mass, repeated_short_runs_terminate)
