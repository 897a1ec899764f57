"""gossip invariants, run as ``mpiexec -n P python tests/mpi/gossip_check.py [protocol] [method]``.

protocol (ranks 0 and 1 act, P >= 2): no RMA call waits for a target busy outside MPI; a pull reader
never sees a torn vector while the writer republishes as fast as it can.
method: pull and push gossip with gradients off drive the consensus distance to ~0; push-sum
conserves sum w_i x_i and sum w_i; the global sample counter is exact; evaluation averages exactly.
Measured numbers are printed by rank 0 as ``measured: ...`` lines.
"""
import sys
import time
from types import SimpleNamespace

import numpy as np
from harness import run_checks
from mpi4py import MPI

from scalesgd import config as C
from scalesgd.comm import topology
from scalesgd.comm.window import SampleCounter, Inbox, PublishedVector
from scalesgd.methods import mixing
from scalesgd.methods import create, evaluated
from scalesgd.train.control import Signals

TOPO = topology.init()
BIG = 4 * 1024 * 1024                       # 4M float32 = 16 MB per copy: a wrong protocol would tear


ERRS: list[str] = []


def expect(cond, msg="") -> None:
    """A failed expectation is recorded, not raised, so every rank still runs every collective of
    the check (a rank leaving early would deadlock the others); ``soft`` raises at the end."""
    if not cond:
        ERRS.append(str(msg))


def soft(check):
    def wrapped(comm):
        ERRS.clear()
        check(comm)
        assert not ERRS, "\n".join(ERRS)
    wrapped.__name__ = check.__name__
    return wrapped


def say(comm, msg):
    if comm.rank == 0:
        print(f"measured: {msg}", flush=True)


@soft
def rma_calls_do_not_wait_for_a_busy_target(comm):
    """Rank 0 (the target, and the global counter's root, as in the method) sleeps 1 s outside MPI
    after setup; rank 1's Get of its 4M-float vector, Accumulate into its inbox and Fetch_and_op on
    its counter must each finish in < 0.2 s."""
    pub, inbox, counter = PublishedVector(comm, BIG, np.float32), Inbox(comm, 1001, np.float32), \
        SampleCounter(comm, root=0)
    pub.publish(np.full(BIG, 10.0 + comm.rank, np.float32))
    out = np.empty(BIG, np.float32)
    comm.Barrier()
    times = {}
    if comm.rank == 0:
        time.sleep(1.0)                                  # busy outside MPI
    elif comm.rank == 1:
        time.sleep(0.1)                                  # make sure rank 0 is asleep
        t = t_begin = time.perf_counter()
        version, retries = pub.read(0, out)
        times["get"] = time.perf_counter() - t
        expect(version == 1 and retries == 0 and np.all(out == 10.0), (version, retries, out[:3]))
        t = time.perf_counter()
        inbox.push(0, np.ones(1001, np.float32))
        times["accumulate"] = time.perf_counter() - t
        t = time.perf_counter()
        total = counter.add(7)[0]
        times["fetch_and_op"] = time.perf_counter() - t
        expect(total == 7, total)
        reads = []
        for _ in range(5):                               # warm Get timings, target still asleep
            t = time.perf_counter()
            pub.read(0, out)
            reads.append(time.perf_counter() - t)
        times["get_warm_median"] = float(np.median(reads))
        expect(time.perf_counter() - t_begin < 0.8, "rank 0 woke before the checks ended")
    comm.Barrier()
    if comm.rank == 0:                                   # the push arrived while it slept
        back = np.empty(1001, np.float32)
        inbox.drain(back)
        expect(np.all(back == 1.0) and np.all(inbox.local == 0), "inbox not drained exactly")
        expect(counter.add(0)[0] == 7, "counter")
    times = comm.bcast(times, root=1)
    say(comm, "busy target (ms): " + ", ".join(f"{k} {1e3 * v:.2f}" for k, v in times.items()))
    for k, v in times.items():
        expect(v < 0.2, f"{k} took {v:.3f}s: it waited for the sleeping target")
    for w in (pub, inbox, counter):
        w.free()


@soft
def pull_reader_never_sees_a_torn_vector(comm):
    """Rank 1 republishes 4M-float vectors whose every element equals the version, as fast as it
    can, for ~1.5 s; rank 0 reads all the while: every read is constant and equals its version.
    Each side goes on (up to 10 s) until it has done more than 20, as a slow transport needs.
    Unprotected Gets of one half (no seqlock) are counted too, to show tears do happen here."""
    pub = PublishedVector(comm, BIG, np.float32)
    x = np.empty(BIG, np.float32)
    out = np.empty(BIG, np.float32)
    pub.publish(np.zeros(BIG, np.float32))              # version 1 holds 0.0, version v holds v-1
    comm.Barrier()
    duration, stats = 1.5, np.zeros(5, np.int64)          # reads, retries, raw gets, raw torn, pubs
    t0 = time.perf_counter()

    def going(done: int) -> bool:
        t = time.perf_counter() - t0
        return t < duration or (done <= 20 and t < 10.0)
    if comm.rank == 1:
        v = 1
        while going(v - 1):
            x.fill(float(v))
            pub.publish(x)
            v += 1
        stats[4] = v - 1
    bad = []
    if comm.rank == 0:
        while going(stats[0]):
            version, r = pub.read(1, out)
            stats[0] += 1
            stats[1] += r
            if not (out[0] == out[-1] == version - 1 and out.min() == out.max()):
                bad.append((version, float(out.min()), float(out.max())))
            if stats[0] % 2 == 0:                        # a raw Get of half 0, no protocol
                pub.win.get(out, 1, pub._offset(0))
                stats[2] += 1
                stats[3] += int(out.min() != out.max())
    comm.Barrier()
    tot = np.zeros_like(stats)
    comm.Allreduce(stats, tot)
    say(comm, f"torn-read test: {tot[4]} publications, {tot[0]} consistent reads, {tot[1]} torn-read "
              f"retries; unprotected gets torn {tot[3]}/{tot[2]}")
    expect(not bad, f"torn reads returned as consistent: {bad[:5]}")
    expect(tot[0] > 20 and tot[4] > 20, tot)
    pub.free()


def fake_ps(n, rank, dtype=np.float64):
    rng = np.random.default_rng(100 + rank)
    return SimpleNamespace(params=np.zeros(n, dtype), buffers=np.zeros(3, dtype), xp=np,
                           _init=(rank * 10.0 + rng.standard_normal(n)).astype(dtype))


def gather(comm, a):
    out = np.empty((comm.size, a.size), a.dtype)
    comm.Allgather(a, out)
    return out


def method_for(variant, **dist):
    cfg = C.build(overrides={"train": {"method": "gossip", "seed": 1},
                             "dist": {"gossip": variant, **dist}})
    return create(cfg, TOPO, Signals())


def run_gossip(comm, variant, steps=300, tau=1, **dist):
    """Distinct flat vectors, ``steps`` steps with gradients off (after_update only); returns
    (method, ps, initial distance, initial sum, gs list)."""
    m = method_for(variant, tau=tau, **dist)
    ps = fake_ps(2000, comm.rank)
    m.start(ps)                                          # broadcast makes them equal ...
    expect(np.all(gather(comm, ps.params) == ps.params), "start() did not broadcast")
    ps.params[...] = ps._init                            # ... then each rank gets its own vector
    ps.buffers[...] = comm.rank
    if variant == "pull":
        m.pub.publish(ps.params)
    comm.Barrier()
    xs = gather(comm, ps.params)
    d0, mass0 = mixing.consensus_distance(xs), xs.sum(axis=0)
    # evaluation: exact average, BN stats averaged, consensus distance, own replica restored
    with evaluated(m, ps) as extra:
        expect(np.allclose(ps.params, xs.mean(axis=0), rtol=1e-12, atol=0), "eval: not the exact mean")
        expect(np.all(ps.buffers == (comm.size - 1) / 2), "eval: BN buffers not averaged")
        expect(abs(extra["consensus_distance"] - d0) < 1e-9 * d0, (extra, d0))
    expect(np.array_equal(ps.params, ps._init) and np.all(ps.buffers == comm.rank), "not restored")
    gs = []
    for step in range(steps):
        gs.append(m.after_update(step, ps, comm.rank + 1))
        time.sleep(0.0005)                               # let the oversubscribed ranks interleave
    return m, ps, d0, mass0, gs


def check_counter(comm, m, gs, steps, tau):
    expect(all(a <= b for a, b in zip(gs, gs[1:])), "global count went down")
    comm.Barrier()
    total = steps * comm.size * (comm.size + 1) // 2
    expect(m.counter.add(0)[0] == total, "counter total")
    expect(comm.allreduce(gs[-1], op=MPI.MAX) == total, "last global count")
    expect(m.exchanges == steps // tau, m.exchanges)


@soft
def pull_gossip_reaches_consensus(comm):
    for include_self, tau in ((True, 1), (False, 2)):
        m, ps, d0, _, gs = run_gossip(comm, "pull", tau=tau, gossip_self=include_self)
        check_counter(comm, m, gs, 300, tau)
        d = mixing.consensus_distance(gather(comm, ps.params))
        with evaluated(m, ps) as extra:
            expect(abs(extra["consensus_distance"] - d) < 1e-6 * d0, (extra, d))
        say(comm, f"pull p={comm.size} self={include_self} tau={tau}: consensus distance "
                  f"{d0:.3g} -> {d:.3g}; retries {comm.allreduce(m.retries)}")
        expect(d < 1e-4 * d0, (d0, d))
        st = m.stats()
        expect(st["gossip_exchanges"] == 300 // tau and 0 <= st["gossip_peer"] < comm.size, st)
        if not include_self:
            expect(st["gossip_peer"] != comm.rank, "picked itself")
        m.close()
        expect(m.windows == [] and m.counter is None, "windows not freed")


@soft
def push_sum_conserves_mass_and_reaches_consensus(comm):
    for include_self, tau in ((True, 1), (False, 3)):
        m, ps, d0, mass0, gs = run_gossip(comm, "push", tau=tau, gossip_self=include_self)
        check_counter(comm, m, gs, 300 - 300 % tau, tau)   # tau=3 divides 300
        comm.Barrier()                                   # quiescent: every push was flushed
        m.fold_inbox(ps.params)
        num = comm.allreduce(m.weight * ps.params)
        wsum = comm.allreduce(m.weight)
        expect(np.allclose(num, mass0, rtol=1e-10, atol=1e-10), "sum w x not conserved")
        expect(abs(wsum - comm.size) < 1e-12, wsum)
        d = mixing.consensus_distance(gather(comm, ps.params))
        say(comm, f"push p={comm.size} self={include_self} tau={tau}: consensus distance "
                  f"{d0:.3g} -> {d:.3g}; sum w = {wsum!r}; max |sum w x - initial| "
                  f"{np.abs(num - mass0).max():.3g}; w_i in [{comm.allreduce(m.weight, op=MPI.MIN):.3g}, "
                  f"{comm.allreduce(m.weight, op=MPI.MAX):.3g}]")
        expect(d < 1e-4 * d0, (d0, d))
        expect(np.allclose(ps.params, mass0 / comm.size, atol=1e-3), "push-sum: not the initial mean")
        expect(m.stats()["pushsum_weight"] == m.weight, m.stats())
        m.close()


if __name__ == "__main__":
    which = set(sys.argv[1:]) or {"protocol", "method"}
    checks = []
    if "protocol" in which:
        assert MPI.COMM_WORLD.size >= 2
        checks += [rma_calls_do_not_wait_for_a_busy_target, pull_reader_never_sees_a_torn_vector]
    if "method" in which:
        checks += [pull_gossip_reaches_consensus, push_sum_conserves_mass_and_reaches_consensus]
    run_checks(*checks)
