"""The GPU rows: CuPy and the driver, the CUDA majors of the stack, rank -> GPU, NCCL, CUDA-aware
MPI, cuDNN Frontend, fast paths (never run on a GPU: on a machine without one they read n/a with
the reason)."""
from __future__ import annotations

from .base import FAIL, NA, OK, WARN, Check, Ctx
from .mpi import _no_mpi

# ----------------------------------------------------------------------------- GPUs
NO_GPU_FIX = "needs a GPU on every rank (the cupy / cuda row says why there is none)"


def _cuda_version(v: int) -> str:
    """CUDA's integer versions (12040) as '12.4'."""
    return f"{v // 1000}.{v % 1000 // 10}"


def gpu_facts(local_rank: int) -> dict:
    """This rank's CUDA view: {'reason'} without a usable GPU, else versions, the GPU this rank pins
    (local_rank % count, as backend.select does; pinned here) and its PCI bus id.  The CuPy calls
    here have NEVER RUN ON A GPU."""
    from ..backend import _try_cupy
    cupy, info = _try_cupy()
    if cupy is None:
        return {"reason": info}
    rt, dev = cupy.cuda.runtime, local_rank % info
    cupy.cuda.Device(dev).use()                  # as backend.select pins it; later checks use it
    name = rt.getDeviceProperties(dev)["name"]              # bytes in CuPy's runtime API
    return {"count": info, "device": dev, "bus": cupy.cuda.Device(dev).pci_bus_id,
            "name": name.decode(errors="replace") if isinstance(name, bytes) else str(name),
            "cupy": cupy.__version__, "driver": _cuda_version(rt.driverGetVersion()),
            "runtime": _cuda_version(rt.runtimeGetVersion())}


def _gpu_ranks(ctx: Ctx) -> bool:
    """True when every rank has a GPU (after check_cupy_cuda gathered ``ctx.gpus``)."""
    return bool(ctx.gpus) and all("count" in g for g in ctx.gpus)


def _no_gpu(name: str, extra: str = "") -> Check:
    return Check(name, NA, f"no GPU{extra}", NO_GPU_FIX)


def check_cupy_cuda(ctx: Ctx, name: str) -> Check:
    ctx.gpus = ctx.gather(gpu_facts(ctx.local_rank))
    without = [r for r, g in enumerate(ctx.gpus) if "count" not in g]
    if len(without) == ctx.size:
        return Check(name, NA, f"no GPU: {ctx.gpus[0]['reason']}", "on GPU nodes install the extra of "
                     "the driver's CUDA: .venv/bin/pip install -e '.[cuda13]' (or '.[cuda12]'; docs/gpu.md)")
    if without:
        return Check(name, FAIL, f"ranks {_ranges(without)} have no usable GPU "
                     f"({ctx.gpus[without[0]]['reason']}) while the others have one",
                     "every rank of a GPU job needs a GPU: check CUDA_VISIBLE_DEVICES and the job's nodes")
    g = ctx.gpus[0]
    names = sorted({x["name"] for x in ctx.gpus})
    return Check(name, OK, f"CuPy {g['cupy']}, CUDA driver {g['driver']}, runtime {g['runtime']}; "
                 f"{g['count']} GPU{'s' * (g['count'] > 1)} per node ({', '.join(names)})",
                 data={"ranks": ctx.gpus})


def check_gpu_mapping(ctx: Ctx, name: str) -> Check:
    if not _gpu_ranks(ctx):
        return _no_gpu(name, "; each rank would pin GPU local_rank % GPUs per node")
    nodes, problems = {}, []
    for r, (node, g) in enumerate(zip(ctx.nodes.tolist(), ctx.gpus)):
        nodes.setdefault(node, []).append((r, g["device"], g["count"]))
    for node, ranks in nodes.items():
        devices, count = {d for _, d, _ in ranks}, ranks[0][2]
        if len(devices) < len(ranks):
            problems.append(f"the node of rank {node}: {len(ranks)} ranks share {len(devices)} GPUs")
        elif len(devices) < count:
            problems.append(f"the node of rank {node}: {count - len(devices)} of {count} GPUs idle")
    first = next(iter(nodes.values()))
    shown = " ".join(f"{r}->{d}" for r, d, _ in first[:8]) + (" ..." if len(first) > 8 else "")
    data = {"mapping": [[r, g["device"], g["bus"]] for r, g in enumerate(ctx.gpus)]}
    if problems:
        return Check(name, WARN, "; ".join(problems[:3]), "start one rank per GPU "
                     "(e.g. srun --ntasks-per-node=GPUs per node, or mpiexec -ppn GPUs per node)", data)
    return Check(name, OK, f"one GPU per rank, by local rank (first node: {shown})", data=data)


def check_nccl(ctx: Ctx, name: str) -> Check:
    if not _gpu_ranks(ctx):
        return _no_gpu(name)
    from ..comm.mpi import device
    nccl = device.nccl_module()
    return _on_every_rank(
        name, ctx.gather(_nccl_version(nccl.get_version()) if nccl else ""),
        "no NCCL bindings in CuPy on ranks {}: the allreduce method falls back to CUDA-aware MPI or "
        "host copies", "install NCCL for CuPy's CUDA: the cuda13 / cuda12 extra has nvidia-nccl-cu13 / "
        "-cu12", "NCCL {} on every rank (allreduce_transport auto uses it)")


def _on_every_rank(name: str, found: list[str], missing_msg: str, fix: str, ok_msg: str) -> Check:
    """A library every rank should have: ``found`` is each rank's version ('' where missing);
    a warning naming the ranks without it (``missing_msg`` formats them), else ok with the first
    rank's version (``ok_msg`` formats it)."""
    missing = [r for r, v in enumerate(found) if not v]
    if missing:
        return Check(name, WARN, missing_msg.format(_ranges(missing)), fix)
    return Check(name, OK, ok_msg.format(found[0]))


def _nccl_version(v: int) -> str:
    """NCCL's integer version (22105, or 2708 before 2.9) as '2.21.5'."""
    major, rest = (v // 10000, v % 10000) if v >= 10000 else (v // 1000, v % 1000)
    return f"{major}.{rest // 100}.{rest % 100}"


def check_cuda_aware_mpi(ctx: Ctx, name: str) -> Check:
    from ..comm.mpi import device
    if ctx.topo is None:
        return _no_mpi(name)
    says = ctx.gather(device.mpi_cuda_query())
    claim = {True: "says yes", False: "says no", None: "is not available"}[says[0]]
    if not _gpu_ranks(ctx):
        return _no_gpu(name, f"; MPIX_Query_cuda_support of the MPI library {claim}")
    if not all(s is True for s in says):
        return Check(name, WARN, f"not CUDA-aware on every rank (MPIX_Query_cuda_support {claim} on rank 0):"
                     " device buffers reach MPI through host copies", "for fewer copies: the cluster's "
                     "CUDA-aware MPI (e.g. Open MPI with UCX built with CUDA); NCCL does not need it")
    if device.transfer_works(ctx.topo.comm):           # collective; NEVER RUN ON A GPU
        return Check(name, OK, "MPI reports CUDA support and an all-reduce of device arrays gave the "
                     "right sum")
    return Check(name, FAIL, "MPI reports CUDA support but an all-reduce of device arrays gave a wrong "
                 "sum or an error", "set dist.allreduce_transport = nccl or host until the MPI is fixed")


def check_cudnn_frontend(ctx: Ctx, name: str) -> Check:
    if not _gpu_ranks(ctx):
        return _no_gpu(name, "; convolutions use im2col + GEMM")
    from ..nn.cudnn_conv import probe_cudnn
    cudnn = probe_cudnn()
    found = ctx.gather(f"{getattr(cudnn, '__version__', '?')} (cuDNN {_backend(cudnn)})" if cudnn else "")
    return _on_every_rank(
        name, found, "'import cudnn' fails on ranks {}: conv_impl auto uses im2col + GEMM there "
        "(slower)", "install the cuda13 / cuda12 extra (nvidia-cudnn-frontend, nvidia-cudnn-cu13 / -cu12)",
        "cuDNN Frontend {} on every rank (conv_impl auto uses it)")


def _backend(cudnn) -> str:
    """cuDNN's backend version, or why it is unknown (the frontend imports without a libcudnn it
    can load; then backend_version raises, which must not end the row: issue 38, defect 5)."""
    try:
        return str(cudnn.backend_version())
    except Exception as exc:  # noqa: BLE001
        return f"backend not loaded: {type(exc).__name__}"


def check_cuda_stack(ctx: Ctx, name: str) -> Check:
    """Which CUDA major each part of the GPU stack (CuPy, cuDNN, NCCL, DALI) was built for, against
    the driver's (doctor/stack.py); without a GPU the wheels found, as n/a."""
    from ..backend import _try_cupy
    from . import stack
    cupy = _try_cupy()[0] if ctx.gpus and "count" in ctx.gpus[ctx.rank] else None
    facts = ctx.gather({"wheels": stack.installed(), "lib": stack.loaded(cupy)})
    _, text, _ = stack.verdict(facts[0]["wheels"], facts[0]["lib"])
    if not _gpu_ranks(ctx):
        return Check(name, NA, f"no GPU; {text}", NO_GPU_FIX, {"ranks": facts})
    status, text, fix = stack.verdict(facts[0]["wheels"], facts[0]["lib"])
    differ = [r for r, f in enumerate(facts) if f["wheels"] != facts[0]["wheels"]]
    if differ:
        return Check(name, FAIL if status == FAIL else WARN, f"{text}; ranks {_ranges(differ)} have other "
                     "wheels", fix or "install the same extra on every node", {"ranks": facts})
    return Check(name, {"ok": OK, "warn": WARN, "fail": FAIL}[status], text, fix, {"ranks": facts})


def check_fast_paths(ctx: Ctx, name: str) -> Check:
    if not _gpu_ranks(ctx):
        return _no_gpu(name, "; the NumPy reference paths are the only ones")
    results = ctx.gather(kernel_checks())
    failed = [(r, k, o["error"]) for r, res in enumerate(results) for k, o in res.items()
              if o["status"] != "used"]
    data = {"ranks": results}
    if failed:
        r, k, why = failed[0]
        return Check(name, WARN, f"{k} failed its check on rank {r} ({why}); {len(failed)} failure(s) in "
                     "all: training falls back to the reference twin", "bash benchmarks/gpu_check.sh "
                     "shows every fast path (cuDNN graphs too) against its reference on this GPU", data)
    return Check(name, OK, f"{len(results[0])} fused-kernel checks match their reference twins on every "
                 "rank's GPU (cuDNN graphs are checked at the start of each training run)", data=data)


def kernel_checks() -> dict:
    """The fused CUDA kernels of nn/kernels.py against their ``_ref`` twins on this rank's GPU, as a
    training run checks them at start-up (fastpaths/): {component: {'status', 'error'}}.  NEVER
    RUN ON A GPU."""
    from .. import fastpaths
    from ..backend import _try_cupy
    from ..nn.kernels import Kernels
    cupy, _ = _try_cupy()
    outcome = fastpaths.validate(fastpaths.kernel_components(Kernels(), cupy), "auto", speak=False)
    return {k: {"status": o["status"], "error": o.get("error", "")} for k, o in outcome.items()}


def _ranges(ranks: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5'."""
    out, i = [], 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        out.append(f"{ranks[i]}-{ranks[j]}" if j > i else str(ranks[i]))
        i = j + 1
    return ",".join(out)
