"""Per-sample augmentation parameters, drawn in Python from (seed, epoch, global index) only.

Every random choice (scale, crop window, flip, lighting) comes from
``np.random.default_rng([seed, epoch, index])`` and is handed to DALI as per-sample argument
inputs, so a sample gets the same tensor whatever the rank, the number of ranks, the batch it
lands in or the pipeline's history (needed for exact mid-epoch resume). The crop window is
expressed in source pixels, so the decoder only decodes that window (``decoders.image_slice``)
and the resize only touches it: the same output as "resize the whole image, then crop".
"""
from __future__ import annotations

import io
import math
from dataclasses import dataclass

import numpy as np

# AlexNet PCA lighting (Krizhevsky et al. 2012; fb.resnet.torch), RGB, pixel values in 0..1
PCA_EIGVAL = np.array([0.2175, 0.0188, 0.0045])
PCA_EIGVEC = np.array([[-0.5675, 0.7192, 0.4009],
                       [-0.5808, -0.0045, -0.8140],
                       [-0.5836, -0.6948, 0.4203]])
RRC_RATIO = (3 / 4, 4 / 3)
_JPEG_EOI_TAIL = 1024        # a complete JPEG has FF D9 within its last 1 KiB


@dataclass(frozen=True)
class AugmentSpec:
    """What to draw. mode: "multiscale" | "rrc" | "center"; scale: pixels (multiscale) or area
    fraction (rrc); size: output side; val_resize: center mode's shorter side; lighting: alpha std
    (0 = off); mean: (3,) 0..255 units."""

    mode: str
    size: int
    scale: tuple[float, float]
    flip: bool
    lighting: float
    val_resize: int
    mean: tuple[float, float, float]


@dataclass
class Params:
    """One sample's parameters. window: (x0, y0, w, h) float source pixels; mirror 0/1;
    mean: (3,) float32, the normalisation mean with the lighting offset folded in."""

    window: tuple[float, float, float, float]
    mirror: int
    mean: np.ndarray


def image_size(data: np.ndarray) -> tuple[int, int] | None:
    """(width, height) from the header, or None when the bytes are not a complete image by a
    cheap check (PIL cannot parse the header; a JPEG without its end marker, i.e. truncated)."""
    from PIL import Image
    raw = data.tobytes()
    try:
        with Image.open(io.BytesIO(raw)) as im:
            w, h, fmt = im.size[0], im.size[1], im.format
    except Exception:                               # noqa: BLE001 - any failure means "bad"
        return None
    if fmt == "JPEG" and b"\xff\xd9" not in raw[-_JPEG_EOI_TAIL:]:
        return None
    return (w, h) if w > 0 and h > 0 else None


def draw(spec: AugmentSpec, seed: int, epoch: int, index: int, wh: tuple[int, int]) -> Params:
    """Parameters of sample ``index`` in ``epoch`` for a source image of (width, height) ``wh``."""
    rng = np.random.default_rng([seed, epoch, index])
    w, h = wh
    if spec.mode == "multiscale":
        window = _multiscale_window(rng, spec, w, h)
    elif spec.mode == "rrc":
        window = _rrc_window(rng, spec.scale, w, h)
    else:
        window = center_window(spec.size, spec.val_resize, w, h)
    mirror = int(rng.random() < 0.5) if spec.flip else 0
    mean = np.asarray(spec.mean, dtype=np.float64)
    if spec.lighting > 0:
        alpha = rng.normal(0.0, spec.lighting, 3)
        mean = mean - 255.0 * (PCA_EIGVEC @ (alpha * PCA_EIGVAL))   # x+off-m == x-(m-off)
    return Params(window, mirror, mean.astype(np.float32))


def _multiscale_window(rng, spec: AugmentSpec, w: int, h: int):
    """Shorter side resized to S ~ U[scale], random size x size crop: in source pixels a
    square of side size*short/S at a uniform position."""
    s = rng.uniform(*spec.scale)
    side = spec.size * min(w, h) / s
    ux, uy = rng.random(), rng.random()
    return (ux * (w - side), uy * (h - side), side, side)


def _rrc_window(rng, area_range, w: int, h: int):
    """torchvision's RandomResizedCrop: 10 tries of area ~ U[scale]*w*h, log-uniform aspect
    ratio in [3/4, 4/3]; then the central crop of the clamped aspect ratio."""
    area = w * h
    logr = (math.log(RRC_RATIO[0]), math.log(RRC_RATIO[1]))
    for _ in range(10):
        target = area * rng.uniform(*area_range)
        ratio = math.exp(rng.uniform(*logr))
        cw, ch = math.sqrt(target * ratio), math.sqrt(target / ratio)
        if 0 < cw <= w and 0 < ch <= h:
            return (rng.random() * (w - cw), rng.random() * (h - ch), cw, ch)
    ratio = w / h
    if ratio < RRC_RATIO[0]:
        cw, ch = w, w / RRC_RATIO[0]
    elif ratio > RRC_RATIO[1]:
        cw, ch = h * RRC_RATIO[1], h
    else:
        cw, ch = w, h
    return ((w - cw) / 2, (h - ch) / 2, cw, ch)


def center_window(size: int, resize: int, w: int, h: int):
    """Shorter side -> ``resize``, central size x size crop, as a source window."""
    side = min(size * min(w, h) / resize, w, h)
    return ((w - side) / 2, (h - side) / 2, side, side)


def slice_args(window, wh) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Window -> (decode start (x, y) int32, decode end (x, y) int32, resize roi_start (y, x),
    roi_end (y, x) float32 relative to the decoded slice). The decoded slice is the window
    rounded outwards to whole pixels; the resize takes the exact fractional window from it."""
    x0, y0, cw, ch = window
    w, h = wh
    sx0, sy0 = max(0, math.floor(x0)), max(0, math.floor(y0))
    sx1, sy1 = min(w, math.ceil(x0 + cw)), min(h, math.ceil(y0 + ch))
    sx1, sy1 = max(sx1, sx0 + 1), max(sy1, sy0 + 1)
    start = np.array([sx0, sy0], dtype=np.int32)
    end = np.array([sx1, sy1], dtype=np.int32)
    r0 = np.array([max(y0 - sy0, 0.0), max(x0 - sx0, 0.0)], dtype=np.float32)
    r1 = np.array([min(y0 + ch, sy1) - sy0, min(x0 + cw, sx1) - sx0], dtype=np.float32)
    return start, end, r0, r1
