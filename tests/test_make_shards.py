"""make_shards: a small ImageNet-style tree with the odd files ImageNet has, converted, verified,
resumed, and read back through the CPU DALI pipeline by 2 workers."""
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from scalesgd.data import ShardSet
from scalesgd.data.make_shards import BuildProgress, main
from scalesgd.data.pipeline import Loader

SRC = str(Path(__file__).resolve().parents[1] / "src")
WNIDS = ("n00000001", "n00000002", "n00000003")


def red(c):
    """Class c is coded in the red channel (all three channels for grayscale)."""
    return 40 + 70 * c


def _save(path, rgb, fmt="JPEG", mode=None):
    im = Image.fromarray(rgb)
    im = im.convert(mode) if mode else im
    buf = io.BytesIO()
    im.save(buf, fmt, quality=95)
    path.write_bytes(buf.getvalue())


def _image(rng, c, gray=False):
    w, h = rng.integers(40, 100, 2)
    if gray:
        return np.full((h, w, 3), red(c), np.uint8)
    rgb = np.empty((h, w, 3), np.uint8)
    rgb[..., 0], rgb[..., 1], rgb[..., 2] = red(c), rng.integers(0, 256), 128
    return rgb


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """24 good train images (8 per class: 1 grayscale, 1 CMYK, 1 PNG named .JPEG), 1 unreadable;
    6 val images in a flat folder with a ground-truth file."""
    src = tmp_path_factory.mktemp("imagenet")
    rng = np.random.default_rng(0)
    for c, w in enumerate(WNIDS):
        d = src / "train" / w
        d.mkdir(parents=True)
        for k in range(8):
            kind = {0: dict(mode="L"), 1: dict(mode="CMYK"), 2: dict(fmt="PNG")}.get(k, {}) if c == 0 else {}
            _save(d / f"{w}_{k}.JPEG", _image(rng, c, gray=kind.get("mode") == "L"), **kind)
    (src / "train" / WNIDS[1] / "broken.JPEG").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    (src / "val").mkdir()
    lines = []
    for k in range(6):
        _save(src / "val" / f"ILSVRC2012_val_{k:08d}.JPEG", _image(rng, k % 3))
        lines.append(f"ILSVRC2012_val_{k:08d},{WNIDS[k % 3]} 1 2 3 4")
    (src / "val_solution.csv").write_text("ImageId,PredictionString\n" + "\n".join(lines) + "\n")
    (src / "LOC_synset_mapping.txt").write_text("".join(f"{w} thing {i}\n" for i, w in enumerate(WNIDS)))
    return src


ARGS = ["--train-shards", "3", "--val-shards", "1", "--workers", "2", "--quiet"]


@pytest.fixture(scope="module")
def built(tree, tmp_path_factory):
    out = tmp_path_factory.mktemp("shards")
    assert main([str(tree), str(out), "--val-labels", str(tree / "val_solution.csv"), *ARGS]) == 0
    return out


def test_manifest_counts_and_report(built, tree):
    m = json.loads((built / "manifest.json").read_text())
    assert m["num_classes"] == 3 and m["classes"][1] == {"index": 1, "wnid": WNIDS[1], "name": "thing 1"}
    train = m["splits"]["train"]
    counts = [s["count"] for s in train["shards"]]          # 25 files -> 8, 8, 9; one skipped
    assert train["count"] == sum(counts) == 24 and max(counts) - min(counts) <= 2
    r = train["report"]
    assert (r["grayscale"], r["cmyk_converted"], r["other_format_converted"]) == (1, 1, 1)
    assert r["kept"] == 21 and len(r["skipped"]) == 1 and "broken.JPEG" in r["skipped"][0]
    assert m["splits"]["val"]["count"] == 6 and m["options"]["seed"] == 0
    labels = ShardSet.open(built, "train").labels
    assert np.bincount(labels).tolist() == [8, 8, 8]
    assert np.bincount(ShardSet.open(built, "val").labels).tolist() == [2, 2, 2]


def test_shards_are_shuffled_across_classes(built):
    s = ShardSet.open(built, "train")
    counts = [s["count"] for s in s.manifest["splits"]["train"]["shards"]]
    offsets = np.cumsum([0] + counts)
    assert all(len(set(s.labels[a:b].tolist())) > 1 for a, b in zip(offsets[:-1], offsets[1:]))


def test_verify_ok_and_detects_change(built, tmp_path, capsys):
    assert main(["--verify", str(built)]) == 0
    assert "OK (train 24, val 6)" in capsys.readouterr().out
    copy = tmp_path / "copy"
    copy.mkdir()
    for f in built.iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    bad = copy / "train-00001-of-00003.h5"
    raw = bytearray(bad.read_bytes())
    at = bytes(raw).find(b"\xff\xd8\xff") + 200               # inside the first stored JPEG
    raw[at] ^= 0xFF
    bad.write_bytes(bytes(raw))
    assert main(["--verify", str(copy)]) == 1
    assert "train-00001-of-00003.h5: sha256" in capsys.readouterr().err


def test_rerun_resumes_and_reuses_complete_shards(tree, tmp_path, capsys):
    out = tmp_path / "out"
    argv = [str(tree), str(out), "--val-labels", str(tree / "val_solution.csv"), *ARGS]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "skipped unreadable file" in err and "broken.JPEG" in err
    first = json.loads((out / "manifest.json").read_text())
    kept = out / "train-00000-of-00003.h5"
    mtime = kept.stat().st_mtime_ns
    (out / "train-00002-of-00003.h5").unlink()              # interrupted run: one shard missing
    (out / "manifest.json").unlink()
    (out / ".train-00002-of-00003.h5.tmp-1-abc").write_bytes(b"half")
    assert main(argv[:-1]) == 0                              # not quiet: reports the reuse
    assert "3 complete shards from an earlier run reused" in capsys.readouterr().err
    assert kept.stat().st_mtime_ns == mtime
    assert json.loads((out / "manifest.json").read_text()) == first
    assert not [f for f in out.iterdir() if f.name.startswith(".")]


def test_build_progress_lines_at_most_once_a_second_and_always_the_last():
    t = [100.0]
    out = io.StringIO()
    bar = BuildProgress(9000, reused=2, quiet=False, stream=out, clock=lambda: t[0])
    for dt in (2.0, 0.5, 0.6, 3600.0):                       # 1000 images per update
        t[0] += dt
        bar.update(1000)
    t[0] += 0.1
    bar.update(5000)                                        # the last line is never throttled
    assert out.getvalue().splitlines() == [
        "make_shards: 2 complete shards from an earlier run reused",
        "make_shards: 1000/9000 images 500 img/s ETA 0:16",    # 2 s / 1000 images x 8000 left
        "make_shards: 3000/9000 images 968 img/s ETA 0:06",    # (the 2000th came 0.5 s later)
        "make_shards: 4000/9000 images 1 img/s ETA 1:15:04",   # H:MM:SS past an hour
        "make_shards: 9000/9000 images 2 img/s ETA 0:00"]
    quiet = io.StringIO()
    bar = BuildProgress(10, reused=1, quiet=True, stream=quiet)
    bar.update(10)
    assert quiet.getvalue() == ""


def test_read_back_by_two_workers(built):
    train = ShardSet.open(built, "train")
    common = dict(batch_size=4, image_size=32, train=True, scale=(36, 48), flip=True,
                  mean=(0,) * 3, std=(1,) * 3, world=2, seed=7)
    loaders = [Loader(train, rank=r, **common) for r in range(2)]
    orders = []
    for epoch in range(2):
        seen = []
        for ld in loaders:
            for x, y in ld.epoch(epoch):
                assert x.shape == (4, 32, 32, 3) and x.dtype == np.float32 and y.dtype == np.int64
                got = np.rint((x[..., 0].mean(axis=(1, 2)) - 40) / 70).astype(int)
                assert np.array_equal(got, y), (got, y)           # right label for each image
            seen.append(ld.indices(epoch))
            assert ld.bad_samples == []
        assert sorted(np.concatenate(seen).tolist()) == list(range(24))   # each sample once
        orders.append(np.concatenate(seen))
    assert not np.array_equal(orders[0], orders[1])
    again = [np.concatenate([x for x, _ in Loader(train, rank=0, **common).epoch(0)])]
    first = np.concatenate([x for x, _ in loaders[0].epoch(0)])
    assert np.array_equal(again[0], first)                        # deterministic given the seed


def test_console_module_runs(tree, tmp_path):
    out = tmp_path / "o"
    p = subprocess.run([sys.executable, "-m", "scalesgd.data.make_shards", str(tree), str(out),
                        "--val-labels", str(tree / "val_solution.csv"), "--train-shards", "2",
                        "--workers", "2"], env={**os.environ, "PYTHONPATH": SRC},
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "ETA" in p.stderr and "img/s" in p.stderr and "broken.JPEG" in p.stderr
    assert "train: 24 images in 2 shards" in p.stdout
    p = subprocess.run([sys.executable, "-m", "scalesgd.data.make_shards", str(tree), str(out / "x")],
                       env={**os.environ, "PYTHONPATH": SRC}, capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and "flat val/ folder needs --val-labels" in p.stderr
