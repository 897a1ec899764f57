"""A virtual run's clock without its arithmetic: the same run, timed, in a fraction of its cost.

In the virtual cluster time passes only through the transport: a step's compute from the profile
(``step_done``), each message and collective from its bytes, the condition's draws per rank and
step.  None of it depends on the values of the parameters or the images: for a method whose
decisions ignore those values (every method, as long as no run stops at a target error or
diverges), a run whose model neither computes nor reads data takes exactly the same simulated
seconds at every step and validation as the real run.  ``clock_only`` runs that: its ranks hold
real parameter buffers (so the methods sum, mix and send them as usual), a model whose forward
returns zero logits and whose backward leaves the gradients at zero, and loaders of zero batches
with the real loaders' counts (``train_steps`` per epoch, each rank's share of the validation); no
data set is read and DALI is not used.

``python -m scalesgd plan`` uses it to time the study's configurations under a user's profile: the
synchronous methods' samples to target do not depend on the clock, so their times under any
profile are exact (``tests/test_plan.py`` checks them against re-timings of real runs).  A profile
whose compute is *measured* needs the real steps: refused.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..data.pipeline import train_steps, val_indices
from ..errors import ConfigError


class Shards:
    """What a virtual run needs to know of a split it does not read: its size and classes."""

    def __init__(self, num_samples: int, num_classes: int, split: str):
        self.num_samples, self.num_classes, self.split = int(num_samples), int(num_classes), split
        self.root = Path("(clock only)")


class Loader:
    """Zero batches, as many as the real loader of this rank would deliver."""

    crops = 1

    def __init__(self, shards: Shards, *, batch_size: int, image_size: int, train: bool, rank: int,
                 world: int):
        n = shards.num_samples
        own = train_steps(n, batch_size, world) * batch_size if train else len(val_indices(n, rank, world))
        self.steps = -(-own // batch_size)
        self.last = own - (self.steps - 1) * batch_size           # (validation: a shorter last batch)
        self.x = np.zeros((batch_size, image_size, image_size, 3), np.float32)
        self.y = np.zeros(batch_size, np.int64)
        self.train, self.num_samples = train, n
        self._checks = np.zeros(n, np.uint8)

    @property
    def steps_per_epoch(self) -> int:
        return self.steps

    def epoch(self, epoch: int, start_step: int = 0):
        for i in range(start_step, self.steps):
            k = self.last if i == self.steps - 1 else len(self.y)
            yield self.x[:k], self.y[:k]

    def take_new_bad(self) -> list:
        return []

    @property
    def checks(self) -> np.ndarray:
        return self._checks.copy()

    def merge_checks(self, other) -> None:
        pass

    def bad_state(self) -> dict:
        return {"bad": [], "pending": []}

    def restore_bad(self, state: dict) -> None:
        pass


def loaders(cfg, splits, roles, backend, data_threads: int):
    """``train.assemble.loaders`` for a clock-only run: (train, val) of zero batches (None on a
    server rank)."""
    if roles.is_server:
        return None, None
    common = dict(batch_size=cfg.data.batch_size, image_size=cfg.data.image_size,
                  rank=roles.worker_index, world=roles.num_workers)
    return Loader(splits[0], train=True, **common), Loader(splits[1], train=False, **common)


def strip(model) -> None:
    """The model computes nothing: zero logits forward, zero gradients backward (this instance)."""
    k, dtype = model.num_classes, model.ps.params.dtype

    def forward(x, train):
        return np.zeros((x.shape[0], k), dtype), None

    def backward(dlogits, cache, need_dx=False):
        return None
    model.forward, model.backward = forward, backward


def check(prof) -> None:
    if prof.measured:
        raise ConfigError(f"--profile {prof.name}: its compute is measured (the real seconds of each step), "
                          "so its clock cannot run without the arithmetic")
