"""Checkpoint files: one HDF5 file per checkpoint, written atomically, checksummed, last K kept.

Layout of ``RUN_DIR/checkpoints/ckpt-<global samples, 12 digits>.h5``::

    attrs  format = "scalesgd-checkpoint", format_version = 1, meta = JSON (config, method, ranks,
           num_params, global samples, boundaries done, evaluation history, reason, time)
    /rank-00000/params, momentum, buffers, <method arrays>    one group per rank (every replica;
                                                              the server's weights on rank 0 for
                                                              easgd/asgd), each dataset with a
                                                              ``blake2b`` attribute (hex digest)
    /rank-00000 attrs  state = JSON (loop counters, method scalars, RNG states, data position)

Written to a temporary name in the same directory, flushed, fsync'd, renamed: a reader sees the
previous complete checkpoint or the new complete one, never half of one.  Loading checks every
digest of the rank it reads (``read_rank``) or of the whole file (``verify``).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import h5py
import numpy as np

from ..errors import CheckpointError  # noqa: F401 - re-exported
from .files import make_temp

FORMAT, FORMAT_VERSION = "scalesgd-checkpoint", 1
NAME = re.compile(r"^ckpt-(\d{12})\.h5$")


def digest(a: np.ndarray) -> str:
    return hashlib.blake2b(np.ascontiguousarray(a).view(np.uint8).ravel(), digest_size=16).hexdigest()


def checkpoint_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def file_name(global_samples: int) -> str:
    return f"ckpt-{global_samples:012d}.h5"


class Writer:
    """Root only: collects every rank's state (``add_rank``), then ``commit()`` makes it visible."""

    def __init__(self, directory: Path, global_samples: int, meta: dict):
        self.final = directory / file_name(global_samples)
        try:                        # a read-only or full run directory is the user's to fix
            directory.mkdir(parents=True, exist_ok=True)
            fd, tmp = make_temp(directory, ".ckpt-")
            os.close(fd)
        except OSError as exc:
            raise CheckpointError(f"{directory}: cannot write a checkpoint here ({exc.strerror or exc})"
                                  ) from None
        self.tmp = Path(tmp)
        self.f = h5py.File(self.tmp, "w")
        self.f.attrs["format"], self.f.attrs["format_version"] = FORMAT, FORMAT_VERSION
        self.f.attrs["meta"] = json.dumps(meta)

    def add_rank(self, rank: int, arrays: dict, state: str) -> None:
        try:
            g = self.f.create_group(f"rank-{rank:05d}")
            g.attrs["state"] = state
            for name, a in arrays.items():
                ds = g.create_dataset(name, data=np.asarray(a))
                ds.attrs["blake2b"] = digest(np.asarray(a))
        except OSError as exc:      # e.g. the disk filled up while the file was written
            raise self.failed(exc) from None

    def commit(self) -> Path:
        try:
            return self._commit()
        except OSError as exc:
            raise self.failed(exc) from None

    def failed(self, exc: OSError) -> CheckpointError:
        """One line: the checkpoint, the file system and its free space, the cause, the last good
        checkpoint (HDF5's own message is a paragraph: its errno says what happened)."""
        cause = os.strerror(exc.errno) if exc.errno else " ".join(str(exc).split())[:200]
        mount = _mount_point(self.final.parent)
        try:
            st = os.statvfs(mount)
            free = f", {_size(st.f_bavail * st.f_frsize)} free of {_size(st.f_blocks * st.f_frsize)}"
        except OSError:
            free = ""
        last = "there is no earlier good checkpoint"
        for p in reversed([p for p in listing(self.final.parent) if p != self.final]):
            try:
                verify(p)                        # (its digests: the one a --resume would take)
            except CheckpointError:
                continue
            last = f"the last good checkpoint is {p}"
            break
        return CheckpointError(f"{self.final}: cannot write the checkpoint ({cause}) on the file system "
                               f"mounted at {mount}{free}; {last}")

    def _commit(self) -> Path:
        self.f.close()
        with open(self.tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(self.tmp, self.final)
        dfd = os.open(self.final.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        return self.final

    def abort(self) -> None:
        """Drops the unfinished file.  Closing it may fail as writing did (HDF5 flushes on close,
        into the same full disk): that is not a second error, the file is removed either way."""
        try:
            self.f.close()
        except OSError:
            pass
        finally:
            self.tmp.unlink(missing_ok=True)


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return ""


def _mount_point(path: Path) -> Path:
    """The mount point of the file system holding ``path``."""
    p = path.resolve()
    while not os.path.ismount(p) and p != p.parent:
        p = p.parent
    return p


def _open(path: Path) -> h5py.File:
    try:
        f = h5py.File(path, "r")
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no such checkpoint") from None
    except OSError as exc:
        raise CheckpointError(f"{path}: not a readable HDF5 file (truncated or corrupt: {exc})") from None
    if f.attrs.get("format") != FORMAT:
        f.close()
        raise CheckpointError(f"{path}: not a scalesgd checkpoint")
    return f


def read_meta(path: str | Path) -> dict:
    with _open(Path(path)) as f:
        return json.loads(f.attrs["meta"])


def _read_group(path: Path, g) -> tuple[dict, dict]:
    arrays = {}
    for name, ds in g.items():
        a = ds[...]
        if digest(a) != ds.attrs.get("blake2b"):
            raise CheckpointError(f"{path}: checksum mismatch in {g.name}/{name} (corrupt checkpoint)")
        arrays[name] = a
    return arrays, json.loads(g.attrs["state"])


def read_rank(path: str | Path, rank: int, arrays: bool = True) -> tuple[dict, dict, dict]:
    """(meta, arrays, state) of one rank, every digest checked; ``arrays=False``: the JSON state
    alone (arrays ``{}``, nothing read or checked but the attributes)."""
    path = Path(path)
    with _open(path) as f:
        key = f"rank-{rank:05d}"
        if key not in f:
            raise CheckpointError(f"{path}: holds no state for rank {rank}")
        try:
            got, state = _read_group(path, f[key]) if arrays else ({}, json.loads(f[key].attrs["state"]))
        except (OSError, KeyError) as exc:
            raise CheckpointError(f"{path}: unreadable {key} ({exc})") from None
        return json.loads(f.attrs["meta"]), got, state


def verify(path: str | Path) -> dict:
    """Checks every dataset's digest; returns the meta.  Raises CheckpointError naming the cause."""
    path = Path(path)
    with _open(path) as f:
        meta = json.loads(f.attrs["meta"])
        for key in f:
            try:
                _read_group(path, f[key])
            except (OSError, KeyError) as exc:
                raise CheckpointError(f"{path}: unreadable {key} ({exc})") from None
        if len([k for k in f if k.startswith("rank-")]) != meta["ranks"]:
            raise CheckpointError(f"{path}: incomplete ({meta['ranks']} ranks expected)")
    return meta


def listing(directory: str | Path) -> list[Path]:
    """Checkpoint files of a directory, oldest first."""
    d = Path(directory)
    if not d.is_dir():
        return []
    return sorted(p for p in d.iterdir() if NAME.match(p.name))


def latest_good(directory: str | Path) -> Path:
    """The newest checkpoint that verifies.  If the newest is corrupt, the error names it and the
    previous good one (the user decides: ``--resume`` that file)."""
    files = listing(directory)
    if not files:
        raise CheckpointError(f"{directory}: no checkpoint to resume from")
    try:
        verify(files[-1])
        return files[-1]
    except CheckpointError as exc:
        for older in reversed(files[:-1]):
            try:
                verify(older)
            except CheckpointError:
                continue
            raise CheckpointError(f"{exc}; the previous good checkpoint is {older}: "
                                  f"resume from it with --resume {older}") from None
        raise


def prune(directory: str | Path, keep: int) -> None:
    """Deletes all but the newest ``keep`` checkpoints (and stale temporary files)."""
    for p in listing(directory)[:-keep] if keep > 0 else []:
        p.unlink(missing_ok=True)
