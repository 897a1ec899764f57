"""gossip invariants, run as ``mpiexec -n P python tests/mpi/gossip_check.py [protocol] [method]``.

protocol (ranks 0 and 1 act, P >= 2): no RMA call waits for a target busy outside MPI; a pull reader
never sees a torn vector while the writer republishes as fast as it can, neither reading itself nor
through a courier thread (overlap's request-based, polled reads); every window also works with each
rank as its own target (``windows_on_oneself``, which runs at P = 1 too); a push-sum drain takes
whole messages and names the order they were added in, while every other rank pushes at once; the
courier runs its jobs and keeps MPI progressing while idle.
method: pull and push gossip with gradients off, blocking and overlapped, drive the consensus
distance to ~0; push-sum conserves sum w_i x_i and sum w_i (overlapped: once ``quiesce`` flushed the
pushes in flight); the global sample counter is exact; evaluation averages exactly; an overlapped
pull mixes the copy read one exchange earlier, reads it while the main thread stays outside MPI, and
reads the pending peer again after a state round trip (a resume).
Measured numbers are printed by rank 0 as ``measured: ...`` lines.
"""
import json
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from harness import run_checks
from mpi4py import MPI

from scalesgd import config as C
from scalesgd.comm.mpi import start
from scalesgd.comm.mpi.inbox import Inbox
from scalesgd.comm.jobs import POLL_SECONDS
from scalesgd.comm.mpi.window import Courier, PublishedVector, SampleCounter, Window
from scalesgd.methods import mixing
from scalesgd.methods import create, evaluated
from scalesgd.train.control import Signals

TOPO = start.init()
BIG = 4 * 1024 * 1024                       # 4M float32 = 16 MB per copy: a wrong protocol would tear
GUARD = 30.0        # seconds before a rank gives up waiting for its peer's progress: a hang guard only


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


def wait_outside_mpi_for(flag: Path) -> bool:
    """Polls for ``flag`` in plain Python (no MPI call); False if it is not there after GUARD s."""
    t = time.monotonic()
    while not flag.exists():
        if time.monotonic() - t > GUARD:
            return False
        time.sleep(0.001)
    return True


def shared_dir(comm) -> Path:
    """A fresh directory that ranks 0 and 1 (one host) both see; rank 0 removes it at the end."""
    hosts = comm.allgather(MPI.Get_processor_name())
    assert hosts[0] == hosts[1], f"ranks 0 and 1 must share a host for the flag files: {hosts[:2]}"
    return Path(comm.bcast(tempfile.mkdtemp(prefix="gossip_check.") if comm.rank == 0 else None))


def calls_on_an_absent_target(pub, inbox, counter) -> dict:
    """Rank 1's side: a Get of rank 0's vector, an Accumulate into its inbox, a Fetch_and_op on its
    counter, then 5 more Gets; each checked, each timed (seconds, for the record only)."""
    out = np.empty(BIG, np.float32)
    times, t = {}, time.perf_counter()
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
    for _ in range(5):                                   # warm Get timings, target still away
        t = time.perf_counter()
        pub.read(0, out)
        reads.append(time.perf_counter() - t)
    times["get_warm_median"] = float(np.median(reads))
    return times


@soft
def rma_calls_do_not_wait_for_a_busy_target(comm):
    """Rank 0 (the target, and the global counter's root, as in the method) leaves MPI and says so
    through a file; rank 1 then does a Get of rank 0's 4M-float vector, an Accumulate into its inbox
    and a Fetch_and_op on its counter, and says through another file that they all completed.  Rank
    0 enters MPI again only after that, so a call that waited for the target to enter MPI could not
    complete: rank 0 would give up after GUARD s and the check fail.  An ordering, not a timing:
    the times are printed, never judged."""
    pub, inbox = PublishedVector(comm, BIG, np.float32), Inbox(comm, 1001, np.float32)
    counter = SampleCounter(comm, root=0)
    pub.publish(np.full(BIG, 10.0 + comm.rank, np.float32))
    flags = shared_dir(comm)
    away, done = flags / "rank-0-away", flags / "rank-1-done"
    comm.Barrier()
    times = {}
    if comm.rank == 0:
        away.touch()                                     # from here until `done`, no MPI call
        expect(wait_outside_mpi_for(done), f"rank 1's RMA calls had not completed {GUARD:.0f} s after "
               "their target left MPI: they wait for the target")
    elif comm.rank == 1:
        expect(wait_outside_mpi_for(away), "rank 0 never said it had left MPI")
        times = calls_on_an_absent_target(pub, inbox, counter)
        done.touch()
    comm.Barrier()
    if comm.rank == 0:                                   # the push arrived while it was away
        back = np.empty(1001, np.float32)
        inbox.drain(back)
        left = inbox.memory()                            # rank 0's own inbox memory
        expect(np.all(back == 1.0) and np.all(left == 0), "inbox not drained exactly")
        expect(counter.add(0)[0] == 7, "counter")
        for f in (away, done):
            f.unlink(missing_ok=True)
        flags.rmdir()
    times = comm.bcast(times, root=1)
    say(comm, "busy target (ms): " + ", ".join(f"{k} {1e3 * v:.2f}" for k, v in times.items()))
    for w in (pub, inbox, counter):
        w.free()


def publish_until_told(pub, stop) -> int:
    """The writer (rank 1): publishes 4M-float vectors, every element of version v equal to v - 1,
    as fast as it can until its own flag in ``stop`` is set; returns how many it published."""
    x = np.empty(BIG, np.float32)
    flag, nothing = np.zeros(1, np.int64), np.zeros(1, np.int64)
    v = 1
    while True:
        stop.fetch_and_op(nothing, flag, 1, 0, MPI.NO_OP)        # atomic read of its own flag
        if flag[0]:
            return v - 1
        x.fill(float(v))
        pub.publish(x)
        v += 1


def read_until_seen(pub, reads_min: int, versions_min: int, stats, courier=None) -> list:
    """The reader (rank 0): reads rank 1's vector until it has done ``reads_min`` reads and seen
    ``versions_min`` versions (GUARD s at most), every second read followed by a raw, unprotected
    Get of half 0.  With ``courier``, each read is its job (request-based, polled), as an overlapped
    pull reads.  Fills stats[0, 1, 2, 3, 5]; returns the reads that came back torn."""
    out, bad, seen = np.empty(BIG, np.float32), [], set()
    t = time.monotonic()
    while (stats[0] < reads_min or len(seen) < versions_min) and time.monotonic() - t < GUARD:
        if courier is None:
            version, r = pub.read(1, out)
        else:
            courier.submit(pub.read, 1, out, POLL_SECONDS)
            version, r = courier.wait()
        stats[0] += 1
        stats[1] += r
        seen.add(version)
        if not (out[0] == out[-1] == version - 1 and out.min() == out.max()):
            bad.append((version, float(out.min()), float(out.max())))
        if stats[0] % 2 == 0:                            # a raw Get of half 0, no protocol
            pub.win.get(out, 1, pub._offset(0))
            stats[2] += 1
            stats[3] += int(out.min() != out.max())
    stats[5] = len(seen)
    return bad


@soft
def pull_reader_never_sees_a_torn_vector(comm):
    """Rank 1 republishes 4M-float vectors as fast as it can until rank 0 has read them 40 times and
    seen 20 different versions (so it read all the while the writer was writing), first itself, then
    through a courier (overlap's path: request-based reads completed by polling, the seq check after
    the data's completion); every read is constant and equals its version.  Rank 0 tells rank 1 to
    stop through a one-sided flag on rank 1, so the test ends on counts, whatever the speed, and
    neither side waits for the other in MPI.  Unprotected Gets (no seqlock) are counted too, to show
    tears do happen here."""
    reads_min, versions_min = 40, 20
    pub = PublishedVector(comm, BIG, np.float32)
    stop = Window(comm, 8, disp_unit=8)                  # int64 on every rank; rank 1's is the flag
    pub.publish(np.zeros(BIG, np.float32))              # version 1 holds 0.0, version v holds v-1
    comm.Barrier()
    # per path (blocking, courier): reads, retries, raw gets, raw torn, pubs, versions seen
    stats = np.zeros((2, 6), np.int64)
    bad = []
    if comm.rank == 1:
        stats[0, 4] = publish_until_told(pub, stop)
    elif comm.rank == 0:
        bad = read_until_seen(pub, reads_min, versions_min, stats[0])
        courier = Courier()
        bad += read_until_seen(pub, reads_min, versions_min, stats[1], courier)
        courier.close()
        stop.accumulate(np.ones(1, np.int64), 1, 0, MPI.REPLACE)
    comm.Barrier()
    tot = np.zeros_like(stats)
    comm.Allreduce(stats, tot)
    for path, t in zip(("itself", "courier"), tot):
        say(comm, f"torn-read test, reading {path}: {t[0]} consistent reads of {t[5]} versions, "
                  f"{t[1]} torn-read retries; unprotected gets torn {t[3]}/{t[2]}")
        expect(t[0] >= reads_min and t[5] >= versions_min,
               f"{path}: {t[0]} reads of {t[5]} versions in {GUARD:.0f} s: the writer made no progress")
    say(comm, f"torn-read test: {tot[0, 4]} publications")
    expect(not bad, f"torn reads returned as consistent: {bad[:5]}")
    stop.free()
    pub.free()


@soft
def windows_on_oneself(comm):
    """Each window with every rank as its own target, as a gossip rank that picks itself (and every
    rank of a one-rank job) uses them: read back one's own publications, push into one's own inbox
    and drain it, count on a counter one is the root of.  Runs at any P, 1 included."""
    pub, inbox = PublishedVector(comm, 1000, np.float64), Inbox(comm, 10, np.float64)
    counter = SampleCounter(comm, root=0)               # rank 0 counts on itself
    out = np.empty(1000)
    for k in (1, 2, 3):                                  # both halves, and back to the first
        expect(pub.publish(np.full(1000, comm.rank + k, np.float64)) == k, "version")
        version, retries = pub.read(comm.rank, out)
        expect(version == k and retries == 0 and np.all(out == comm.rank + k), (k, version, out[:3]))
    inbox.push(comm.rank, np.arange(10.0))
    inbox.push(comm.rank, np.ones(10))
    back = np.empty(10)
    order = inbox.drain(back)
    expect(np.array_equal(back, np.arange(10.0) + 1) and order == [comm.rank] * 2, (back, order))
    order = inbox.drain(back)
    expect(not back.any() and order == [], f"a second drain found {back} from {order}")
    p = comm.size
    counter.add(comm.rank + 1, [comm.rank, 2 * comm.rank])
    comm.Barrier()
    total, seen = counter.add(0)
    expect(total == p * (p + 1) // 2 and seen.tolist() == [p - 1, 2 * (p - 1)], (total, seen))
    comm.Barrier()
    if comm.rank == 0:
        counter.set(40)                                  # a restore: nobody else uses it now
    comm.Barrier()
    total, seen = counter.add(0)
    expect(total == 40 and seen.tolist() == [p - 1, 2 * (p - 1)], f"after set: {total} {seen}")
    for w in (pub, inbox, counter):
        w.free()


def message(sender: int, k: int, n: int) -> np.ndarray:
    """Sender's k-th message to rank 0: float32 values whose sums round differently in every
    order (so a drain's sum shows the order it was added in), a count in the sender's slot."""
    out = np.random.default_rng([sender, k]).standard_normal(n + 8).astype(np.float32) * 1e3
    out[n:] = 0
    out[n + sender] = 1
    return out


@soft
def inbox_drains_whole_messages_in_a_known_order(comm):
    """Every other rank pushes 24 messages of 2 MB into rank 0's inbox as fast as it can (every
    second one from a courier thread, request-based and polled, as overlapped push-sum), while
    rank 0 drains again and again: each drain must equal the sum, from zero and in the order the
    drain names, of whole messages (each sender's next ones), and all of them arrive once."""
    n, per = 512 * 1024, 24
    inbox = Inbox(comm, n + 8, np.float32)
    comm.Barrier()
    if comm.rank == 0:
        got, sums, out, drains = {s: 0 for s in range(1, comm.size)}, 0, np.empty(n + 8, np.float32), 0
        t = time.monotonic()
        while sum(got.values()) < per * (comm.size - 1) and time.monotonic() - t < GUARD:
            order = inbox.drain(out)
            want = np.zeros(n + 8, np.float32)
            for s in order:
                want += message(s, got[s], n)
                got[s] += 1
            expect(np.array_equal(out, want), f"drain {drains} (from {order}) is not the ordered sum "
                   f"of whole messages (max difference {np.abs(out - want).max():.3g})")
            sums += len(order) > 1
            drains += 1
            if not order:
                time.sleep(0.0005)                       # (2 cores: leave them to the senders)
        expect(sum(got.values()) == per * (comm.size - 1), f"got {got} of {per} each")
        say(comm, f"inbox: {drains} drains took {per * (comm.size - 1)} messages, {sums} drains "
                  "summed more than one")
    else:
        courier = Courier()
        for k in range(per):
            msg = message(comm.rank, k, n)
            if k % 2:
                courier.submit(inbox.push, 0, msg, POLL_SECONDS)
                courier.wait()
            else:
                inbox.push(0, msg)
        courier.close()
    comm.Barrier()
    expect(not inbox.memory().any() or comm.rank != 0, "messages left behind")
    inbox.free()


@soft
def courier_runs_one_job_at_a_time_and_progresses_when_idle(comm):
    """The communication thread of an overlapped exchange: a job's value (or its exception) comes
    back from ``wait``; ``busy``/``done`` follow it; its seconds are counted; idle, it calls its
    progress function (here ``Iprobe``, counted) every ``idle_poll`` s and stops at ``close``."""
    pokes = []

    def progress():
        pokes.append(comm.Iprobe())
    c = Courier(progress=progress, idle_poll=0.001)
    expect(c.wait() is None and not c.busy, "wait without a job")
    gate = threading.Event()                 # (held until checked: a descheduled check may be late)
    c.submit(lambda: (gate.wait(GUARD), time.sleep(0.05), comm.rank)[2])
    expect(c.busy and not c.done, "a job in flight is neither idle nor done")
    gate.set()
    expect(c.wait() == comm.rank and not c.busy, "the job's value")
    expect(c.busy_seconds >= 0.05 and c.exposed_seconds > 0 and c.jobs == 1,
           (c.busy_seconds, c.exposed_seconds, c.jobs))
    c.submit(lambda: 1 / 0)
    try:
        c.wait()
        expect(False, "the job's error was not raised")
    except ZeroDivisionError:
        pass
    n, t = len(pokes), time.monotonic()
    while len(pokes) < n + 20 and time.monotonic() - t < GUARD:
        time.sleep(0.001)
    expect(len(pokes) >= n + 20, f"idle courier: {len(pokes) - n} progress calls")
    c.close()
    c.close()
    n = len(pokes)
    time.sleep(0.01)
    expect(len(pokes) == n and not c._thread.is_alive(), "the courier did not stop")


def fake_ps(n, rank, dtype=np.float64):
    rng = np.random.default_rng(100 + rank)
    return SimpleNamespace(params=np.zeros(n, dtype), buffers=np.zeros(3, dtype), xp=np,
                           _init=(rank * 10.0 + rng.standard_normal(n)).astype(dtype))


def gather(comm, a):
    out = np.empty((comm.size, a.size), a.dtype)
    comm.Allgather(a, out)
    return out


def method_for(variant, **dist):
    dist.setdefault("gossip_graph", "uniform")           # the checks below were written for it
    cfg = C.build(overrides={"train": {"method": "gossip", "seed": 1},
                             "dist": {"gossip": variant, **dist}})
    record = create(cfg, TOPO, Signals())
    m = record.exchange                   # the gossip strategy (its codec too), with its method
    m.record = record                     # (a test-only attribute: ``evaluated`` takes the method)
    return m


def run_gossip(comm, variant, steps=300, tau=1, before_last=None, **dist):
    """Distinct flat vectors, ``steps`` steps with gradients off (after_update only), calling
    ``before_last(m)`` before the last; returns (method, ps, initial distance, initial sum, gs)."""
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
    with evaluated(m.record, ps) as extra:
        expect(np.allclose(ps.params, xs.mean(axis=0), rtol=1e-12, atol=0), "eval: not the exact mean")
        expect(np.all(ps.buffers == (comm.size - 1) / 2), "eval: BN buffers not averaged")
        expect(abs(extra["consensus_distance"] - d0) < 1e-9 * d0, (extra, d0))
    expect(np.array_equal(ps.params, ps._init) and np.all(ps.buffers == comm.rank), "not restored")
    gs = []
    for step in range(steps):
        if step == steps - 1 and before_last is not None:
            before_last(m)
        gs.append(m.after_update(step, ps, comm.rank + 1))
        time.sleep(0.0005)                               # let the oversubscribed ranks interleave
        if step % 25 == 24:     # (the test's, not the method's: no rank runs far ahead of the others,
            comm.Barrier()      # whose values it must mix with, however a loaded machine schedules)
    return m, ps, d0, mass0, gs


def check_counter(comm, m, gs, steps, tau):
    """After ``m.quiesce`` (overlap: every counter update collected and landed)."""
    expect(all(a <= b for a, b in zip(gs, gs[1:])), "global count went down")
    comm.Barrier()
    total = steps * comm.size * (comm.size + 1) // 2
    expect(m.counter.add(0)[0] == total, "counter total")
    expect(comm.allreduce(m.global_samples, op=MPI.MAX) == total, "last global count")
    expect(m.exchanges == steps // tau, m.exchanges)


def overlap_note(comm, m) -> str:
    """The exchanges' seconds on the courier and the part the steps waited for (summed over ranks)."""
    courier = getattr(m.exchanger, "courier", None)
    if courier is None:
        return ""
    st = m.stats()
    bg, exp = comm.allreduce(st["gossip_background_seconds"]), comm.allreduce(st["gossip_exposed_seconds"])
    expect(courier.jobs > 0 and bg > 0, f"the courier ran no exchange: {st}")
    return f"; overlap: {1e3 * bg:.0f} ms on the couriers, {1e3 * exp:.0f} ms waited for"


@soft
def pull_gossip_reaches_consensus(comm):
    for include_self, tau, overlap in ((True, 1, False), (False, 2, False), (True, 1, True)):
        m, ps, d0, _, gs = run_gossip(comm, "pull", tau=tau, gossip_self=include_self,
                                      gossip_overlap=overlap)
        m.quiesce(ps)                                    # (overlap: the last exchange lands)
        check_counter(comm, m, gs, 300, tau)
        d = mixing.consensus_distance(gather(comm, ps.params))
        with evaluated(m.record, ps) as extra:
            expect(abs(extra["consensus_distance"] - d) < 1e-6 * d0, (extra, d))
        say(comm, f"pull p={comm.size} self={include_self} tau={tau} overlap={overlap}: consensus "
                  f"distance {d0:.3g} -> {d:.3g}; retries {comm.allreduce(m.retries)}"
                  f"{overlap_note(comm, m)}")
        expect(d < 1e-4 * d0, (d0, d))
        st = m.stats()
        expect(st["gossip_exchanges"] == 300 // tau and 0 <= st["gossip_peer"] < comm.size, st)
        if not include_self:
            expect(st["gossip_peer"] != comm.rank, "picked itself")
        m.close()
        expect(m.windows == [] and m.counter is None, "windows not freed")


def slow_pushes(m) -> None:
    """From now on, every push of ``m`` starts 0.2 s late (a real push, on its courier)."""
    push = m.inbox.push

    def late(*args):
        time.sleep(0.2)
        push(*args)
    m.inbox.push = late


@soft
def push_sum_conserves_mass_and_reaches_consensus(comm):
    """Mass is counted as a checkpoint counts it: each rank calls ``quiesce`` straight after its
    own last exchange, while slower ranks may still be pushing into it (overlap: pushes may still
    be on the courier or on their way; quiesce flushes them all before anyone drains)."""
    for include_self, tau, overlap in ((True, 1, False), (False, 3, False), (True, 1, True),
                                       (False, 3, True)):
        # the last case's last push leaves 0.2 s late, as over a slow link: quiesce must wait for it
        m, ps, d0, mass0, gs = run_gossip(comm, "push", tau=tau, gossip_self=include_self,
                                          gossip_overlap=overlap,
                                          before_last=slow_pushes if tau == 3 and overlap else None)
        if not overlap:
            comm.Barrier()                               # blocking pushes: flushed when they return
        m.quiesce(ps)
        check_counter(comm, m, gs, 300 - 300 % tau, tau)   # tau=3 divides 300
        note = overlap_note(comm, m)
        num = comm.allreduce(m.weight * ps.params)
        wsum = comm.allreduce(m.weight)
        expect(np.allclose(num, mass0, rtol=1e-10, atol=1e-10), f"overlap={overlap}: sum w x not "
               f"conserved (max error {np.abs(num - mass0).max():.3g})")
        expect(abs(wsum - comm.size) < 1e-12, f"overlap={overlap}: sum w = {wsum!r}")
        d = mixing.consensus_distance(gather(comm, ps.params))
        say(comm, f"push p={comm.size} self={include_self} tau={tau} overlap={overlap}: consensus "
                  f"distance {d0:.3g} -> {d:.3g}; sum w = {wsum!r}; max |sum w x - initial| "
                  f"{np.abs(num - mass0).max():.3g}; w_i in [{comm.allreduce(m.weight, op=MPI.MIN):.3g}, "
                  f"{comm.allreduce(m.weight, op=MPI.MAX):.3g}]{note}")
        expect(d < 1e-4 * d0, (d0, d))
        expect(np.allclose(ps.params, mass0 / comm.size, atol=1e-3), "push-sum: not the initial mean")
        expect(m.stats()["pushsum_weight"] == m.weight, m.stats())
        m.close()


def wait_for_courier_outside_mpi(courier) -> bool:
    """Polls in plain Python (no MPI call on this thread) until the courier's job is done."""
    t = time.monotonic()
    while not courier.done:
        if time.monotonic() - t > GUARD:
            return False
        time.sleep(0.001)
    return True


def ring_pull(comm, value: float):
    """An overlapped pull on the ring (peer = rank + 1) whose replica is the constant ``value``,
    published; returns (method, ps)."""
    m = method_for("pull", gossip_overlap=True, gossip_graph="ring", gossip_self=False)
    ps = fake_ps(1000, comm.rank)
    m.start(ps)
    ps.params[...] = value
    m.pub.publish(ps.params)
    comm.Barrier()
    return m, ps


@soft
def overlapped_pull_mixes_the_copy_one_exchange_older(comm):
    """Rank 0 alone exchanges (the others wait in a barrier, their copies fixed: rank r holds
    10 (r + 1)), on the ring, gamma 1/2.  Exchange 0 mixes nothing (nothing in flight yet) and
    starts reading rank 1, which completes while rank 0 stays outside MPI; exchange 1 mixes that
    copy: 0.5 * 10 + 0.5 * 20 = 15 (a blocking pull has 15 after exchange 0).  Then the state goes
    through a round trip as at a checkpoint and resume: ``quiesce`` collected exchange 1's read (20),
    the checkpoint keeps that copy, and the resumed method mixes it, 0.5 * 15 + 0.5 * 20 = 17.5, as
    the uninterrupted run does, although rank 1's restored parameters are now 40 (reading it
    again would give 27.5)."""
    m, ps = ring_pull(comm, 10.0 * (comm.rank + 1))
    if comm.rank == 0:
        m.after_update(0, ps, 1)
        expect(np.all(ps.params == 10.0) and m.exchanger.in_flight_peer == 1,
               f"exchange 0 mixed: {ps.params[:2]}")
        expect(wait_for_courier_outside_mpi(m.exchanger.courier), "the read never completed off MPI")
        expect(np.all(m.peer_buf == 20.0), f"read {m.peer_buf[:2]}")
        m.after_update(1, ps, 1)
        expect(np.all(ps.params == 15.0), f"exchange 1: {ps.params[:2]} (want 15)")
        expect(m.last_version == 2 and m.stats()["gossip_exposed_seconds"] >= 0, m.stats())
    comm.Barrier()
    m.quiesce(ps)                                        # as a checkpoint does, then its state
    arrays, scalars = m.state(ps)
    scalars = json.loads(json.dumps(scalars))           # as a checkpoint stores them
    expect(scalars["pending"] == -1 and ("landed" in scalars) == (comm.rank == 0), scalars)
    expect(comm.rank != 0 or np.all(arrays["gossip_peer_copy"] == 20.0), "the collected copy was not kept")
    m.close()
    saved = ps.params.copy()
    m2 = method_for("pull", gossip_overlap=True, gossip_graph="ring", gossip_self=False)
    m2.start(ps)                                         # (broadcasts rank 0's replica) ...
    ps.params[...] = 40.0 if comm.rank == 1 else saved   # ... then the restore, as a resume does
    m2.load_state(ps, arrays, scalars)                   # rank 0: the kept copy, no read again
    expect(m2.exchanger.courier.busy_seconds >= scalars["courier_seconds"][0], "courier seconds not restored")
    if comm.rank == 0:
        expect(m2.exchanger.in_flight_peer is None and not m2.exchanger.courier.busy,
               "a collected read was started again")
        m2.after_update(2, ps, 1)
        expect(np.all(ps.params == 17.5),
               f"after the resume: {ps.params[:2]} (want 17.5, as without it)")
    comm.Barrier()
    m2.close()
    expect(not hasattr(m2.exchanger, "courier") and m2.windows == [], "not closed")


if __name__ == "__main__":
    which = set(sys.argv[1:]) or {"protocol", "method"}
    checks = []
    if "protocol" in which:
        assert MPI.COMM_WORLD.size >= 2
        checks += [rma_calls_do_not_wait_for_a_busy_target, pull_reader_never_sees_a_torn_vector,
                   windows_on_oneself, inbox_drains_whole_messages_in_a_known_order,
                   courier_runs_one_job_at_a_time_and_progresses_when_idle]
    if "method" in which:
        checks += [pull_gossip_reaches_consensus, push_sum_conserves_mass_and_reaches_consensus,
                   overlapped_pull_mixes_the_copy_one_exchange_older]
    run_checks(*checks)
