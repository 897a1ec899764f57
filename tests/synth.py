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


def make_dataset(root, n=40, num_classes=10, shards=2, seed=0, bad=None, n_val=0, size=16):
    """A train split of n random JPEGs (and a val split of n_val if > 0); sample ``bad`` (an index
    or several) of the train split is a JPEG cut at half."""
    rng = np.random.default_rng(seed)
    splits = {"train": [(jpeg(rng, size), i % num_classes) for i in range(n)]}
    if n_val:
        splits["val"] = [(jpeg(rng, size), i % num_classes) for i in range(n_val)]
    for i in ([] if bad is None else [bad] if isinstance(bad, int) else bad):
        data, label = splits["train"][i]
        splits["train"][i] = (data[:len(data) // 2], label)
    did = content_id(splits, num_classes)
    entries = {name: write_split(root, name, samples, shards if name == "train" else 1, did, num_classes)
               for name, samples in splits.items()}
    classes = [{"index": c, "wnid": f"n{c:08d}", "name": f"class{c}"} for c in range(num_classes)]
    write_manifest(root, name="synthetic", dataset_id=did, classes=classes, splits=entries,
                   options={"seed": seed})
    return Path(root)
