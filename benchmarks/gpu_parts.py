"""The cases of ``gpu_check.py``, one function each; every one returns a JSON-able dict and prints
its rows as it makes them.  A case guards each of its parts (a cuDNN graph no engine supports, a
runner that cannot be built), so one failure is recorded beside the results already made instead of
discarding them."""
from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from benchlib import OursRunner, mpi_launcher

from scalesgd.nn import cudnn_conv as CC
from scalesgd.nn import kernels as K
from scalesgd.nn import layers as L
from scalesgd.train import graphstep as GS

ROOT = Path(__file__).resolve().parents[1]
RESNET50 = ("resnet50", 1000, 224, 25_557_032)      # model, classes, image side, parameter count
TOL = {"fp32": 1e-4, "tf32": 5e-3, "bf16": 3e-2}    # cuDNN graphs against the xp layers
KERNEL_TOL = 1e-5
TARGET_SPEED, TARGET_MEM = 0.8, 1.5                 # ours against PyTorch: images/s, peak memory
HEADER = ["| precision | batch | path | images/s | vs torch | peak MiB | vs torch | targets |",
          "|---|---|---|---|---|---|---|---|"]


def err_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:500]}"


def guarded(fn, *args):
    """``fn(*args)``, or ``{"error": ...}`` when it raises (any one probe or part)."""
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - recorded, never fatal
        return {"error": err_text(exc)}


# ----------------------------------------------------------------------------- environment
def _version(mod_name: str):
    try:
        import importlib  # noqa: PLC0415
        mod = importlib.import_module(mod_name)
        return getattr(mod, "__version__", "?")
    except Exception as exc:  # noqa: BLE001
        return f"absent ({type(exc).__name__})"


def _cmd(argv) -> list[str]:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=20).stdout.strip().splitlines()
    except Exception as exc:  # noqa: BLE001
        return [f"unavailable ({type(exc).__name__})"]


def env_report(xp) -> dict:
    """Versions of everything the check uses; each probe guarded on its own (a cuDNN whose library
    does not load used to end the whole check here, before any section)."""
    from scalesgd.doctor.stack import installed  # noqa: PLC0415
    rep = {"python": platform.python_version(), "numpy": np.__version__,
           "cupy": _version("cupy"), "cudnn_frontend": _version("cudnn"), "torch": _version("torch"),
           "mpi4py": _version("mpi4py"), "dali": _version("nvidia.dali"),
           "nvcc": _cmd(["nvcc", "--version"])[-1:],
           "nvidia_smi": _cmd(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                               "--format=csv,noheader"]),
           "wheels": guarded(installed)}
    rep.update(guarded(_mpi_facts, xp))
    cudnn = CC.probe_cudnn()
    if cudnn is not None:
        rep["cudnn_backend"] = guarded(cudnn.backend_version)
    if xp is not np:
        rep.update(guarded(_device_facts, xp))
    return rep


def _mpi_facts(xp) -> dict:
    from mpi4py import MPI  # noqa: PLC0415

    from scalesgd.comm.mpi import device  # noqa: PLC0415
    return {"mpi_library": MPI.Get_library_version().splitlines()[0],
            "mpi_cuda_query": device.mpi_cuda_query(),
            "nccl": device.nccl_module() is not None if xp is not np else None}


def _device_facts(xp) -> dict:
    props = xp.cuda.runtime.getDeviceProperties(0)
    return {"gpu": props["name"].decode() if isinstance(props["name"], bytes) else props["name"],
            "cuda_driver": xp.cuda.runtime.driverGetVersion(),
            "cuda_runtime": xp.cuda.runtime.runtimeGetVersion()}


# ----------------------------------------------------------------------------- parity
def relerr(a, ref) -> float:
    a, ref = (np.asarray(to_host(v), dtype=np.float64) for v in (a, ref))
    if not np.all(np.isfinite(a)):
        return float("inf")                      # unwritten (NaN-poisoned) or overflowed output
    return float(np.linalg.norm(a - ref) / max(np.linalg.norm(ref), 1e-30))


def to_host(a):
    return a if isinstance(a, np.ndarray) else a.get()


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


CONV_CASES = [(8, 14, 64, 128, 3, 1), (8, 28, 64, 256, 1, 2), (4, 56, 3, 64, 7, 2)]   # n, hw, c, k, r, s


def cudnn_parity(xp, rng, precision: str, cudnn=None) -> tuple[dict, dict]:
    """cuDNN conv fprop/dgrad/wgrad and BN fwd/bwd vs the im2col/xp layers (float32): ({name:
    relative error}, {case: error of a case that raised}); each geometry guarded on its own."""
    eng = CC.CudnnEngine(cudnn or CC.probe_cudnn(), xp, precision)
    errs, raised = {}, {}
    for geom in CONV_CASES:
        n, hw, c, k, r, stride = geom
        tag = f"conv{r}x{r}/s{stride} {c}->{k}"
        try:
            errs.update(_conv_parity(xp, rng, eng, tag, n, hw, c, k, r, stride))
        except Exception as exc:  # noqa: BLE001 - this geometry alone (e.g. no engine supports it)
            raised[tag] = err_text(exc)
    try:
        errs.update(_bn_parity(xp, rng, eng))
    except Exception as exc:  # noqa: BLE001
        raised["bn"] = err_text(exc)
    eng.close()
    return errs, raised


def _conv_parity(xp, rng, eng, tag, n, hw, c, k, r, stride) -> dict:
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
    return {f"{tag} fprop": relerr(y, y_ref), f"{tag} dgrad": relerr(dx, dx_ref),
            f"{tag} wgrad": relerr(mod.dw, dw_ref)}


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


def parity_case(args, xp, precision: str) -> dict:
    """The fused kernels (first precision only) and this precision's cuDNN graphs."""
    rng = np.random.default_rng(int(time.time()))            # fresh inputs every run
    errs, raised = {}, {}
    if precision == args.precisions[0]:
        errs.update(guarded(kernel_parity, xp, rng))
        if "error" in errs:
            raised["kernels"] = errs.pop("error")
    if not args.dry_run and CC.probe_cudnn() is not None:
        e, r = cudnn_parity(xp, rng, precision)
        errs.update({f"{k} [{precision}]": v for k, v in e.items()})
        raised.update({f"{k} [{precision}]": v for k, v in r.items()})
    bad = [k for k, v in errs.items() if not v <= (TOL[precision] if "[" in k else KERNEL_TOL)]
    for k, v in errs.items():
        print(f"parity {k:40s} rel.err {v:.2e} {'FAIL' if k in bad else 'ok'}", flush=True)
    for k, v in raised.items():
        print(f"parity {k:40s} RAISED {v}", flush=True)
    return {"errors": errs, "failed": bad + list(raised), "raised": raised}


# ----------------------------------------------------------------------------- a training run
TRAIN = {"model": "resnet50", "size": 224, "batch": 128, "train": 512, "val": 128, "epochs": 2,
         "jpeg": (500, 375)}                      # 4 steps an epoch, 8 in all: the loss's first steps
TRAIN_DRY = {"model": "resnet20", "size": 32, "batch": 8, "train": 64, "val": 16, "epochs": 2,
             "jpeg": (40, 30)}


def train_shards(root: Path, n_train: int, n_val: int, wh: tuple[int, int], classes: int = 10) -> Path:
    """HDF5 shards (the program's own format, ``scalesgd.data.shards``) of smooth random JPEGs of
    ``wh`` (the ImageNet median is 500 x 375), ``classes`` classes; made once under ``root``."""
    import io  # noqa: PLC0415

    from PIL import Image  # noqa: PLC0415

    from scalesgd.data.shards import content_id, write_manifest, write_split  # noqa: PLC0415
    if (root / "manifest.json").exists():
        return root
    rng = np.random.default_rng(0)

    def jpeg(label: int) -> bytes:
        small = rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)
        small[..., label % 3] = 32 * (label + 1) % 256            # a class shows in its colour
        buf = io.BytesIO()
        Image.fromarray(small).resize(wh, Image.BILINEAR).save(buf, "JPEG", quality=90)
        return buf.getvalue()
    splits = {s: [(jpeg(i % classes), i % classes) for i in range(n)] for s, n in
              (("train", n_train), ("val", n_val))}
    did = content_id(splits, classes)
    entries = {s: write_split(root, s, v, 2 if s == "train" else 1, did, classes) for s, v in splits.items()}
    write_manifest(root, name="gpu-check", dataset_id=did, splits=entries, options={"seed": 0},
                   classes=[{"index": c, "wnid": f"n{c:08d}", "name": f"class{c}"} for c in range(classes)])
    return root


class PeakMemory:
    """The most device memory a process held while this watched it: ``nvidia-smi``'s per-process
    ``used_memory``, sampled every ``period`` seconds on a thread (MiB; None where nvidia-smi is
    missing or never listed the process, as on a CPU)."""

    def __init__(self, period: float = 0.5):
        import threading  # noqa: PLC0415
        self.period, self.pid, self.mib = period, None, None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> int | None:
        """The watched process's MiB now, from ``nvidia-smi --query-compute-apps``."""
        if self.pid is None or shutil.which("nvidia-smi") is None:
            return None
        try:
            out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                                  "--format=csv,noheader,nounits"], capture_output=True, text=True,
                                 timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        for line in out.stdout.splitlines():
            pid, _, mib = line.partition(",")
            if pid.strip() == str(self.pid) and mib.strip().isdigit():
                return int(mib)
        return None

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            now = self.sample()
            if now is not None:
                self.mib = max(self.mib or 0, now)

    def watch(self, pid: int) -> "PeakMemory":
        self.pid = pid
        self._thread.start()
        return self

    def stop(self) -> int | None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=15)
        return self.mib


def _child_env() -> dict:
    """The environment of a case's subprocess: this one's, with the repository's ``src`` first."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))


def _out_dir(args) -> Path:
    """Where a case keeps its files: ``--out``, else a temporary directory of its own."""
    import tempfile  # noqa: PLC0415
    return Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="gpu_check."))


def _two_ranks(case: str) -> tuple[list | None, dict | None]:
    """(the launcher of 2 ranks, None), or (None, the case's "skipped" record) where there is none
    (benchlib's "no mpiexec found" message)."""
    try:
        return mpi_launcher(2), None
    except SystemExit as exc:
        print(f"{case}: skipped ({exc})", flush=True)
        return None, {"skipped": str(exc)}


def train_case(args, xp, precision: str) -> dict:
    """A short training run of the program itself (``python -m scalesgd``, one rank): ResNet-50 at
    224 px, batch 128, from HDF5 shards of 500 x 375 JPEGs that DALI decodes and resizes on the GPU,
    ``--fast-paths auto`` (a dry run: ResNet-20 at 32 px, batch 8, on the CPU).  Records the fast
    paths that ran (used or fell back), images/s, each step's loss and whether it went down, the
    run's seconds, and its summary's path; the run's own output is kept in ``train-PREC.log``."""
    t = TRAIN_DRY if args.dry_run else TRAIN
    out = _out_dir(args)
    data = train_shards(out / "train-data", t["train"], t["val"], t["jpeg"])
    run_dir = out / f"train-{precision}"
    shutil.rmtree(run_dir, ignore_errors=True)
    argv = [sys.executable, "-m", "scalesgd", "--data", str(data), "--run-dir", str(run_dir),
            "--model", t["model"], "--image-size", str(t["size"]), "--batch-size", str(t["batch"]),
            "--epochs", str(t["epochs"]), "--log-every", "1", "--progress", "lines",
            "--fast-paths", "auto", "--precision", precision,
            "--device", "cpu" if args.dry_run else "gpu"]
    t0 = time.perf_counter()
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             stdin=subprocess.DEVNULL)
    peak = PeakMemory().watch(child.pid)
    try:
        stdout, stderr = child.communicate(timeout=max(60, int(args.budget_s)))
    except subprocess.TimeoutExpired:
        child.kill()
        stdout, stderr = child.communicate()
    seconds = round(time.perf_counter() - t0, 1)
    (out / f"train-{precision}.log").write_text(stdout + stderr)
    res = {"argv": " ".join(argv[1:]), "rc": child.returncode, "seconds": seconds,
           "peak_device_mib": peak.stop()}      # (None on a CPU: nvidia-smi lists no process)
    summary = run_dir / "summary.json"
    if child.returncode != 0 or not summary.exists():
        res["error"] = (stderr.strip().splitlines() or ["no output"])[-1]
        print(f"train {precision}: FAILED ({res['error']})", flush=True)
        return res
    s = json.loads(summary.read_text())
    steps = [json.loads(x) for x in (run_dir / "metrics" / "rank-0.jsonl").read_text().splitlines()
             if '"kind": "step"' in x]
    losses = [round(r["loss"], 4) for r in steps]
    paths = s.get("fast_paths", {}).get("components", {})
    res.update(model=t["model"], batch=t["batch"], images_per_second=s.get("images_per_second"),
               val_top1=s.get("val_top1_accuracy"), losses=losses,
               loss_down=bool(losses) and min(losses[len(losses) // 2:]) < losses[0],
               fast_paths={k: v.get("status") for k, v in paths.items()}, summary=str(summary))
    res["steady_images_per_second"] = steady_rate(steps, t["batch"])
    res["torch_same_data"] = guarded(torch_on_same_data, args, data, precision, t)
    tr = res["torch_same_data"].get("steady_images_per_second")
    if tr and res["steady_images_per_second"]:
        res["vs_torch"] = round(res["steady_images_per_second"] / tr, 3)
    used = sum(v == "used" for v in res["fast_paths"].values())
    print(f"train {precision}: {len(losses)} steps of {t['model']} at batch {t['batch']}, "
          f"{res['images_per_second'] or 0:.1f} images/s, loss {losses[0] if losses else '-'} -> "
          f"{losses[-1] if losses else '-'} ({'down' if res['loss_down'] else 'NOT down'}); fast paths "
          f"{used} used, {len(paths) - used} not; peak device memory "
          f"{res['peak_device_mib'] if res['peak_device_mib'] is not None else 'n/a'} MiB; steady "
          f"{res['steady_images_per_second'] or 0:.1f} images/s, PyTorch on the same data: "
          + (f"{res['vs_torch']:.2f}x" if "vs_torch" in res else
             str(res["torch_same_data"].get("skipped") or res["torch_same_data"].get("error"))), flush=True)
    return res


def steady_rate(steps: list[dict], batch: int) -> float | None:
    """Images/s of a run's steady state: ``batch`` over the median time between consecutive steps
    (their ``train_seconds``: the loader's wait included, evaluations not) in the second half of
    the run's steps (the first ones build graphs and compile kernels).  None below 4 steps."""
    ts = [r["train_seconds"] for r in steps]
    gaps = [b - a for a, b in zip(ts, ts[1:])][len(ts) // 2 - 1:]
    return round(batch / float(np.median(gaps)), 2) if len(ts) >= 4 and np.median(gaps) > 0 else None


def torch_on_same_data(args, data: Path, precision: str, t: dict) -> dict:
    """PyTorch's ResNet (torch_resnet.py) trained on the batches the program's own loader makes of
    the same shards (``train.assemble.loaders``: DALI's GPU decode and resize on a GPU; each batch
    handed to torch by DLPack, its NHWC memory viewed as channels_last NCHW), the same epochs and
    batch, timed as ``steady_rate`` times the program: the loader's wait included.  Never run yet:
    no torch on the CPU machine, and no GPU run since it was written ("skipped" where torch does not
    import or sees no GPU)."""
    from torch_resnet import TorchRunner, torch  # noqa: PLC0415  (imports torch: only here)
    if torch is None:
        return {"skipped": "torch does not import"}
    device = "cpu" if args.dry_run else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        return {"skipped": "torch sees no GPU"}
    import types  # noqa: PLC0415

    from scalesgd import backend as backend_mod  # noqa: PLC0415
    from scalesgd import config as C  # noqa: PLC0415
    from scalesgd.nn.resnet import ResNet  # noqa: PLC0415
    from scalesgd.train.assemble import loaders, open_splits  # noqa: PLC0415
    cfg = C.build(overrides={"data": {"batch_size": t["batch"], "image_size": t["size"]},
                             "model": {"model": t["model"]}})
    splits = open_splits(data, cfg.data.cache_mb)
    classes = splits[0].num_classes
    roles = types.SimpleNamespace(is_server=False, worker_index=0, num_workers=1)
    train, _ = loaders(cfg, splits, roles, backend_mod.select("cpu" if args.dry_run else "gpu"), 4)
    nparams = ResNet(t["model"], classes).num_params
    runner = TorchRunner(t["model"], classes, t["size"], t["batch"], nparams, precision=precision,
                         device=device)
    stamps, losses, t0 = [], [], time.perf_counter()
    for epoch in range(t["epochs"]):
        for x, y in train.epoch(epoch):
            runner.x = torch.from_dlpack(x).permute(0, 3, 1, 2)      # NHWC memory: channels_last
            runner.y = torch.from_dlpack(y).long()
            runner.step()
            losses.append(round(runner.loss, 4))                      # (a device sync per step)
            stamps.append({"train_seconds": time.perf_counter() - t0})
    train.close()
    return {"steps": len(stamps), "losses": losses, "seconds": round(time.perf_counter() - t0, 1),
            "steady_images_per_second": steady_rate(stamps, t["batch"])}


# ----------------------------------------------------------------------------- self-check
TARGET_CHECK_S = 6.0            # 10% of the first minute of a ResNet-50 epoch


def selfcheck_case(args, xp, precision: str) -> dict:
    """fastpaths.check in strict mode, as a run on ResNet-50 would call it (dry run: ResNet-20 at
    32 px on NumPy posing as a GPU, so every model-level component runs on the reference)."""
    import types  # noqa: PLC0415

    from scalesgd import config as C  # noqa: PLC0415
    from scalesgd import fastpaths as F  # noqa: PLC0415
    from scalesgd.errors import BackendError  # noqa: PLC0415
    from scalesgd.nn.resnet import ResNet  # noqa: PLC0415
    name, classes, size, _ = ("resnet20", 10, 32, 0) if args.dry_run else RESNET50
    model = ResNet(name, classes, 1.0, xp=xp, seed=0)
    if not args.dry_run and CC.probe_cudnn() is not None:
        model.set_engine(CC.CudnnEngine(CC.probe_cudnn(), xp, precision, model.kernels))
    cfg = C.build(None, {"data": {"image_size": size, "batch_size": 64, "scale": [size, size * 1.15]},
                         "model": {"fast_paths": "strict", "precision": precision}})
    val = types.SimpleNamespace(train=False, batch_size=16, crops=10, indices=lambda e: range(20),
                                device_id=None)       # (no decode check: no shards here)
    gpu = types.SimpleNamespace(is_gpu=True, xp=xp)
    topo = types.SimpleNamespace(size=1, comm=None, is_root=True)
    t0 = time.perf_counter()
    try:
        rep, err = F.check(cfg, topo, model, gpu, (None, val), None).to_dict(), None
    except BackendError as exc:         # strict: the evidence of every component comes with it
        rep, err = exc.report.to_dict() if exc.report is not None else {}, str(exc)
    took = time.perf_counter() - t0
    print(f"selfcheck {precision}: {len(rep.get('components', {}))} components in {took:.2f} s "
          f"({rep.get('gflops', 0):.0f} GFLOPs){' FAILED: ' + err if err else ''}", flush=True)
    del model
    _free_device_memory(xp)
    return {"model": name, "budget_s": TARGET_CHECK_S, "seconds": round(took, 3), "gflops": rep.get("gflops"),
            "error": err, "within_budget": took <= TARGET_CHECK_S, "components": rep.get("components", {})}


# ----------------------------------------------------------------------------- results
def bench(runners: dict, steps: int, warmup: int, blocks: int) -> tuple[dict, dict]:
    """Interleaved blocks of ``steps`` timed steps per runner; median images/s and peak memory.
    A runner that raises is dropped with its error; the others go on: (runs, errors)."""
    errors, cold = {}, {}
    for k, r in list(runners.items()):
        try:
            cold[k] = []
            for _ in range(warmup):          # each warm-up step to its end: the first is the cold one
                t0 = time.perf_counter()     # (graphs built, kernels compiled): what the budget's
                r.step()                     # units must be set from, not the warm steps below
                r.sync()
                cold[k].append(round(time.perf_counter() - t0, 4))
        except Exception as exc:  # noqa: BLE001 - this path alone
            errors[k] = err_text(exc)
            del runners[k]
    times = {k: [] for k in runners}
    queued = {k: [] for k in runners}
    for _ in range(blocks):
        for k, r in list(runners.items()):
            try:
                r.sync()
                t0 = time.perf_counter()
                for _ in range(steps):
                    r.step()
                t1 = time.perf_counter()
                r.sync()
            except Exception as exc:  # noqa: BLE001
                errors[k] = err_text(exc)
                del runners[k], times[k], queued[k]
                continue
            times[k].append((time.perf_counter() - t0) / steps)
            queued[k].append((t1 - t0) / steps)
    runs = {k: {"img_s": r.batch / float(np.median(times[k])), "step_s": times[k],
                # the host's time to issue a step: near step_s, the host (Python, launches, or a
                # synchronisation inside the step) is on the critical path, not the device
                "host_s": queued[k], "peak_bytes": r.peak_bytes(), "warmup_s": cold[k]}
            for k, r in runners.items()}
    for k, r in runners.items():
        if hasattr(r, "model"):             # ours: where a step's host time goes
            runs[k]["host_profile"] = guarded(host_profile, r)
    return runs, errors


def host_profile(runner, top: int = 12) -> list:
    """One step under cProfile: the ``top`` functions by their own host time, as [function
    (file:line), calls, own ms, cumulative ms] (the profiler roughly doubles the Python cost)."""
    import cProfile  # noqa: PLC0415
    import pstats  # noqa: PLC0415
    prof = cProfile.Profile()
    runner.sync()
    prof.enable()
    runner.step()
    prof.disable()
    runner.sync()
    rows = sorted(pstats.Stats(prof).stats.items(), key=lambda kv: kv[1][2], reverse=True)[:top]
    return [[f"{fn} ({Path(file).name}:{line})", nc, round(tt * 1e3, 3), round(ct * 1e3, 3)]
            for (file, line, fn), (_, nc, tt, ct, _) in rows]


def results_case(args, xp, precision: str, batch: int, emit=print) -> dict:
    """One (precision, batch) of ResNet-50 (dry run: ResNet-20 at batch 2) on each path; each
    runner guarded; ``emit`` gets the table rows as soon as they exist."""
    batch = 2 if args.dry_run else batch
    runners, errors = _runners(args, xp, batch, precision)
    n = (lambda v: 1 if args.dry_run else v)      # noqa: E731 - a dry run: one of each
    runs, failed = bench(runners, n(args.steps), n(args.warmup), n(args.blocks))
    res = {"precision": precision, "batch": batch, "runs": runs, "errors": {**errors, **failed}}
    for row in table_rows([res]):
        emit(row)
    for k, v in runs.items():
        host, step = float(np.median(v["host_s"])), float(np.median(v["step_s"]))
        prof = v.get("host_profile")
        top = "; ".join(f"{r[0]} {r[2]:.1f} ms" for r in prof[:3]) if isinstance(prof, list) else prof
        emit(f"results {precision} {batch} {k}: the host issues a step in {host * 1e3:.1f} ms of "
             f"{step * 1e3:.1f} ({host / step:.0%})" + (f"; its own time most in {top}" if top else ""))
    for k, v in res["errors"].items():
        emit(f"results {precision} {batch} {k}: FAILED {v}")
    del runners
    _free_device_memory(xp)
    return res


def _runners(args, xp, batch, precision) -> tuple[dict, dict]:
    if args.dry_run:      # CPU: a tiny ResNet-20 through the same runner class (the graph: a stand-in)
        return {"im2col": OursRunner("resnet20", 10, 32, batch),
                "im2col-graph": OursRunner("resnet20", 10, 32, batch, graph="host")}, {}
    name, classes, size, nparams = RESNET50
    runners, errors = {}, {}
    for path in args.paths:
        try:
            if path == "cudnn" and CC.probe_cudnn() is None:
                errors[path] = "skipped: the cudnn frontend does not import"
            elif path in ("cudnn", "im2col", "cudnn-graph"):
                engine = CC.CudnnEngine(CC.probe_cudnn(), xp, precision) if path.startswith("cudnn") else None
                runners[path] = OursRunner(name, classes, size, batch, xp=xp, engine=engine,
                                           graph="cuda" if path.endswith("-graph") else None)
                assert runners[path].model.num_params == nparams
            elif path == "torch":
                from torch_resnet import TorchRunner, torch  # noqa: PLC0415  (imports torch: only here)
                if torch is not None and torch.cuda.is_available():
                    runners["torch"] = TorchRunner(name, classes, size, batch, nparams, precision=precision,
                                                   device="cuda")
        except Exception as exc:  # noqa: BLE001 - this path alone
            errors[path] = err_text(exc)
    return runners, errors


def graph_case(args, xp, precision: str) -> dict:
    """The training step captured in a CUDA graph against the uncaptured one (``graphstep.
    captured_matches_eager``: one capture, replays on two batches, each output's relative
    difference), ResNet-50 on cuDNN at batch 32 (dry run: ResNet-20 at batch 2 on NumPy, through
    the host stand-in), within the whole model's tolerance (``fastpaths`` ``MODEL_TOL``)."""
    from scalesgd.fastpaths.core import MODEL_TOL  # noqa: PLC0415
    from scalesgd.nn.resnet import ResNet  # noqa: PLC0415
    if args.dry_run:
        model, batch, hw, classes = ResNet("resnet20", 10, 0.25), 2, 32, 10
        capture = GS.replay_on_host(model)
    else:
        name, classes, hw, _ = RESNET50
        model, batch, capture = ResNet(name, classes, xp=xp), 32, GS.cuda_capture
        if CC.probe_cudnn() is not None:
            model.set_engine(CC.CudnnEngine(CC.probe_cudnn(), xp, precision))
    rng = np.random.default_rng(11)
    x = xp.asarray(rng.standard_normal((batch, hw, hw, 3)).astype(np.float32))
    y = xp.asarray(rng.integers(0, classes, batch))
    t = time.perf_counter()
    worst = GS.captured_matches_eager(model, x, y, xp, capture)
    tol = MODEL_TOL[precision if model.stem_conv.engine is not None else "fp32"]
    out = {"precision": precision, "batch": batch, "rel_error": worst, "tol": tol,
           "ok": max(worst.values()) <= tol, "seconds": round(time.perf_counter() - t, 2),
           "engine": "cudnn" if model.stem_conv.engine is not None else "xp"}
    print(f"graph {precision}: captured step against eager, largest relative difference "
          f"{max(worst.values()):.2e} (tolerance {tol:g}): {'same' if out['ok'] else 'DIFFERENT'}",
          flush=True)
    del model
    _free_device_memory(xp)
    return out


def _free_device_memory(xp) -> None:
    """Between cases: CuPy's cached blocks and torch's cache go back to the device."""
    if xp is not np:
        xp.get_default_memory_pool().free_all_blocks()
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available():
            torch.cuda.empty_cache()


def table_rows(results: list[dict]) -> list[str]:
    """The throughput table's rows (no header) of ``results``: one per path of each case."""
    rows = []
    for res in results:
        t = res.get("runs", {}).get("torch")
        for k, v in res.get("runs", {}).items():
            sp = v["img_s"] / t["img_s"] if t else None
            mem = (v["peak_bytes"] / t["peak_bytes"]) if t and v["peak_bytes"] and t["peak_bytes"] else None
            ok = "" if k == "torch" or sp is None else (
                "met" if sp >= TARGET_SPEED and (mem is None or mem <= TARGET_MEM) else "MISSED")
            mib = f"{v['peak_bytes'] / 2**20:.0f}" if v["peak_bytes"] else "-"
            rows.append(f"| {res.get('precision', '-')} | {res['batch']} | {k} | {v['img_s']:.1f} | "
                        f"{'-' if sp is None else f'{sp:.2f}x'} | {mib} | "
                        f"{'-' if mem is None else f'{mem:.2f}x'} | {ok} |")
    return rows


# ----------------------------------------------------------------------------- transports, DALI
def allreduce_case(args, xp) -> dict:
    """$MPIEXEC $MPIEXEC_ARGS -n 2 tests/gpu/allreduce_parity.py (cupy | numpy for a dry run)
    --time (benchlib.mpi_launcher, as every benchmark launches): the lines
    ``transport NAME: sums agree`` / ``skipped transport NAME: why`` / ``time NAME: MS ms ...``."""
    launcher, skipped = _two_ranks("allreduce")
    if skipped:
        return skipped
    env = _child_env()
    proc = subprocess.run([*launcher, sys.executable, str(ROOT / "tests/gpu/allreduce_parity.py"),
                           "numpy" if args.dry_run else "cupy", "--time"], capture_output=True, text=True,
                          timeout=240, env=env, stdin=subprocess.DEVNULL)
    out: dict = {"rc": proc.returncode, "launcher": launcher, "transports": {}}
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


def doctor_case(args, xp) -> dict:
    """``scalesgd doctor`` under ``$MPIEXEC -n 2`` (two ranks on the one GPU): every row it wrote
    (name, status, result), the GPU rows among them by name; its JSON kept as ``doctor.json``."""
    launcher, skipped = _two_ranks("doctor")
    if skipped:
        return skipped
    out_dir = _out_dir(args)
    rows_file = out_dir / "doctor.json"
    env = _child_env()
    proc = subprocess.run([*launcher, sys.executable, "-m", "scalesgd", "doctor", "--run-dir",
                           str(out_dir / "doctor-run"), "--json", str(rows_file)], capture_output=True,
                          text=True, timeout=180, env=env, stdin=subprocess.DEVNULL)
    out: dict = {"rc": proc.returncode, "launcher": launcher}
    if not rows_file.exists():
        out["error"] = (proc.stdout + proc.stderr)[-800:] or "no rows written"
        print(f"doctor: FAILED ({out['error'][-200:]})", flush=True)
        return out
    d = json.loads(rows_file.read_text())
    out.update(ranks=d.get("ranks"), ok=d.get("ok"),
               rows={c["name"]: {"status": c["status"], "result": c["result"]} for c in d["checks"]})
    gpu = {k: v for k, v in out["rows"].items()
           if any(w in k.lower() for w in ("gpu", "cuda", "nccl", "cudnn"))}
    out["gpu_rows"] = sorted(gpu)
    for k, v in gpu.items():
        print(f"doctor {k}: {v['status']} ({v['result'][:120]})", flush=True)
    print(f"doctor: {len(out['rows'])} rows on {out['ranks']} ranks, {len(gpu)} about the GPU", flush=True)
    return out


def nccl_case(args, xp) -> dict:
    """One rank's NCCL communicator through comm/mpi/device.py (tests/gpu/nccl_one_rank.py, a
    subprocess so that a crash in NCCL is this case's error, not the check's end): created from a
    unique id, one all-reduce checked, destroyed.  A dry run uses the CuPy 14 NCCL double."""
    env = _child_env()
    proc = subprocess.run([sys.executable, str(ROOT / "tests/gpu/nccl_one_rank.py"),
                           "double" if args.dry_run else "cupy"], capture_output=True, text=True,
                          timeout=120, env=env, stdin=subprocess.DEVNULL)
    out: dict = {"rc": proc.returncode, "steps": {}}
    for line in proc.stdout.splitlines():
        if line.startswith("nccl "):
            step, _, what = line[5:].partition(": ")
            out["steps"][step] = what
            print(line, flush=True)
    if proc.returncode != 0:
        out["error"] = (proc.stdout + proc.stderr)[-800:]
    return out


def timed_passes(run_batch, batches: int, sync=lambda: None, repeats: int = 3,
                 clock=time.perf_counter) -> list[float]:
    """Seconds of each of ``repeats`` passes of ``batches`` calls of ``run_batch``; a pass's clock
    is read after ``sync()`` (a GPU pipeline's batch exists once its work is queued: without the
    wait the first GPU check timed the queueing, not the decode)."""
    times = []
    for _ in range(repeats):
        t0 = clock()
        for _ in range(batches):
            run_batch()
        sync()
        times.append(clock() - t0)
    return times


def dali_case(args, xp) -> dict:
    """DALI decode + resize (shorter side 256) + crop/normalize (224) of 256 JPEGs of 500x375,
    batch 64, on the CPU and (GPU) "mixed"; images/s each (median of 3 passes after one warm-up)."""
    try:
        from nvidia.dali import Pipeline, fn, types  # noqa: PLC0415
    except Exception as exc:  # noqa: BLE001
        why = os.environ.get("GPU_CHECK_DALI_SKIPPED", "")
        out = {"skipped": f"nvidia.dali does not import ({type(exc).__name__}: {exc})"
                          + (f"; install: {why}" if why else "")}
        print(f"dali: skipped ({out['skipped']})", flush=True)
        return out
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
        # mixed: a batch returned is queued work on the device; the pass ends when the device did it
        sync = (lambda: xp.cuda.runtime.deviceSynchronize()) if device != "cpu" else (lambda: None)
        return n / float(np.median(timed_passes(pipe.run, n // batch, sync)))
    out = {"cpu_img_s": rate("cpu")}
    if not args.dry_run:
        out.update(guarded(lambda: {"gpu_img_s": rate("mixed")}))
        if "gpu_img_s" in out:
            out["gpu_vs_cpu"] = out["gpu_img_s"] / out["cpu_img_s"]
    print(f"dali: {json.dumps(out)}", flush=True)
    return out
