"""ONE script for a lent GPU (< 8 min on an H200): environment, kernel parity, ResNet-50 images/s.

    PYTHONPATH=src python3 benchmarks/gpu_check.py [--batches 64 128] [--precision tf32] [--out DIR]
    .venv/bin/python benchmarks/gpu_check.py --dry-run      # CPU: everything but the device parts

1. environment: GPU, driver, CuPy, cuDNN (frontend + backend), NCCL, MPI library, PyTorch;
2. parity of every fused kernel (nn/kernels.py) and every cuDNN graph (nn/cudnn_conv.py) against its
   reference twin, on fresh random data (never zeros), outputs poisoned with NaN first;
3. ResNet-50 training steps (forward + loss + backward + Nesterov SGD), 224x224, synthetic data in
   device memory, per batch: our cuDNN path, our im2col path, a torchvision-free PyTorch ResNet-50
   (torch_resnet.py; channels_last, same precision, same batch) when torch imports; interleaved
   blocks, median images/s, ratios and peak device memory.  Table printed last; JSON + markdown
   written to $OUT (or --out).
Targets: ours >= 0.8x PyTorch images/s, peak memory <= 1.5x PyTorch's.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from benchlib import OursRunner

from scalesgd.nn import cudnn_conv as CC
from scalesgd.nn import kernels as K
from scalesgd.nn import layers as L

TARGET_SPEED, TARGET_MEM = 0.8, 1.5
RESNET50 = ("resnet50", 1000, 224, 25_557_032)      # model, classes, image side, parameter count


def _version(mod_name: str):
    try:
        mod = __import__(mod_name)
        return getattr(mod, "__version__", "?")
    except Exception as exc:  # noqa: BLE001
        return f"absent ({type(exc).__name__})"


def env_report(xp) -> dict:
    rep = {"python": platform.python_version(), "numpy": np.__version__,
           "cupy": _version("cupy"), "cudnn_frontend": _version("cudnn"), "torch": _version("torch"),
           "mpi4py": _version("mpi4py"), "nvcc": _cmd(["nvcc", "--version"])[-1:],
           "nvidia_smi": _cmd(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                               "--format=csv,noheader"])}
    try:
        from mpi4py import MPI
        rep["mpi_library"] = MPI.Get_library_version().splitlines()[0]
        from scalesgd.comm import device
        rep["mpi_cuda_query"] = device.mpi_cuda_query()
        rep["nccl"] = device.nccl_module() is not None if xp is not np else None
    except Exception as exc:  # noqa: BLE001
        rep["mpi_library"] = f"absent ({exc})"
    cudnn = CC.probe_cudnn()
    if cudnn is not None:
        rep["cudnn_backend"] = cudnn.backend_version()
    if xp is not np:
        props = xp.cuda.runtime.getDeviceProperties(0)
        rep["gpu"] = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
        rep["cuda_driver"] = xp.cuda.runtime.driverGetVersion()
        rep["cuda_runtime"] = xp.cuda.runtime.runtimeGetVersion()
    return rep


def _cmd(argv) -> list[str]:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=20).stdout.strip().splitlines()
    except Exception as exc:  # noqa: BLE001
        return [f"unavailable ({type(exc).__name__})"]


def relerr(a, ref) -> float:
    a, ref = (np.asarray(K_to_host(v), dtype=np.float64) for v in (a, ref))
    if not np.all(np.isfinite(a)):
        return float("inf")                      # unwritten (NaN-poisoned) or overflowed output
    return float(np.linalg.norm(a - ref) / max(np.linalg.norm(ref), 1e-30))


def K_to_host(a):
    return a if isinstance(a, np.ndarray) else a.get()


# ----------------------------------------------------------------------------- parity
def kernel_parity(xp, rng, dtype="float32") -> dict:
    """fast (CuPy kernel; on NumPy the twin) vs float64 NumPy reference, fresh random inputs."""
    dev = lambda a: xp.asarray(a.astype(dtype))  # noqa: E731
    out = {}
    x = rng.standard_normal((4, 7, 5, 24))
    sc, sh = rng.standard_normal(24), rng.standard_normal(24)
    out["bn_apply+relu"] = relerr(K.bn_apply(dev(x), dev(sc), dev(sh), True), K.bn_apply_ref(x, sc, sh, True))
    h, s = rng.standard_normal(x.shape), rng.standard_normal(x.shape)
    out["add_relu"] = relerr(K.add_relu(dev(h), dev(s)), K.add_relu_ref(h.copy(), s))
    n = 1_000_003
    p, g, buf = rng.standard_normal(n), rng.standard_normal(n), rng.standard_normal(n)
    mask = (rng.random(n) < 0.7).astype(np.float64)
    pd, bd = dev(p), dev(buf)
    K.sgd_update(pd, dev(g), bd, dev(mask), 0.1, 0.9, 1e-4, True)
    K.sgd_update_ref(p, g, buf, mask, 0.1, 0.9, 1e-4, True)
    out["sgd_update(nesterov)"] = max(relerr(pd, p), relerr(bd, buf))
    return out


def cudnn_parity(xp, rng, precision: str) -> dict:
    """cuDNN conv fprop/dgrad/wgrad and BN fwd/bwd vs the im2col/xp layers (float32), GPU only."""
    cudnn = CC.probe_cudnn()
    eng = CC.CudnnEngine(cudnn, xp, precision)
    out = {}
    for (n, hw, c, k, r, stride) in [(8, 14, 64, 128, 3, 1), (8, 28, 64, 256, 1, 2), (4, 56, 3, 64, 7, 2)]:
        mod = type("M", (), {})()
        mod.w = xp.asarray(rng.standard_normal((r, r, c, k)).astype(np.float32) * 0.1)
        mod.dw = xp.full(mod.w.shape, np.nan, dtype=xp.float32)
        mod.stride, mod.pad = stride, r // 2
        x = xp.asarray(rng.standard_normal((n, hw, hw, c)).astype(np.float32))
        y, cache = eng.conv_forward(mod, x, True)
        y_ref, rc = L.conv2d_forward(x, mod.w, stride, r // 2)
        dy = xp.asarray(rng.standard_normal(y_ref.shape).astype(np.float32))
        dx = eng.conv_backward(mod, dy, cache, True)
        dw_ref = xp.empty_like(mod.w)
        dx_ref = L.conv2d_backward(dy, rc, dw_ref, True)
        tag = f"conv{r}x{r}/s{stride} {c}->{k}"
        out[tag + " fprop"], out[tag + " dgrad"] = relerr(y, y_ref), relerr(dx, dx_ref)
        out[tag + " wgrad"] = relerr(mod.dw, dw_ref)
    out.update(_bn_parity(xp, rng, eng))
    return out


def _bn_parity(xp, rng, eng) -> dict:
    c = 64
    mod = type("B", (), {})()
    mod.relu = True
    mod.gamma, mod.beta = (xp.asarray(rng.standard_normal(c).astype(np.float32)) for _ in range(2))
    mod.rmean, mod.rvar = xp.zeros(c, xp.float32), xp.ones(c, xp.float32)
    mod.dgamma, mod.dbeta = xp.full(c, np.nan, xp.float32), xp.full(c, np.nan, xp.float32)
    x = xp.asarray(rng.standard_normal((8, 14, 14, c)).astype(np.float32) * 2 + 0.5)
    y, cache = eng.bn_forward(mod, x, True)
    rm, rv = xp.zeros(c, xp.float32), xp.ones(c, xp.float32)
    y_ref, rc = L.batchnorm_forward(x, mod.gamma, mod.beta, rm, rv, True)
    y_ref = xp.maximum(y_ref, 0)
    dy = xp.asarray(rng.standard_normal(x.shape).astype(np.float32))
    dx = eng.bn_backward(mod, dy.copy(), cache)
    dg, db = xp.empty(c, xp.float32), xp.empty(c, xp.float32)
    dx_ref = L.batchnorm_backward(dy * (y_ref > 0), rc, dg, db)
    return {"bn fwd": relerr(y, y_ref), "bn running_var": relerr(mod.rvar, rv),
            "bn bwd dx": relerr(dx, dx_ref), "bn bwd dgamma": relerr(mod.dgamma, dg)}


# ----------------------------------------------------------------------------- timing and report
def bench(runners: dict, steps: int, warmup: int, blocks: int) -> dict:
    """Interleaved blocks of ``steps`` timed steps per runner; median images/s and peak memory."""
    for r in runners.values():
        for _ in range(warmup):
            r.step()
        r.sync()
    times = {k: [] for k in runners}
    for _ in range(blocks):
        for k, r in runners.items():
            r.sync()
            t0 = time.perf_counter()
            for _ in range(steps):
                r.step()
            r.sync()
            times[k].append((time.perf_counter() - t0) / steps)
    return {k: {"img_s": r.batch / float(np.median(times[k])), "step_s": times[k],
                "peak_bytes": r.peak_bytes()} for k, r in runners.items()}


def table(results: list[dict]) -> str:
    rows = ["| batch | path | images/s | vs torch | peak MiB | vs torch | targets |",
            "|---|---|---|---|---|---|---|"]
    for res in results:
        t = res["runs"].get("torch")
        for k, v in res["runs"].items():
            sp = v["img_s"] / t["img_s"] if t else None
            mem = (v["peak_bytes"] / t["peak_bytes"]) if t and v["peak_bytes"] and t["peak_bytes"] else None
            ok = "" if k == "torch" or sp is None else (
                "met" if sp >= TARGET_SPEED and (mem is None or mem <= TARGET_MEM) else "MISSED")
            mib = f"{v['peak_bytes'] / 2**20:.0f}" if v["peak_bytes"] else "-"
            rows.append(f"| {res['batch']} | {k} | {v['img_s']:.1f} | "
                        f"{'-' if sp is None else f'{sp:.2f}x'} | {mib} | "
                        f"{'-' if mem is None else f'{mem:.2f}x'} | {ok} |")
    return "\n".join(rows)


def _parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="CPU: tiny model, no device parts")
    ap.add_argument("--batches", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--precision", default="tf32", choices=CC.PRECISIONS)
    ap.add_argument("--paths", nargs="+", default=["cudnn", "im2col", "torch"])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--blocks", type=int, default=3)
    ap.add_argument("--out", default=os.environ.get("OUT", ""))
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = _parse(argv)
    xp = np
    if not args.dry_run:
        from scalesgd import backend
        backend.set_precision(args.precision)
        xp = backend.select("gpu").xp
    rep = {"date": time.strftime("%Y-%m-%d %H:%M"), "dry_run": args.dry_run, "precision": args.precision,
           "env": env_report(xp)}
    print(json.dumps(rep["env"], indent=1), flush=True)
    rng = np.random.default_rng(int(time.time()))            # fresh inputs every run
    rep["parity"] = kernel_parity(xp, rng)
    if not args.dry_run and CC.probe_cudnn() is not None:
        rep["parity"].update(cudnn_parity(xp, rng, args.precision))
    tol = 1e-5 if args.precision == "fp32" or args.dry_run else 1e-2
    bad = {k: v for k, v in rep["parity"].items() if not v <= tol}
    for k, v in rep["parity"].items():
        print(f"parity {k:32s} rel.err {v:.2e} {'FAIL' if k in bad else 'ok'}", flush=True)
    rep["results"] = []
    for batch in ([2] if args.dry_run else args.batches):
        rep["results"].append({"batch": batch, "runs": bench(_runners(args, xp, batch),
                                                             1 if args.dry_run else args.steps,
                                                             1 if args.dry_run else args.warmup,
                                                             1 if args.dry_run else args.blocks)})
    rep["table"] = table(rep["results"])
    _write(rep, args.out)
    print(rep["table"])
    return 1 if bad else 0


def _runners(args, xp, batch) -> dict:
    if args.dry_run:      # CPU: a tiny ResNet-20 through the same runner class
        return {"im2col": OursRunner("resnet20", 10, 32, batch)}
    name, classes, size, nparams = RESNET50
    runners = {}
    for path in args.paths:
        if path == "cudnn" and CC.probe_cudnn() is None:
            print("cudnn path skipped: cudnn frontend does not import", flush=True)
        elif path in ("cudnn", "im2col"):
            engine = CC.CudnnEngine(CC.probe_cudnn(), xp, args.precision) if path == "cudnn" else None
            runners[path] = OursRunner(name, classes, size, batch, xp=xp, engine=engine)
            assert runners[path].model.num_params == nparams
        elif path == "torch":
            from torch_resnet import TorchRunner, torch  # noqa: PLC0415  (imports torch: only here)
            if torch is not None and torch.cuda.is_available():
                runners["torch"] = TorchRunner(name, classes, size, batch, nparams, precision=args.precision,
                                               device="cuda")
    return runners


def _write(rep: dict, out: str) -> None:
    if not out:
        return
    d = Path(out)
    d.mkdir(parents=True, exist_ok=True)
    (d / "gpu_check.json").write_text(json.dumps(rep, indent=1, default=str))
    (d / "gpu_check.md").write_text(f"# gpu_check {rep['date']} ({rep['precision']})\n\n"
                                    f"{rep['env'].get('gpu', 'no GPU')}\n\n{rep['table']}\n")


if __name__ == "__main__":
    sys.exit(main())
