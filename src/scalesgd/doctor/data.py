"""The input rows: DALI decode on the CPU and the GPU, the shard directory, the run directory's disk."""
from __future__ import annotations

import io
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from .base import DECODED_PER_SHARD, DISK_FAIL_GB, DISK_WARN_GB, FAIL, NA, OK, WARN, Check, Ctx
from .gpu import _gpu_ranks, _no_gpu


# ----------------------------------------------------------------------------- DALI
def make_jpeg() -> tuple[np.ndarray, np.ndarray]:
    """A 64x48 colour gradient encoded by Pillow in memory: ((n,) uint8 JPEG bytes, (48, 64, 3) uint8
    Pillow's decode of them, the reference)."""
    from PIL import Image
    img = np.zeros((48, 64, 3), dtype=np.uint8)
    img[..., 0] = np.arange(64, dtype=np.uint8) * 4
    img[..., 1] = np.arange(48, dtype=np.uint8)[:, None] * 5
    img[..., 2] = 128
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="JPEG", quality=90)
    data = np.frombuffer(buf.getvalue(), dtype=np.uint8)
    with Image.open(io.BytesIO(buf.getvalue())) as im:
        return data, np.asarray(im.convert("RGB"))


def _decode_on_node(device_id: int | None) -> dict:
    """One node's decode of the JPEG of ``make_jpeg`` with the training loader's decoder
    (``fastpaths.decode_crops``: DALI's image_slice of a centre window), on the CPU or, with
    ``device_id``, the 'mixed' GPU decoder (NEVER RUN ON A GPU), against its reference: Pillow's
    decode of the same window, or DALI's CPU decode for the GPU.  {'error': relative error,
    'problem': '' or why, 'ms', 'version'}."""
    try:
        import nvidia.dali

        from .. import fastpaths
        data, ref = make_jpeg()
        h, w = ref.shape[:2]
        t0 = time.perf_counter()
        got = fastpaths.decode_crops([data], "cpu" if device_id is None else "mixed", device_id)
        ms = (time.perf_counter() - t0) * 1e3
        want = [ref[h // 4:h - h // 4, w // 8:w - w // 8]] if device_id is None else \
            fastpaths.decode_crops([data], "cpu")
        err, why = fastpaths.compare(got, want, fastpaths.DECODE_TOL, ("the window",))
    except Exception as exc:       # noqa: BLE001 - ImportError, a DALI error: the row says which
        return {"problem": f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"}
    return {"error": err, "problem": why or "", "ms": round(ms, 2), "version": nvidia.dali.__version__}


def _decode_row(name: str, nodes: list[dict], what: str, fix: str) -> Check:
    bad = [n for n in nodes if n["problem"]]
    if bad:
        return Check(name, FAIL, f"{len(bad)} of {len(nodes)} node(s): {bad[0]['problem']}", fix,
                     {"nodes": nodes})
    return Check(name, OK, f"DALI {nodes[0]['version']}: {what} (relative error "
                 f"{max(n['error'] for n in nodes):.1e}) on every node", data={"nodes": nodes})


def check_dali_cpu_decode(ctx: Ctx, name: str) -> Check:
    nodes = ctx.on_leaders(lambda: _decode_on_node(None))
    return _decode_row(name, nodes, "the loader's CPU decoder reads a 64x48 JPEG as Pillow does",
                       "install DALI into this environment: pip install -e '.[cpu]' (nvidia-dali-cuda120, "
                       "whose CPU decoder needs no GPU), or the cuda13 / cuda12 extra on GPU nodes")


def check_dali_gpu_decode(ctx: Ctx, name: str) -> Check:
    if not _gpu_ranks(ctx):
        return _no_gpu(name, "; DALI decodes on the CPU")
    nodes = ctx.on_leaders(lambda: _decode_on_node(ctx.gpus[ctx.rank]["device"]))
    return _decode_row(name, nodes, "GPU decode of a 64x48 JPEG matches the CPU decode",
                       "install the extra of the node's CUDA (cuda13: nvidia-dali-cuda130, cuda12: -120); "
                       "a training run falls back to the CPU decoder by itself")


# ----------------------------------------------------------------------------- data and disk
def verify_share(root: Path, rank: int, size: int) -> dict:
    """This rank's part of the data check: both splits opened as training opens them (manifest,
    every shard's attributes and labels), then, for the shards j with j % size == rank, the sha256
    against the manifest and a strict decode of the first DECODED_PER_SHARD samples.  Returns
    {'problem': the first one or '', 'splits': {split: [samples, shards]}, 'shards', 'bytes', 'decoded'}."""
    from ..data.shards import SPLITS, ShardError, ShardSet
    out = {"problem": "", "splits": {}, "shards": 0, "bytes": 0, "decoded": 0}
    try:
        sets = [ShardSet.open(root, split) for split in SPLITS]
    except ShardError as exc:
        return dict(out, problem=str(exc))
    out["splits"] = {ss.split: [ss.num_samples, len(ss.shard_paths)] for ss in sets}
    mine = [(ss, i) for ss in sets for i in range(len(ss.shard_paths))][rank::size]
    for ss, i in mine:
        problem, nbytes, decoded = _verify_shard(ss, i)
        out["shards"] += 1
        out["bytes"] += nbytes
        out["decoded"] += decoded
        if problem:
            out["problem"] = problem
            break
    for ss in sets:
        ss.close()
    return out


def _verify_shard(ss, i: int) -> tuple[str, int, int]:
    """Shard ``i`` of ``ss``: (problem or '', bytes read for the checksum, samples decoded)."""
    from ..data.shards import file_sha256
    from ..data.validate import decode_problem
    entries = ss.manifest["splits"][ss.split]["shards"]
    path, first = ss.shard_paths[i], sum(int(e["count"]) for e in entries[:i])
    try:
        got = file_sha256(path)
        if got != entries[i]["sha256"]:
            return f"{path}: sha256 {got[:16]}... differs from the manifest's", 0, 0
        decoded = 0
        for local in range(min(DECODED_PER_SHARD, int(entries[i]["count"]))):
            why = decode_problem(ss.read(first + local)[0])
            if why:
                return f"{path}[{local}]: {why}", path.stat().st_size, decoded
            decoded += 1
    except (OSError, KeyError, ValueError, RuntimeError) as exc:
        return f"{path}: cannot read it ({' '.join(str(exc).split())})", 0, 0
    return "", path.stat().st_size, decoded


def check_data(ctx: Ctx, name: str) -> Check:
    if not ctx.args.data:
        return Check(name, NA, "no --data given (the built-in digits are built and checked by the "
                     "program itself)", "pass --data DIR, the shard directory your jobs use")
    root = Path(ctx.args.data)
    parts = ctx.gather(verify_share(root, ctx.rank, ctx.size))
    problems = [p["problem"] for p in parts if p["problem"]]
    data = {k: sum(p[k] for p in parts) for k in ("shards", "bytes", "decoded")}
    if problems:
        return Check(name, FAIL, problems[0] + _elsewhere(problems, ctx.size), _data_fix(problems[0]),
                     dict(data, problems=problems))
    splits = ", ".join(f"{s} {n:,} samples in {k} shard{'s' * (k > 1)}"
                       for s, (n, k) in parts[0]["splits"].items())
    return Check(name, OK, f"{root}: {splits}; sha256 of all {data['shards']} shards "
                 f"({_size(data['bytes'])}) and {data['decoded']} samples decoded, read by "
                 f"{ctx.size} rank{'s' * (ctx.size > 1)} on {ctx.num_nodes} node{'s' * (ctx.num_nodes > 1)}",
                 data=dict(data, splits=parts[0]["splits"]))


def _elsewhere(problems: list[str], size: int) -> str:
    """What the other ranks found, after the first problem: '' or a short note."""
    if len(problems) == size > 1 and len(set(problems)) == 1:
        return " (on every rank)"
    return f" (and {len(problems) - 1} more problem(s) on other ranks)" if len(problems) > 1 else ""


def _data_fix(problem: str) -> str:
    if "manifest not found" in problem:
        return "--data must name the directory holding manifest.json, at the same path on every node"
    return ("rebuild the shard directory or copy it again (scalesgd-make-shards, docs/data.md); it must "
            "be at the same path on every node")


def _size(nbytes: float) -> str:
    """Bytes in the unit a reader wants: '812 kB', '1.2 MB', '148.3 GB'."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6)):
        if nbytes >= scale:
            return f"{nbytes / scale:,.1f} {unit}"
    return f"{nbytes / 1e3:,.0f} kB"


def disk_facts(run_dir: Path) -> dict:
    """{'where': the run directory or its nearest existing parent (runs create it), 'free_gb',
    'problem': '' or why runs could not write there}."""
    where = run_dir.absolute()
    while not where.exists() and where != where.parent:
        where = where.parent
    if not where.is_dir():
        return {"where": str(where), "free_gb": 0.0, "problem": f"{where} is not a directory"}
    free = shutil.disk_usage(where).free / 1e9
    try:
        fd, tmp = tempfile.mkstemp(prefix=".scalesgd-doctor-", dir=where)
        os.close(fd)
        os.unlink(tmp)
    except OSError as exc:
        return {"where": str(where), "free_gb": free, "problem": f"cannot write in {where} "
                f"({exc.strerror or exc})"}
    return {"where": str(where), "free_gb": free, "problem": ""}


def check_run_dir(ctx: Ctx, name: str) -> Check:
    nodes = ctx.on_leaders(lambda: disk_facts(Path(ctx.args.run_dir)))
    least = min(nodes, key=lambda n: n["free_gb"])
    bad = next((n["problem"] for n in nodes if n["problem"]), "")
    data = {"nodes": nodes}
    if bad or least["free_gb"] < DISK_FAIL_GB:
        return Check(name, FAIL, bad or f"{least['where']}: only {least['free_gb']:.2f} GB free",
                     "pass --run-dir on a writable file system with room for checkpoints", data)
    result = (f"{ctx.args.run_dir}: writable, {least['free_gb']:,.1f} GB free"
              f"{' (least of ' + str(len(nodes)) + ' nodes)' if len(nodes) > 1 else ''}")
    if least["free_gb"] < DISK_WARN_GB:
        return Check(name, WARN, result, "checkpoints of large models need more: free some space or "
                     "pass --run-dir elsewhere", data)
    return Check(name, OK, result, data=data)
