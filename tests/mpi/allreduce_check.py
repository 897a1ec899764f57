"""allreduce invariants, run as ``mpiexec -n P python tests/mpi/allreduce_check.py``."""
import numpy as np
from harness import run_checks
from mpi4py import MPI

from scalesgd import config as C
from scalesgd.comm.mpi import buckets, start
from scalesgd.methods import create, evaluated
from scalesgd.nn.layers import softmax_cross_entropy
from scalesgd.nn.params import Layout, TensorSpec
from scalesgd.nn.resnet import ResNet
from scalesgd.optim.sgd import SGD
from scalesgd.train.control import Control, Signals

TOPO = start.init()


def cfg(**dist):
    return C.build(overrides={"train": {"method": "allreduce"}, "dist": dist})


def closed_form_buckets(comm):
    """Grads filled with rank + 1: every element sums to p(p+1)/2 (not 0 at one rank), for every
    bucket size, with and without overlap."""
    layout = Layout([TensorSpec(f"t{i}", (1000 + 37 * i,)) for i in range(12)])
    for bucket_bytes in (0, 4000, 20000, 10**9):
        for overlap in (True, False):
            flat = np.full(layout.size, comm.rank + 1.0, dtype=np.float64)
            red = buckets.BucketedAllreduce(comm, flat, layout, bucket_bytes, overlap=overlap)
            for spec in reversed(layout.specs):        # the order backward reports them
                red.ready([spec.name])
            red.finish()
            assert np.all(flat == comm.size * (comm.size + 1) / 2), (bucket_bytes, overlap)
        covered = sorted((lo, hi) for lo, hi, _ in red.buckets)
        assert covered[0][0] == 0 and covered[-1][1] == layout.size
        assert all(a[1] == b[0] for a, b in zip(covered, covered[1:])), "buckets must tile the buffer"


def batch(rank, step, n=4, hw=8, classes=5):
    rng = np.random.default_rng([rank, step])
    return rng.standard_normal((n, hw, hw, 3)), rng.integers(0, classes, n)


def make_model():
    m = ResNet("resnet20", 5, width=0.25, dtype="float64")
    m.ps.initialize(0)
    return m


def started(c):
    """A model whose rank-0 replica starts off the others' (start() must overwrite that) and the
    method of config ``c``, attached and started: (model, method)."""
    model = make_model()
    if TOPO.rank == 0:
        model.ps.params += 0.01
    method = create(c, TOPO, Signals())
    method.gradients.attach(model)
    method.start(model.ps)
    return model, method


def train_steps(model, method, opt, steps, rank):
    for step in range(steps):
        x, y = batch(rank, step)
        logits, cache = model.forward(x, True)
        _, d, _ = softmax_cross_entropy(logits, y)
        model.backward(d * method.gradients.grad_scale, cache)   # as train_step does
        method.gradients.after_backward(step, model.ps)
        opt.step(model.ps.params, model.ps.grads, 0.05)


def replicas_identical_and_equal_to_serial(comm):
    """After N steps the replicas are bitwise identical (overlap on and off), and equal to one
    process that runs every rank's minibatch itself and averages the gradients (BN per minibatch)."""
    results = {}
    for overlap in (True, False):
        c = cfg(overlap=overlap, bucket_mb=0.01)
        model, method = started(c)
        opt = SGD(model.ps.params, c.optim, model.ps.decay_mask())
        train_steps(model, method, opt, 4, comm.rank)
        gathered = np.empty((comm.size, model.ps.params.size)) if comm.rank == 0 else None
        comm.Gather(model.ps.params, gathered, root=0)
        if comm.rank == 0:
            assert all(np.array_equal(gathered[0], g) for g in gathered[1:]), "replicas differ"
        results[overlap] = model.ps.params.copy()
    np.testing.assert_allclose(results[True], results[False], rtol=1e-12, atol=1e-14)
    if comm.rank == 0:                                   # the serial reference
        ref = make_model()
        ref.ps.params += 0.01
        opt = SGD(ref.ps.params, cfg().optim, ref.ps.decay_mask())
        for step in range(4):
            acc = np.zeros_like(ref.ps.grads)
            for r in range(comm.size):
                x, y = batch(r, step)
                logits, cache = ref.forward(x, True)
                _, d, _ = softmax_cross_entropy(logits, y)
                ref.backward(d, cache)
                acc += ref.ps.grads
            opt.step(ref.ps.params, acc / comm.size, 0.05)
        np.testing.assert_allclose(results[True], ref.ps.params, rtol=1e-10, atol=1e-12)


def bn_statistics_averaged_for_evaluation(comm):
    model = make_model()
    method = create(cfg(), TOPO, Signals())
    model.ps.buffers[...] = comm.rank
    with evaluated(method, model.ps):
        assert np.all(model.ps.buffers == (comm.size - 1) / 2)
    assert np.all(model.ps.buffers == comm.rank), "own statistics restored after evaluation"
    counts = Control(TOPO.transport, comm.size).sum_over_ranks([1, 2, 3])
    assert counts.tolist() == [comm.size, 2 * comm.size, 3 * comm.size]


if __name__ == "__main__":
    assert MPI.COMM_WORLD.size >= 2
    run_checks(closed_form_buckets, replicas_identical_and_equal_to_serial,
               bn_statistics_averaged_for_evaluation)
