"""Small synthetic datasets in the real shard format (random RGB JPEGs), for tests."""
import io
from pathlib import Path

import numpy as np
from PIL import Image

from scalesgd.data.shards import content_id, write_manifest, write_split


def jpeg(rng, size=16):
    """A random RGB JPEG of (size, size)."""
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(buf, "JPEG")
    return buf.getvalue()


def entropy_range(data: bytes) -> tuple[int, int]:
    """(start, end) of a baseline JPEG's entropy-coded data: after the SOS segment, before EOI."""
    i = 2                                            # after SOI; marker segments: FF xx LEN(2) ...
    while data[i] == 0xFF and data[i + 1] != 0xDA:
        i += 2 + int.from_bytes(data[i + 2:i + 4], "big")
    return i + 2 + int.from_bytes(data[i + 2:i + 4], "big"), data.rindex(b"\xff\xd9")


def garbled(data: bytes, seed=0) -> bytes:
    """``data`` (a JPEG) with its compressed data replaced by random bytes of the same length,
    headers and end marker intact. 0xFF is byte-stuffed (FF 00), so no marker appears in the
    garbage: header parsers accept it and libjpeg decodes it to noise with only a warning
    ("Corrupt JPEG data: N extraneous bytes before marker 0xd9"), no error."""
    lo, hi = entropy_range(data)
    noise = np.random.default_rng(seed).integers(0, 256, hi - lo, dtype=np.uint8).tobytes()
    return data[:lo] + noise.replace(b"\xff", b"\xff\x00") + data[hi:]


def _indices(which):
    return [] if which is None else [which] if isinstance(which, int) else list(which)


def make_dataset(root, n=40, num_classes=10, shards=2, seed=0, bad=None, n_val=0, size=16,
                 garbage=None, val_garbage=None):
    """A train split of n random JPEGs (and a val split of n_val if > 0). Train samples ``bad``
    (an index or several) are JPEGs cut at half; train samples ``garbage`` and val samples
    ``val_garbage`` have intact headers but garbage compressed data (``garbled``)."""
    rng = np.random.default_rng(seed)
    splits = {"train": [(jpeg(rng, size), i % num_classes) for i in range(n)]}
    if n_val:
        splits["val"] = [(jpeg(rng, size), i % num_classes) for i in range(n_val)]
    for split, which, damage in (("train", bad, lambda d, i: d[:len(d) // 2]),
                                 ("train", garbage, garbled), ("val", val_garbage, garbled)):
        for i in _indices(which):
            data, label = splits[split][i]
            splits[split][i] = (damage(data, i), label)
    did = content_id(splits, num_classes)
    entries = {name: write_split(root, name, samples, shards if name == "train" else 1, did, num_classes)
               for name, samples in splits.items()}
    classes = [{"index": c, "wnid": f"n{c:08d}", "name": f"class{c}"} for c in range(num_classes)]
    write_manifest(root, name="synthetic", dataset_id=did, classes=classes, splits=entries,
                   options={"seed": seed})
    return Path(root)
