"""Pure gossip numerics, no MPI: peer choice, pull mixing, push-sum split and fold.

Arrays may be NumPy or CuPy (only array arithmetic is used); the functions work in place where they
say so, so a flat parameter buffer is never copied more than once.
"""
from __future__ import annotations

import numpy as np

PEER_STREAM = 0x6055        # keeps the peer stream apart from the data/straggler streams of one seed


def peer_rng(seed: int, rank: int) -> np.random.Generator:
    """The generator rank ``rank`` draws its peers from: reproducible, different on every rank."""
    return np.random.default_rng([seed, rank, PEER_STREAM])


def choose_peer(rng: np.random.Generator, rank: int, size: int, include_self: bool = True) -> int:
    """A peer uniform over all ``size`` ranks (the authors' choice, self included), or over the
    others when ``include_self`` is False (a one-rank world can only pick itself)."""
    if include_self or size == 1:
        return int(rng.integers(size))
    j = int(rng.integers(size - 1))
    return j + (j >= rank)


def pull_mix(x, peer, gamma: float):
    """x <- (1 - gamma) x + gamma peer, in place on ``x`` (returns it), computed as
    (x - peer)(1 - gamma) + peer: no temporary, and equal replicas stay exactly equal."""
    x -= peer
    x *= 1.0 - gamma
    x += peer
    return x


def push_split(w: float, dtype=np.float64) -> tuple[float, float]:
    """Push-sum: the weight sent (w/2, rounded to ``dtype`` as it travels) and the weight kept;
    sent + kept == w exactly."""
    sent = float(np.dtype(dtype).type(w / 2))
    return sent, w - sent


def push_message(x, w_sent: float, out):
    """The push-sum message for de-biased parameters x: out[:n] = w_sent x (the numerator share),
    out[n] = w_sent.  The sender's de-biased x is unchanged by the split (both halves scale)."""
    n = x.size
    out[:n] = x
    out[:n] *= w_sent
    out[n] = w_sent
    return out


def push_fold(x, w: float, inbox) -> float:
    """Folds a drained inbox (numerator sum S = inbox[:n], weight sum W = inbox[n]) into the state
    whose numerator is w x: x <- (w x + S) / (w + W), in place.  Returns the new weight w + W."""
    n = x.size
    W = float(inbox[n])
    x *= w
    x += inbox[:n]
    w_new = w + W
    x /= w_new
    return w_new


def consensus_distance(xs) -> float:
    """mean_i ||x_i - mean(x)|| of a list of replicas (the single-process oracle for tests)."""
    xs = np.asarray(xs, dtype=np.float64)
    return float(np.mean(np.linalg.norm(xs - xs.mean(axis=0), axis=1)))
