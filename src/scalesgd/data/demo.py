"""The built-in dataset: scikit-learn's handwritten digits as JPEG shards.

1,797 8x8 grayscale images (values 0..16, 10 classes) are scaled to 0..255, upsampled to
``image_size`` with PIL bicubic, encoded as grayscale JPEG (quality 95) and split into a fixed,
stratified train/val split drawn from ``seed``. Built once; later calls reuse the directory.
"""
from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np

from .shards import (MANIFEST_NAME, DataError, ShardError, content_id, read_manifest, write_manifest,
                     write_split)

DIGITS_VERSION = 1
JPEG_QUALITY = 95


def default_data_dir(image_size: int = 32) -> Path:
    """``$SCALESGD_DATA`` if set, else ``~/.cache/scalesgd/digits-<image_size>``."""
    env = os.environ.get("SCALESGD_DATA")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "scalesgd" / f"digits-{image_size}"


def digits_options(image_size: int, seed: int, val_fraction: float,
                   train_shards: int, val_shards: int) -> dict:
    """The options recorded in the manifest; a build is reused only if they match exactly."""
    return {"source": "sklearn.datasets.load_digits", "version": DIGITS_VERSION,
            "image_size": int(image_size), "seed": int(seed), "val_fraction": float(val_fraction),
            "train_shards": int(train_shards), "val_shards": int(val_shards),
            "jpeg_quality": JPEG_QUALITY, "resample": "bicubic", "mode": "L"}


def build_digits(out_dir=None, image_size: int = 32, seed: int = 0, *, val_fraction: float = 0.2,
                 train_shards: int = 2, val_shards: int = 1) -> Path:
    """Build (or reuse) the digits dataset in ``out_dir``; returns the directory.

    Reuse check is cheap: manifest parses, its options match, every listed shard file exists.
    Concurrent builders are safe: each file is replaced atomically and the content (hence the
    dataset_id and every byte) is deterministic; the manifest is written last.
    """
    out_dir = Path(out_dir) if out_dir is not None else default_data_dir(image_size)
    options = digits_options(image_size, seed, val_fraction, train_shards, val_shards)
    if _reusable(out_dir, options):
        return out_dir
    images, labels = _load_digits()
    encoded = [encode_jpeg(img, image_size) for img in images]
    train_idx, val_idx = stratified_split(labels, val_fraction, seed)
    splits = {"train": [(encoded[i], int(labels[i])) for i in train_idx],
              "val": [(encoded[i], int(labels[i])) for i in val_idx]}
    dataset_id = content_id(splits, num_classes=10)
    classes = [{"index": c, "wnid": str(c), "name": str(c)} for c in range(10)]
    try:
        entries = {s: write_split(out_dir, s, splits[s], n, dataset_id, 10)
                   for s, n in (("train", train_shards), ("val", val_shards))}
        write_manifest(out_dir, name="digits", dataset_id=dataset_id, classes=classes,
                       splits=entries, options=options)
    except OSError as exc:          # read-only home, a file in the way, a full disk
        raise DataError(f"{out_dir}: cannot build the digits demo data set there "
                        f"({exc.strerror or exc}); set SCALESGD_DATA to a writable directory") from None
    return out_dir


def _reusable(out_dir: Path, options: dict) -> bool:
    if not (out_dir / MANIFEST_NAME).is_file():
        return False
    try:
        manifest = read_manifest(out_dir)
    except ShardError:
        return False
    if manifest.get("options") != options:
        return False
    files = [sh["file"] for s in ("train", "val") for sh in manifest["splits"].get(s, {}).get(
        "shards", [])]
    return bool(files) and all((out_dir / f).is_file() for f in files)


def _load_digits() -> tuple[np.ndarray, np.ndarray]:
    """Returns images (1797, 8, 8) uint8 in 0..255 and labels (1797,) int64.

    The values are scikit-learn's ``load_digits()``, read straight from the CSV file it ships
    (``sklearn/datasets/data/digits.csv.gz``: 64 pixel columns, then the label): importing
    ``sklearn.datasets`` pulls in SciPy and costs about 1.5 s of CPU, against 0.01 s for the file.
    Where that file is not found (another layout), ``load_digits()`` itself is used.
    """
    data = _digits_csv()
    if data is None:
        from sklearn.datasets import load_digits      # slow import
        d = load_digits()
        pixels, target = d.images, d.target
    else:
        pixels, target = data[:, :64].reshape(-1, 8, 8), data[:, 64]
    images = np.rint(pixels * (255.0 / 16.0)).clip(0, 255).astype(np.uint8)
    return images, target.astype(np.int64)


def _digits_csv() -> np.ndarray | None:
    """scikit-learn's digits file as a (1797, 65) float array, or None where it is not found."""
    import importlib.util
    spec = importlib.util.find_spec("sklearn")      # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        return None
    for root in spec.submodule_search_locations:
        path = Path(root) / "datasets" / "data" / "digits.csv.gz"
        if path.is_file():
            data = np.loadtxt(path, delimiter=",", ndmin=2)
            return data if data.shape == (1797, 65) else None
    return None


def encode_jpeg(image: np.ndarray, image_size: int) -> bytes:
    """(h, w) uint8 grayscale -> JPEG bytes of an (image_size, image_size) bicubic upsample."""
    from PIL import Image
    pil = Image.fromarray(image, mode="L").resize((image_size, image_size), Image.BICUBIC)
    buf = io.BytesIO()
    pil.save(buf, format="JPEG", quality=JPEG_QUALITY, optimize=False, progressive=False)
    return buf.getvalue()


def stratified_split(labels: np.ndarray, val_fraction: float, seed: int
                     ) -> tuple[np.ndarray, np.ndarray]:
    """Per class, ``round(val_fraction * n_c)`` samples to val, drawn with ``seed``.

    Returns (train_idx, val_idx), each sorted ascending, disjoint, covering all samples.
    """
    rng = np.random.default_rng(seed)
    val = []
    for c in np.unique(labels):
        members = np.flatnonzero(labels == c)
        k = int(round(val_fraction * members.size))
        val.append(rng.permutation(members)[:k])
    val_idx = np.sort(np.concatenate(val))
    train_idx = np.setdiff1d(np.arange(labels.size), val_idx)
    return train_idx, val_idx
