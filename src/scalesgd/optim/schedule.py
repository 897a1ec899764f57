"""Learning-rate schedules as pure functions of training progress (epochs, a float).

``lr_at(cfg, epoch, update_batch)`` depends on nothing else, so every rank, a resumed run and a plot
agree on it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

SCHEDULES = ("constant", "step", "cosine")


@dataclass(frozen=True)
class ScheduleConfig:
    lr: float = 0.1                        # base rate (for the reference batch, see linear scaling)
    schedule: str = "step"                 # constant | step | cosine
    milestones: tuple[float, ...] = (30.0, 60.0, 80.0)   # epochs where step decay multiplies by gamma
    gamma: float = 0.1
    warmup_epochs: float = 0.0             # linear warm-up from warmup_start_factor * peak to peak
    warmup_start_factor: float = 0.1
    epochs: float = 90.0                   # horizon of the cosine schedule (the CLI: 0 = train.epochs)
    final_lr_factor: float = 0.0           # cosine ends at final_lr_factor * peak
    linear_scaling: bool = False           # peak = lr * global batch / reference_batch (Goyal et al.)
    reference_batch: int = 256


def peak_lr(cfg: ScheduleConfig, update_batch: int) -> float:
    """The base rate, scaled linearly with ``update_batch`` when ``linear_scaling`` is on.

    ``update_batch`` is the job's global batch (every worker's batch), for every method alike,
    as in SGP and SlowMo (Goyal et al.'s rule applied alike)."""
    return cfg.lr * update_batch / cfg.reference_batch if cfg.linear_scaling else cfg.lr


def lr_at(cfg: ScheduleConfig, epoch: float, update_batch: int) -> float:
    """Learning rate after ``epoch`` epochs of training (fractional: step / steps_per_epoch);
    ``update_batch`` as for ``peak_lr``."""
    peak = peak_lr(cfg, update_batch)
    if cfg.warmup_epochs > 0 and epoch < cfg.warmup_epochs:
        t = epoch / cfg.warmup_epochs
        return peak * (cfg.warmup_start_factor + (1.0 - cfg.warmup_start_factor) * t)
    if cfg.schedule == "constant":
        return peak
    if cfg.schedule == "step":
        return peak * cfg.gamma ** sum(epoch >= m for m in cfg.milestones)
    if cfg.schedule == "cosine":
        span = max(cfg.epochs - cfg.warmup_epochs, 1e-12)
        t = min(max((epoch - cfg.warmup_epochs) / span, 0.0), 1.0)
        lo = peak * cfg.final_lr_factor
        return lo + (peak - lo) * 0.5 * (1.0 + math.cos(math.pi * t))
    raise ValueError(f"schedule: expected one of {', '.join(SCHEDULES)}, got {cfg.schedule!r}")
