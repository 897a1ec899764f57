"""Which CUDA the GPU stack was built for, and whether its parts agree.

CuPy, cuDNN, NCCL and DALI each ship as wheels named for one CUDA major (``cupy-cuda12x`` /
``cupy-cuda13x``, ``nvidia-cudnn-cu12`` / ``-cu13``, ``nvidia-nccl-cu12`` / ``-cu13``,
``nvidia-dali-cuda120`` / ``-cuda130``; the ``cuda12`` and ``cuda13`` extras of setup.cfg install one
set), and the driver says up to which CUDA it runs.  A mix (a CUDA 12 DALI beside a CUDA 13 CuPy, as
the former unconditional ``nvidia-dali-cuda120`` gave on CUDA 13 machines) loads two CUDA runtimes
into one process; a part built for a newer CUDA than the driver's does not start.

``installed()`` reads the installed distributions' names (``importlib.metadata``: no import, no
GPU), ``loaded()`` asks the libraries themselves (CuPy's runtime and driver, cuDNN's and NCCL's
versions, guarded each), and ``verdict()`` (pure, tested with made-up facts) compares them.  A
machine's own CuPy or cuDNN, not from a wheel, counts by what its runtime reports, else as unknown.
"""
from __future__ import annotations

import re

WHEELS = {"cupy": r"cupy-cuda(\d+)x", "cudnn": r"nvidia-cudnn-cu(\d+)", "nccl": r"nvidia-nccl-cu(\d+)",
          "dali": r"nvidia-dali-cuda(\d\d)0"}
NAMES = {"cupy": "CuPy", "cudnn": "cuDNN", "nccl": "NCCL", "dali": "DALI"}


def installed() -> dict:
    """{component: [{"wheel", "version", "cuda"}]} for every CUDA-specific wheel installed (more than
    one per component is itself a problem); components without a wheel are absent."""
    from importlib import metadata  # noqa: PLC0415
    out: dict = {}
    for dist in metadata.distributions():
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        for comp, pattern in WHEELS.items():
            m = re.fullmatch(pattern, name)
            row = {"wheel": name, "version": dist.version, "cuda": int(m.group(1))} if m else None
            if row and row not in out.get(comp, []):
                out.setdefault(comp, []).append(row)
    return out


def _cuda(v) -> str:
    """CUDA's integer versions (13000) as '13.0'."""
    return f"{int(v) // 1000}.{int(v) % 1000 // 10}"


def loaded(cupy=None) -> dict:
    """What the libraries report on this rank (each probe guarded: a library that does not load is
    its error, never the doctor's end): driver and runtime CUDA (CuPy), cuDNN's and NCCL's versions."""
    out: dict = {}
    if cupy is not None:
        for key, fn in (("driver", cupy.cuda.runtime.driverGetVersion),
                        ("runtime", cupy.cuda.runtime.runtimeGetVersion)):
            try:
                out[key] = int(fn())
            except Exception as exc:  # noqa: BLE001
                out[f"{key}_error"] = f"{type(exc).__name__}: {exc}"
        out["cupy"] = str(cupy.__version__)
    try:
        from ..nn.cudnn_conv import probe_cudnn  # noqa: PLC0415
        cudnn = probe_cudnn()
        if cudnn is not None:
            out["cudnn"] = int(cudnn.backend_version())
    except Exception as exc:  # noqa: BLE001 - e.g. the frontend imports but libcudnn does not load
        out["cudnn_error"] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
    if cupy is not None:
        try:
            from ..comm.mpi import device  # noqa: PLC0415
            nccl = device.nccl_module()
            if nccl is not None:
                out["nccl"] = int(nccl.get_version())
        except Exception as exc:  # noqa: BLE001
            out["nccl_error"] = f"{type(exc).__name__}: {exc}"
    return out


def verdict(wheels: dict, lib: dict) -> tuple[str, str, str]:
    """(status 'ok' | 'warn' | 'fail', result, fix) of one rank's stack: ``wheels`` as
    ``installed()``, ``lib`` as ``loaded()``.  ok: every part found has one CUDA major, the
    driver's or older; warn: majors differ, or two wheels of one part; fail: a part needs a newer
    CUDA than the driver runs."""
    majors: dict = {}
    parts = []
    for comp in ("cupy", "cudnn", "nccl", "dali"):
        rows = wheels.get(comp, [])
        for r in rows:
            majors.setdefault(r["cuda"], []).append(f"{NAMES[comp]} ({r['wheel']})")
        if comp == "cupy" and not rows and "runtime" in lib:      # a CuPy not from a wheel
            majors.setdefault(lib["runtime"] // 1000, []).append("CuPy (its runtime)")
        parts.append(_part(comp, rows, lib))
    driver = lib.get("driver")
    text = (f"CUDA driver {_cuda(driver)}; " if driver else "") + ", ".join(parts)
    doubles = [f"{NAMES[c]}: {', '.join(r['wheel'] for r in rows)}"
               for c, rows in wheels.items() if len(rows) > 1]
    if driver and majors and max(majors) > driver // 1000:
        newer = "; ".join(majors[m][0] for m in sorted(majors) if m > driver // 1000)
        return "fail", f"{text}: {newer} needs CUDA {max(majors)}, the driver runs up to {_cuda(driver)}", \
            f"install the cuda{driver // 1000} extra (pip install -e '.[cuda{driver // 1000}]') instead"
    if len(majors) > 1 or doubles:
        what = "; ".join(f"CUDA {m}: {', '.join(v)}" for m, v in sorted(majors.items())) if len(majors) > 1 \
            else "two wheels of one part: " + "; ".join(doubles)
        keep = max(majors) if not driver else min(max(majors), driver // 1000)
        return "warn", f"{text}: {what}", (f"keep one CUDA: pip uninstall the other wheels, then pip install "
                                           f"-e '.[cuda{keep}]'")
    one = f"; one CUDA major ({next(iter(majors))})" if majors else "; no CUDA-specific wheel found"
    return "ok", text + one, ""


def _part(comp: str, rows: list, lib: dict) -> str:
    """'CuPy 14.2.0 (CUDA 13)', 'cuDNN 9.27.0 (CUDA 13)', 'NCCL absent', ..."""
    name = NAMES[comp]
    version = ""
    if comp == "cupy" and "cupy" in lib:
        version = lib["cupy"]
    elif comp in ("cudnn", "nccl") and comp in lib:
        v = lib[comp]
        version = f"{v // 10000}.{v % 10000 // 100}.{v % 100}" if v >= 10000 else str(v)
    elif rows:
        version = rows[0]["version"]
    if not version and not rows:
        err = lib.get(f"{comp}_error")
        return f"{name} absent" + (f" ({err})" if err else "")
    cuda = "/".join(str(r["cuda"]) for r in rows) or (str(lib["runtime"] // 1000) if comp == "cupy"
                                                      and "runtime" in lib else "")
    return f"{name} {version or '?'} ({f'CUDA {cuda}' if cuda else 'not a wheel: CUDA unknown'})"
