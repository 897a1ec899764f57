"""Training input pipeline: DALI Loader images/s against PIL + NumPy loaders doing the same work.

Same shard (synthetic 500x375 JPEGs, the ImageNet median size), same thread count, same
augmentation (shorter side ~ U[256, 480], random 224 crop, flip, normalise, CHW float32),
interleaved rounds, medians and ratios printed:

    PYTHONPATH=src python benchmarks/input_pipeline.py [--threads 1] [--images 256] [--rounds 5]
    PYTHONPATH=src python benchmarks/input_pipeline.py --device 0      # GPU decode (mixed)

Baselines: ``pil`` decodes, resizes the whole image, crops (the usual torchvision-style loop);
``pil-box`` decodes and resizes only the crop window (``Image.resize(box=...)``), the best PIL
can do with the same output. The Loader decodes only the window (``decoders.image_slice``).
"""
from __future__ import annotations

import argparse
import io
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from PIL import Image

from scalesgd.data.augment import AugmentSpec, draw, image_size
from scalesgd.data.pipeline import IMAGENET_MEAN, IMAGENET_STD, Loader
from scalesgd.data.shards import ShardSet, content_id, write_manifest, write_split

SIZE, SCALE = 224, (256.0, 480.0)


def make_jpegs(n: int, seed: int = 0) -> list[tuple[bytes, int]]:
    """Smooth random 500x375 RGB images with noise, JPEG quality 90 (~100 KB each)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        base = Image.fromarray(rng.integers(0, 256, (30, 40, 3), dtype=np.uint8)).resize((500, 375),
                                                                                           Image.BICUBIC)
        a = np.asarray(base, dtype=np.int16) + rng.integers(-24, 24, (375, 500, 3))
        buf = io.BytesIO()
        Image.fromarray(a.clip(0, 255).astype(np.uint8)).save(buf, "JPEG", quality=90)
        out.append((buf.getvalue(), i % 10))
    return out


def make_dataset(root: str, n: int) -> ShardSet:
    samples = make_jpegs(n)
    did = content_id({"train": samples}, 10)
    entry = write_split(root, "train", samples, 1, did, 10)
    write_manifest(root, name="bench", dataset_id=did,
                   classes=[{"index": c, "wnid": str(c), "name": str(c)} for c in range(10)],
                   splits={"train": entry}, options={})
    return ShardSet.open(root, "train")


def pil_sample(shards, spec, g: int, box: bool) -> np.ndarray:
    """One sample the PIL way; the crop window comes from the same parameters as the Loader's."""
    data = shards.read(g)[0]
    p = draw(spec, 0, 0, g, image_size(data))
    im = Image.open(io.BytesIO(data.tobytes())).convert("RGB")
    x0, y0, w, h = p.window
    if box:
        im = im.resize((SIZE, SIZE), Image.BILINEAR, box=(x0, y0, x0 + w, y0 + h))
    else:
        s = SIZE / w                           # resize factor: shorter side -> S = SIZE*short/w
        im = im.resize((round(im.width * s), round(im.height * s)), Image.BILINEAR)
        cx, cy = min(round(x0 * s), im.width - SIZE), min(round(y0 * s), im.height - SIZE)
        im = im.crop((cx, cy, cx + SIZE, cy + SIZE))
    a = np.asarray(im, dtype=np.float32)
    if p.mirror:
        a = a[:, ::-1]
    a = (a - np.asarray(IMAGENET_MEAN, np.float32)) / np.asarray(IMAGENET_STD, np.float32)
    return np.ascontiguousarray(a.transpose(2, 0, 1))


def run_pil(shards, spec, pool, batch: int, box: bool) -> tuple[float, float]:
    """-> (images per wall second, images per CPU second of this process)."""
    n = shards.num_samples // batch * batch
    t, c = time.perf_counter(), time.process_time()
    for lo in range(0, n, batch):
        np.stack(list(pool.map(lambda g: pil_sample(shards, spec, g, box), range(lo, lo + batch))))
    return n / (time.perf_counter() - t), n / (time.process_time() - c)


def run_dali(loader: Loader, epoch: int) -> tuple[float, float]:
    it = loader.epoch(epoch)
    next(it)                                                      # build + first batch excluded
    t, c, n = time.perf_counter(), time.process_time(), 0
    for x, _ in it:
        n += len(x)
    return n / (time.perf_counter() - t), n / (time.process_time() - c)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--images", type=int, default=256)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--device", type=int, default=None, help="GPU id: mixed decode (UNVERIFIED)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as root:
        shards = make_dataset(root, a.images)
        kb = np.mean([len(shards.read(i)[0]) for i in range(shards.num_samples)]) / 1e3
        spec = AugmentSpec("multiscale", SIZE, SCALE, True, 0.0, 256, IMAGENET_MEAN)
        loader = Loader(shards, batch_size=a.batch, image_size=SIZE, train=True, scale=SCALE,
                        num_threads=a.threads, device_id=a.device, layout="NCHW")
        res = {"dali": [], "pil": [], "pil-box": []}
        with ThreadPoolExecutor(a.threads) as pool:
            for r in range(a.rounds):                             # interleaved
                res["dali"].append(run_dali(loader, r))
                res["pil"].append(run_pil(shards, spec, pool, a.batch, box=False))
                res["pil-box"].append(run_pil(shards, spec, pool, a.batch, box=True))
        med = {k: float(np.median([w for w, _ in v])) for k, v in res.items()}
        cpu = {k: float(np.median([c for _, c in v])) for k, v in res.items()}
        print(f"{a.images} JPEGs 500x375 (mean {kb:.0f} KB), batch {a.batch}, threads {a.threads}, "
              f"device {'cpu' if a.device is None else f'gpu {a.device}'}, cores {os.cpu_count()}")
        for k, v in res.items():
            print(f"  {k:8s} median {med[k]:7.1f} img/s, {cpu[k]:6.1f} img per CPU-s  "
                  f"(rounds: {', '.join(f'{w:.0f}' for w, _ in v)})")
        print(f"  ratio dali/pil {med['dali'] / med['pil']:.2f}x, dali/pil-box "
              f"{med['dali'] / med['pil-box']:.2f}x (same thread count); per CPU-second "
              f"{cpu['dali'] / cpu['pil']:.2f}x, {cpu['dali'] / cpu['pil-box']:.2f}x")


if __name__ == "__main__":
    main()
