"""DALI input pipelines over HDF5 shards: one Loader for training and validation.

Graph: ``fn.external_source`` (a Python callback reading the shards and drawing every random
augmentation parameter, batch mode) -> ``fn.decoders.image_slice`` (CPU, or "mixed" = nvJPEG on a
GPU) decoding only the crop window -> ``fn.resize`` of that window to the output size ->
``fn.crop_mirror_normalize`` (flip, lighting folded into the mean, normalise). Ten-crop
validation decodes the whole image instead (see ``_ten_crop``). DALI has no HDF5 reader and no
sharding for external sources, so the callback (``source.Source``) does the index math
(``train_indices`` / ``val_indices``, docs/data.md). DALI is imported lazily, when a pipeline is
first built.
Every sample is decoded strictly once (``validate.decode_problem``) the first time the Loader
meets it, because DALI's decoder turns garbage compressed data into noise without an error.
"""
from __future__ import annotations

from typing import Iterator

import numpy as np

from ..choices import AUGMENTS
from .augment import AugmentSpec
from .shards import DataError, ShardSet, sample_id
from .source import BAD, Ledger, Source
from .validate import decode_problem

IMAGENET_MEAN = (123.675, 116.28, 103.53)   # 0..255 units
IMAGENET_STD = (58.395, 57.12, 57.375)
TEN_CROPS = 10


# ----------------------------------------------------------------------------- index math
def require_dali() -> None:
    """A one-line error, before anything is written, when NVIDIA DALI (the data path) is missing:
    it comes from exactly one extra (cpu, cuda12, cuda13), not from the base install."""
    import importlib.util  # noqa: PLC0415
    try:
        found = importlib.util.find_spec("nvidia.dali") is not None
    except ImportError:                          # (no 'nvidia' namespace at all)
        found = False
    if not found:
        raise DataError("NVIDIA DALI (the data path) is not installed: pip install -e '.[cpu]' on a "
                        "machine without a GPU, '.[cuda13]' or '.[cuda12]' on a GPU node (the "
                        "driver's CUDA, nvidia-smi; docs/gpu.md)")


def train_steps(n: int, batch_size: int, world: int) -> int:
    """Training steps per epoch, the same on every rank: whole global batches of ``world`` x
    ``batch_size`` in ``n`` samples (the rest of the split is not read that epoch).  The one place
    an epoch's length is defined; the loop's samples per epoch are ``train_steps * world * batch``."""
    return n // (world * batch_size)


def train_indices(n: int, batch_size: int, rank: int, world: int, seed: int, epoch: int
                  ) -> np.ndarray:
    """Global sample indices rank ``rank`` reads in training epoch ``epoch``: (steps*batch,) int64.

    One permutation of [0, n) per (seed, epoch), the same on every rank; rank r takes the r-th
    contiguous block of steps*batch entries, steps = n // (world*batch); the rest is dropped.
    """
    per_rank = train_steps(n, batch_size, world) * batch_size
    perm = np.random.default_rng([seed, epoch]).permutation(n)
    return perm[rank * per_rank:(rank + 1) * per_rank].astype(np.int64)


def val_indices(n: int, rank: int, world: int) -> np.ndarray:
    """Global indices rank ``rank`` evaluates: the contiguous range [r*n//w, (r+1)*n//w), in order."""
    return np.arange(rank * n // world, (rank + 1) * n // world, dtype=np.int64)


# ----------------------------------------------------------------------------- loader
class Loader:
    """Batches of (x, y) from one ShardSet through a DALI pipeline, for training or validation.

    x: (N, H, W, 3) for layout "NHWC" or (N, 3, H, W) for "NCHW", ``dtype``, normalised as
    (pixel - mean) / std with mean/std in 0..255 units; y: (N,) int64. NumPy on the CPU
    (``device_id=None``), CuPy on GPU ``device_id`` (UNVERIFIED, see docs/data.md).
    Training: N = batch_size always; validation: the last batch may be smaller; with
    ``ten_crop`` x holds ``crops`` = 10 consecutive crops per sample (N*10 rows) and y stays (N,).
    augment: "multiscale" (shorter side ~ U[scale] pixels, random crop), "rrc" (random resized
    crop, scale = area fraction range) or "center" (shorter side -> val_resize, centre crop).
    lighting: AlexNet PCA lighting noise std (0 = off). Every random choice depends only on
    (seed, epoch, global sample index): see augment.py.
    """

    def __init__(self, shards: ShardSet, *, batch_size: int, image_size: int, train: bool,
                 augment: str | None = None, scale: tuple[float, float] | None = None,
                 flip: bool | None = None, mean=IMAGENET_MEAN, std=IMAGENET_STD,
                 val_resize: int | None = None, rank: int = 0, world: int = 1, seed: int = 0,
                 num_threads: int = 1, device_id: int | None = None, layout: str = "NHWC",
                 dtype: str = "float32", prefetch: int = 2, lighting: float = 0.0,
                 ten_crop: bool = False):
        self.shards, self.batch_size, self.image_size = shards, int(batch_size), int(image_size)
        self.train, self.rank, self.world, self.seed = bool(train), int(rank), int(world), int(seed)
        self.augment = augment or ("multiscale" if train else "center")
        self.scale = tuple(scale) if scale is not None else _default_scale(self.augment, image_size)
        self.flip = self.train if flip is None else bool(flip)
        self.mean, self.std = [float(m) for m in mean], [float(s) for s in std]
        self.val_resize = int(val_resize or round(image_size * 256 / 224))
        self.num_threads, self.device_id, self.prefetch = int(num_threads), device_id, int(prefetch)
        self.layout, self.dtype, self.lighting = layout, dtype, float(lighting)
        self.ten_crop = bool(ten_crop) and not self.train
        self._check_args()
        self.spec = AugmentSpec(self.augment, self.image_size, self.scale, self.flip, self.lighting,
                                self.val_resize, tuple(self.mean))
        self._ledger = Ledger(shards.num_samples)
        self._pipe = self._source = None
        self._next: tuple[int, int] | None = None

    # set by the start-up check (fastpaths/) when DALI's GPU decode fails it: decode on the CPU,
    # copy the batches to the GPU (read when the pipeline is next built)
    cpu_decode = False
    decoder = property(lambda self: "cpu" if self.device_id is None or self.cpu_decode else "mixed",
                       doc='where JPEGs are decoded: "cpu", or "mixed" (nvJPEG on the GPU)')

    crops = property(lambda self: TEN_CROPS if self.ten_crop else 1,
                     doc="rows of x per sample (10 with ten_crop, else 1)")

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
        if self.lighting < 0 or self.val_resize < self.image_size:
            raise ValueError(f"lighting={self.lighting}, val_resize={self.val_resize}: need "
                             f"lighting >= 0 and val_resize >= image_size={self.image_size}")
        n, w, b = self.shards.num_samples, self.world, self.batch_size
        if self.train and n < w * b:
            raise DataError(f"{where}: {n} samples, but one training step needs {w * b} "
                             f"({w} workers x batch size {b}): use a smaller batch size or fewer "
                             "ranks, or add samples")
        if not self.train and n < w:
            raise DataError(f"{where}: {n} samples for {w} workers that share the validation, "
                            "each needs at least one: use fewer ranks or a larger "
                            f"{self.shards.split} split")

    @property
    def steps_per_epoch(self) -> int:
        """Training: n // (world*batch), equal on every rank. Validation: ceil(own range / batch)."""
        n = self.shards.num_samples
        if self.train:
            return train_steps(n, self.batch_size, self.world)
        return -(-len(val_indices(n, self.rank, self.world)) // self.batch_size)

    bad_count = property(lambda self: len(self._ledger.found), doc="len(bad_samples), cheap")

    @property
    def bad_samples(self) -> list[tuple[str, int]]:
        """(shard file, index in it) of every sample this loader found bad so far (undecodable, or
        decodable only with libjpeg's "Corrupt JPEG data" warnings), in the order found; each was
        replaced by the next good sample (docs/data.md, Bad input). Samples that ``merge_checks``
        brought in as bad are skipped too but not listed: another loader found them."""
        return [(str(p), int(i)) for p, i in (self.shards.locate(g) for g, _ in self._ledger.found)]

    def take_new_bad(self) -> list[tuple[int, str, str]]:
        """The bad samples found since the last call: [(sample id, "<shard file>[<i>]", reason)];
        sample ids (``shards.sample_id``) are unique across the splits of the dataset."""
        led, split = self._ledger, self.shards.split
        new, led.reported = led.found[led.reported:], len(led.found)
        return [(sample_id(split, g), "{}[{}]".format(*self.shards.locate(g)), why)
                for g, why in new]

    def bad_state(self) -> dict:
        """For a checkpoint (JSON): the samples known bad ({"bad": [global index]}) and those found
        but not yet reported at an evaluation ({"pending": [[index, reason]]})."""
        led = self._ledger
        return {"bad": np.flatnonzero(led.state == BAD).tolist(),
                "pending": [[int(g), why] for g, why in led.found[led.reported:]]}

    def restore_bad(self, state: dict) -> None:
        """After a resume: samples known bad are skipped without a second warning; pending ones
        are reported at the next evaluation, as they would have been without the interruption."""
        led = self._ledger
        led.state[np.asarray(state.get("bad", []), dtype=np.int64)] = BAD
        led.found += [(int(g), why) for g, why in state.get("pending", [])]

    @property
    def checks(self) -> np.ndarray:
        """(num_samples,) uint8, per sample: 0 not checked yet, 1 good, 2 bad (a copy)."""
        return self._ledger.state.copy()

    def merge_checks(self, other: np.ndarray) -> None:
        """Adopt another loader's ``checks`` of the same split (element-wise max), e.g. those of the
        other ranks: samples they checked are not decoded strictly again here, their bad ones are
        skipped here without being counted again."""
        np.maximum(self._ledger.state, np.asarray(other, dtype=np.uint8),
                   out=self._ledger.state)

    @property
    def same_every_epoch(self) -> bool:
        """Whether every epoch delivers the same batches: evaluation order (``val_indices`` has no
        epoch) and a crop, mirror and mean that draw nothing (``augment.draw``'s rng unused)."""
        return not self.train and self.augment == "center" and not self.flip and self.lighting == 0

    def indices(self, epoch: int) -> np.ndarray:
        """Global indices this rank reads in ``epoch``, in delivery order: (samples,) int64."""
        n = self.shards.num_samples
        if self.train:
            return train_indices(n, self.batch_size, self.rank, self.world, self.seed, epoch)
        return val_indices(n, self.rank, self.world)

    def epoch(self, epoch: int, start_step: int = 0) -> Iterator[tuple]:
        """Yield batches ``start_step ..`` of ``epoch`` (``steps_per_epoch - start_step`` of them).

        Batches before ``start_step`` are skipped without being read or decoded; the batches
        yielded are exactly those a full ``epoch(epoch)`` yields from that step on. The pipeline
        is reused when (epoch, start_step) = (previous + 1, 0) after a fully consumed epoch, or,
        where every epoch delivers the same batches (``same_every_epoch``: an evaluation), for any
        whole epoch after a fully consumed one; rebuilt otherwise (10-15 ms, and a virtual worker
        evaluates at every boundary). An undecodable sample is replaced and recorded in
        ``bad_samples`` (the failed batch is rebuilt, never lost); raises DataError naming the
        shard file and index when a sample cannot be read or the failure cannot be attributed.
        """
        if not 0 <= start_step <= self.steps_per_epoch:
            raise ValueError(f"start_step={start_step} not in [0, {self.steps_per_epoch}]")
        reuse = self._next == (epoch, start_step) or (
            self.same_every_epoch and self._next is not None and start_step == 0)
        if self._pipe is None or not reuse:
            self._build(epoch, start_step)
        self._next = None                        # mid-epoch until StopIteration
        step = start_step
        while True:
            try:
                out = self._pipe.run()
            except StopIteration:
                self._pipe.reset()
                self._next = (epoch + 1, 0)
                return
            except RuntimeError as e:            # decoder failure: the batch is lost
                self._recover(e)                 # raises DataError if it cannot
                self._build(epoch, step)         # same batches again, bad samples replaced
                continue
            step += 1
            yield self._to_arrays(out)

    def close(self) -> None:
        """Drop the DALI pipeline (a later ``epoch`` call builds a new one)."""
        self._pipe = self._source = None
        self._next = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- internals
    def _build(self, first_epoch: int, start_step: int) -> None:
        from nvidia.dali import Pipeline, fn, types
        self.close()
        self._source = Source(self.shards, self.indices, self.batch_size, first_epoch, start_step,
                               self.spec, self.seed, self._ledger, self.ten_crop)
        pipe = Pipeline(batch_size=self.batch_size, num_threads=self.num_threads,
                        device_id=self.device_id, seed=self.seed,
                        prefetch_queue_depth=self.prefetch, exec_dynamic=True)
        with pipe:
            pipe.set_outputs(*(self._ten_crop(fn, types) if self.ten_crop
                               else self._graph(fn, types)))
        pipe.build()
        self._pipe = pipe

    def _cmn_args(self, types) -> dict:
        return dict(std=self.std, dtype=types.FLOAT if self.dtype == "float32" else types.FLOAT16,
                    output_layout="HWC" if self.layout == "NHWC" else "CHW")

    def _graph(self, fn, types):
        """Decode the crop window only, resize it to image_size^2, mirror + normalise."""
        jpegs, labels, start, end, r0, r1, mirror, mean = fn.external_source(
            source=self._source, num_outputs=8, batch=True, batch_info=True,
            dtype=[types.UINT8, types.INT64, types.INT32, types.INT32, types.FLOAT, types.FLOAT,
                   types.INT32, types.FLOAT], ndim=[1, 0, 1, 1, 1, 1, 0, 1])
        images = fn.decoders.image_slice(
            jpegs, start=start, end=end, output_type=types.RGB, adjust_orientation=False,
            device=self.decoder)
        s = self.image_size
        images = fn.resize(images, size=(s, s), roi_start=r0, roi_end=r1)
        return fn.crop_mirror_normalize(images, mirror=mirror, mean=mean,
                                        **self._cmn_args(types)), labels

    def _ten_crop(self, fn, types):
        """Shorter side -> val_resize; four corners + centre, each also mirrored: (10, ...) per
        sample, in the order (x, y) = TL, TR, BL, BR, centre, then the same mirrored."""
        jpegs, labels = fn.external_source(source=self._source, num_outputs=2, batch=True,
                                           batch_info=True, dtype=[types.UINT8, types.INT64],
                                           ndim=[1, 0])
        images = fn.decoders.image(jpegs, output_type=types.RGB, adjust_orientation=False,
                                   device=self.decoder)
        images = fn.resize(images, resize_shorter=self.val_resize)
        s, kw = self.image_size, self._cmn_args(types)
        crops = [fn.crop_mirror_normalize(images, crop=(s, s), crop_pos_x=px, crop_pos_y=py,
                                          mirror=m, mean=self.mean, **kw)
                 for m in (0, 1) for px, py in ((0, 0), (1, 0), (0, 1), (1, 1), (0.5, 0.5))]
        return fn.stack(*crops, axis=0), labels

    def _to_arrays(self, out) -> tuple:
        """DALI outputs -> (x, y); zero-copy views (the dynamic executor keeps them valid)."""
        x_tl, y_tl = out
        y = np.asarray(y_tl.as_tensor()).reshape(-1)
        if self.device_id is None:
            x = np.asarray(x_tl.as_tensor())
            return (x.reshape(-1, *x.shape[2:]) if self.ten_crop else x), y
        import cupy                              # GPU branch only (UNVERIFIED: no GPU here)
        x = cupy.asarray(np.asarray(x_tl.as_tensor())) if self.cpu_decode else \
            cupy.from_dlpack(x_tl.as_tensor())
        return (x.reshape(-1, *x.shape[2:]) if self.ten_crop else x), cupy.asarray(y)

    def _recover(self, exc: RuntimeError) -> None:
        """Find the samples behind a DALI failure among the last batches the callback produced,
        mark them bad (they will be replaced); DataError when the cause is not a bad sample."""
        src = self._source
        if src.error:
            self.close()
            raise DataError(src.error)
        led = self._ledger
        seen = dict.fromkeys(int(j) for batch in list(src.recent) for j in batch)
        new = {}
        for j in seen:                           # strict decode: the reason DALI failed
            why = None if led.is_bad(j) else decode_problem(self.shards.read(j)[0])
            if why:
                new[j] = why
        if not new:
            self.close()
            lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
            hint = next((ln for ln in lines if "ailed" in ln), lines[-1] if lines else repr(exc))
            raise DataError(f"{self.shards.root}/{self.shards.split}: DALI pipeline failed and "
                            f"the bad sample was not identified ({hint[:200]})")
        for j, why in new.items():
            led.mark_found(j, why)


def _default_scale(augment: str, image_size: int) -> tuple[float, float]:
    if augment == "rrc":
        return (0.08, 1.0)
    return (round(image_size * 256 / 224), round(image_size * 480 / 224))

