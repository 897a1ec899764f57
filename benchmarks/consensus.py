"""Gossip with gradients off: how fast the replicas agree (experiment 5 of docs/results.md).

    mpiexec -n P python benchmarks/consensus.py --variant pull|push [--graph uniform|exponential|ring]
                                                [--rounds R] [--repeats K] [--floats N] [--json OUT]

Each rank starts from its own random vector (N floats, seeded by rank and repeat), then every round
each rank makes exactly one exchange of the real ``Gossip`` method with its peer on ``--graph``
(``dist.gossip_graph``; pull: one-sided Get of a random
peer's published copy, x_i <- (x_i + x_j)/2; push: push-sum through Accumulate), followed by a barrier
and a measurement: the consensus distance mean_i ||x_i - xbar|| relative to its initial value (for
push, after every rank folded its inbox, so nothing is in flight), and how far the average moved
(pull does not conserve the mean; push-sum conserves sum_i w_i x_i).  Rank 0 writes the mean over
repeats of the relative distance after 0..R exchanges per rank, the decay rate per exchange
(d_k ** (1/k) at the last k where d_k is still above rounding level, 1e-10), and the exchanges until
the distance falls below 1e-3.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from scalesgd import config as C
from scalesgd.comm.mpi import start
from scalesgd.methods import graphs, mixing
from scalesgd.methods import create
from scalesgd.train.control import Signals


FLOOR = 1e-10          # relative distances below this are rounding, not mixing


def gather(comm, a):
    out = np.empty((comm.size, a.size), a.dtype)
    comm.Allgather(a, out)
    return out


def one_repeat(topo, variant: str, rounds: int, n: int, repeat: int,
               graph: str = "uniform") -> tuple[list[float], float]:
    comm = topo.comm
    cfg = C.build(overrides={"train": {"method": "gossip", "seed": 1000 + repeat},
                             "dist": {"gossip": variant, "gossip_graph": graph}})
    m = create(cfg, topo, Signals()).exchange          # the gossip strategy itself
    ps = SimpleNamespace(params=np.zeros(n), buffers=np.zeros(1), xp=np)
    m.start(ps)
    ps.params[...] = np.random.default_rng([repeat, comm.rank]).standard_normal(n)
    if variant == "pull":
        m.pub.publish(ps.params)
    comm.Barrier()
    xs = gather(comm, ps.params)
    d0, mean0 = mixing.consensus_distance(xs), xs.mean(axis=0)
    dist = [1.0]
    for _ in range(rounds):
        m.after_update(0, ps, 0)             # one exchange (tau 1); counts no samples
        comm.Barrier()                       # every exchange of this round has completed
        if variant == "push":
            m.quiesce(ps)                    # fold what arrived: nothing left in flight
        xs = gather(comm, ps.params)
        w = np.array(comm.allgather(m.stats().get("pushsum_weight", 1.0)))   # pull: all 1
        dist.append(mixing.consensus_distance(xs) / d0)
        comm.Barrier()
    if variant == "push":                    # the conserved quantity: sum_i w_i x_i / sum_i w_i
        mean = (w[:, None] * xs).sum(axis=0) / w.sum()
    else:
        mean = xs.mean(axis=0)
    drift = float(np.linalg.norm(mean - mean0)) / d0
    m.close()
    return dist, drift


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--variant", choices=["pull", "push"], default="pull")
    ap.add_argument("--graph", choices=list(graphs.GRAPHS), default="uniform")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--floats", type=int, default=100_000)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    topo = start.init()
    curves, drifts = [], []
    for rep in range(a.repeats):
        d, drift = one_repeat(topo, a.variant, a.rounds, a.floats, rep, a.graph)
        curves.append(d)
        drifts.append(drift)
    if topo.rank == 0:
        mean = np.array(curves).mean(axis=0)          # expected relative distance after k exchanges
        below = np.nonzero(mean <= 1e-3)[0]
        # decay rate per exchange, fitted before the distance hits rounding level (identical
        # replicas stay exactly identical, so the distance can drop to exactly 0)
        k = int(np.nonzero(mean > FLOOR)[0][-1]) if (mean > FLOOR).any() else 0
        k = max(k, 1)
        out = dict(variant=a.variant, graph=a.graph, ranks=topo.size, rounds=a.rounds, repeats=a.repeats,
                   floats=a.floats, distance=mean.tolist(),
                   rate_per_exchange=float(max(mean[k], 0.0) ** (1.0 / k)), rate_fitted_over=k,
                   **{"exchanges_to_1e-3": int(below[0]) if len(below) else None},
                   mean_drift=float(np.mean(drifts)))
        print(json.dumps({k: v for k, v in out.items() if k != "distance"}))
        if a.json:
            a.json.write_text(json.dumps(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
