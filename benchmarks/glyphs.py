#!/usr/bin/env python3
"""``glyphs``: the crossover study's proxy data set, procedural, any size, as JPEG shards.

10 classes of simple shapes (disk, ring, filled square, square outline, triangle, plus, bar, two
parallel bars, L corner, T), each image 16x16 RGB by default, drawn from signed distance functions with
anti-aliased edges and heavy nuisance variation: any rotation, scale 0.45-0.8 of the image,
translation up to a quarter of it, stroke width, foreground and background colours (the background a
two-colour gradient, the contrast between glyph and background as low as 0.12 in luminance), 0-3
clutter strokes of random colour drawn over the glyph, Gaussian pixel noise, then JPEG (quality 90).

Why it is hard enough: rotation makes the square and the diamond, the plus and the X the same class,
and at 16x16 after anti-aliasing and noise a small disk and a small filled square, a ring and a
square outline, one thick bar and two close bars, an L and a T differ by a few pixels; clutter strokes
cross the glyph and look like bars.  No single pixel, colour or intensity statistic identifies a class
(the colours and the gradient are drawn independently of it), so a linear classifier on the pixels
stays far from a CNN (measured by the study, and stated in docs/results.md).

Every image is a pure function of (seed, split, index): the train split is the same in every build,
and the held-out ``tune`` split (for choosing hyper-parameters; never the reported ``val``) is drawn
from its own stream.  Two data set directories share the train images:

    python benchmarks/glyphs.py OUT [--train 51200] [--val 5000] [--tune 5000] [--size 16] [--seed 0]
    #   OUT/main: train + val (the reported validation split)
    #   OUT/tune: train + tune as its "val" split (tuning runs point --data here)
"""
from __future__ import annotations

import argparse
import io
import sys
import time
from pathlib import Path

import numpy as np

from scalesgd.data.shards import content_id, write_manifest, write_split

CLASSES = ("disk", "ring", "square", "square_outline", "triangle", "plus", "bar", "two_bars",
           "l_corner", "t_shape")
SPLIT_STREAM = {"train": 0, "val": 1, "tune": 2}
JPEG_QUALITY = 90
VERSION = 1


def _box(px, py, hx, hy):
    """Signed distance to an axis-aligned box of half-sizes (hx, hy) centred at 0."""
    qx, qy = np.abs(px) - hx, np.abs(py) - hy
    out = np.hypot(np.maximum(qx, 0), np.maximum(qy, 0))
    return out + np.minimum(np.maximum(qx, qy), 0)


def _segment(px, py, ax, ay, bx, by):
    """Distance to the segment a-b (arrays broadcast)."""
    dx, dy = bx - ax, by - ay
    t = np.clip(((px - ax) * dx + (py - ay) * dy) / np.maximum(dx * dx + dy * dy, 1e-9), 0, 1)
    return np.hypot(px - ax - t * dx, py - ay - t * dy)


def glyph_sdf(c: np.ndarray, px, py, t):
    """Signed distance (glyph units, |p| <= 1) of class c at local coordinates (px, py), stroke t."""
    r = np.hypot(px, py)
    k = np.sqrt(3.0)
    tri = np.maximum(np.abs(px) * k / 2 + py / 2, -py) - 0.45        # equilateral, centred
    d = np.stack([
        r - 0.8,                                                     # disk
        np.abs(r - 0.65) - t,                                        # ring
        _box(px, py, 0.68, 0.68),                                    # filled square
        np.abs(_box(px, py, 0.62, 0.62)) - t,                        # square outline
        tri,                                                         # triangle
        np.minimum(_box(px, py, 0.85, t), _box(px, py, t, 0.85)),    # plus
        _box(px, py, 0.85, 1.6 * t),                                 # one thick bar
        np.minimum(_box(px, py - 0.42, 0.85, t), _box(px, py + 0.42, 0.85, t)),   # two bars
        np.minimum(_box(px + 0.55, py, t, 0.8), _box(px - 0.1, py - 0.7, 0.7, t)),  # L corner
        np.minimum(_box(px, py - 0.6, 0.85, t), _box(px, py + 0.15, t, 0.75)),     # T
    ])
    return np.take_along_axis(d, c[None, :, None, None], axis=0)[0]


def render(n: int, size: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """n images (n, size, size, 3) uint8 and their labels, drawn from ``rng``."""
    c = rng.integers(0, len(CLASSES), n)
    g = (np.arange(size) + 0.5) / size * 2 - 1                      # pixel centres in [-1, 1]
    gy, gx = np.meshgrid(g, g, indexing="ij")
    gx, gy = gx[None], gy[None]
    theta = rng.uniform(0, 2 * np.pi, n)[:, None, None]
    scale = rng.uniform(0.45, 0.8, n)[:, None, None]
    cx, cy = (rng.uniform(-0.25, 0.25, n)[:, None, None] for _ in range(2))
    stroke = rng.uniform(0.12, 0.22, n)[:, None, None]
    x, y = (gx - cx) / scale, (gy - cy) / scale                      # image -> glyph units
    px = np.cos(theta) * x + np.sin(theta) * y
    py = -np.sin(theta) * x + np.cos(theta) * y
    pixel = (2.0 / size) / scale                                     # one pixel in glyph units
    alpha = np.clip(0.5 - glyph_sdf(c, px, py, stroke) / pixel, 0, 1)[..., None]
    # background: a gradient between two colours along a random direction; glyph colour with a
    # luminance contrast of at least 0.12 against the background's mean
    b0, b1 = rng.uniform(0, 1, (n, 3)), rng.uniform(0, 1, (n, 3))
    phi = rng.uniform(0, 2 * np.pi, n)[:, None, None]
    ramp = (0.5 + 0.5 * (np.cos(phi) * gx + np.sin(phi) * gy) / np.sqrt(2))[..., None]
    bg = b0[:, None, None] * (1 - ramp) + b1[:, None, None] * ramp
    fg = rng.uniform(0, 1, (n, 3))
    lum = np.array([0.299, 0.587, 0.114])
    diff = fg @ lum - bg.mean(axis=(1, 2)) @ lum
    need = np.abs(diff) < 0.12
    push = np.where(diff >= 0, 1.0, -1.0)[:, None] * (0.12 - np.abs(diff))[:, None]
    fg = np.where(need[:, None], np.clip(fg + push + 0.06 * np.sign(push), 0, 1), fg)
    img = bg * (1 - alpha) + fg[:, None, None] * alpha
    # clutter: 0-3 thin strokes of random colour across the image, over the glyph
    for k in range(3):
        on = rng.random(n) < (0.6, 0.35, 0.15)[k]
        ax, ay, bx, by = (rng.uniform(-1, 1, n)[:, None, None] for _ in range(4))
        w = rng.uniform(0.5, 1.0, n)[:, None, None] * (2.0 / size)
        a = np.clip(0.5 - (_segment(gx, gy, ax, ay, bx, by) - w) / (2.0 / size), 0, 1)
        a *= (on * rng.uniform(0.5, 1.0, n))[:, None, None]
        col = rng.uniform(0, 1, (n, 3))[:, None, None]
        img = img * (1 - a[..., None]) + col * a[..., None]
    img += rng.normal(0, 1, img.shape) * rng.uniform(0.02, 0.08, n)[:, None, None, None]
    return np.clip(np.rint(img * 255), 0, 255).astype(np.uint8), c.astype(np.int64)


def images(split: str, count: int, size: int, seed: int, chunk: int = 4096):
    """(images, labels) of a split: chunk by chunk, each chunk from its own stream (seed, split, i)."""
    out_x, out_y = [], []
    for i in range(0, count, chunk):
        rng = np.random.default_rng([seed, SPLIT_STREAM[split], i // chunk])
        x, y = render(min(chunk, count - i), size, rng)
        out_x.append(x)
        out_y.append(y)
    return np.concatenate(out_x), np.concatenate(out_y)


def encode(img: np.ndarray) -> bytes:
    from PIL import Image  # noqa: PLC0415
    buf = io.BytesIO()
    Image.fromarray(img, mode="RGB").save(buf, format="JPEG", quality=JPEG_QUALITY)
    return buf.getvalue()


def build(out: Path, train: int, val: int, tune: int, size: int = 16, seed: int = 0,
          shards: int = 8) -> dict:
    """Writes OUT/main (train + val) and OUT/tune (train + tune, as its val split); returns counts
    and the seconds taken."""
    t0 = time.perf_counter()
    data = {s: images(s, n, size, seed) for s, n in (("train", train), ("val", val), ("tune", tune))}
    enc = {s: [(encode(x), int(y)) for x, y in zip(*data[s])] for s in data}
    classes = [{"index": i, "wnid": name, "name": name} for i, name in enumerate(CLASSES)]
    options = {"source": "benchmarks/glyphs.py", "version": VERSION, "size": size, "seed": seed,
               "jpeg_quality": JPEG_QUALITY}
    for name, held in (("main", "val"), ("tune", "tune")):
        splits = {"train": enc["train"], "val": enc[held]}
        did = content_id(splits, num_classes=len(CLASSES))
        entries = {"train": write_split(out / name, "train", splits["train"], shards, did, len(CLASSES)),
                   "val": write_split(out / name, "val", splits["val"], 1, did, len(CLASSES))}
        write_manifest(out / name, name=f"glyphs-{name}", dataset_id=did, classes=classes,
                       splits=entries, options={**options, "val_split": held})
    return {"train": train, "val": val, "tune": tune, "seconds": time.perf_counter() - t0,
            "bytes_per_image": sum(len(b) for b, _ in enc["train"]) / max(train, 1)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--train", type=int, default=51200)
    ap.add_argument("--val", type=int, default=5000)
    ap.add_argument("--tune", type=int, default=5000)
    ap.add_argument("--size", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--preview", type=Path, help="also write a PNG grid of 10 images per class here")
    a = ap.parse_args(argv)
    info = build(a.out, a.train, a.val, a.tune, a.size, a.seed, a.shards)
    print(f"glyphs: {info['train']} train, {info['val']} val, {info['tune']} tune images of "
          f"{a.size}x{a.size} in {a.out}/main and {a.out}/tune ({info['seconds']:.0f} s, "
          f"{info['bytes_per_image']:.0f} bytes per JPEG)")
    if a.preview:
        x, y = images("val", 2000, a.size, a.seed)
        rows = [np.concatenate([x[np.flatnonzero(y == c)[i]] for i in range(10)], axis=1)
                for c in range(len(CLASSES))]
        from PIL import Image  # noqa: PLC0415
        Image.fromarray(np.concatenate(rows, axis=0)).resize(
            (10 * a.size * 4, len(CLASSES) * a.size * 4), Image.NEAREST).save(a.preview)
    return 0


if __name__ == "__main__":
    sys.exit(main())
