"""Atomic file writes: a reader sees the old file or the complete new one, never half of one; and
run directories named by the clock that two runs of the same second do not share."""
from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path


def stamped(name: str, root: str | Path = "runs") -> Path:
    """``root/<YYYYmmdd-HHMMSS>-name``: a default run directory, named by the clock."""
    return Path(root) / f"{time.strftime('%Y%m%d-%H%M%S')}-{name}"


def free_name(base: Path) -> Path:
    """``base``, else ``base.2``, ``base.3``, ...: the first that does not exist yet (a second run
    started within the same second gets a directory of its own instead of being refused)."""
    path, n = base, 1
    while os.path.lexists(path):          # (a dangling link takes the name too)
        n += 1
        path = base.with_name(f"{base.name}.{n}")
    return path


def reserve_dir(base: Path) -> Path:
    """``free_name(base)``, created here, exclusively: of two processes that pick the same name at
    once, one creates it and the other goes on to the next."""
    while True:
        path = free_name(base)
        try:
            path.mkdir(parents=True)
            return path
        except FileExistsError:
            continue


def umask() -> int:
    """This process's umask, without changing it (Linux: /proc/self/status; elsewhere set and
    restored at once)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def make_temp(directory: Path, prefix: str, suffix: str = ".tmp") -> tuple[int, str]:
    """``tempfile.mkstemp`` in ``directory``, but with the permissions a plain ``open`` would give
    (0666 less the umask) instead of mkstemp's 0600: results of a run follow the umask, so that a
    group can read them on a shared cluster."""
    fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=directory)
    try:
        os.fchmod(fd, 0o666 & ~umask())
    except OSError:
        pass
    return fd, tmp


def write_atomic(path: str | Path, data: bytes) -> None:
    """Writes ``data`` to a temp file in the same directory, fsyncs it, then renames it over ``path``
    (the file gets the permissions the umask gives, as a plain ``open`` would)."""
    path = Path(path)
    fd, tmp = make_temp(path.parent, f".{path.name}.")
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
