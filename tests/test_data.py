"""Data package: shard format, digits dataset, DALI loaders. Real HDF5, real JPEGs, real DALI."""
import io
import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
from PIL import Image

from scalesgd.data import DataError, ShardError, ShardSet
from scalesgd.data.demo import build_digits, default_data_dir
from scalesgd.data.pipeline import Loader, train_indices, val_indices
from scalesgd.data.shards import sample_id, split_of, write_manifest, write_split
from scalesgd.data.validate import decode_problem, header_size

from synth import entropy_range, garbled, jpeg, make_dataset

SRC = str(Path(__file__).resolve().parents[1] / "src")


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    return build_digits(tmp_path_factory.mktemp("digits"), image_size=32, seed=0)


# ----------------------------------------------------------------------------- digits + format
def test_the_digits_are_read_from_sklearns_file_exactly_as_load_digits_gives_them(monkeypatch):
    """The build reads scikit-learn's CSV file without importing sklearn (1.5 s of SciPy); it must
    hold exactly what load_digits() returns, and load_digits() stays the fallback."""
    from sklearn.datasets import load_digits
    from scalesgd.data import demo
    d = load_digits()
    assert demo._digits_csv() is not None                  # the fast path is the one taken here
    images, labels = demo._load_digits()
    assert images.shape == (1797, 8, 8) and images.dtype == np.uint8 and labels.dtype == np.int64
    np.testing.assert_array_equal(labels, d.target)
    np.testing.assert_array_equal(images, np.rint(d.images * (255.0 / 16.0)).astype(np.uint8))
    monkeypatch.setattr(demo, "_digits_csv", lambda: None)
    fallback_images, fallback_labels = demo._load_digits()
    np.testing.assert_array_equal(fallback_images, images)
    np.testing.assert_array_equal(fallback_labels, labels)


def test_build_digits_counts_and_reuse(digits):
    train, val = ShardSet.open(digits, "train"), ShardSet.open(digits, "val")
    assert train.num_samples + val.num_samples == 1797
    assert 340 <= val.num_samples <= 380
    assert len(train.shard_paths) == 2 and len(val.shard_paths) == 1
    assert train.num_classes == 10 and train.class_names == [str(c) for c in range(10)]
    assert set(np.unique(train.labels)) == set(range(10)) == set(np.unique(val.labels))
    files = sorted(digits.iterdir())
    mtimes = [f.stat().st_mtime_ns for f in files]
    assert build_digits(digits, image_size=32, seed=0) == digits
    assert sorted(digits.iterdir()) == files
    assert [f.stat().st_mtime_ns for f in files] == mtimes
    train.verify()
    val.verify()


def test_read_back_decodes(digits):
    train = ShardSet.open(digits, "train")
    for g in (0, 719, train.num_samples - 1):
        data, label = train.read(g)
        assert data.dtype == np.uint8 and data[:2].tolist() == [0xFF, 0xD8]
        assert label == train.labels[g]
        assert Image.open(io.BytesIO(data.tobytes())).size == (32, 32)
    path, local = train.locate(train.num_samples - 1)
    assert path.name == "train-00001-of-00002.h5" and local == train.num_samples - 1 - 719
    with pytest.raises(IndexError):
        train.read(train.num_samples)


def test_default_data_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("SCALESGD_DATA", str(tmp_path))
    assert default_data_dir() == tmp_path
    monkeypatch.delenv("SCALESGD_DATA")
    assert default_data_dir(64).name == "digits-64"


def test_concurrent_builds_do_not_corrupt(tmp_path):
    code = "import sys; from scalesgd.data.demo import build_digits; build_digits(sys.argv[1], 16)"
    env = {**os.environ, "PYTHONPATH": SRC}
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], env=env)
             for _ in range(2)]
    assert [p.wait(timeout=60) for p in procs] == [0, 0]
    assert not [f for f in tmp_path.iterdir() if f.name.startswith(".")]
    for split in ("train", "val"):
        ShardSet.open(tmp_path, split).verify()


def test_missing_manifest(tmp_path):
    with pytest.raises(ShardError, match=r"manifest\.json: manifest not found"):
        ShardSet.open(tmp_path, "train")
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(ShardError, match="cannot parse manifest"):
        ShardSet.open(tmp_path, "train")


def test_missing_shard(tmp_path):
    root = make_dataset(tmp_path)
    (root / "train-00001-of-00002.h5").unlink()
    with pytest.raises(ShardError, match=r"train-00001-of-00002\.h5: .*missing"):
        ShardSet.open(root, "train")


@pytest.mark.parametrize("damage", ["truncate", "header"])
def test_corrupt_shard(tmp_path, damage):
    root = make_dataset(tmp_path)
    path = root / "train-00000-of-00002.h5"
    raw = path.read_bytes()
    path.write_bytes(raw[:len(raw) // 2] if damage == "truncate" else b"\0" * 64 + raw[64:])
    with pytest.raises(ShardError, match=r"train-00000-of-00002\.h5: not a readable HDF5"):
        ShardSet.open(root, "train")
    with pytest.raises(ShardError, match="sha256"):
        ShardSet(root, "train", *_raw_parts(root)).verify()


def _raw_parts(root):
    """Constructor arguments of an unvalidated ShardSet, to reach verify() on a bad file."""
    import json
    m = json.loads((root / "manifest.json").read_text())
    shards = m["splits"]["train"]["shards"]
    counts = np.array([s["count"] for s in shards])
    return m, [root / s["file"] for s in shards], counts, np.zeros(counts.sum(), np.int64)


def test_label_out_of_range(tmp_path):
    root = make_dataset(tmp_path, num_classes=10)
    with h5py.File(root / "train-00001-of-00002.h5", "r+") as f:
        f["labels"][7] = 12
    with pytest.raises(ShardError, match=r"train-00001-of-00002\.h5\[7\]: label 12 not in \[0, 10\)"):
        ShardSet.open(root, "train")
    with pytest.raises(ValueError, match=r"\[3\]: label 12"):
        write_split(tmp_path / "w", "train", [(b"x", 1)] * 3 + [(b"x", 12)], 1, "id", 10)


def test_equal_length_samples_round_trip(tmp_path):
    samples = [(bytes([i, 1, 2, 3]), i % 3) for i in range(5)]      # all 4 bytes long
    entry = write_split(tmp_path, "val", samples, 2, "id0", 3)
    classes = [{"index": c, "wnid": str(c), "name": str(c)} for c in range(3)]
    write_manifest(tmp_path, name="t", dataset_id="id0", classes=classes,
                   splits={"val": entry}, options={})
    val = ShardSet.open(tmp_path, "val")
    assert [c["count"] for c in entry["shards"]] == [2, 3]
    assert [val.read(i)[0].tolist() for i in range(5)] == [list(d) for d, _ in samples]
    assert val.labels.tolist() == [lab for _, lab in samples]


def test_shard_from_other_dataset(tmp_path):
    a, b = make_dataset(tmp_path / "a", seed=0), make_dataset(tmp_path / "b", seed=1)
    (b / "train-00001-of-00002.h5").replace(a / "train-00001-of-00002.h5")
    with pytest.raises(ShardError, match=r"train-00001-of-00002\.h5: attribute dataset_id="):
        ShardSet.open(a, "train")


# ----------------------------------------------------------------------------- loaders
def test_index_math():
    n, bs = 1000, 32
    for epoch in range(3):
        parts = [train_indices(n, bs, r, 3, 7, epoch) for r in range(3)]
        assert all(p.size == (n // (3 * bs)) * bs for p in parts)
        assert len(set(np.concatenate(parts).tolist())) == sum(p.size for p in parts)
    assert not np.array_equal(train_indices(n, bs, 0, 3, 7, 0), train_indices(n, bs, 0, 3, 7, 1))
    assert np.array_equal(np.concatenate([val_indices(n, r, 3) for r in range(3)]), np.arange(n))


def test_train_loader_shapes_and_sharding(digits):
    train = ShardSet.open(digits, "train")
    loaders = [Loader(train, batch_size=32, image_size=28, train=True, scale=(28, 36),
                      mean=(128,) * 3, std=(64,) * 3, rank=r, world=2, seed=3) for r in range(2)]
    assert loaders[0].steps_per_epoch == loaders[1].steps_per_epoch == train.num_samples // 64
    for epoch in range(2):
        idx = [ld.indices(epoch) for ld in loaders]
        assert idx[0].size == idx[1].size == loaders[0].steps_per_epoch * 32
        assert not set(idx[0].tolist()) & set(idx[1].tolist())
        batches = [(x, y, x.copy()) for x, y in loaders[0].epoch(epoch)]
        assert len(batches) == loaders[0].steps_per_epoch
        assert all(np.array_equal(x, x0) for x, _, x0 in batches)   # zero-copy views stay valid
        x, y, _ = batches[0]
        assert x.shape == (32, 28, 28, 3) and x.dtype == np.float32
        assert y.shape == (32,) and y.dtype == np.int64 and 0 <= y.min() and y.max() < 10
        assert np.array_equal(np.concatenate([b[1] for b in batches]), train.labels[idx[0]])
    assert not set(loaders[0].indices(0).tolist()) == set(loaders[0].indices(1).tolist())


def test_train_loader_resume_and_abandon(digits):
    train = ShardSet.open(digits, "train")
    ld = Loader(train, batch_size=64, image_size=24, train=True, augment="rrc", layout="NCHW")
    x, y = next(iter(ld.epoch(4)))                      # resume at 4, abandon mid-epoch
    assert x.shape == (64, 3, 24, 24) and np.array_equal(y, train.labels[ld.indices(4)[:64]])
    for epoch in (5, 6):
        ys = [y for _, y in ld.epoch(epoch)]
        assert np.array_equal(np.concatenate(ys), train.labels[ld.indices(epoch)])
    ld.close()


def test_val_loader_covers_every_sample_once(digits):
    val = ShardSet.open(digits, "val")
    for world in (1, 2):
        got = []
        for rank in range(world):
            ld = Loader(val, batch_size=64, image_size=32, train=False, rank=rank, world=world)
            sizes = [len(y) for _, y in ld.epoch(0)]
            assert len(sizes) == ld.steps_per_epoch and sum(sizes) == ld.indices(0).size
            assert all(s == 64 for s in sizes[:-1]) and sizes[-1] <= 64
            got.append(np.concatenate([y for _, y in ld.epoch(1)]))
        assert np.array_equal(np.concatenate(got), val.labels)


def _pil_center(data, resize, crop):
    """Reference: PIL decode -> RGB -> bilinear resize -> centre crop; (crop, crop, 3) float."""
    im = Image.open(io.BytesIO(data.tobytes())).convert("RGB").resize((resize, resize),
                                                                      Image.BILINEAR)
    o = (resize - crop) // 2
    return np.asarray(im.crop((o, o, o + crop, o + crop)), dtype=np.float32)


def test_center_normalisation_matches_pil(digits):
    val = ShardSet.open(digits, "val")
    common = dict(batch_size=16, image_size=24, train=False, val_resize=28)
    raw = Loader(val, mean=(0,) * 3, std=(1,) * 3, **common)
    norm = Loader(val, mean=(100, 110, 120), std=(50, 60, 70), **common)
    x, _ = next(iter(raw.epoch(0)))
    xn, _ = next(iter(norm.epoch(0)))
    ref = np.stack([_pil_center(val.read(i)[0], 28, 24) for i in range(16)])
    assert np.abs(x - ref).mean() < 1.0                 # measured 0.19 (0..255 units)
    expect = (x - np.array([100, 110, 120])) / np.array([50, 60, 70])
    np.testing.assert_allclose(xn, expect, atol=1e-4)


def test_bad_jpeg_is_skipped_and_counted(tmp_path):
    root = make_dataset(tmp_path, n=40, bad=23)         # shard 1 holds 20..39 -> local 3
    shards = ShardSet.open(root, "train")
    for train in (True, False):
        ld = Loader(shards, batch_size=8, image_size=16, train=train, augment="center")
        ys = [y for _, y in ld.epoch(0)]
        assert len(ys) == ld.steps_per_epoch and all(len(y) == 8 for y in ys)
        assert ld.bad_samples == [(str(root / "train-00001-of-00002.h5"), 3)]
        expect = shards.labels[np.where(ld.indices(0) == 23, 24, ld.indices(0))]   # next good one
        assert np.array_equal(np.concatenate(ys), expect)


def test_unreadable_shard_after_open_raises_data_error(tmp_path):
    root = make_dataset(tmp_path, n=40)
    shards = ShardSet.open(root, "train")
    (root / "train-00000-of-00002.h5").write_bytes(b"garbage")
    ld = Loader(shards, batch_size=8, image_size=16, train=False)
    with pytest.raises(DataError, match=r"train-00000-of-00002\.h5\[0\]: cannot read sample"):
        list(ld.epoch(0))


def test_bad_arguments(digits, tmp_path):
    val = ShardSet.open(digits, "val")
    with pytest.raises(ValueError, match="multiscale"):
        Loader(val, batch_size=8, image_size=32, train=True, scale=(16, 40))
    with pytest.raises(DataError, match=r"/val: 359 samples, but one training step needs 512 "
                                         r"\(2 workers x batch size 256\): use a smaller batch size"):
        Loader(val, batch_size=256, image_size=32, train=True, world=2)
    Loader(val, batch_size=256, image_size=32, train=False, world=2)   # validation: a batch < 256 is fine
    tiny = ShardSet.open(make_dataset(tmp_path, n=8, n_val=3), "val")
    why = (r"/val: 3 samples for 4 workers that share the validation, each needs at least one: "
           r"use fewer ranks or a larger val split")
    for rank in range(4):            # every rank says it, also those whose share is not empty
        with pytest.raises(DataError, match=why):
            Loader(tiny, batch_size=8, image_size=16, train=False, rank=rank, world=4)
    assert Loader(tiny, batch_size=8, image_size=16, train=False, rank=2, world=3).steps_per_epoch == 1


def _encode(img, fmt="JPEG", **kw):
    buf = io.BytesIO()
    img.save(buf, fmt, **kw)
    return np.frombuffer(buf.getvalue(), np.uint8)


def test_strict_decode_catches_what_dali_and_pil_let_through():
    """Good images of every kind pass with their size; a JPEG whose compressed data is garbage
    (markers stuffed or not, zeros) fails with libjpeg's reason, as do truncated and junk bytes."""
    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, (24, 30, 3), dtype=np.uint8)
    good = {"rgb": _encode(Image.fromarray(a)), "gray": _encode(Image.fromarray(a[..., 0])),
            "cmyk": _encode(Image.fromarray(a).convert("CMYK")),
            "progressive": _encode(Image.fromarray(a), progressive=True),
            "png": _encode(Image.fromarray(a), "PNG")}
    good["trailing bytes"] = np.concatenate([good["rgb"], np.zeros(64, np.uint8)])
    for name, data in good.items():
        assert decode_problem(data) is None, name
        assert header_size(data) == (30, 24), name
    src = jpeg(rng, 40)
    lo, hi = entropy_range(src)                             # the compressed data: src[lo:hi]
    bad = {f"garbled {k}": garbled(src, k) for k in range(20)}
    bad["raw noise"] = src[:lo] + rng.integers(0, 256, hi - lo, np.uint8).tobytes() + src[hi:]
    bad["zeros"] = src[:lo] + bytes(hi - lo) + src[hi:]
    for name, data in bad.items():
        arr = np.frombuffer(data, np.uint8)
        assert header_size(arr) == (40, 40), name          # the header is intact...
        with Image.open(io.BytesIO(data)) as im:            # ...and Pillow sees nothing wrong
            if name.startswith("garbled") or name == "zeros":
                im.load()
        why = decode_problem(arr)                           # "Corrupt JPEG data: ..."
        assert why and ("Corrupt JPEG data" in why or name == "raw noise"), (name, why)
    for name, data in {"empty": b"", "junk": b"hello", "half jpeg": src[:len(src) // 2],
                       "half png": good["png"][:good["png"].size // 2].tobytes()}.items():
        assert decode_problem(np.frombuffer(data, np.uint8)), name


def test_sample_ids_are_unique_over_splits():
    assert sample_id("train", 5) == 5 and split_of(5) == ("train", 5)
    assert sample_id("val", 5) == 2 ** 40 + 5 and split_of(2 ** 40 + 5) == ("val", 5)


def test_imports_have_no_side_effects():
    code = ("import sys, scalesgd.data, scalesgd.data.demo, scalesgd.data.pipeline; "
            "print([m for m in ('nvidia.dali', 'mpi4py', 'cupy', 'sklearn') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": SRC},
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr


def test_a_loaded_split_reads_the_same_bytes_from_memory(tmp_path):
    """``ShardSet.load`` (data.cache_mb): every sample's bytes and label as the HDF5 read gives them;
    ``open_splits`` loads a split only when its files fit the cache; a shard that cannot be read
    while loading is named."""
    from scalesgd.train.assemble import open_splits
    root = make_dataset(tmp_path / "d", n=24, n_val=6, num_classes=3)
    disk, mem = ShardSet.open(root, "train"), ShardSet.open(root, "train").load()
    assert mem.loaded and not disk.loaded
    for g in range(disk.num_samples):
        a, b = disk.read(g), mem.read(g)
        assert a[1] == b[1] and np.array_equal(a[0], b[0]) and not b[0].flags.writeable
    assert all(s.loaded for s in open_splits(root, 1))
    assert not any(s.loaded for s in open_splits(root, 0))
    disk.close()
    with h5py.File(root / "train-00001-of-00002.h5", "r+") as f:    # readable header, no images
        del f["images"]
    broken = ShardSet(root, "train", *_raw_parts(root))
    with pytest.raises(ShardError, match=r"train-00001-of-00002\.h5: cannot read its images"):
        broken.load()
