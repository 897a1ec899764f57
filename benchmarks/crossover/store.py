"""The study's run records: one JSON object a run, keyed ``KIND/NAME`` (``Run.key``).

While a study runs, each finished run is a loose file ``DIR/KIND/NAME.json``: a piece commits the
runs it finished, and a piece stopped midway loses only the runs in flight.  ``pack`` then folds
each kind's loose files into one ``DIR/KIND.jsonl.gz`` (a record a line, sorted by key, compressed
with a fixed header so that the same records give the same bytes): a finished study is a handful of
files, not thousands.  Readers see both forms; a loose record wins over a packed one of the same key
(a run done again after a pack).

    records(dir) -> {key: record}      write(dir, key, record)      pack(dir) -> {kind: records}
"""
from __future__ import annotations

import gzip
import io
import json
from pathlib import Path

PACKED = ".jsonl.gz"


def _loose(root: Path) -> list[Path]:
    return sorted(root.glob("*/*.json"))


def _packs(root: Path) -> list[Path]:
    return sorted(root.glob(f"*{PACKED}"))


def _read_pack(path: Path) -> dict[str, dict]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        recs = (json.loads(line) for line in f if line.strip())
        return {r["key"]: r for r in recs}


def _read_loose(path: Path) -> dict | None:
    """A loose record, or None where it cannot be read (a file being written, a stray one)."""
    try:
        r = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return r if isinstance(r, dict) and "key" in r else None


def records(root: Path) -> dict[str, dict]:
    """Every record under ``root``: the packs', then the loose files' over them."""
    out: dict[str, dict] = {}
    for p in _packs(root):
        out.update(_read_pack(p))
    for f in _loose(root):
        r = _read_loose(f)
        if r is not None:
            out[r["key"]] = r
    return out


def any_records(root: Path) -> bool:
    return bool(_packs(root) or _loose(root))


def write(root: Path, key: str, rec: dict) -> Path:
    """A finished run's record as a loose file (written whole, then renamed into place)."""
    path = root / f"{key}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(rec, indent=1) + "\n")
    tmp.replace(path)
    return path


def _write_pack(path: Path, recs: dict[str, dict]) -> None:
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, compresslevel=9, mtime=0) as z:
        for k in sorted(recs):
            z.write((json.dumps(recs[k], sort_keys=True, separators=(",", ":")) + "\n").encode())
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(buf.getvalue())
    tmp.replace(path)


def pack(root: Path) -> dict[str, int]:
    """Folds every kind's loose records into its pack (kept: what the pack held) and removes the
    loose files once the pack that holds them is in place; {kind: records in its pack}."""
    by_kind: dict[str, list[Path]] = {}
    for f in _loose(root):
        by_kind.setdefault(f.parent.name, []).append(f)
    counts = {}
    for kind, files in sorted(by_kind.items()):
        path = root / f"{kind}{PACKED}"
        recs = _read_pack(path) if path.exists() else {}
        for f in files:
            r = _read_loose(f)
            if r is None:
                raise ValueError(f"{f}: not a run record; move it away before packing")
            if not r["key"].startswith(f"{kind}/"):
                raise ValueError(f"{f}: its key {r['key']!r} is not of kind {kind!r}")
            recs[r["key"]] = r
        _write_pack(path, recs)
        if _read_pack(path) != recs:                   # (read back before anything is removed)
            raise RuntimeError(f"{path}: the pack does not read back as written")
        for f in files:
            f.unlink()
        if not any(f.parent.iterdir()):
            f.parent.rmdir()
        counts[kind] = len(recs)
    return counts


def pinned(results: Path) -> str | None:
    """The commit pinned in ``results``/pin.json (a study's runs all execute it), None before one is."""
    try:
        return json.loads((results / "pin.json").read_text())["commit"]
    except (OSError, ValueError, KeyError):
        return None
