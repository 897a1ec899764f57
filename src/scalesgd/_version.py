"""The package version, for ``--version``: the installed package's metadata (the ``version`` of
setup.cfg when it was installed), else setup.cfg itself when running from a clone that was never
installed (``python -m src.main`` with the dependencies from elsewhere)."""
from __future__ import annotations

import configparser
from importlib import metadata
from pathlib import Path

SETUP_CFG = Path(__file__).resolve().parents[2] / "setup.cfg"     # src/scalesgd/ -> repository root


def version() -> str:
    try:
        return metadata.version("scalesgd")
    except metadata.PackageNotFoundError:
        cfg = configparser.ConfigParser()
        cfg.read(SETUP_CFG)
        return cfg.get("metadata", "version", fallback="unknown (not installed, no setup.cfg)")
