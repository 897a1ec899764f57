"""ImageNet-style tree -> HDF5 shards + manifest (the format of shards.py), and ``--verify``.

    python -m scalesgd.data.make_shards SRC OUT [options]      (console script: scalesgd-make-shards)
    python -m scalesgd.data.make_shards --verify OUT

SRC holds ``train/<wnid>/*`` and ``val/`` (class folders, or flat files plus ``--val-labels``).
Each split is shuffled with ``--seed`` and cut into shards balanced by count; shards are built by
a process pool, one shard per task, each written atomically by ``shards.write_shard``. A rerun
reuses every shard already under its final name whose attributes match (same dataset_id, index,
count of shards): only complete files are ever renamed into place. The manifest comes last.
See docs/data.md section 5.
"""
from __future__ import annotations

import argparse
import hashlib
import io
import json
import math
import os
import sys
import time
import multiprocessing
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Callable, TextIO

import h5py
import numpy as np

from ..backend import usable_cores
from ..io.progress import eta_seconds, format_duration
from .shards import (FORMAT, FORMAT_VERSION, SPLITS, ShardError, ShardSet, file_sha256, read_manifest,
                     shard_name, write_manifest, write_shard)

BUILDER_VERSION = 1
COUNTERS = ("kept", "grayscale", "cmyk_converted", "other_format_converted", "resized")
NAME_FILES = ("LOC_synset_mapping.txt", "synset_words.txt", "words.txt")


# ----------------------------------------------------------------------------- scanning
def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))


def scan(src: Path, val_labels: Path | None) -> tuple[list[str], dict[str, list]]:
    """-> (wnids sorted, {split: [(path, label), ...]}); class index = position in sorted wnids."""
    train = src / "train"
    if not train.is_dir():
        raise ShardError(f"{train}: no train/ folder (expected train/<wnid>/*.JPEG)")
    wnids = sorted(d.name for d in train.iterdir() if d.is_dir())
    if not wnids:
        raise ShardError(f"{train}: no class folders")
    index = {w: i for i, w in enumerate(wnids)}
    splits = {"train": [(p, index[w]) for w in wnids for p in _files(train / w)]}
    val = src / "val"
    if val.is_dir():
        splits["val"] = _scan_val(val, index, val_labels)
    return wnids, splits


def _scan_val(val: Path, index: dict, labels_file: Path | None) -> list:
    subdirs = sorted(d for d in val.iterdir() if d.is_dir())
    if subdirs:
        unknown = [d.name for d in subdirs if d.name not in index]
        if unknown:
            raise ShardError(f"{val}: class folders not in train/: {unknown[:5]}")
        return [(p, index[d.name]) for d in subdirs for p in _files(d)]
    if labels_file is None:
        raise ShardError(f"{val}: flat val/ folder needs --val-labels FILE")
    truth = _read_val_labels(labels_file, index)
    out = []
    for p in _files(val):
        key = p.stem if p.stem in truth else p.name
        if key not in truth:
            raise ShardError(f"{labels_file}: no label for {p.name}")
        out.append((p, truth[key]))
    return out


def _read_val_labels(path: Path, index: dict) -> dict[str, int]:
    """Lines ``<file or stem> <wnid | class index>`` (space or comma separated; extra fields
    ignored, as in Kaggle's LOC_val_solution.csv). A header line without a known label is skipped."""
    truth = {}
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        parts = line.replace(",", " ").split()
        if len(parts) < 2:
            continue
        name, lab = parts[0], parts[1]
        if lab in index:
            truth[name] = index[lab]
        elif lab.isdigit() and int(lab) < len(index):
            truth[name] = int(lab)
        elif n > 1:
            raise ShardError(f"{path}:{n}: unknown class {lab!r}")
    return truth


def class_names(src: Path, wnids: list[str], names_file: Path | None) -> list[dict]:
    """[{index, wnid, name}]; names from ``names_file`` or a known file in SRC (``wnid name...``)."""
    names = {}
    for f in ([names_file] if names_file else [src / n for n in NAME_FILES]):
        if f.is_file():
            for line in f.read_text().splitlines():
                parts = line.split(None, 1)
                if len(parts) == 2:
                    names[parts[0]] = parts[1].strip()
            break
    return [{"index": i, "wnid": w, "name": names.get(w, w)} for i, w in enumerate(wnids)]


# ----------------------------------------------------------------------------- one image
def prepare(path: Path, max_side: int, quality: int) -> tuple[bytes | None, str]:
    """-> (bytes to store, counter name), or (None, reason) when the file cannot be decoded.

    JPEG in RGB/L stored as is; CMYK JPEG and any other format (PNG named .JPEG...) re-encoded
    as RGB JPEG; a longer side above ``max_side`` (> 0) resized (bicubic) and re-encoded."""
    from PIL import Image
    try:
        raw = path.read_bytes()
        with Image.open(io.BytesIO(raw)) as im:
            im.load()
            fmt, mode = im.format, im.mode
            big = max_side > 0 and max(im.size) > max_side
            if fmt == "JPEG" and mode in ("RGB", "L") and not big:
                return raw, "grayscale" if mode == "L" else "kept"
            kind = ("resized" if big else "cmyk_converted" if fmt == "JPEG" and mode == "CMYK"
                    else "other_format_converted")
            rgb = im.convert("L" if mode in ("L", "LA", "I", "I;16") else "RGB")
            if big:
                s = max_side / max(im.size)
                rgb = rgb.resize((max(1, round(im.width * s)), max(1, round(im.height * s))),
                                 Image.BICUBIC)
            buf = io.BytesIO()
            rgb.save(buf, "JPEG", quality=quality)
            return buf.getvalue(), kind
    except Exception as e:                          # noqa: BLE001 - unreadable: skip, report
        return None, " ".join(str(e).split()) or type(e).__name__


# ----------------------------------------------------------------------------- one shard
def build_shard(out: str, split: str, i: int, k: int, items: list, dataset_id: str,
                num_classes: int, max_side: int, quality: int) -> tuple[dict, dict]:
    """Convert ``items`` [(path, label)] and write shard i of k -> (manifest entry, report)."""
    report = {c: 0 for c in COUNTERS}
    report["skipped"] = []
    samples = []
    for path, label in items:
        data, kind = prepare(Path(path), max_side, quality)
        if data is None:
            report["skipped"].append(f"{path}: {kind}")
            continue
        report[kind] += 1
        samples.append((data, label))
    attrs = {"format": FORMAT, "format_version": FORMAT_VERSION, "split": split,
             "shard_index": i, "num_shards": k, "dataset_id": dataset_id,
             "num_classes": num_classes, "build_report": json.dumps(report)}
    entry = write_shard(Path(out) / shard_name(split, i, k), samples, attrs)
    return entry, report


def existing_shard(path: Path, split: str, i: int, k: int, dataset_id: str):
    """(entry, report) of a complete shard from an earlier run with the same inputs, else None."""
    try:
        with h5py.File(path, "r") as f:
            a = dict(f.attrs)
            want = {"format": FORMAT, "split": split, "shard_index": i, "num_shards": k,
                    "dataset_id": dataset_id}
            if any(_attr(a.get(key)) != v for key, v in want.items()) or "build_report" not in a:
                return None
            if f["images"].shape != (int(a["count"]),):
                return None
            report = json.loads(_attr(a["build_report"]))
        return {"file": path.name, "count": int(a["count"]), "sha256": file_sha256(path)}, report
    except (OSError, KeyError, ValueError):
        return None


def _attr(v):
    v = v.decode() if isinstance(v, bytes) else v
    return int(v) if isinstance(v, np.integer) else v


# ----------------------------------------------------------------------------- whole build
def plan(splits: dict, seed: int, shard_mb: float, counts: dict) -> dict[str, list[list]]:
    """{split: [items of shard 0, ...]}: shuffled with (seed, split), cut into balanced shards."""
    out = {}
    for s_i, split in enumerate(sorted(splits)):
        items = splits[split]
        perm = np.random.default_rng([seed, s_i]).permutation(len(items))
        k = counts.get(split) or max(1, math.ceil(sum(p.stat().st_size for p, _ in items)
                                                  / (shard_mb * 2 ** 20)))
        k = min(k, len(items))
        n = len(items)
        out[split] = [[(str(items[j][0]), int(items[j][1])) for j in perm[i * n // k:(i + 1) * n // k]]
                      for i in range(k)]
    return out


def dataset_id_of(jobs: dict, options: dict) -> str:
    """sha256 over the options and every (split, shard, relative path, size, label)."""
    h = hashlib.sha256(json.dumps(options, sort_keys=True).encode())
    for split in sorted(jobs):
        for i, items in enumerate(jobs[split]):
            h.update(f"/{split}/{i}".encode())
            for p, lab in items:
                h.update(f"{Path(p).name}:{os.path.getsize(p)}:{lab}\n".encode())
    return h.hexdigest()


def build(src: Path, out: Path, args) -> dict:
    """Run the whole conversion; returns the manifest's splits (with reports)."""
    wnids, splits = scan(src, args.val_labels)
    options = {"builder": "scalesgd.data.make_shards", "version": BUILDER_VERSION,
               "source": str(src.resolve()), "seed": args.seed, "max_side": args.max_side,
               "val_max_side": args.val_max_side, "quality": args.quality,
               "shard_size_mb": args.shard_size_mb, "train_shards": args.train_shards,
               "val_shards": args.val_shards}
    jobs = plan(splits, args.seed, args.shard_size_mb,
                {"train": args.train_shards, "val": args.val_shards})
    did = dataset_id_of(jobs, options)
    out.mkdir(parents=True, exist_ok=True)
    for stray in out.glob(".*.h5.tmp-*"):           # left by a killed run
        stray.unlink(missing_ok=True)
    results = _run_jobs(out, jobs, did, len(wnids), args)
    entries = {}
    for split, shards in results.items():
        report = _merge([r for _, r in shards])
        entries[split] = {"count": sum(e["count"] for e, _ in shards),
                          "shards": [e for e, _ in shards], "report": report}
    write_manifest(out, name=args.name or src.resolve().name, dataset_id=did,
                   classes=class_names(src, wnids, args.class_names), splits=entries, options=options)
    return entries


def _run_jobs(out: Path, jobs: dict, did: str, num_classes: int, args) -> dict:
    results = {s: [None] * len(j) for s, j in jobs.items()}
    todo = []
    for split, shards in jobs.items():
        k = len(shards)
        for i, items in enumerate(shards):
            done = existing_shard(out / shard_name(split, i, k), split, i, k, did)
            if done:
                results[split][i] = done
            else:
                side = args.val_max_side if split == "val" and args.val_max_side else args.max_side
                todo.append(((str(out), split, i, k, items, did, num_classes, side, args.quality),
                             len(items)))
    reused = sum(r is not None for v in results.values() for r in v)
    bar = BuildProgress(sum(n for _, n in todo), reused, args.quiet)
    # forkserver, not fork: forking a process that already runs threads (BLAS, DALI, h5py) can
    # deadlock the child on a lock some thread held (seen when called from inside a test run)
    ctx = multiprocessing.get_context("forkserver")
    with ProcessPoolExecutor(max_workers=args.workers or usable_cores(), mp_context=ctx) as pool:
        futs = {pool.submit(build_shard, *a): (a[1], a[2], n) for a, n in todo}
        for fut in as_completed(futs):
            split, i, n = futs[fut]
            results[split][i] = fut.result()
            for line in results[split][i][1]["skipped"]:
                print(f"make_shards: skipped unreadable file {line}", file=sys.stderr)
            bar.update(n)
    return results


def _merge(reports: list[dict]) -> dict:
    out = {c: sum(r[c] for r in reports) for c in COUNTERS}
    out["skipped"] = [s for r in reports for s in r["skipped"]]
    return out


class BuildProgress:
    """The build's progress on ``stream`` (stderr): images done of ``total``, images/s and ETA, one
    line per ``interval`` seconds at most and always the last one; nothing when ``quiet``."""

    def __init__(self, total: int, reused: int, quiet: bool, stream: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic, interval: float = 1.0):
        self.total, self.done, self.quiet, self.interval = total, 0, quiet, interval
        self.stream = stream if stream is not None else sys.stderr
        self.clock = clock
        self.t0, self.last = clock(), -float("inf")
        if reused:
            self._write(f"make_shards: {reused} complete shards from an earlier run reused")

    def update(self, n: int) -> None:
        """``n`` more images done (one shard)."""
        self.done += n
        now = self.clock()
        if now - self.last >= self.interval or self.done == self.total:
            elapsed = now - self.t0
            self._write(f"make_shards: {self.done}/{self.total} images "
                        f"{self.done / max(elapsed, 1e-9):,.0f} img/s "
                        f"ETA {format_duration(eta_seconds(elapsed, self.done, self.total))}")
            self.last = now

    def _write(self, line: str) -> None:
        if not self.quiet:
            self.stream.write(line + "\n")
            self.stream.flush()


# ----------------------------------------------------------------------------- verify + CLI
def verify(out: Path) -> dict[str, int]:
    """Open every split (attrs, counts, labels) and checksum every shard; {split: samples}."""
    manifest = read_manifest(out)
    counts = {}
    for split in SPLITS:
        if split in manifest["splits"]:
            s = ShardSet.open(out, split)
            s.verify()
            counts[split] = s.num_samples
    return counts


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="scalesgd-make-shards", description=__doc__.split("\n\n")[0])
    p.add_argument("paths", nargs="+", type=Path, help="SRC OUT, or OUT with --verify")
    p.add_argument("--verify", action="store_true", help="check OUT against its manifest and exit")
    p.add_argument("--val-labels", type=Path, help="ground truth for a flat val/: '<file> <wnid|index>'")
    p.add_argument("--class-names", type=Path, help="'<wnid> <name>' lines (default: found in SRC)")
    p.add_argument("--shard-size-mb", type=float, default=1024.0, help="target shard size (source bytes)")
    p.add_argument("--train-shards", type=int, default=0, help="number of train shards (overrides size)")
    p.add_argument("--val-shards", type=int, default=0, help="number of val shards (overrides size)")
    p.add_argument("--max-side", type=int, default=0, help="re-encode images whose longer side exceeds it")
    p.add_argument("--val-max-side", type=int, default=0, help="--max-side for val (0 = same)")
    p.add_argument("--quality", type=int, default=90, help="JPEG quality of re-encoded images")
    p.add_argument("--seed", type=int, default=0, help="shuffle seed")
    p.add_argument("--workers", type=int, default=0, help="processes (0 = cores available)")
    p.add_argument("--name", default="", help="dataset name in the manifest (default: SRC's name)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    args = p.parse_args(argv)
    if len(args.paths) != (1 if args.verify else 2):
        p.error("expected SRC OUT, or --verify OUT")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        if args.verify:
            counts = verify(args.paths[0])
            print(f"make_shards: {args.paths[0]}: OK ({', '.join(f'{k} {v}' for k, v in counts.items())})")
            return 0
        entries = build(args.paths[0], args.paths[1], args)
    except ShardError as e:
        print(f"make_shards: error: {e}", file=sys.stderr)
        return 1
    for split, e in entries.items():
        r = e["report"]
        print(f"make_shards: {split}: {e['count']} images in {len(e['shards'])} shards; "
              + ", ".join(f"{c} {r[c]}" for c in COUNTERS) + f", skipped {len(r['skipped'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
