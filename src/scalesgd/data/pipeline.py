"""DALI input pipelines over HDF5 shards: one Loader for training and validation.

Graph: ``fn.external_source`` (a Python callback reading the shards, batch mode) ->
``fn.decoders.image`` (CPU, or "mixed" on a GPU) -> augmentation -> ``fn.crop_mirror_normalize``.
DALI has no HDF5 reader and no sharding for external sources, so the callback does the index
math (see ``train_indices`` / ``val_indices`` and docs/data.md). DALI is imported lazily, when a
pipeline is first built.
"""
from __future__ import annotations

import collections
import io
from typing import Iterator

import numpy as np

from .shards import DataError, ShardSet

AUGMENTS = ("multiscale", "rrc", "center")
IMAGENET_MEAN = (123.675, 116.28, 103.53)   # 0..255 units
IMAGENET_STD = (58.395, 57.12, 57.375)


# ----------------------------------------------------------------------------- index math
def train_indices(n: int, batch_size: int, rank: int, world: int, seed: int, epoch: int
                  ) -> np.ndarray:
    """Global sample indices rank ``rank`` reads in training epoch ``epoch``: (steps*batch,) int64.

    One permutation of [0, n) per (seed, epoch), the same on every rank; rank r takes the r-th
    contiguous block of steps*batch entries, steps = n // (world*batch); the rest is dropped.
    """
    steps = n // (world * batch_size)
    per_rank = steps * batch_size
    perm = np.random.default_rng([seed, epoch]).permutation(n)
    return perm[rank * per_rank:(rank + 1) * per_rank].astype(np.int64)


def val_indices(n: int, rank: int, world: int) -> np.ndarray:
    """Global indices rank ``rank`` evaluates: the contiguous range [r*n//w, (r+1)*n//w), in order."""
    return np.arange(rank * n // world, (rank + 1) * n // world, dtype=np.int64)


# ----------------------------------------------------------------------------- callback
class _Source:
    """External-source callback (batch mode, ``batch_info=True``): BatchInfo -> (images, labels).

    images: list of (nbytes,) uint8 arrays; labels: list of () int64 arrays. Raises only
    StopIteration: a failed read is recorded in ``self.error`` and delivered as empty bytes, so
    the decoder fails and the Loader reports the recorded cause. ``recent`` keeps the global
    indices of the last few batches produced (the callback runs ahead of ``run()``).
    """

    def __init__(self, shards: ShardSet, indices_of, batch_size: int, first_epoch: int):
        self.shards, self.indices_of, self.batch_size = shards, indices_of, batch_size
        self.first_epoch = first_epoch
        self.recent: collections.deque = collections.deque(maxlen=8)
        self.error: str | None = None
        self._cache: tuple[int, np.ndarray] | None = None

    def __call__(self, info):
        epoch = self.first_epoch + int(info.epoch_idx)
        if self._cache is None or self._cache[0] != epoch:
            self._cache = (epoch, self.indices_of(epoch))
        start = int(info.iteration) * self.batch_size
        batch = self._cache[1][start:start + self.batch_size]
        if batch.size == 0:
            raise StopIteration
        self.recent.append(batch)
        images, labels = [], []
        for j in batch:
            images.append(self._read(int(j)))
            labels.append(np.array(self.shards.labels[j], dtype=np.int64))
        return images, labels

    def _read(self, j: int) -> np.ndarray:
        try:
            return self.shards.read(j)[0]
        except Exception as e:                      # noqa: BLE001 - must not escape into DALI
            path, local = self.shards.locate(j)
            if self.error is None:
                self.error = f"{path}[{local}]: cannot read sample ({' '.join(str(e).split())})"
            return np.zeros(0, dtype=np.uint8)


# ----------------------------------------------------------------------------- loader
class Loader:
    """Batches of (x, y) from one ShardSet through a DALI pipeline, for training or validation.

    x: (N, H, W, 3) for layout "NHWC" or (N, 3, H, W) for "NCHW", ``dtype``, normalised as
    (pixel - mean) / std with mean/std in 0..255 units; y: (N,) int64. NumPy on the CPU
    (``device_id=None``), CuPy on GPU ``device_id`` (UNVERIFIED, see docs/data.md).
    Training: N = batch_size always; validation: the last batch may be smaller.
    augment: "multiscale" (shorter side ~ U[scale] pixels, random crop), "rrc" (random resized
    crop, scale = area fraction range) or "center" (shorter side -> val_resize, centre crop).
    """

    def __init__(self, shards: ShardSet, *, batch_size: int, image_size: int, train: bool,
                 augment: str | None = None, scale: tuple[float, float] | None = None,
                 flip: bool | None = None, mean=IMAGENET_MEAN, std=IMAGENET_STD,
                 val_resize: int | None = None, rank: int = 0, world: int = 1, seed: int = 0,
                 num_threads: int = 1, device_id: int | None = None, layout: str = "NHWC",
                 dtype: str = "float32", prefetch: int = 2):
        self.shards, self.batch_size, self.image_size = shards, int(batch_size), int(image_size)
        self.train, self.rank, self.world, self.seed = bool(train), int(rank), int(world), int(seed)
        self.augment = augment or ("multiscale" if train else "center")
        self.scale = tuple(scale) if scale is not None else _default_scale(self.augment, image_size)
        self.flip = self.train if flip is None else bool(flip)
        self.mean, self.std = [float(m) for m in mean], [float(s) for s in std]
        self.val_resize = int(val_resize or round(image_size * 256 / 224))
        self.num_threads, self.device_id, self.prefetch = int(num_threads), device_id, int(prefetch)
        self.layout, self.dtype = layout, dtype
        self._check_args()
        self._pipe = self._source = None
        self._next_epoch: int | None = None

    def _check_args(self) -> None:
        where = f"{self.shards.root}/{self.shards.split}"
        if self.augment not in AUGMENTS:
            raise ValueError(f"augment={self.augment!r}: expected one of {AUGMENTS}")
        if self.layout not in ("NHWC", "NCHW") or self.dtype not in ("float32", "float16"):
            raise ValueError(f"layout={self.layout!r}, dtype={self.dtype!r}: expected "
                             "NHWC|NCHW and float32|float16")
        if not (0 <= self.rank < self.world) or self.batch_size < 1 or self.num_threads < 1:
            raise ValueError(f"rank={self.rank}, world={self.world}, batch_size={self.batch_size}"
                             f", num_threads={self.num_threads}: out of range")
        lo, hi = self.scale
        if self.augment == "multiscale" and not self.image_size <= lo <= hi:
            raise ValueError(f"scale={self.scale}: multiscale needs image_size <= lo <= hi pixels")
        if self.augment == "rrc" and not 0 < lo <= hi <= 1:
            raise ValueError(f"scale={self.scale}: rrc needs an area range 0 < lo <= hi <= 1")
        if self.steps_per_epoch < 1:
            raise ValueError(f"{where}: {self.shards.num_samples} samples give no full step "
                             f"for world={self.world}, batch_size={self.batch_size}")

    @property
    def steps_per_epoch(self) -> int:
        """Training: n // (world*batch), equal on every rank. Validation: ceil(own range / batch)."""
        n = self.shards.num_samples
        if self.train:
            return n // (self.world * self.batch_size)
        return -(-len(val_indices(n, self.rank, self.world)) // self.batch_size)

    def indices(self, epoch: int) -> np.ndarray:
        """Global indices this rank reads in ``epoch``, in delivery order: (samples,) int64."""
        n = self.shards.num_samples
        if self.train:
            return train_indices(n, self.batch_size, self.rank, self.world, self.seed, epoch)
        return val_indices(n, self.rank, self.world)

    def epoch(self, epoch: int) -> Iterator[tuple]:
        """Yield the ``steps_per_epoch`` batches (x, y) of ``epoch``.

        Calling with epoch = previous + 1 after a fully consumed epoch reuses the pipeline;
        any other epoch (resume, or an abandoned epoch) rebuilds it. Raises DataError naming
        the shard file and index when a sample cannot be read or decoded.
        """
        if self._pipe is None or self._next_epoch != epoch:
            self._build(epoch)
        self._next_epoch = None                  # mid-epoch until StopIteration
        pipe = self._pipe
        while True:
            try:
                out = pipe.run()
            except StopIteration:
                pipe.reset()
                self._next_epoch = epoch + 1
                return
            except RuntimeError as e:            # decoder failure: the batch is lost
                err = self._diagnose(e)
                self.close()                     # do not rely on recovery: rebuild next time
                raise err from None
            yield self._to_arrays(out)

    def close(self) -> None:
        """Drop the DALI pipeline (a later ``epoch`` call builds a new one)."""
        self._pipe = self._source = None
        self._next_epoch = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- internals
    def _build(self, first_epoch: int) -> None:
        from nvidia.dali import Pipeline, fn, types
        self.close()
        self._source = _Source(self.shards, self.indices, self.batch_size, first_epoch)
        pipe = Pipeline(batch_size=self.batch_size, num_threads=self.num_threads,
                        device_id=self.device_id, seed=self.seed + self.rank,
                        prefetch_queue_depth=self.prefetch, exec_dynamic=True)
        with pipe:
            jpegs, labels = fn.external_source(
                source=self._source, num_outputs=2, batch=True, batch_info=True,
                dtype=[types.UINT8, types.INT64], ndim=[1, 0])
            images = fn.decoders.image(jpegs, device="cpu" if self.device_id is None else "mixed",
                                       output_type=types.RGB)
            pipe.set_outputs(self._augment(images, fn, types), labels)
        pipe.build()
        self._pipe = pipe

    def _augment(self, images, fn, types):
        """Decoded HWC uint8 images -> normalised (image_size, image_size) crops."""
        s, kw = self.image_size, {}
        if self.augment == "multiscale":
            images = fn.resize(images, resize_shorter=fn.random.uniform(range=self.scale))
            kw = {"crop": (s, s), "crop_pos_x": fn.random.uniform(range=(0.0, 1.0)),
                  "crop_pos_y": fn.random.uniform(range=(0.0, 1.0))}
        elif self.augment == "rrc":
            images = fn.random_resized_crop(images, size=(s, s), random_area=self.scale)
        else:
            images = fn.resize(images, resize_shorter=self.val_resize)
            kw = {"crop": (s, s)}
        mirror = fn.random.coin_flip(probability=0.5) if self.flip else 0
        return fn.crop_mirror_normalize(
            images, mirror=mirror, mean=self.mean, std=self.std,
            dtype=types.FLOAT if self.dtype == "float32" else types.FLOAT16,
            output_layout="HWC" if self.layout == "NHWC" else "CHW", **kw)

    def _to_arrays(self, out) -> tuple:
        """DALI outputs -> (x, y); zero-copy views (the dynamic executor keeps them valid)."""
        x_tl, y_tl = out
        y = np.asarray(y_tl.as_tensor()).reshape(-1)
        if self.device_id is None:
            return np.asarray(x_tl.as_tensor()), y
        import cupy                              # GPU branch only (UNVERIFIED: no GPU here)
        return cupy.from_dlpack(x_tl.as_tensor()), cupy.asarray(y)

    def _diagnose(self, exc: RuntimeError) -> DataError:
        """Find the sample behind a DALI failure among the last batches the callback produced."""
        if self._source.error:
            return DataError(self._source.error)
        for batch in list(self._source.recent):
            for j in batch:
                reason = _decode_error(self.shards.read(int(j))[0])
                if reason:
                    path, local = self.shards.locate(int(j))
                    return DataError(f"{path}[{local}]: cannot decode JPEG ({reason})")
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
        hint = next((ln for ln in lines if "ailed" in ln), lines[-1] if lines else repr(exc))
        return DataError(f"{self.shards.root}/{self.shards.split}: DALI pipeline failed and the "
                         f"bad sample was not identified ({hint[:200]})")


def _default_scale(augment: str, image_size: int) -> tuple[float, float]:
    if augment == "rrc":
        return (0.08, 1.0)
    return (round(image_size * 256 / 224), round(image_size * 480 / 224))


def _decode_error(data: np.ndarray) -> str | None:
    """None if PIL fully decodes the bytes, else a one-line reason."""
    from PIL import Image
    if data.size == 0:
        return "empty"
    try:
        with Image.open(io.BytesIO(data.tobytes())) as im:
            im.load()
    except Exception as e:                      # noqa: BLE001 - any PIL failure is the answer
        return " ".join(str(e).split()) or type(e).__name__
    return None
