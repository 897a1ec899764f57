"""Atomic file writes: a reader sees the old file or the complete new one, never half of one."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path


def write_atomic(path: str | Path, data: bytes) -> None:
    """Writes ``data`` to a temp file in the same directory, fsyncs it, then renames it over ``path``."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_json_atomic(path: str | Path, obj) -> None:
    write_atomic(path, (json.dumps(obj, indent=2, sort_keys=False) + "\n").encode())
