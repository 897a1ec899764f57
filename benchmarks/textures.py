"""A second real data set for the experiments: 32x32 patches of photographs that scikit-image
ships in its wheel (no download), one class per photograph.

    pip install scikit-image                     # not a dependency of scalesgd
    python benchmarks/textures.py TREE           # ImageNet-style tree: TREE/{train,val}/<class>/*.jpg
    python -m scalesgd.data.make_shards TREE SHARDS
    python benchmarks/experiments.py methods --data SHARDS --workers 4 --tag textures

Classes: brick, grass, gravel (texture photographs), moon (surface), cell (microscopy), coins.
Each grayscale photograph is cut into a grid of non-overlapping 32x32 cells; a seeded 20% of the
cells of each photograph go to validation, the rest to training, so no validation pixel is ever
seen in training.  About 1,470 patches (1,180 train / 290 val), the size of the built-in digits,
but a texture patch is far less distinctive than a digit: brick, grass and gravel patches are all
grey, high-frequency and unaligned.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

SOURCES = ("brick", "grass", "gravel", "moon", "cell", "coins")
CELL = 32


def split_cells(shape: tuple[int, int], rng, val_fraction: float = 0.2) -> dict[str, list]:
    """The non-overlapping CELL x CELL cells (row, col) of an image of ``shape``, a seeded
    ``val_fraction`` of them for validation: {"train": [...], "val": [...]}."""
    rows, cols = shape[0] // CELL, shape[1] // CELL
    cells = [(r, c) for r in range(rows) for c in range(cols)]
    val = set(rng.permutation(len(cells))[: int(round(val_fraction * len(cells)))].tolist())
    return {"train": [x for i, x in enumerate(cells) if i not in val],
            "val": [x for i, x in enumerate(cells) if i in val]}


def build(tree: Path, seed: int = 0, val_fraction: float = 0.2) -> dict:
    try:
        from skimage import data  # noqa: PLC0415
    except ImportError:
        raise SystemExit("textures: needs scikit-image (pip install scikit-image)") from None
    from PIL import Image  # noqa: PLC0415
    rng = np.random.default_rng(seed)
    counts = {}
    for name in SOURCES:
        img = getattr(data, name)()
        for split, cells in split_cells(img.shape, rng, val_fraction).items():
            out = tree / split / name
            out.mkdir(parents=True, exist_ok=True)
            for r, c in cells:
                patch = img[r * CELL:(r + 1) * CELL, c * CELL:(c + 1) * CELL]
                Image.fromarray(np.ascontiguousarray(patch), mode="L").save(
                    out / f"{name}_{r:02d}_{c:02d}.jpg", quality=95)
            counts[split] = counts.get(split, 0) + len(cells)
    return counts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("tree", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    counts = build(a.tree, a.seed)
    print(f"textures: {counts} patches in {a.tree}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
