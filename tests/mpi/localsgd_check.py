"""localsgd invariants, run as ``mpiexec -n P python tests/mpi/localsgd_check.py``."""
import numpy as np
from allreduce_check import batch, make_model, started
from harness import run_checks
from mpi4py import MPI

from scalesgd import config as C
from scalesgd.comm.mpi import start
from scalesgd.methods import create, evaluated
from scalesgd.nn.layers import softmax_cross_entropy
from scalesgd.optim.sgd import SGD
from scalesgd.train.control import Signals

TOPO = start.init()
LR = 0.05


def setup(**dist):
    c = C.build(overrides={"train": {"method": "localsgd"}, "dist": dist})
    model, method = started(c)
    return c, model, method, SGD(model.ps.params, c.optim, model.ps.decay_mask())


def local_step(model, method, opt, step, rank):
    """One step as the loop runs it, up to (not including) after_update."""
    x, y = batch(rank, step)
    logits, cache = model.forward(x, True)
    _, d, _ = softmax_cross_entropy(logits, y)
    model.backward(d * method.gradients.grad_scale, cache)
    method.gradients.after_backward(step, model.ps)
    opt.step(model.ps.params, model.ps.grads, LR)


def gather(comm, a):
    out = np.empty((comm.size, a.size))
    comm.Allgather(np.ascontiguousarray(a), out)
    return out


def tau_1_is_synchronous_sgd(comm):
    """tau = 1 without SlowMo: after every step the replicas are bitwise identical and equal (to
    rounding) to one process that averages every rank's gradients, momentum and decay included."""
    _, model, method, opt = setup(tau=1)
    for step in range(4):
        local_step(model, method, opt, step, comm.rank)
        method.exchange.after_update(step, model.ps, 4, LR)
        g = gather(comm, model.ps.params)
        assert all(np.array_equal(g[0], r) for r in g[1:]), f"replicas differ after step {step}"
    ref = make_model()
    ref.ps.params += 0.01
    opt = SGD(ref.ps.params, C.build().optim, ref.ps.decay_mask())
    for step in range(4):
        acc = np.zeros_like(ref.ps.grads)
        for r in range(comm.size):
            x, y = batch(r, step)
            logits, cache = ref.forward(x, True)
            ref.backward(softmax_cross_entropy(logits, y)[1], cache)
            acc += ref.ps.grads
        opt.step(ref.ps.params, acc / comm.size, LR)
    np.testing.assert_allclose(model.ps.params, ref.ps.params, rtol=1e-10, atol=1e-12)


def replicas_drift_for_tau_steps_then_average(comm):
    """tau = 3: between exchanges the replicas differ; at step 3k+2 params and BN statistics become
    the mean over ranks of what they were, bitwise identical everywhere; global samples in lockstep."""
    _, model, method, opt = setup(tau=3)
    for step in range(6):
        local_step(model, method, opt, step, comm.rank)
        before_p, before_b = gather(comm, model.ps.params), gather(comm, model.ps.buffers)
        gs = method.exchange.after_update(step, model.ps, 4, LR)
        assert gs == 4 * comm.size * (step + 1)
        after = gather(comm, model.ps.params)
        if step % 3 == 2:
            assert all(np.array_equal(after[0], r) for r in after[1:]), f"replicas differ at {step}"
            np.testing.assert_allclose(model.ps.params, before_p.mean(axis=0), rtol=1e-13, atol=1e-15)
            np.testing.assert_allclose(model.ps.buffers, before_b.mean(axis=0), rtol=1e-13, atol=1e-15)
        else:
            assert not np.array_equal(after[0], after[1]), f"replicas equal at {step}: no local step"
            assert np.array_equal(after, before_p), "parameters changed between exchanges"
    assert method.exchange.stats() == {"averages": 2}


def slowmo_outer_steps_follow_the_formula(comm):
    """beta 0.5, alpha 0.8, tau 2: each exchange is u <- beta u + (x_sync - x_avg)/lr,
    x_sync <- x_sync - alpha lr u, every replica <- x_sync (checked in float64 from the gathered
    replicas, over two exchanges); the state survives a checkpoint round trip."""
    beta, alpha = 0.5, 0.8
    c, model, method, opt = setup(tau=2, slowmo_beta=beta, slowmo_lr=alpha)
    x_sync, u = model.ps.params.copy(), np.zeros_like(model.ps.params)
    for step in range(4):
        local_step(model, method, opt, step, comm.rank)
        x_avg = gather(comm, model.ps.params).mean(axis=0)
        method.exchange.after_update(step, model.ps, 4, LR)
        if step % 2 == 1:
            u = beta * u + (x_sync - x_avg) / LR
            x_sync = x_sync - alpha * LR * u
            np.testing.assert_allclose(model.ps.params, x_sync, rtol=1e-10, atol=1e-12)
            g = gather(comm, model.ps.params)
            assert all(np.array_equal(g[0], r) for r in g[1:])
    arrays, scalars = method.codec.state(model.ps)
    fresh = create(c, TOPO, Signals())
    fresh.start(model.ps)
    fresh.codec.load_state(model.ps, {k: v.copy() for k, v in arrays.items()}, scalars)
    np.testing.assert_array_equal(fresh.exchange.u, method.exchange.u)
    np.testing.assert_array_equal(fresh.exchange.x_sync, method.exchange.x_sync)
    assert fresh.exchange.exchanges == method.exchange.exchanges == 2


def evaluation_model_is_the_average(comm):
    """Mid-period the evaluated model is the replicas' average; each rank's own replica is back
    afterwards."""
    _, model, method, opt = setup(tau=100)
    local_step(model, method, opt, 0, comm.rank)
    method.exchange.after_update(0, model.ps, 4, LR)
    own_p, own_b = model.ps.params.copy(), model.ps.buffers.copy()
    mean_p = gather(comm, own_p).mean(axis=0)
    with evaluated(method, model.ps):
        np.testing.assert_allclose(model.ps.params, mean_p, rtol=1e-13, atol=1e-15)
    assert np.array_equal(model.ps.params, own_p) and np.array_equal(model.ps.buffers, own_b)


if __name__ == "__main__":
    assert MPI.COMM_WORLD.size >= 2
    run_checks(tau_1_is_synchronous_sgd, replicas_drift_for_tau_steps_then_average,
               slowmo_outer_steps_follow_the_formula, evaluation_model_is_the_average)
