"""Gossip's pure numerics (methods/mixing.py): peer choice, pull mixing, push-sum mass conservation."""
import numpy as np
import pytest

from scalesgd.methods import graphs as G
from scalesgd.methods import mixing


@pytest.mark.parametrize("size", [1, 2, 4, 7])
def test_peer_choice_is_uniform_over_all_ranks_including_self(size):
    rng = mixing.peer_rng(0, 1 % size)
    draws = np.array([mixing.choose_peer(rng, 1 % size, size) for _ in range(20000)])
    counts = np.bincount(draws, minlength=size)
    assert len(counts) == size
    expected = 20000 / size
    assert np.all(np.abs(counts - expected) < 5 * np.sqrt(expected)), counts


@pytest.mark.parametrize("size,rank", [(2, 0), (2, 1), (4, 0), (4, 2), (4, 3)])
def test_peer_choice_can_exclude_self_and_stays_uniform(size, rank):
    rng = mixing.peer_rng(3, rank)
    draws = np.array([mixing.choose_peer(rng, rank, size, include_self=False) for _ in range(12000)])
    assert rank not in draws
    counts = np.bincount(draws, minlength=size)
    others = np.delete(counts, rank)
    expected = 12000 / (size - 1)
    assert np.all(np.abs(others - expected) < 5 * np.sqrt(expected)), counts


def test_one_rank_can_only_pick_itself():
    rng = mixing.peer_rng(0, 0)
    assert {mixing.choose_peer(rng, 0, 1, include_self=False) for _ in range(10)} == {0}


def test_peer_choice_is_seeded_and_differs_between_ranks_and_seeds():
    def seq(seed, rank):
        rng = mixing.peer_rng(seed, rank)
        return [mixing.choose_peer(rng, rank, 8) for _ in range(50)]
    assert seq(0, 1) == seq(0, 1)
    assert seq(0, 1) != seq(0, 2)
    assert seq(0, 1) != seq(1, 1)


@pytest.mark.parametrize("gamma", [0.5, 0.25, 1.0])
def test_pull_mix(gamma):
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal(100), rng.standard_normal(100)
    ref = (1 - gamma) * x + gamma * y
    out = mixing.pull_mix(x, y, gamma)
    assert out is x
    np.testing.assert_allclose(x, ref, rtol=1e-12, atol=1e-15)
    z = y.copy()
    np.testing.assert_array_equal(mixing.pull_mix(z, y, gamma), y)     # equal replicas stay equal


def test_push_split_conserves_weight_exactly():
    for w in (1.0, 0.3, 1e-7, 2.0 / 3.0):
        for dt in (np.float32, np.float64):
            sent, kept = mixing.push_split(w, dt)
            assert sent + kept == w and float(np.dtype(dt).type(sent)) == sent


def test_push_message_and_fold():
    x = np.arange(5, dtype=np.float64)
    msg = mixing.push_message(x, 0.25, np.empty(6))
    np.testing.assert_array_equal(msg, [0, 0.25, 0.5, 0.75, 1.0, 0.25])
    y = np.full(5, 2.0)
    w = mixing.push_fold(y, 0.5, msg)                   # (0.5*2 + 0.25*x) / 0.75
    assert w == 0.75
    np.testing.assert_allclose(y, (1.0 + 0.25 * x) / 0.75)


@pytest.mark.parametrize("p,include_self", [(2, True), (4, True), (4, False), (7, True)])
def test_push_sum_conserves_mass_and_reaches_consensus(p, include_self):
    """Asynchronous push-sum simulated in one process: random ranks push in random order, inboxes
    are drained at random times.  sum_i w_i x_i + in-flight and sum_i w_i + in-flight are conserved;
    after draining everything the de-biased x_i agree on the initial mean."""
    rng = np.random.default_rng(p)
    n = 17
    xs = [rng.standard_normal(n) for _ in range(p)]
    ws = [1.0] * p
    inbox = [np.zeros(n + 1) for _ in range(p)]
    mass0 = sum(xs)
    peers = [mixing.peer_rng(0, i) for i in range(p)]
    msg = np.empty(n + 1)
    d0 = mixing.consensus_distance(xs)
    for _ in range(400 * p):
        i = int(rng.integers(p))
        j = mixing.choose_peer(peers[i], i, p, include_self)
        if j != i:
            sent, ws[i] = mixing.push_split(ws[i])
            inbox[j] += mixing.push_message(xs[i], sent, msg)
        if rng.random() < 0.7:                          # sometimes the fold waits for a later step
            ws[i] = mixing.push_fold(xs[i], ws[i], inbox[i])
            inbox[i][...] = 0
        total = sum(w * x for w, x in zip(ws, xs)) + sum(b[:n] for b in inbox)
        np.testing.assert_allclose(total, mass0, rtol=1e-9, atol=1e-9)
        assert abs(sum(ws) + sum(b[n] for b in inbox) - p) < 1e-9
    for i in range(p):
        ws[i] = mixing.push_fold(xs[i], ws[i], inbox[i])
        inbox[i][...] = 0
    np.testing.assert_allclose(sum(w * x for w, x in zip(ws, xs)), mass0, rtol=1e-9, atol=1e-9)
    assert abs(sum(ws) - p) < 1e-9
    assert mixing.consensus_distance(xs) < 1e-6 * d0
    np.testing.assert_allclose(np.mean(xs, axis=0), mass0 / p, atol=1e-6)


def test_consensus_distance_oracle():
    assert mixing.consensus_distance([[0.0, 0.0], [2.0, 0.0]]) == 1.0


@pytest.mark.parametrize("p", [1, 2, 3, 6, 8])
def test_deterministic_graphs_cycle_through_their_peers(p):
    """Exponential: rank + 2^k, k = 0..ceil(log2 p)-1 cycling, never itself when p > 1;
    ring: rank + 1.  Both restart from their checkpointed state."""
    m = max(1, (p - 1).bit_length())
    for rank in range(p):
        g = G.ExponentialGraph(0, rank, p)
        got = [g.peer() for _ in range(2 * m)]
        assert got == [(rank + 2 ** (k % m)) % p for k in range(2 * m)]
        if p > 1:
            assert rank not in got
        again = G.ExponentialGraph(0, rank, p)
        again.load_state(g.state())
        assert again.peer() == g.peer()
        r = G.RingGraph(0, rank, p)
        assert {r.peer() for _ in range(3)} == {(rank + 1) % p}


@pytest.mark.parametrize("p", [2, 4, 8])
def test_exponential_pull_averages_exactly_in_log2_p_rounds(p):
    """Synchronous rounds of pull with gamma = 1/2 over the one-peer exponential graph: after
    log2(p) rounds every replica is the exact mean (up to rounding); the uniform graph is not."""
    rng = np.random.default_rng(p)
    x0 = [rng.standard_normal(11) for _ in range(p)]
    for name in ("exponential", "uniform"):
        xs = [x.copy() for x in x0]
        graphs = [G.GRAPHS[name](0, i, p, include_self=False) for i in range(p)]
        for _ in range(int(np.log2(p))):
            peers = [g.peer() for g in graphs]
            old = [x.copy() for x in xs]
            for i in range(p):
                mixing.pull_mix(xs[i], old[peers[i]], 0.5)
        d = mixing.consensus_distance(xs) / mixing.consensus_distance(x0)
        if name == "exponential":
            assert d < 1e-14, d
        elif p > 2:
            assert d > 1e-6, d          # a random peer does not average in log2(p) rounds


@pytest.mark.parametrize("name", ["exponential", "ring"])
def test_push_sum_conserves_mass_on_every_graph(name):
    """Push-sum over a deterministic graph: sum_i w_i x_i and sum_i w_i conserved; consensus."""
    p, n = 6, 9
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal(n) for _ in range(p)]
    ws, mass0 = [1.0] * p, sum(xs)
    graphs = [G.GRAPHS[name](0, i, p) for i in range(p)]
    msg = np.empty(n + 1)
    for _ in range(200):
        inbox = [np.zeros(n + 1) for _ in range(p)]
        for i in range(p):
            sent, ws[i] = mixing.push_split(ws[i])
            inbox[graphs[i].peer()] += mixing.push_message(xs[i], sent, msg)
        for i in range(p):
            ws[i] = mixing.push_fold(xs[i], ws[i], inbox[i])
        np.testing.assert_allclose(sum(w * x for w, x in zip(ws, xs)), mass0, rtol=1e-9, atol=1e-9)
        assert abs(sum(ws) - p) < 1e-9
    assert mixing.consensus_distance(xs) < 1e-6
