"""The defaults that follow the rank count (``fit_to_world``), applied once it is known."""
from __future__ import annotations

import dataclasses
import logging

from ..choices import workers_of
from .schema import GLOBAL_BATCH, MIN_WORKER_BATCH, Config


def fitted_batch(cfg: Config, workers: int) -> int:
    """The per-worker batch a run of ``workers`` workers uses: ``data.batch_size`` as set, else the
    demo's global batch split over them, at least MIN_WORKER_BATCH (``fit_to_world``)."""
    if "data.batch_size" in cfg.explicit:
        return cfg.data.batch_size
    return max(MIN_WORKER_BATCH, GLOBAL_BATCH // workers)


def fit_to_world(cfg: Config, ranks: int, worker_nodes: int | None = None) -> Config:
    """The defaults that depend on the rank count, for keys nobody set; each change is logged (only
    rank 0 logs at INFO).  An explicit value is kept as given.

    * ``data.batch_size``: the demo's global batch of 64 split over the workers, at least 8 per
      worker (4 workers: 16, as jobs/digits-*.toml), so an epoch keeps the step count of one rank.
    * ``schedule.lr`` for ``asgd``: the base rate / the pushers (workers; ``dist.hierarchy = node``:
      node groups), since the server adds every update (jobs/digits-asgd.toml: 0.033).
    """
    workers = workers_of(cfg.train.method, ranks, cfg.dist.servers)
    log = logging.getLogger("scalesgd")
    data, sched = cfg.data, cfg.schedule
    if "data.batch_size" not in cfg.explicit:
        batch = fitted_batch(cfg, workers)
        if batch != data.batch_size:
            log.info("data.batch_size not set: %d per worker (global batch %d over %d workers); "
                     "--batch-size sets it", batch, batch * workers, workers)
            data = dataclasses.replace(data, batch_size=batch)
    grouped = cfg.dist.hierarchy == "node" and worker_nodes is not None
    pushers, who = (worker_nodes, "worker node group") if grouped else (workers, "worker")
    if cfg.train.method == "asgd" and "schedule.lr" not in cfg.explicit and pushers > 1:
        lr = sched.lr / pushers
        log.info("schedule.lr not set: asgd uses %g / %d %ss = %.4g (its server adds every "
                 "%s's update); --lr sets it", sched.lr, pushers, who, lr, who)
        sched = dataclasses.replace(sched, lr=lr)
    return dataclasses.replace(cfg, data=data, schedule=sched)
