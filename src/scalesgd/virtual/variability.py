"""Variability of the virtual cluster's compute: per-step noise, rare long delays, slow nodes.

A *condition* is a JSON object (``conditions/*.json`` ship with the package; ``--condition
FILE.json`` reads a user's own; a profile names its default in ``variability``):

==================  ===========================================================================
``name``            what ``--condition NAME`` selects
``description``     one line, shown by ``--list-profiles``
``source``          where its numbers come from (a citation, a measurement), or why it has none
``noise``           ``{"dist": "normal"|"lognormal", "cv": c}``: every step's compute is
                    multiplied by a factor of mean 1 and coefficient of variation c
                    (``normal``: max(0.5, 1 + c N(0, 1)); ``lognormal``: exp(s N(0, 1) - s^2/2),
                    s^2 = ln(1 + c^2), heavy-tailed).  Omitted or c = 0: none
``delays``          rare long delays: ``{"prob": q, "dist": "exponential"|"uniform"|"lognormal"|
                    "pareto"|"fixed", ..., "unit": "step"|"s", "fraction": f}``: after a step, with
                    probability q, a delay drawn from ``dist`` (``exponential``/``fixed``:
                    ``mean``; ``uniform``: ``low``, ``high``; ``lognormal``: ``mean``, ``cv``;
                    ``pareto``: ``scale`` x_m and ``alpha``) in units of the profile's step
                    (``step``, default) or seconds (``s``).  ``fraction`` (default 1): the share
                    of workers that can be delayed (chosen at random, rounded up; Jin et al.'s
                    straggler hook delays a few chosen ranks every step: q = 1)
``slow_nodes``      ``{"fraction": f, "factor": k}``: that share of nodes (rounded up) computes
                    every step k times slower, for the whole run
==================  ===========================================================================

Draws are per rank, from a stream of (seed, rank): what one rank draws for its k-th step does not
depend on what the others did or in which order the simulation ran them, so a re-timed run draws
exactly what a full run under the same profile and condition draws.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np

from ..errors import ConfigError
from . import jsonfile

CONDITION_DIR = Path(__file__).parent / "conditions"
DELAY_KEYS = {"exponential": {"mean"}, "fixed": {"mean"}, "uniform": {"low", "high"},
              "lognormal": {"mean", "cv"}, "pareto": {"scale", "alpha"}}


@dataclass(frozen=True)
class Condition:
    name: str
    description: str = ""
    source: str = ""
    noise: dict = field(default_factory=dict)
    delays: dict = field(default_factory=dict)
    slow_nodes: dict = field(default_factory=dict)

    @property
    def none(self) -> bool:
        return not (self.noise.get("cv") or self.delays.get("prob") or
                    (self.slow_nodes.get("fraction") and self.slow_nodes.get("factor", 1) != 1))

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def available() -> dict[str, Path]:
    return {p.stem: p for p in sorted(CONDITION_DIR.glob("*.json"))}


def load(spec, where: str = "--condition") -> Condition:
    """``spec``: a shipped condition's name, a JSON file's path, or an inline dict."""
    if isinstance(spec, dict):
        raw, origin = spec, where
    else:
        raw, origin = jsonfile.read(spec, available(), "condition", where)
    if not isinstance(raw, dict) or "name" not in raw:
        raise ConfigError(f"{origin}: a condition is a JSON object with at least a name")
    jsonfile.refuse_unknown(raw, Condition, origin)
    jsonfile.refuse_mistyped(raw, Condition, origin)
    cond = Condition(**raw)
    _check(cond, origin)
    return cond


def _check(c: Condition, origin: str) -> None:
    n, d, s = c.noise, c.delays, c.slow_nodes
    if n and (n.get("dist", "normal") not in ("normal", "lognormal") or not n.get("cv", 0) >= 0
              or set(n) - {"dist", "cv"}):
        raise ConfigError(f"{origin}: noise is {{\"dist\": \"normal\"|\"lognormal\", \"cv\": >= 0}}")
    if d:
        dist = d.get("dist")
        if dist not in DELAY_KEYS:
            raise ConfigError(f"{origin}: delays.dist is one of {', '.join(DELAY_KEYS)}")
        extra = set(d) - DELAY_KEYS[dist] - {"dist", "prob", "unit", "fraction"}
        if extra or DELAY_KEYS[dist] - set(d):
            raise ConfigError(f"{origin}: delays with dist {dist} take prob, unit, fraction and "
                              f"{', '.join(sorted(DELAY_KEYS[dist]))}")
        if not 0 <= d.get("prob", 0) <= 1 or not 0 < d.get("fraction", 1) <= 1 or \
                d.get("unit", "step") not in ("step", "s"):
            raise ConfigError(f"{origin}: delays: 0 <= prob <= 1, 0 < fraction <= 1, unit step or s")
        if any(not (isinstance(d[k], (int, float)) and d[k] >= 0) for k in DELAY_KEYS[dist]) or \
                (dist == "uniform" and d["high"] < d["low"]) or (dist == "pareto" and d["alpha"] <= 1):
            raise ConfigError(f"{origin}: delays' parameters must be >= 0 (uniform: low <= high; "
                              "pareto: alpha > 1, so that its mean is finite)")
    if s and (set(s) - {"fraction", "factor"} or not 0 <= s.get("fraction", 0) <= 1
              or not s.get("factor", 1) >= 1):
        raise ConfigError(f"{origin}: slow_nodes is {{\"fraction\": 0..1, \"factor\": >= 1}}")


def chosen(n: int, fraction: float, rng: np.random.Generator) -> set[int]:
    """``ceil(fraction n)`` of ``range(n)``, at random (none when fraction is 0)."""
    if not fraction or n < 1:
        return set()
    k = min(n, max(1, math.ceil(fraction * n - 1e-9)))
    return {int(i) for i in rng.choice(n, size=k, replace=False)}


class Variability:
    """The factor and delay of every rank's every step under one condition (see the module doc).
    ``ranks``: world ranks that compute (the workers), ``node_of``: a rank's node."""

    def __init__(self, cond: Condition, seed: int, ranks, node_of):
        self.cond, self.seed = cond, seed
        ranks = sorted(ranks)
        nodes = sorted({node_of(r) for r in ranks})
        pick = np.random.default_rng([seed, 0x510])
        slow = chosen(len(nodes), cond.slow_nodes.get("fraction", 0.0), pick)
        self.slow = {r for r in ranks if nodes.index(node_of(r)) in slow}
        self.delayed = {ranks[i] for i in chosen(len(ranks), cond.delays.get("fraction", 1.0), pick)} \
            if cond.delays.get("prob") else set()
        self._rng: dict[int, np.random.Generator] = {}
        n = cond.noise
        self.cv = float(n.get("cv", 0.0)) if n else 0.0
        self.lognormal = n.get("dist", "normal") == "lognormal" if n else False
        self.sigma = math.sqrt(math.log1p(self.cv ** 2)) if self.lognormal else 0.0

    def rng(self, rank: int) -> np.random.Generator:
        if rank not in self._rng:
            self._rng[rank] = np.random.default_rng([self.seed, rank, 0xC0FE])
        return self._rng[rank]

    def __call__(self, rank: int, base: float) -> float:
        """Seconds of ``rank``'s next step whose undisturbed compute is ``base``."""
        c, t = self.cond, base
        if rank in self.slow:
            t *= float(c.slow_nodes.get("factor", 1.0))
        if self.cv:
            z = self.rng(rank).standard_normal()
            t *= (math.exp(self.sigma * z - self.sigma ** 2 / 2) if self.lognormal
                  else max(0.5, 1.0 + self.cv * z))
        d = c.delays
        if rank in self.delayed and self.rng(rank).random() < d["prob"]:
            t += self.delay(rank) * (base if d.get("unit", "step") == "step" else 1.0)
        return t

    def delay(self, rank: int) -> float:
        d, g = self.cond.delays, self.rng(rank)
        dist = d["dist"]
        if dist == "fixed":
            return float(d["mean"])
        if dist == "exponential":
            return float(g.exponential(d["mean"]))
        if dist == "uniform":
            return float(g.uniform(d["low"], d["high"]))
        if dist == "lognormal":
            s2 = math.log1p(d["cv"] ** 2)
            return float(d["mean"] * math.exp(math.sqrt(s2) * g.standard_normal() - s2 / 2))
        return float(d["scale"] * (1.0 + g.pareto(d["alpha"])))      # pareto: x_m (1 + Lomax)
