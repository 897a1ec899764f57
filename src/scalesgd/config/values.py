"""Reading and checking values: a job file (TOML) or a run's saved ``config.json``, flag and file
values coerced to the field's type and range (``ConfigError`` naming the key), merged into a
``Config`` (``build``), the derived ``data.scale`` and the checks across keys.
"""
from __future__ import annotations

import dataclasses
import json
import math
import tomllib
import typing
from pathlib import Path

from ..errors import ConfigError
from .schema import MULTISCALE_RATIO, RRC_SCALE, SECTIONS, Config, fields_of


def _coerce(key: str, value, typ):
    """Checks/converts one TOML or flag value to the field's declared type."""
    origin = typing.get_origin(typ)
    if origin is tuple:
        args = typing.get_args(typ)
        if isinstance(value, str):
            value = [v for v in value.replace(" ", "").split(",") if v]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        elem = args[0]
        if args[-1] is not Ellipsis and len(value) != len(args):
            raise ConfigError(f"{key}: expected {len(args)} values, got {len(value)}")
        return tuple(_coerce(key, v, elem) for v in value)
    if typ is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected true or false, got {value!r}")
    if typ is int:
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        try:
            return int(value)
        except ValueError:
            raise ConfigError(f"{key}: expected an integer, got {value!r}") from None
    if typ is float:
        if isinstance(value, bool):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        try:
            out = float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{key}: expected a number, got {value!r}") from None
        if not math.isfinite(out):          # nan / inf would train (and summarise) garbage
            raise ConfigError(f"{key}: expected a finite number, got {value!r}")
        return out
    if typ is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {value!r}")
        return value
    raise TypeError(f"unsupported config type {typ} for {key}")


def _check_range(key: str, value, meta: dict):
    vals = value if isinstance(value, tuple) else (value,)
    choices, lo, hi = meta.get("choices"), meta.get("lo"), meta.get("hi")
    for v in vals:
        if choices and v not in choices:
            raise ConfigError(f"{key}: expected one of {', '.join(map(str, choices))}, got {v!r}")
        if lo is not None and (v <= lo if meta.get("lo_open") else v < lo):
            raise ConfigError(f"{key}: must be {'>' if meta.get('lo_open') else '>='} {lo}, got {v!r}")
        if hi is not None and v > hi:
            raise ConfigError(f"{key}: must be <= {hi}, got {v!r}")


def _section(name: str, values: dict):
    hints = typing.get_type_hints(SECTIONS[name])
    known = {f.name: meta for f, meta in fields_of(name)}
    out = {}
    for k, v in values.items():
        if k not in known:
            raise ConfigError(f"{name}.{k}: unknown key (known: {', '.join(sorted(known))})")
        v = _coerce(f"{name}.{k}", v, hints[k])
        _check_range(f"{name}.{k}", v, known[k])
        out[k] = v
    return dataclasses.replace(getattr(Config(), name), **out)   # the demo's defaults underneath


def build(file_values: dict | None = None, overrides: dict | None = None) -> Config:
    """Config from nested ``{section: {key: value}}`` dicts: file values, then overrides on top."""
    merged: dict[str, dict] = {s: {} for s in SECTIONS}
    for source in (file_values or {}), (overrides or {}):
        for sec, vals in source.items():
            if sec not in SECTIONS:
                raise ConfigError(f"{sec}: unknown section (known: {', '.join(SECTIONS)})")
            if not isinstance(vals, dict):
                raise ConfigError(f"{sec}: expected a table of keys, got {vals!r}")
            merged[sec].update(vals)
    explicit = frozenset(f"{s}.{k}" for s, vals in merged.items() for k in vals)
    cfg = Config(**{s: _section(s, v) for s, v in merged.items()}, explicit=explicit)
    return _cross_checks(_derive_scale(cfg))


def _derive_scale(cfg: Config) -> Config:
    """An unset ``data.scale`` follows the augmentation and the crop size (as ``val_resize`` does)."""
    d = cfg.data
    if "data.scale" in cfg.explicit:
        return cfg
    lo, hi = RRC_SCALE if d.augment == "rrc" else (d.image_size * r for r in MULTISCALE_RATIO)
    return dataclasses.replace(cfg, data=dataclasses.replace(d, scale=(float(lo), float(hi))))


def _cross_checks(cfg: Config) -> Config:
    lo, hi = cfg.data.scale
    if lo > hi:
        raise ConfigError(f"data.scale: lower bound {lo} is above upper bound {hi}")
    if cfg.data.augment == "rrc" and hi > 1:
        raise ConfigError(f"data.scale: rrc takes area fractions in (0, 1], got {cfg.data.scale}")
    if cfg.data.augment == "multiscale" and lo < cfg.data.image_size:
        raise ConfigError(f"data.scale: multiscale shorter side {lo} is below data.image_size "
                          f"{cfg.data.image_size}")
    if cfg.dist.straggler:
        parse_straggler(cfg.dist.straggler)            # raises ConfigError naming dist.straggler
    if -1 < cfg.dist.bucket_mb < 0:
        raise ConfigError(f"dist.bucket_mb: -1 (auto) or a size >= 0 in MB, got {cfg.dist.bucket_mb}")
    if cfg.dist.hierarchy == "node" and cfg.train.on_failure == "continue" \
            and cfg.train.method == "allreduce":
        # tried under Open MPI's ULFM on 3 emulated nodes: after a leader's death the two-level
        # sum's non-blocking collectives never returned (the job timed out at 240 s)
        raise ConfigError("dist.hierarchy: all-reduce's two-level sum cannot survive a lost rank yet "
                          "(train.on_failure = continue): drop --hierarchy node or --on-failure continue")
    if cfg.dist.hierarchy == "node" and cfg.dist.allreduce_transport not in ("auto", "host"):
        raise ConfigError(f"dist.hierarchy: 'node' sums through MPI on host buffers; "
                          f"dist.allreduce_transport = {cfg.dist.allreduce_transport} is a device "
                          "transport (NCCL is topology-aware by itself): use one or the other")
    if cfg.dist.max_staleness >= 0 and cfg.dist.servers > 1 and cfg.train.method == "asgd":
        # each shard would judge a push by its own version: one update applied to some slices only
        raise ConfigError(f"dist.max_staleness: needs dist.servers = 1 (got {cfg.dist.servers}): each "
                          "shard would judge staleness by its own version and could apply a push to some "
                          "slices of the model only")
    if list(cfg.schedule.milestones) != sorted(cfg.schedule.milestones):
        raise ConfigError(f"schedule.milestones: must be increasing, got {cfg.schedule.milestones}")
    if cfg.schedule.epochs == 0:        # cosine horizon defaults to the training length
        cfg = dataclasses.replace(cfg, schedule=dataclasses.replace(cfg.schedule,
                                                                    epochs=float(cfg.train.epochs)))
    return cfg


def parse_straggler(spec: str) -> tuple[tuple[int, ...], float, float]:
    """'1,3:100:50' -> ((1, 3), 100.0, 50.0): ranks, delay ms, jitter ms (uniform +-jitter)."""
    parts = spec.split(":")
    try:
        if len(parts) not in (2, 3):
            raise ValueError
        ranks = tuple(int(r) for r in parts[0].split(",") if r)
        delay = float(parts[1])
        jitter = float(parts[2]) if len(parts) == 3 else 0.0
        if not ranks or min(ranks) < 0 or delay < 0 or jitter < 0 or jitter > delay:
            raise ValueError
    except ValueError:
        raise ConfigError(f"dist.straggler: expected RANKS:DELAY_MS[:JITTER_MS] with jitter <= delay, "
                          f"e.g. '1,3:100:50', got {spec!r}") from None
    return ranks, delay, jitter


def load_json_config(path: str | Path) -> dict:
    """A run's saved config.json (for --resume); a missing or unreadable file names the path."""
    p = Path(path)
    try:
        return json.loads(p.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{p}: not found (is this a run directory?)") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{p}: unreadable ({exc})") from None


def load_toml(path: str | Path) -> dict:
    """Reads a TOML job file; a missing file or bad syntax is a ConfigError naming the file."""
    p = Path(path)
    try:
        with p.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"{p}: config file not found") from None
    except IsADirectoryError:
        raise ConfigError(f"{p}: is a directory, not a TOML config file") from None
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read the config file ({exc.strerror or exc})") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{p}: malformed TOML: {exc}") from None
