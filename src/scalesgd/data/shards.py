"""HDF5 shard format: writer and validating reader.

A dataset directory holds ``manifest.json`` plus, per split, shard files
``{split}-{i:05d}-of-{n:05d}.h5``. Each shard has two datasets of equal length:

- ``images``: (count,) variable-length uint8, the encoded image bytes (JPEG);
- ``labels``: (count,) int64, class indices in [0, num_classes);

and the attributes listed in ``SHARD_ATTRS``. The format is described in docs/data.md.
Every file is written atomically (temp name in the same directory, fsync, ``os.replace``)
and the manifest is written last, so a directory with a manifest is complete.
"""
from __future__ import annotations

import hashlib
import json
import os
import uuid
from pathlib import Path
from typing import Iterable, Sequence

import h5py
import numpy as np

from ..errors import DataError  # noqa: F401 - re-exported: shards.DataError

FORMAT = "scalesgd-shard"
MANIFEST_FORMAT = "scalesgd-dataset"
FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
SPLITS = ("train", "val")
SHARD_ATTRS = ("format", "format_version", "split", "shard_index", "num_shards",
               "dataset_id", "num_classes", "count")
_WRITE_CHUNK = 4096          # samples assigned to h5py per slice write


class ShardError(DataError):
    """A dataset directory, manifest or shard file is missing, corrupt or inconsistent."""


# ----------------------------------------------------------------------------- writing
def shard_name(split: str, index: int, num_shards: int) -> str:
    """File name of shard ``index`` of ``num_shards`` of ``split``."""
    return f"{split}-{index:05d}-of-{num_shards:05d}.h5"


def content_id(splits: dict[str, Sequence[tuple[bytes, int]]], num_classes: int) -> str:
    """sha256 hex digest over the classes count and every (split, label, sha256(bytes)) in order.

    Identical content gives the same id; any other dataset gets a different one.
    """
    h = hashlib.sha256(f"{FORMAT}/{FORMAT_VERSION}/classes={num_classes}".encode())
    for split in sorted(splits):
        h.update(f"/split={split}".encode())
        for data, label in splits[split]:
            h.update(int(label).to_bytes(8, "little", signed=True))
            h.update(hashlib.sha256(bytes(data)).digest())
    return h.hexdigest()


def file_sha256(path: str | os.PathLike) -> str:
    """sha256 hex digest of a file, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _temp_path(final: Path) -> Path:
    return final.with_name(f".{final.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")


def _commit(tmp: Path, final: Path) -> None:
    """fsync ``tmp``, rename it onto ``final`` atomically, fsync the directory."""
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, final)
    dfd = os.open(final.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def write_shard(path: Path, samples: Sequence[tuple[bytes, int]], attrs: dict) -> dict:
    """Write one shard file atomically; returns its manifest entry {file, count, sha256}.

    samples: sequence of (encoded bytes, int label); attrs: the SHARD_ATTRS except ``count``.
    """
    path = Path(path)
    tmp = _temp_path(path)
    n = len(samples)
    num_classes = int(attrs["num_classes"])
    try:
        with h5py.File(tmp, "w") as f:
            images = f.create_dataset("images", (n,), dtype=h5py.vlen_dtype(np.uint8))
            labels = f.create_dataset("labels", (n,), dtype=np.int64)
            for lo in range(0, n, _WRITE_CHUNK):
                chunk = [samples[i] for i in range(lo, min(n, lo + _WRITE_CHUNK))]
                labels[lo:lo + len(chunk)] = _checked_labels(path, lo, chunk, num_classes)
                _write_images(images, lo, [np.frombuffer(bytes(d), np.uint8) for d, _ in chunk])
            f.attrs.update({**attrs, "count": n})
        _commit(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return {"file": path.name, "count": n, "sha256": file_sha256(path)}


def _write_images(images: h5py.Dataset, lo: int, arrays: list[np.ndarray]) -> None:
    """images[lo:lo+len(arrays)] = arrays; one slice write unless all lengths are equal
    (h5py then turns the object array into a 2-D one and fails: write one by one)."""
    if len({a.size for a in arrays}) > 1:
        buf = np.empty(len(arrays), dtype=object)
        for k, a in enumerate(arrays):
            buf[k] = a
        images[lo:lo + len(arrays)] = buf
    else:
        for k, a in enumerate(arrays):
            images[lo + k] = a


def _checked_labels(path: Path, lo: int, chunk: list, num_classes: int) -> list[int]:
    labels = [int(lab) for _, lab in chunk]
    for i, lab in enumerate(labels):
        if not 0 <= lab < num_classes:
            raise ValueError(f"{path}[{lo + i}]: label {lab} not in [0, {num_classes})")
    return labels


def write_split(out_dir, split: str, samples: Sequence[tuple[bytes, int]], num_shards: int,
                dataset_id: str, num_classes: int) -> dict:
    """Write ``samples`` as ``num_shards`` contiguous shards of ``split`` into ``out_dir``.

    Shard i holds samples [i*n//k, (i+1)*n//k). Returns the manifest entry of the split:
    {"count": n, "shards": [{file, count, sha256}, ...]}.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    n = len(samples)
    if num_shards < 1 or num_shards > max(n, 1):
        raise ValueError(f"{out_dir}: cannot write {n} {split} samples as {num_shards} shards")
    entries = []
    for i in range(num_shards):
        lo, hi = i * n // num_shards, (i + 1) * n // num_shards
        attrs = {"format": FORMAT, "format_version": FORMAT_VERSION, "split": split,
                 "shard_index": i, "num_shards": num_shards, "dataset_id": dataset_id,
                 "num_classes": num_classes}
        entries.append(write_shard(out_dir / shard_name(split, i, num_shards),
                                   _Slice(samples, lo, hi), attrs))
    return {"count": n, "shards": entries}


class _Slice(Sequence):
    """A view of samples[lo:hi] that does not copy (works for lazy sequences too)."""

    def __init__(self, base, lo: int, hi: int):
        self.base, self.lo, self.hi = base, lo, hi

    def __len__(self):
        return self.hi - self.lo

    def __getitem__(self, i):
        if not 0 <= i < len(self):
            raise IndexError(i)
        return self.base[self.lo + i]


def write_manifest(out_dir, *, name: str, dataset_id: str, classes: Iterable[dict],
                   splits: dict[str, dict], options: dict) -> Path:
    """Write ``manifest.json`` atomically (call it last). classes: [{index, wnid, name}]."""
    classes = [dict(c) for c in classes]
    manifest = {"format": MANIFEST_FORMAT, "format_version": FORMAT_VERSION, "name": name,
                "dataset_id": dataset_id, "num_classes": len(classes), "classes": classes,
                "splits": splits, "options": options}
    final = Path(out_dir) / MANIFEST_NAME
    tmp = _temp_path(final)
    try:
        tmp.write_text(json.dumps(manifest, indent=1) + "\n")
        _commit(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)
    return final


# ----------------------------------------------------------------------------- sample ids
SPLIT_STRIDE = 1 << 40       # sample id = SPLITS.index(split) * SPLIT_STRIDE + global index


def sample_id(split: str, index: int) -> int:
    """A sample's id, unique within the dataset and stable (it depends only on the manifest):
    train sample g has id g, val sample g has id 2**40 + g."""
    return SPLITS.index(split) * SPLIT_STRIDE + int(index)


def split_of(sid: int) -> tuple[str, int]:
    """Inverse of ``sample_id``: (split, global index in that split)."""
    return SPLITS[int(sid) // SPLIT_STRIDE], int(sid) % SPLIT_STRIDE


# ----------------------------------------------------------------------------- reading
def read_manifest(root) -> dict:
    """Parse and sanity-check ``root/manifest.json``; raises ShardError naming the path."""
    path = Path(root) / MANIFEST_NAME
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise ShardError(f"{path}: manifest not found") from None
    except (OSError, ValueError) as e:
        raise ShardError(f"{path}: cannot parse manifest ({e})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        raise ShardError(f"{path}: not a {MANIFEST_FORMAT} manifest")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise ShardError(f"{path}: unsupported format_version {manifest.get('format_version')!r}")
    for key in ("dataset_id", "num_classes", "classes", "splits"):
        if key not in manifest:
            raise ShardError(f"{path}: manifest lacks {key!r}")
    return manifest


def _check_shard(path: Path, f: h5py.File, expect: dict, num_classes: int) -> np.ndarray:
    """Check one open shard against the manifest; returns its labels (count,) int64."""
    for key, want in expect.items():
        got = f.attrs.get(key)
        got = got.decode() if isinstance(got, bytes) else got
        if got != want:
            raise ShardError(f"{path}: attribute {key}={got!r}, manifest says {want!r}")
    if "images" not in f or "labels" not in f:
        raise ShardError(f"{path}: missing 'images' or 'labels' dataset")
    if f["images"].shape != (expect["count"],) or f["labels"].shape != (expect["count"],):
        raise ShardError(f"{path}: images/labels length differ from count {expect['count']}")
    labels = f["labels"][...].astype(np.int64, copy=False)
    bad = np.flatnonzero((labels < 0) | (labels >= num_classes))
    if bad.size:
        i = int(bad[0])
        raise ShardError(f"{path}[{i}]: label {int(labels[i])} not in [0, {num_classes})")
    return labels


class ShardSet:
    """One split of a dataset directory, validated on open; samples addressed by a global index.

    Global index g in [0, num_samples) runs through the shards in manifest order. h5py files
    are opened lazily on the first read and kept open, one set of handles per process (a forked
    or unpickled copy opens its own).
    """

    def __init__(self, root: Path, split: str, manifest: dict, paths: list[Path],
                 counts: np.ndarray, labels: np.ndarray):
        self._root, self._split, self.manifest = root, split, manifest
        self.shard_paths = paths
        self._offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)  # (k+1,)
        self._labels = labels
        self._files: dict[int, h5py.File] = {}
        self._images: dict[int, h5py.Dataset] = {}
        self._pid = os.getpid()
        self._blob: np.ndarray | None = None      # load(): every sample's bytes, concatenated
        self._starts: np.ndarray | None = None    # (num_samples+1,) int64 offsets into _blob

    @classmethod
    def open(cls, root, split: str) -> "ShardSet":
        """Validate ``root``'s manifest and every shard of ``split`` (attrs, lengths, labels).

        Does not checksum the files (see ``verify``). Raises ShardError naming the file.
        """
        root = Path(root)
        manifest = read_manifest(root)
        entry = manifest["splits"].get(split)
        if not entry or not entry.get("shards"):
            raise ShardError(f"{root / MANIFEST_NAME}: no shards listed for split {split!r}")
        shards = entry["shards"]
        paths, labels = [], []
        for i, sh in enumerate(shards):
            expect = {"format": FORMAT, "format_version": FORMAT_VERSION, "split": split,
                      "shard_index": i, "num_shards": len(shards),
                      "dataset_id": manifest["dataset_id"], "count": sh["count"]}
            path = root / sh["file"]
            labels.append(_open_and_check(path, expect, int(manifest["num_classes"])))
            paths.append(path)
        counts = np.array([sh["count"] for sh in shards], dtype=np.int64)
        if int(counts.sum()) != entry.get("count"):
            raise ShardError(f"{root / MANIFEST_NAME}: {split} count {entry.get('count')} "
                             f"!= sum of shard counts {int(counts.sum())}")
        return cls(root, split, manifest, paths, counts, np.concatenate(labels))

    # ---- properties
    root = property(lambda self: self._root, doc="dataset directory (Path)")
    split = property(lambda self: self._split, doc="'train' or 'val'")
    num_samples = property(lambda self: int(self._offsets[-1]), doc="samples in this split")
    num_classes = property(lambda self: int(self.manifest["num_classes"]))
    dataset_id = property(lambda self: self.manifest["dataset_id"])
    labels = property(lambda self: self._labels, doc="(num_samples,) int64, read once on open")

    @property
    def class_names(self) -> list[str]:
        """Human-readable class names, indexed by label."""
        return [c["name"] for c in sorted(self.manifest["classes"], key=lambda c: c["index"])]

    def __len__(self) -> int:
        return self.num_samples

    # ---- access
    def locate(self, index: int) -> tuple[Path, int]:
        """Global index -> (shard file path, index inside that shard)."""
        shard, local = self._shard_of(index)
        return self.shard_paths[shard], local

    def read(self, index: int) -> tuple[np.ndarray, int]:
        """Global index -> (encoded bytes as (nbytes,) uint8 array, int label).

        After ``load`` the array is a read-only view into the in-memory copy."""
        shard, local = self._shard_of(index)
        if self._blob is not None:
            g = int(index)
            return self._blob[self._starts[g]:self._starts[g + 1]], int(self._labels[g])
        data = self._dataset(shard)[local]
        return np.asarray(data, dtype=np.uint8), int(self._labels[index])

    @property
    def disk_bytes(self) -> int:
        """Total size of this split's shard files (bytes)."""
        return sum(p.stat().st_size for p in self.shard_paths)

    @property
    def loaded(self) -> bool:
        """True once ``load`` has read the split into memory."""
        return self._blob is not None

    def load(self) -> "ShardSet":
        """Read every sample's encoded bytes into one in-memory array (reads then cost a slice,
        not an HDF5 call: ~0.4 ms per sample on small JPEGs).  For splits that fit memory
        comfortably (``data.cache_mb``); ranks of one process (the virtual cluster) share it."""
        if self._blob is None:
            parts = []
            for shard, path in enumerate(self.shard_paths):
                try:
                    parts.extend(np.asarray(a, dtype=np.uint8) for a in self._dataset(shard)[:])
                except (OSError, KeyError, ValueError, RuntimeError) as e:
                    msg = " ".join(str(e).split())
                    raise ShardError(f"{path}: cannot read its images ({msg})") from None
            starts = np.zeros(len(parts) + 1, dtype=np.int64)
            np.cumsum([a.size for a in parts], out=starts[1:])
            blob = np.concatenate(parts) if parts else np.zeros(0, np.uint8)
            blob.flags.writeable = False
            self._blob, self._starts = blob, starts
            self.close()
        return self

    def _shard_of(self, index: int) -> tuple[int, int]:
        index = int(index)
        if not 0 <= index < self.num_samples:
            raise IndexError(f"{self._root}/{self._split}: index {index} not in "
                             f"[0, {self.num_samples})")
        shard = int(np.searchsorted(self._offsets, index, side="right")) - 1
        return shard, index - int(self._offsets[shard])

    def _dataset(self, shard: int) -> h5py.Dataset:
        """The ``images`` dataset of one shard, opened once per process (a lookup by name costs
        more than the read of a small sample)."""
        if self._pid != os.getpid():            # forked: never share HDF5 handles
            self._files, self._images, self._pid = {}, {}, os.getpid()
        ds = self._images.get(shard)
        if ds is None:
            f = self._files.get(shard)
            if f is None:
                f = self._files[shard] = h5py.File(self.shard_paths[shard], "r")
            ds = self._images[shard] = f["images"]
        return ds

    def verify(self) -> None:
        """Check every shard's sha256 against the manifest (reads all bytes; slow for ImageNet)."""
        entries = self.manifest["splits"][self._split]["shards"]
        for path, sh in zip(self.shard_paths, entries):
            got = file_sha256(path)
            if got != sh["sha256"]:
                raise ShardError(f"{path}: sha256 {got[:16]}... does not match the manifest "
                                 f"({sh['sha256'][:16]}...)")

    def close(self) -> None:
        """Close the HDF5 handles this process opened (reads reopen them)."""
        if self._pid == os.getpid():
            for f in self._files.values():
                f.close()
        self._files, self._images = {}, {}

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_files"], state["_images"] = {}, {}
        return state

    def __repr__(self) -> str:
        return (f"ShardSet({str(self._root)!r}, {self._split!r}, samples={self.num_samples}, "
                f"shards={len(self.shard_paths)}, classes={self.num_classes})")


def _open_and_check(path: Path, expect: dict, num_classes: int) -> np.ndarray:
    """Open one shard read-only, check it, close it; returns its labels (count,) int64."""
    if not path.is_file():
        raise ShardError(f"{path}: shard file listed in the manifest is missing")
    try:
        with h5py.File(path, "r") as f:
            return _check_shard(path, f, expect, num_classes)
    except ShardError:
        raise
    except (OSError, KeyError, ValueError, RuntimeError) as e:
        msg = " ".join(str(e).split())
        raise ShardError(f"{path}: not a readable HDF5 shard ({msg})") from None
