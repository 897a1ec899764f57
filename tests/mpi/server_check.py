"""easgd / asgd invariants with fake training, run as ``mpiexec -n P python tests/mpi/server_check.py``.

No model: a replica is a flat float64 array, "training" adds a known integer-valued vector, and a
small driver mirrors ``train/loop.py`` (workers: step -> after_update -> evaluate every boundary the
returned count reached; server: ``serve`` with the same evaluation collective as ``on_boundary``).
"""
import time
from collections import Counter

import numpy as np
from harness import run_checks
from mpi4py import MPI

from scalesgd import config as C
from scalesgd.comm.mpi import start
from scalesgd.comm.mpi.protocol import ServerPort, WorkerPort
from scalesgd.comm.wire import PushHeader, Tag, header, shard_bounds
from scalesgd.methods import create, evaluated
from scalesgd.methods.asgd import ASGD
from scalesgd.methods.easgd import EASGD
from scalesgd.train.control import Control
from scalesgd.train.phases import Phases

TOPO = start.init()
N = 1000                                   # parameters of the fake replica


class FakePS:
    """What the methods touch of a ParamSet: flat ``params`` and ``buffers``."""

    def __init__(self, n, nb=7, dtype=np.float64):
        self.params = np.arange(n, dtype=dtype) % 13 - 6.0
        self.buffers = np.zeros(nb, dtype=dtype)


def make(cls, **dist):
    """The method's exchange (its server role and codec too, here) with its control plane
    (``m.control``) and the whole method (``m.record``): test-only attributes."""
    control = Control(TOPO.transport, TOPO.size)
    record = create(C.build(overrides={"train": {"method": cls.name}, "dist": dist}), TOPO, control.signals)
    m = record.exchange
    assert record.codec is m and record.server is (m if m.roles.is_server else None)
    m.control, m.record = control, record
    return m


def phases_for(m, boundaries, on_boundary):
    return Phases(m.control, boundaries, on_boundary, poll=m.poll_in_phase)


def fake_grad(rank, step, n):
    """Integer-valued, so sums in float64 are exact."""
    return (np.arange(n) % 7 - 3.0) * rank + (step % 5 + 1)


def drive(comm, method, ps, boundaries, samples=4, jitter=0.0, rng=None):
    """One run; returns (boundaries evaluated in order, [extras], total fake gradient added)."""
    done, extras = [], []
    added = np.zeros_like(ps.params)

    def evaluate(b):
        own_p, own_b = ps.params.copy(), ps.buffers.copy()
        with evaluated(method.record, ps) as extra:
            ref = ps.params.copy()
            comm.Bcast(ref, root=0)
            assert np.array_equal(ps.params, ref), "evaluated params differ from the server's"
            k = method.roles.num_servers
            mean_b = (k + comm.size - 1) / 2                    # mean of worker buffers k..p-1
            if method.roles.is_server:              # evaluates nothing: its statistics stay out
                assert np.all(ps.buffers == -100.0), ps.buffers
            else:
                assert np.allclose(ps.buffers, mean_b), (ps.buffers, mean_b)
            d = 0.0 if method.roles.is_server else float(np.linalg.norm(own_p - ps.params))
            dsum = comm.allreduce(d)
            assert np.isclose(extra["worker_distance"], dsum / (comm.size - k)), (extra, dsum)
            method.control.sum_over_ranks([0, 0, 0])
        assert np.array_equal(ps.params, own_p) and np.array_equal(ps.buffers, own_b), "not restored"
        done.append(b)
        extras.append(extra)

    method.start(ps)
    ps.buffers[...] = -100.0 if method.roles.is_server else comm.rank   # the server's must not count
    phases = phases_for(method, boundaries, lambda i: evaluate(boundaries[i]))
    control = method.control

    entries = []        # per phase entered: a shard's exchanges served per worker / a worker's count

    class CheckedPhases:
        """The server's view of the phases: records what each shard had served from each worker
        when it entered a phase (checked below against the workers' own counts)."""

        def due(self, gs, sig):
            return phases.due(gs, sig)

        def enter(self, gs):
            entries.append([int(v) for v in method.served])
            return phases.enter(gs)

    if method.roles.is_server:
        method.serve(ps, CheckedPhases())
    else:
        gs, step, finished = 0, 0, False
        pending = np.zeros_like(ps.params)             # added since the last exchange
        while not finished:
            g = fake_grad(comm.rank, step, ps.params.size)
            ps.params += g
            added += g
            pending += g
            if jitter and rng.random() < 0.3:
                time.sleep(jitter)
            before = (method.exchanges, method.rejected)
            gs = method.after_update(step, ps, samples)
            if method.exchanges != before[0]:
                if method.rejected != before[1]:        # asgd --max-staleness dropped it
                    added -= pending
                pending[...] = 0
            step += 1
            entered = control.phase_done
            finished = phases.check(gs, method.signals.seen)
            if control.phase_done != entered:
                entries.append(method.exchanges)
        method.samples_fed = step * samples
    method.close()
    # every shard entered every phase having served exactly the exchanges each worker had made by
    # then: the worker's last exchange before a phase answered by every shard, none after it
    r = method.roles
    views = comm.allgather((r.is_server, -1 if r.is_server else r.worker_index, entries))
    made = [e for _, _, e in sorted(v for v in views if not v[0])]        # [worker][phase]
    want = [list(col) for col in zip(*made)]                               # [phase][worker]
    for is_server, _, served in views:
        if is_server:
            assert served == want, (served, want)
    all_done = comm.allgather(done)
    assert all(d == all_done[0] for d in all_done), all_done
    assert done == list(boundaries), (done, boundaries)
    comm.Barrier()
    if method.roles.is_server:
        time.sleep(0.001)
        assert nothing_in_flight(method.port.comm), "a message was left in flight"
    return done, extras, added


def nothing_in_flight(comm) -> bool:
    """No parameter-server message (any ``Tag``) waits to be received here: clean termination."""
    return not any(comm.Iprobe(source=MPI.ANY_SOURCE, tag=t) for t in Tag)


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
        total = 4 * 6 * m.roles.num_workers
        _, extras, added = drive(comm, m, ps, [total // 2, total])
        pushes = comm.reduce(0 if m.roles.is_server else m.exchanges)
        hists = comm.gather(m.staleness)
        fed = comm.reduce(0 if m.roles.is_server else m.samples_fed)
        added_all = reduce_sum(comm, added)
        if m.roles.is_server:
            assert np.array_equal(ps.params, w0 + added_all), "master != initial + sum of updates"
            assert m.exchanges == m.version == pushes == sum(m.staleness.values()), pushes
            assert sum(hists[1:], Counter()) == m.staleness, "worker and server histograms differ"
            assert m.global_samples == fed >= total, (m.global_samples, fed)
            assert min(m.staleness) >= 0 and m.stats()["staleness_mean"] >= 0
            if m.roles.num_workers == 1:
                assert set(m.staleness) == {0}, m.staleness
            st = m.stats()
            assert st["served"] == pushes and st["staleness_max"] == max(m.staleness)
            assert extras[-1]["server_version"] == m.version
        else:
            assert np.array_equal(ps.params, m.base.arr), "worker did not take the fetched w"
            assert sum(m.staleness.values()) == m.exchanges and min(m.staleness) >= 0
            if m.roles.num_workers == 1:
                assert set(m.staleness) == {0}
            assert m.stats()["exchanges"] == m.exchanges
        # the final replica of each worker is the master of its last fetch; the last fetch
        # overall equals the final master
        last = comm.gather((m.version, ps.params.copy()) if not m.roles.is_server else None)
        if m.roles.is_server:
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
    if m.roles.is_server:
        m.start(ps)
        ps.buffers[...] = -100.0
        phases = phases_for(m, boundaries, lambda i: _eval_only(comm, m, ps))
        m.serve(ps, phases)
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
        phases = phases_for(m, boundaries, lambda i: _eval_only(comm, m, ps))
        step, finished = 0, False
        while not finished:
            ps.params += 1.0
            gs = m.after_update(step, ps, 4)
            step += 1
            assert gs == 4 * step
            finished = phases.check(gs, m.signals.seen)
        comm.Send(ps.params, dest=0)
        assert m.exchanges == k_steps and m.stats()["staleness"] == 0


def _eval_only(comm, m, ps):
    with evaluated(m.record, ps):
        m.control.sum_over_ranks([0, 0, 0])


def easgd_conserves_mass(comm):
    """Any tau, any number of workers, any arrival order: sum_i x_i + x~ = p x0 + sum of g
    (each exchange moves e from a worker to the center); staleness >= 0, every push served."""
    for tau in (1, 2, 3):
        ps = FakePS(N)
        x0 = ps.params.copy()
        m = make(EASGD, tau=tau, beta=0.8)
        total = 4 * 7 * m.roles.num_workers
        _, _, added = drive(comm, m, ps, [total // 3, total // 2, total])
        mass = reduce_sum(comm, ps.params)
        added_all = reduce_sum(comm, added)
        stale = comm.gather(m.staleness)
        if m.roles.is_server:
            np.testing.assert_allclose(mass, comm.size * x0 + added_all, rtol=1e-12, atol=1e-9)
            assert all(s >= 0 for h in stale for s in h)
            assert m.exchanges == m.version == sum(sum(h.values()) for h in stale[1:])
            assert sum(stale[1:], Counter()) == m.staleness, "worker and server histograms differ"
            if m.roles.num_workers == 1:
                assert set(m.staleness) == {0}


def repeated_short_runs_terminate(comm):
    """12 short runs per method, random period, batch per worker, boundaries, jitter, sizes (20
    took two thirds of this file's time, 34 of 50 s on 4 ranks under load; every run's draws are
    the same as before, the last 8 left out; the real program's runs end in test_demo's too)."""
    for cls, knob in ((EASGD, "tau"), (ASGD, "n_sync")):
        for run in range(12):
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


def sharded_one_worker_is_the_unsharded_rule_bitwise(comm):
    """--servers K = size - 1, one worker, tau = 1: the shards together apply exactly the elastic
    rule of one server (same float operations, element by element), checked against a serial
    replay of it, bit for bit; each shard counts every exchange."""
    k = comm.size - 1
    if k < 2:
        return
    beta, steps = 0.3, 7
    ps = FakePS(N)
    x0 = ps.params.copy()
    m = make(EASGD, tau=1, beta=beta, servers=k)
    assert m.roles.num_servers == k and m.roles.num_workers == 1
    drive(comm, m, ps, [4 * steps])
    if m.roles.is_server:
        m.quiesce(ps)                                    # the servers assemble the whole center
        assert m.exchanges == m.version == steps, (m.exchanges, m.version)
    x = ps.params.copy()
    comm.Bcast(x, root=k)                                # the worker's replica
    c_ref, x_ref, alpha = x0.copy(), x0.copy(), beta     # serial replay of drive + EASGD
    for step in range(steps):
        x_ref += fake_grad(k, step, N)
        e = x_ref.copy()
        e -= c_ref
        e *= alpha                                       # server: c += alpha (x - c), c old
        back = c_ref.copy()
        back -= x_ref
        back *= alpha                                    # worker: x += alpha (c_old - x)
        c_ref += e
        x_ref += back
    assert np.array_equal(x, x_ref), np.abs(x - x_ref).max()
    if comm.rank == 0:
        assert np.array_equal(ps.params, c_ref), np.abs(ps.params - c_ref).max()


def sharded_servers_keep_the_invariants(comm):
    """--servers 2 with several workers: asgd's assembled master = initial + every update
    (bitwise, integer-valued updates); easgd conserves sum_i x_i + center; every shard serves every
    exchange; runs end cleanly (no message in flight) with boundaries and jitter."""
    if comm.size < 4:
        return
    for cls, knob in ((ASGD, "n_sync"), (EASGD, "tau")):
        for period in (1, 2):
            ps = FakePS(N + 3)                          # shards of unequal length
            x0 = ps.params.copy()
            extra = {"beta": 0.8} if cls is EASGD else {}
            m = make(cls, servers=2, **{knob: period}, **extra)
            total = 4 * 5 * m.roles.num_workers
            rng = np.random.default_rng([period, comm.rank])
            _, _, added = drive(comm, m, ps, [total // 2, total], jitter=0.0005, rng=rng)
            served = comm.gather(m.exchanges if m.roles.is_server else 0)
            pushes = comm.reduce(0 if m.roles.is_server else m.exchanges)
            if m.roles.is_server:
                m.quiesce(ps)                           # rank 0 now holds the whole center/master
            own = np.zeros_like(ps.params) if m.roles.is_server else ps.params
            workers_sum = reduce_sum(comm, own)
            added_all = reduce_sum(comm, added)
            if comm.rank == 0:
                assert served[:2] == [pushes, pushes], (served, pushes)
                if cls is ASGD:
                    assert np.array_equal(ps.params, x0 + added_all), "master != initial + updates"
                else:
                    w = m.roles.num_workers
                    np.testing.assert_allclose(workers_sum + ps.params, (w + 1) * x0 + added_all,
                                               rtol=1e-12, atol=1e-9)


def shards_taking_pushes_in_opposite_orders_finish(comm):
    """Two shards take two workers' pushes in opposite orders (shard 0: rank 2 then 3; shard 1: 3
    then 2), which ANY_SOURCE allows since nothing orders messages from different senders: both
    exchanges complete, each shard slice in place.  A worker that waited for every shard to take
    its header before sending any payload deadlocks here (shard 0 waits for rank 2's payload, rank
    2 for shard 1, shard 1 for rank 3's payload, rank 3 for shard 0): a shard fails instead."""
    if comm.size < 4:
        return
    n, shards, workers = 11, [0, 1], [2, 3]
    bounds = shard_bounds(n, len(shards))
    if comm.rank in workers:
        port, got = WorkerPort(comm, shards, bounds), np.zeros(n)
        port.post_reply(got)
        port.send_push(header(PushHeader.SIZE), np.full(n, float(comm.rank)))
        port.finish_push()
        port.wait_reply()
        assert np.array_equal(got, np.full(n, -float(comm.rank))), got
    elif comm.rank in shards:
        port = ServerPort(comm)
        part = np.zeros(bounds[comm.rank + 1] - bounds[comm.rank])
        for src in (workers if comm.rank == 0 else workers[::-1]):
            comm.Recv(port.push_hdr, source=src, tag=Tag.PUSH_HEADER)
            req = comm.Irecv(part, source=src, tag=Tag.PUSH_PAYLOAD)
            deadline = time.monotonic() + 30             # a hang guard, not a timing check
            while not req.Test():
                assert time.monotonic() < deadline, f"shard {comm.rank}: rank {src}'s payload " \
                    "never came after its header (the workers wait for each other: deadlock)"
                time.sleep(0.001)
            assert np.all(part == src), part
            port.send_reply(src, -part)


def asgd_bounded_staleness_holds(comm):
    """--max-staleness S: every applied update is at most S versions stale (the server's
    histogram), the master = initial + exactly the applied updates, and rejected + applied pushes =
    all pushes, on the worker side and the server side alike."""
    if comm.size < 3:
        return
    for bound in (0, 1):
        ps = FakePS(N)
        w0 = ps.params.copy()
        m = make(ASGD, n_sync=1, max_staleness=bound)
        total = 4 * 12 * m.roles.num_workers
        rng = np.random.default_rng([bound, comm.rank])
        _, _, added = drive(comm, m, ps, [total // 2, total], jitter=0.001, rng=rng)
        pushes = comm.reduce(0 if m.roles.is_server else m.exchanges)
        rejected = comm.reduce(0 if m.roles.is_server else m.rejected)
        added_all = reduce_sum(comm, added)
        if m.roles.is_server:
            assert max(m.staleness) <= bound, m.staleness
            assert m.rejected == rejected and m.version + m.rejected == pushes == m.exchanges
            assert np.array_equal(ps.params, w0 + added_all), "master != initial + applied updates"
            assert m.stats()["rejected"] == m.rejected
            if bound == 0:                      # two workers or more: someone is always behind
                assert m.rejected > 0, m.staleness


if __name__ == "__main__":
    assert MPI.COMM_WORLD.size >= 2
    run_checks(asgd_applies_every_update_exactly, easgd_hand_computed_two_ranks,
               easgd_conserves_mass, repeated_short_runs_terminate,
               sharded_one_worker_is_the_unsharded_rule_bitwise,
               shards_taking_pushes_in_opposite_orders_finish, sharded_servers_keep_the_invariants,
               asgd_bounded_staleness_holds)
