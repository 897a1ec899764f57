"""ONE script for a lent GPU (< 10 min on an H200): every number the first GPU contact should give.

    PYTHONPATH=src python3 benchmarks/gpu_check.py [--batches 128] [--precisions fp32 bf16] [--out DIR]
    .venv/bin/python benchmarks/gpu_check.py --dry-run      # CPU: every section on a tiny model

Sections (each one's failure is recorded in the JSON and does not stop the others):
1. ``env``: GPU, driver, CuPy, cuDNN (frontend + backend), NCCL, MPI library, PyTorch, DALI;
2. ``parity``: every fused kernel (nn/kernels.py) and every cuDNN graph (nn/cudnn_conv.py) against
   its reference twin, on fresh random data (never zeros), outputs poisoned with NaN first;
3. ``selfcheck``: the start-up self-validation (fastpaths.check) in ``strict`` mode on ResNet-50 at
   224 px, training batch 64, a ten-crop evaluation batch: every component's status and error, the
   seconds it took and its estimated GFLOPs, against the budget (10% of the first minute of a
   ResNet-50 epoch: 6 s);
4. ``results``: ResNet-50 training steps (forward + loss + backward + Nesterov SGD), 224x224,
   synthetic data in device memory, per precision (fp32, bf16) and batch: our cuDNN path (and
   im2col with ``--paths``), a torchvision-free PyTorch ResNet-50 (torch_resnet.py; channels_last,
   same precision, same batch) when torch imports; interleaved blocks, median images/s, ratios and
   peak device memory;
5. ``allreduce``: a 2-rank all-reduce on this one GPU through each transport (host staging,
   CUDA-aware MPI, NCCL; one that cannot run is named with the reason), sums checked, then the time
   of one all-reduce of a ResNet-50-sized gradient (``mpiexec``, tests/gpu/allreduce_parity.py);
6. ``dali``: DALI decode + resize + crop/normalize of JPEGs on the GPU ("mixed") against the CPU,
   images/s (skipped with the reason when nvidia.dali does not import).
The table is printed last; JSON + markdown are written to $OUT (or --out).
Targets: ours >= 0.8x PyTorch images/s, peak memory <= 1.5x PyTorch's; self-check <= 6 s.
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
TARGET_CHECK_S = 6.0            # 10% of the first minute of a ResNet-50 epoch
RESNET50 = ("resnet50", 1000, 224, 25_557_032)      # model, classes, image side, parameter count
ROOT = Path(__file__).resolve().parents[1]


def _version(mod_name: str):
    try:
        import importlib  # noqa: PLC0415
        mod = importlib.import_module(mod_name)
        return getattr(mod, "__version__", "?")
    except Exception as exc:  # noqa: BLE001
        return f"absent ({type(exc).__name__})"


def env_report(xp) -> dict:
    rep = {"python": platform.python_version(), "numpy": np.__version__,
           "cupy": _version("cupy"), "cudnn_frontend": _version("cudnn"), "torch": _version("torch"),
           "mpi4py": _version("mpi4py"), "dali": _version("nvidia.dali"),
           "nvcc": _cmd(["nvcc", "--version"])[-1:],
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
    rows = ["| precision | batch | path | images/s | vs torch | peak MiB | vs torch | targets |",
            "|---|---|---|---|---|---|---|---|"]
    for res in results:
        t = res["runs"].get("torch")
        for k, v in res["runs"].items():
            sp = v["img_s"] / t["img_s"] if t else None
            mem = (v["peak_bytes"] / t["peak_bytes"]) if t and v["peak_bytes"] and t["peak_bytes"] else None
            ok = "" if k == "torch" or sp is None else (
                "met" if sp >= TARGET_SPEED and (mem is None or mem <= TARGET_MEM) else "MISSED")
            mib = f"{v['peak_bytes'] / 2**20:.0f}" if v["peak_bytes"] else "-"
            rows.append(f"| {res.get('precision', '-')} | {res['batch']} | {k} | {v['img_s']:.1f} | "
                        f"{'-' if sp is None else f'{sp:.2f}x'} | {mib} | "
                        f"{'-' if mem is None else f'{mem:.2f}x'} | {ok} |")
    return "\n".join(rows)


def _parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="CPU: tiny model, no device parts")
    ap.add_argument("--batches", type=int, nargs="+", default=[128])
    ap.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], choices=CC.PRECISIONS)
    ap.add_argument("--paths", nargs="+", default=["cudnn", "torch"])
    ap.add_argument("--sections", nargs="+", default=list(SECTIONS), choices=list(SECTIONS))
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
        backend.set_precision(args.precisions[0])
        xp = backend.select("gpu").xp
    rep = {"date": time.strftime("%Y-%m-%d %H:%M"), "dry_run": args.dry_run,
           "precisions": args.precisions, "env": env_report(xp), "seconds": {}}
    print(json.dumps(rep["env"], indent=1), flush=True)
    for name in args.sections:               # each section's failure is recorded, the rest still run
        t0 = time.perf_counter()
        try:
            rep[name] = SECTIONS[name](args, xp)
        except Exception as exc:  # noqa: BLE001
            rep[name] = {"error": f"{type(exc).__name__}: {' '.join(str(exc).split())[:500]}"}
            print(f"section {name} failed: {rep[name]['error']}", flush=True)
        rep["seconds"][name] = round(time.perf_counter() - t0, 1)
    rep["table"] = report_table(rep)
    _write(rep, args.out)
    print(rep["table"])
    return 1 if failures(rep) else 0


def failures(rep: dict) -> list[str]:
    """What makes the script exit non-zero: a parity beyond tolerance, a section that raised, a
    self-check component that failed (strict), a transport whose sums were wrong."""
    out = [f"parity {k}" for k in rep.get("parity", {}).get("failed", [])]
    out += [f"selfcheck {p}" for p, v in rep.get("selfcheck", {}).get("precisions", {}).items() if v.get("error")]
    out += [f"section {k}" for k in SECTIONS if isinstance(rep.get(k), dict) and "error" in rep[k]]
    return out + [f"allreduce {k}" for k, v in rep.get("allreduce", {}).get("transports", {}).items()
                  if v.get("sums") == "wrong"]


def parity_section(args, xp) -> dict:
    rng = np.random.default_rng(int(time.time()))            # fresh inputs every run
    errs = kernel_parity(xp, rng)
    if not args.dry_run and CC.probe_cudnn() is not None:
        for prec in args.precisions:
            errs.update({f"{k} [{prec}]": v for k, v in cudnn_parity(xp, rng, prec).items()})
    tol = {"fp32": 1e-4, "tf32": 5e-3, "bf16": 3e-2}
    bad = [k for k, v in errs.items() if not v <= (tol[k.rsplit("[", 1)[1][:-1]] if "[" in k else 1e-5)]
    for k, v in errs.items():
        print(f"parity {k:40s} rel.err {v:.2e} {'FAIL' if k in bad else 'ok'}", flush=True)
    return {"errors": errs, "failed": bad}


def selfcheck_section(args, xp) -> dict:
    """fastpaths.check in strict mode, as a run on ResNet-50 would call it (dry run: ResNet-20 at
    32 px on NumPy posing as a GPU, so every model-level component runs on the reference)."""
    import types  # noqa: PLC0415

    from scalesgd import config as C  # noqa: PLC0415
    from scalesgd import fastpaths as F  # noqa: PLC0415
    from scalesgd.errors import BackendError  # noqa: PLC0415
    from scalesgd.nn.resnet import ResNet  # noqa: PLC0415
    name, classes, size, _ = ("resnet20", 10, 32, 0) if args.dry_run else RESNET50
    out = {"model": name, "budget_s": TARGET_CHECK_S, "precisions": {}}
    for prec in args.precisions:
        model = ResNet(name, classes, 1.0, xp=xp, seed=0)
        if not args.dry_run and CC.probe_cudnn() is not None:
            model.set_engine(CC.CudnnEngine(CC.probe_cudnn(), xp, prec, model.kernels))
        cfg = C.build(None, {"data": {"image_size": size, "batch_size": 64, "scale": [size, size * 1.15]},
                             "model": {"fast_paths": "strict", "precision": prec}})
        val = types.SimpleNamespace(train=False, batch_size=16, crops=10, indices=lambda e: range(20),
                                    device_id=None)       # (no decode check: no shards here)
        gpu = types.SimpleNamespace(is_gpu=True, xp=xp)
        topo = types.SimpleNamespace(size=1, comm=None, is_root=True)
        t0 = time.perf_counter()
        try:
            rep = F.check(cfg, topo, model, gpu, (None, val), None).to_dict()
            err = None
        except BackendError as exc:
            rep, err = {}, str(exc)
        took = time.perf_counter() - t0
        out["precisions"][prec] = {"seconds": round(took, 3), "gflops": rep.get("gflops"), "error": err,
                                   "within_budget": took <= TARGET_CHECK_S,
                                   "components": rep.get("components", {})}
        print(f"selfcheck {prec}: {len(rep.get('components', {}))} components in {took:.2f} s "
              f"({rep.get('gflops', 0):.0f} GFLOPs){' FAILED: ' + err if err else ''}", flush=True)
        del model
    return out


def bench_section(args, xp) -> dict:
    results = []
    for prec in ([args.precisions[0]] if args.dry_run else args.precisions):
        for batch in ([2] if args.dry_run else args.batches):
            n = (lambda v: 1 if args.dry_run else v)      # noqa: E731 - a dry run: one of each
            runs = bench(_runners(args, xp, batch, prec), n(args.steps), n(args.warmup), n(args.blocks))
            results.append({"precision": prec, "batch": batch, "runs": runs})
    return {"results": results}


def allreduce_section(args, xp) -> dict:
    """mpiexec -n 2 tests/gpu/allreduce_parity.py (cupy | numpy for a dry run) --time: the lines
    ``transport NAME: sums agree`` / ``skipped transport NAME: why`` / ``time NAME: MS ms ...``."""
    import shutil  # noqa: PLC0415
    beside = Path(sys.executable).parent / "mpiexec"          # an MPI wheel's launcher
    launcher = os.environ.get("MPIEXEC") or (str(beside) if beside.exists() else shutil.which("mpiexec"))
    if launcher is None:
        return {"skipped": "no mpiexec (MPIEXEC unset, none beside python or on PATH)"}
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([launcher, "-n", "2", sys.executable, str(ROOT / "tests/gpu/allreduce_parity.py"),
                           "numpy" if args.dry_run else "cupy", "--time"], capture_output=True, text=True,
                          timeout=240, env=env)
    out: dict = {"rc": proc.returncode, "transports": {}}
    for line in proc.stdout.splitlines():
        words = line.split()
        if line.startswith("transport "):
            out["transports"].setdefault(words[1].rstrip(":"), {})["sums"] = "agree"
        elif line.startswith("skipped transport "):
            out["transports"][words[2].rstrip(":")] = {"skipped": line.split(": ", 1)[1]}
        elif line.startswith("time "):
            t = out["transports"].setdefault(words[1].rstrip(":"), {})
            t.update(ms=float(words[2]), mb=float(words[5]))
    if proc.returncode != 0:
        out["error"] = (proc.stdout + proc.stderr)[-800:]
    print(f"allreduce: {json.dumps(out['transports'])}", flush=True)
    return out


def dali_section(args, xp) -> dict:
    """DALI decode + resize (shorter side 256) + crop/normalize (224) of 256 JPEGs of 500x375,
    batch 64, on the CPU and (GPU) "mixed"; images/s each (median of 3 passes after one warm-up)."""
    try:
        from nvidia.dali import Pipeline, fn, types  # noqa: PLC0415
    except Exception as exc:  # noqa: BLE001
        return {"skipped": f"nvidia.dali does not import ({type(exc).__name__}: {exc})"}
    import io  # noqa: PLC0415

    from PIL import Image  # noqa: PLC0415
    rng = np.random.default_rng(0)
    jpegs = []
    for _ in range(16):                      # smooth random images (real JPEG work, not noise)
        small = rng.integers(0, 256, (24, 32, 3), dtype=np.uint8)
        buf = io.BytesIO()
        Image.fromarray(small).resize((500, 375), Image.BILINEAR).save(buf, "JPEG", quality=90)
        jpegs.append(np.frombuffer(buf.getvalue(), np.uint8))
    batch, n = (8, 32) if args.dry_run else (64, 256)
    files = [jpegs[i % len(jpegs)] for i in range(batch)]

    def rate(device: str) -> float:
        pipe = Pipeline(batch_size=batch, num_threads=4, device_id=None if device == "cpu" else 0,
                        prefetch_queue_depth=2)
        with pipe:
            enc = fn.external_source(source=lambda: files, batch=True, dtype=types.UINT8)
            img = fn.decoders.image(enc, device=device, output_type=types.RGB)
            img = fn.resize(img, resize_shorter=256)
            pipe.set_outputs(fn.crop_mirror_normalize(img, crop=(224, 224), dtype=types.FLOAT,
                                                      output_layout="HWC"))
        pipe.build()
        pipe.run()
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(n // batch):
                (o,) = pipe.run()
                if device != "cpu":
                    o.as_tensor()            # the batch exists on the device
            times.append(time.perf_counter() - t0)
        return n / float(np.median(times))
    out = {"cpu_img_s": rate("cpu")}
    if not args.dry_run:
        out["gpu_img_s"] = rate("mixed")
        out["gpu_vs_cpu"] = out["gpu_img_s"] / out["cpu_img_s"]
    print(f"dali: {json.dumps(out)}", flush=True)
    return out


SECTIONS = {"parity": parity_section, "selfcheck": selfcheck_section, "results": bench_section,
            "allreduce": allreduce_section, "dali": dali_section}


def report_table(rep: dict) -> str:
    """The throughput table, then one line per other section."""
    lines = [table(rep.get("results", {}).get("results", []))]
    for prec, sc in rep.get("selfcheck", {}).get("precisions", {}).items():
        lines.append(f"self-check {prec}: {len(sc['components'])} components, {sc['seconds']:.2f} s "
                     f"(budget {TARGET_CHECK_S:.0f} s: {'met' if sc['within_budget'] else 'MISSED'})"
                     + (f", FAILED: {sc['error']}" if sc["error"] else ""))
    for name, t in rep.get("allreduce", {}).get("transports", {}).items():
        lines.append(f"all-reduce {name}: " + (f"skipped ({t['skipped']})" if "skipped" in t else
                     f"sums {t.get('sums', '?')}, {t.get('ms', float('nan')):.2f} ms per {t.get('mb', 0):.0f} MB"))
    if "skipped" in rep.get("allreduce", {}):
        lines.append(f"all-reduce: skipped ({rep['allreduce']['skipped']})")
    d = rep.get("dali", {})
    if d:
        lines.append("dali: " + (d.get("skipped") or d.get("error") or
                                 ", ".join(f"{k} {v:.1f}" for k, v in d.items())))
    bad = failures(rep)
    lines.append("failures: " + (", ".join(bad) if bad else "none"))
    return "\n".join(lines)


def _runners(args, xp, batch, precision) -> dict:
    if args.dry_run:      # CPU: a tiny ResNet-20 through the same runner class
        return {"im2col": OursRunner("resnet20", 10, 32, batch)}
    name, classes, size, nparams = RESNET50
    runners = {}
    for path in args.paths:
        if path == "cudnn" and CC.probe_cudnn() is None:
            print("cudnn path skipped: cudnn frontend does not import", flush=True)
        elif path in ("cudnn", "im2col"):
            engine = CC.CudnnEngine(CC.probe_cudnn(), xp, precision) if path == "cudnn" else None
            runners[path] = OursRunner(name, classes, size, batch, xp=xp, engine=engine)
            assert runners[path].model.num_params == nparams
        elif path == "torch":
            from torch_resnet import TorchRunner, torch  # noqa: PLC0415  (imports torch: only here)
            if torch is not None and torch.cuda.is_available():
                runners["torch"] = TorchRunner(name, classes, size, batch, nparams, precision=precision,
                                               device="cuda")
    return runners


def _write(rep: dict, out: str) -> None:
    if not out:
        return
    d = Path(out)
    d.mkdir(parents=True, exist_ok=True)
    (d / "gpu_check.json").write_text(json.dumps(rep, indent=1, default=str))
    (d / "gpu_check.md").write_text(f"# gpu_check {rep['date']} ({', '.join(rep['precisions'])})\n\n"
                                    f"{rep['env'].get('gpu', 'no GPU')}\n\n{rep['table']}\n")


if __name__ == "__main__":
    sys.exit(main())
