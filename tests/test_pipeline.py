"""Loader determinism: augmentation from (seed, epoch, index) only, mid-epoch start, ten-crop,
lighting, bad samples: those only DALI finds, corrupt JPEGs DALI decodes without an error, and
their count over ranks. Real DALI on the CPU, real HDF5 shards, real mpiexec."""
import json
import re

import numpy as np
import pytest

from scalesgd.data import ShardSet
from scalesgd.data import source
from scalesgd.data.pipeline import Loader
from scalesgd.data.shards import sample_id
from scalesgd.data.validate import header_size

from mpirun import check, run_mpi, uses_mpi
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


@pytest.mark.parametrize("ten_crop", [False, True])
def test_an_evaluation_loader_keeps_its_pipeline_and_its_batches(shards, monkeypatch, ten_crop):
    """Evaluated again and again (every boundary calls ``epoch(0)``), a validation loader builds its
    pipeline once and delivers the same batches each time, bit for bit those of a fresh loader; a
    loader whose epochs differ (training, or a validation loader with flips) builds again."""
    builds = []
    real = Loader._build
    monkeypatch.setattr(Loader, "_build", lambda self, *a: builds.append(self) or real(self, *a))
    val = Loader(shards, batch_size=8, image_size=32, train=False, val_resize=36, ten_crop=ten_crop,
                 rank=1, world=2)
    assert val.same_every_epoch
    first = [(x.copy(), y.copy()) for x, y in val.epoch(0)]
    for e in (0, 0, 5):
        again = [(x.copy(), y.copy()) for x, y in val.epoch(e)]
        assert len(again) == len(first) > 1
        assert all(np.array_equal(x, x0) and np.array_equal(y, y0) for (x, y), (x0, y0) in zip(again, first))
    assert builds.count(val) == 1
    part = val.epoch(0)                                     # stopped mid-epoch: built again
    next(part)
    assert [y.tolist() for _, y in val.epoch(0)] == [y.tolist() for _, y in first] and builds.count(val) == 2
    fresh = Loader(shards, batch_size=8, image_size=32, train=False, val_resize=36, ten_crop=ten_crop,
                   rank=1, world=2)
    assert all(np.array_equal(x, x0) for (x, _), (x0, _) in zip(fresh.epoch(0), first))
    flips = Loader(shards, batch_size=8, image_size=32, train=False, flip=True)
    train = Loader(shards, batch_size=8, image_size=32, train=True, scale=(36, 60))
    for ld in (flips, train):
        assert not ld.same_every_epoch
        for _ in range(2):
            list(ld.epoch(0))
        assert builds.count(ld) == 2


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
    monkeypatch.setattr(source.Ledger, "check", lambda self, g, d: header_size(d) or (16, 16))
    ld = Loader(shards, batch_size=8, image_size=16, train=True, scale=(16, 20), seed=3)
    ys = [y.copy() for _, y in ld.epoch(0)]
    assert len(ys) == 5 and ld.bad_samples == [(str(root / "train-00001-of-00002.h5"), 3)]
    expect = shards.labels[np.where(ld.indices(0) == 23, 24, ld.indices(0))]
    assert np.array_equal(np.concatenate(ys), expect)


def _header_only(monkeypatch):
    """Switch the strict first decode off: the Loader then checks headers only, as it did before."""
    monkeypatch.setattr(source.Ledger, "check", lambda self, g, d: header_size(d))


def test_corrupt_jpeg_that_dali_decodes_is_skipped(tmp_path, monkeypatch):
    """Samples 5 and 23 keep their JPEG headers but their compressed data is garbage. DALI decodes
    them to noise without an error (first half: the premise); the Loader's strict first decode
    finds them, replaces each by the next good sample and names it with libjpeg's reason."""
    root = make_dataset(tmp_path, n=40, garbage=[5, 23])
    shards = ShardSet.open(root, "train")
    common = dict(batch_size=8, image_size=16, scale=(16, 20), seed=3)
    with monkeypatch.context() as m:
        _header_only(m)
        blind = Loader(shards, train=False, **common)
        assert sum(len(y) for _, y in blind.epoch(0)) == 40 and blind.bad_samples == []
    files = [str(root / f"train-0000{i}-of-00002.h5") for i in (0, 1)]
    for train in (True, False):
        ld = Loader(shards, train=train, **common)
        ys = [y.copy() for _, y in ld.epoch(0)]
        assert len(ys) == ld.steps_per_epoch and all(len(y) == 8 for y in ys)
        assert sorted(ld.bad_samples) == [(files[0], 5), (files[1], 3)]
        idx = ld.indices(0)
        used = np.where(np.isin(idx, [5, 23]), idx + 1, idx)          # the next good ones
        assert np.array_equal(np.concatenate(ys), shards.labels[used])
        new = ld.take_new_bad()
        assert sorted(sid for sid, _, _ in new) == [sample_id("train", 5), sample_id("train", 23)]
        assert all(why.startswith("Corrupt JPEG data") for _, _, why in new), new
        assert {where for _, where, _ in new} == {f"{files[0]}[5]", f"{files[1]}[3]"}
        assert ld.take_new_bad() == []                      # each handed out once


def test_each_sample_is_decoded_strictly_once_and_checks_merge(tmp_path, monkeypatch):
    """The strict decode runs once per sample per job: not again in later epochs, and not in a
    loader that merged another's checks (as ranks do at each evaluation), which also skips the
    other's bad sample without counting it again."""
    root = make_dataset(tmp_path, n=48, garbage=[7])
    shards = ShardSet.open(root, "train")
    strict = []
    real = source.decode_problem
    monkeypatch.setattr(source, "decode_problem", lambda d: strict.append(1) or real(d))
    common = dict(batch_size=8, image_size=16, train=True, scale=(16, 20), world=2, seed=1)
    a = Loader(shards, rank=0, **common)
    for epoch in range(3):
        list(a.epoch(epoch))
    assert 7 in set(np.concatenate([a.indices(e) for e in range(3)]).tolist())
    checked = int((a.checks > 0).sum())
    assert len(strict) == checked < 48                      # one strict decode per sample met
    assert a.bad_samples == [(str(root / "train-00000-of-00002.h5"), 7)]
    assert np.flatnonzero(a.checks == 2).tolist() == [7]
    b = Loader(shards, rank=1, **common)
    b.merge_checks(a.checks)
    del strict[:]
    for epoch in range(3):
        list(b.epoch(epoch))
    assert 7 in set(np.concatenate([b.indices(e) for e in range(3)]).tolist())
    assert len(strict) == int((b.checks > 0).sum()) - checked        # only the ones a never met
    assert b.bad_samples == [] and b.take_new_bad() == []


@uses_mpi
def test_bad_samples_are_counted_once_per_dataset_over_ranks(tmp_path):
    """Two ranks, three epochs: four truncated and two corrupt training JPEGs and one corrupt
    validation JPEG. The ranks meet most of them, in different epochs (train 36 is met by both
    before the first evaluation, the others after another rank reported them); the job warns once
    per sample and ``bad_samples`` is 7 at both evaluations (it was a per-rank sum of warnings,
    and the corrupt ones were trained on without a word). libjpeg never complains: DALI never
    sees them."""
    root = make_dataset(tmp_path / "d", n=48, n_val=20, num_classes=4, bad=[3, 17, 30, 41],
                        garbage=[8, 36], val_garbage=[2])
    run = tmp_path / "run"
    p = run_mpi(2, ["-m", "src.main", "--data", str(root), "--run-dir", str(run), "--method",
                    "allreduce", "--width", "0.25", "--image-size", "16", "--scale", "16,20",
                    "--batch-size", "8", "--epochs", "3", "--eval-every", "1.5"], timeout=180)
    check(p)
    named = re.findall(r"scalesgd: warning: rank \d: skipped undecodable sample (\S+) \(", p.stderr)
    expect = [f"{root}/train-00000-of-00002.h5[{i}]" for i in (3, 8, 17)] \
        + [f"{root}/train-00001-of-00002.h5[{i}]" for i in (6, 12, 17)] \
        + [f"{root}/val-00000-of-00001.h5[2]"]
    assert sorted(named) == sorted(expect), p.stderr                # each once
    assert p.stderr.count("(Corrupt JPEG data: ") == 3, p.stderr      # ours; libjpeg never printed
    assert p.stderr.count("Corrupt JPEG data") == 3, p.stderr
    summary = json.loads((run / "summary.json").read_text())
    assert [h["bad_samples"] for h in summary["history"]] == [7, 7] == [summary["bad_samples"]] * 2
    assert summary["history"][-1]["val_samples"] == 20
