"""Typed, frozen, validated configuration: TOML file sections + command-line overrides.

A config has six sections, each a frozen dataclass: ``[model]``, ``[data]``, ``[optim]``,
``[schedule]``, ``[train]``, ``[dist]``.  Every field is also a command-line flag named after it
(``--batch-size``, ``--lr``, ``--nesterov/--no-nesterov``...); field names are unique across
sections.  Precedence: defaults < ``--config FILE.toml`` < flags.  Unknown keys, wrong types,
non-finite numbers and out-of-range values raise :class:`ConfigError` naming the key.  The
defaults are the built-in demo (ResNet-20 on the digits).

Derived defaults follow the data and the job, but only for keys nobody set (``Config.explicit`` holds
the keys the job file or the flags set; an explicit value is never changed):

* ``data.scale`` follows ``data.image_size`` and ``data.augment`` (``build``);
* ``data.batch_size`` and, for ``asgd``, ``schedule.lr`` follow the number of workers
  (``fit_to_world``, applied once the rank count is known and logged by rank 0).

The package: ``schema.py`` (the sections and their fields), ``values.py`` (reading, coercing and
checking values: ``build``), ``world.py`` (``fit_to_world``), ``reference.py`` (the docs table).
"""
from __future__ import annotations

from ..choices import workers_of  # noqa: F401 - re-exported: config.workers_of
from ..errors import ConfigError  # noqa: F401 - re-exported: config.ConfigError
from .reference import reference_markdown  # noqa: F401
from .schema import (EXTRA_META, GLOBAL_BATCH, MIN_WORKER_BATCH, MULTISCALE_RATIO, RRC_SCALE,  # noqa: F401
                     SECTIONS, Config, DataConfig, DistConfig, ModelConfig, TrainConfig, fields_of,
                     flag_name)
from .values import build, load_json_config, load_toml, parse_straggler  # noqa: F401
from .world import fit_to_world, fitted_batch  # noqa: F401
