"""Loader determinism: augmentation from (seed, epoch, index) only, mid-epoch start, ten-crop,
lighting, bad samples that only DALI finds. Real DALI on the CPU."""
import numpy as np
import pytest

from scalesgd.data import ShardSet
from scalesgd.data import pipeline
from scalesgd.data.augment import image_size
from scalesgd.data.pipeline import Loader

from synth import make_dataset


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    root = make_dataset(tmp_path_factory.mktemp("synth"), n=64, num_classes=8, shards=3, size=40)
    return ShardSet.open(root, "train")


def _per_sample(ld, epoch, **kw):
    """{global index: x row} over a whole epoch of ``ld``."""
    idx, rows = ld.indices(epoch), []
    for x, _ in ld.epoch(epoch, **kw):
        rows.extend(x.copy())
    return dict(zip(idx.tolist(), rows))


@pytest.mark.parametrize("augment,scale", [("multiscale", (36, 60)), ("rrc", (0.2, 1.0))])
def test_sample_tensor_does_not_depend_on_rank_or_world(shards, augment, scale):
    common = dict(image_size=32, train=True, augment=augment, scale=scale, flip=True, lighting=0.1,
                  seed=5, layout="NCHW")
    alone = _per_sample(Loader(shards, batch_size=8, **common), 1)
    for rank in range(2):
        part = _per_sample(Loader(shards, batch_size=4, rank=rank, world=2, num_threads=2, **common), 1)
        assert part and set(part) <= set(alone)
        for g, x in part.items():
            assert np.array_equal(x, alone[g]), g           # bitwise
    other_epoch = _per_sample(Loader(shards, batch_size=8, **common), 2)
    common_idx = set(other_epoch) & set(alone)
    assert any(not np.array_equal(other_epoch[g], alone[g]) for g in common_idx)


def test_start_step_yields_the_same_batches_without_reading_the_skipped(shards, monkeypatch):
    ld = Loader(shards, batch_size=8, image_size=32, train=True, scale=(36, 60), flip=True, seed=1)
    full = [(x.copy(), y.copy()) for x, y in ld.epoch(3)]
    reads = []
    real = ShardSet.read
    monkeypatch.setattr(ShardSet, "read", lambda self, g: reads.append(int(g)) or real(self, g))
    fresh = Loader(shards, batch_size=8, image_size=32, train=True, scale=(36, 60), flip=True, seed=1)
    part = [(x.copy(), y.copy()) for x, y in fresh.epoch(3, start_step=5)]
    assert len(part) == len(full) - 5
    for (x, y), (x0, y0) in zip(part, full[5:]):
        assert np.array_equal(x, x0) and np.array_equal(y, y0)
    assert not set(reads) & set(ld.indices(3)[:5 * 8].tolist())
    nxt = [y for _, y in fresh.epoch(4)]                    # the pipeline goes on to epoch 4
    assert np.array_equal(np.concatenate(nxt), shards.labels[fresh.indices(4)])


def test_lighting_is_a_per_sample_channel_offset(shards):
    common = dict(batch_size=8, image_size=32, train=True, scale=(36, 60), flip=True, seed=2)
    x0, _ = next(iter(Loader(shards, **common).epoch(0)))
    x1, _ = next(iter(Loader(shards, lighting=0.1, **common).epoch(0)))
    d = (x1 - x0).reshape(8, -1, 3)                         # NHWC
    assert np.allclose(d, d[:, :1, :], atol=1e-4)           # constant over pixels
    assert np.abs(d[:, 0, :]).max() > 1e-3                  # but not zero
    assert np.abs(d[0, 0] - d[1, 0]).max() > 1e-4           # and different per sample


def test_ten_crop(shards):
    common = dict(batch_size=8, image_size=32, train=False, val_resize=36)
    x, y = next(iter(Loader(shards, ten_crop=True, **common).epoch(0)))
    assert x.shape == (80, 32, 32, 3) and y.shape == (8,)
    x = x.reshape(8, 10, 32, 32, 3)
    assert np.array_equal(x[:, 5:], x[:, :5, :, ::-1])      # second five are the mirrors
    xc, _ = next(iter(Loader(shards, **common).epoch(0)))   # centre crop of the plain loader
    assert np.abs(x[:, 4] - xc).mean() < 0.05               # same up to resampling (normalised)
    assert Loader(shards, ten_crop=True, **common).crops == 10


def test_bad_sample_found_only_by_the_decoder_is_replaced(tmp_path, monkeypatch):
    """The cheap header check is switched off: DALI fails, the Loader names the sample, rebuilds
    the pipeline at the failed step and replaces it; the epoch has all its batches."""
    root = make_dataset(tmp_path, n=40, bad=23)
    shards = ShardSet.open(root, "train")
    monkeypatch.setattr(pipeline, "image_size", lambda d: image_size(d) or (16, 16))
    ld = Loader(shards, batch_size=8, image_size=16, train=True, scale=(16, 20), seed=3)
    ys = [y.copy() for _, y in ld.epoch(0)]
    assert len(ys) == 5 and ld.bad_samples == [(str(root / "train-00001-of-00002.h5"), 3)]
    expect = shards.labels[np.where(ld.indices(0) == 23, 24, ld.indices(0))]
    assert np.array_equal(np.concatenate(ys), expect)
