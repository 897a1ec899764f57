"""What the benchmark scripts share: the MPI launcher, the core-to-core placement probe, and the
training-step runner of scalesgd's ResNets (its PyTorch twin is ``torch_resnet.py``, kept apart so
that nothing here imports torch).

Scripts import it as a sibling module (``python benchmarks/X.py`` puts ``benchmarks/`` first on
``sys.path``); ``scalesgd`` itself comes from the editable install (``pip install -e .``) or
``PYTHONPATH=src``.  The name is not ``common`` so that it cannot clash with a test helper module.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

try:
    from scalesgd.nn import layers as L
    from scalesgd.nn.resnet import ResNet
    from scalesgd.optim.sgd import SGD, SGDConfig
except ModuleNotFoundError as exc:       # the one import error a user can fix by a command
    if exc.name != "scalesgd":
        raise
    raise SystemExit("benchmarks: the scalesgd package does not import: run them with the project's "
                     ".venv/bin/python (pip install -e .) or with PYTHONPATH=src") from None

ROOT = Path(__file__).resolve().parents[1]


def git_commit() -> str:
    """The short commit of this tree (what a measurement ran: its JSON records it)."""
    return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
C2C_SRC = ROOT / "benchmarks" / "c2c.c"
SHARED_L3_NS = 80.0         # c2c one-way latency below this: the two CPUs share an L3 right now
PROBE_TIMEOUT_S = 5.0       # idle: 2,000,000 round trips take 0.1-0.8 s; on a busy machine the two
                            # spinning threads rarely run at once and the reading means nothing


# ----------------------------------------------------------------------------- MPI launcher
def mpiexec() -> str:
    """$MPIEXEC, else the launcher next to this Python (the MPI wheel's), else the one on PATH:
    the same choice as the tests make, so Open MPI or a site's launcher works here too."""
    if os.environ.get("MPIEXEC"):
        return os.environ["MPIEXEC"]
    here = Path(sys.executable).parent / "mpiexec"
    exe = str(here) if here.exists() else shutil.which("mpiexec")
    if exe is None:
        raise SystemExit("benchmarks: no mpiexec found: pip install -e '.[mpi]', "
                         "or set MPIEXEC=/path/to/mpiexec")
    return exe


def mpi_launcher(n: int) -> list[str]:
    """argv prefix that starts N ranks: the launcher, $MPIEXEC_ARGS (split like a shell), -n N.
    E.g. Open MPI as root on 2 cores: MPIEXEC_ARGS="--allow-run-as-root --oversubscribe"."""
    return [mpiexec(), *shlex.split(os.environ.get("MPIEXEC_ARGS", "")), "-n", str(n)]


def rank_env() -> dict:
    """The environment of launched processes: this one with one BLAS/OpenMP thread each (every rank
    is one single-threaded process)."""
    return dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")


def run_checked(cmd: list[str], who: str, timeout: float, cwd=None) -> subprocess.CompletedProcess:
    """Runs ``cmd`` (stdin closed, ``rank_env()``, output captured as text) and returns it; a timeout
    or a non-zero exit stops the script with the command and the tail of the child's stderr."""
    try:
        proc = subprocess.run(cmd, cwd=cwd, env=rank_env(), stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise SystemExit(f"{who}: did not finish in {timeout:.0f}s: {shlex.join(cmd)}") from None
    if proc.returncode:
        raise SystemExit(f"{who}: failed (exit {proc.returncode}): {shlex.join(cmd)}\n{proc.stderr[-3000:]}")
    return proc


# ----------------------------------------------------------------------------- placement probe
class Probe:
    """The core-to-core placement probe (``c2c.c``: one-way cache-line latency between CPU 0 and 1).

    Built once with gcc into the temporary directory, named by the source's digest (a changed
    source is rebuilt; concurrent builders each rename a complete file into place).  Without gcc,
    if the build fails, or if a run takes over PROBE_TIMEOUT_S (other processes hold the CPUs),
    ``run()`` returns None and the benchmarks print "n/a"."""

    def __init__(self, src: Path = C2C_SRC):
        self.exe = self._build(Path(src))

    @staticmethod
    def _build(src: Path) -> Path | None:
        if not src.exists() or shutil.which("gcc") is None:
            return None
        digest = hashlib.blake2b(src.read_bytes(), digest_size=6).hexdigest()
        exe = Path(tempfile.gettempdir()) / f"scalesgd-c2c-{os.getuid()}-{digest}"
        if exe.exists():
            return exe
        tmp = exe.with_name(f"{exe.name}.{os.getpid()}.tmp")
        try:
            subprocess.run(["gcc", "-O2", "-pthread", str(src), "-o", str(tmp)], check=True,
                           capture_output=True, timeout=60)
            os.replace(tmp, exe)
        except (OSError, subprocess.SubprocessError):
            tmp.unlink(missing_ok=True)
            return None
        return exe

    def run(self, iters: int | None = None, timeout: float = PROBE_TIMEOUT_S) -> float | None:
        """One-way latency in ns over ``iters`` round trips (the probe's default 2,000,000), or None
        (no probe, or over ``timeout`` seconds)."""
        if self.exe is None:
            return None
        cmd = [str(self.exe)] + ([str(iters)] if iters else [])
        try:
            out = subprocess.run(cmd, check=True, capture_output=True, text=True,
                                 timeout=timeout).stdout
            return float(out.split()[-2])            # "c2c one-way 31.2 ns"
        except (OSError, subprocess.SubprocessError, ValueError, IndexError):
            return None


def fmt_probe(ns: float | None) -> str:
    """'31 ns (shared L3)', '172 ns (no shared L3)' or 'n/a'."""
    if ns is None:
        return "n/a"
    return f"{ns:.0f} ns ({'shared L3' if ns < SHARED_L3_NS else 'no shared L3'})"


# ----------------------------------------------------------------------------- training steps
def synthetic_batch(batch: int, size: int, classes: int, seed: int = 1234) -> tuple[np.ndarray, np.ndarray]:
    """x: (batch, size, size, 3) float32 NHWC standard normal (never zeros), y: (batch,) int64 labels.
    Both runners draw the same batch from the same arguments."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, size, size, 3), dtype=np.float32)
    return x, rng.integers(0, classes, batch, dtype=np.int64)


class DeviceMemory:
    """One runner's device memory: a CuPy memory pool of its own, used for every allocation made
    inside ``active()``, and the peak of its bytes in use (what ``torch.cuda.max_memory_allocated``
    counts for the PyTorch twin).  The default pool's ``total_bytes()`` also held the blocks cached
    by earlier sections and by the other runners, while PyTorch's peak is reset per runner: a
    spurious "missed" on the memory ratio."""

    def __init__(self, xp):
        self.xp, self.pool, self.peak = xp, xp.cuda.MemoryPool(), 0

    def malloc(self, nbytes: int):
        mem = self.pool.malloc(nbytes)
        self.peak = max(self.peak, self.pool.used_bytes())
        return mem

    def active(self):
        """Context manager: CuPy allocates from this pool inside it (``cupy.cuda.using_allocator``)."""
        return self.xp.cuda.using_allocator(self.malloc)


class OursRunner:
    """Training steps of one scalesgd ResNet on one fixed synthetic batch: a step is forward (train
    mode) + softmax cross-entropy + backward + Nesterov SGD (``SGDConfig`` defaults: momentum 0.9,
    weight decay 1e-4 on conv/linear weights only).  ``xp``: numpy or cupy; ``engine``: a
    ``cudnn_conv.CudnnEngine`` for the cuDNN path, None for im2col."""

    def __init__(self, name: str, classes: int, size: int, batch: int, xp=np, engine=None,
                 seed: int = 0, lr: float = 0.01, width: float = 1.0, conv_algo: str = "auto",
                 graph: str | None = None):
        self.xp, self.batch, self.lr = xp, batch, lr
        self.memory = DeviceMemory(xp) if xp is not np else None
        with self._memory():
            self.model = ResNet(name, classes, width, xp=xp, dtype="float32", seed=seed, conv_algo=conv_algo)
            if engine is not None:
                self.model.set_engine(engine)
            self.opt = SGD(self.model.ps.params, SGDConfig(), self.model.ps.decay_mask())
            x, y = synthetic_batch(batch, size, classes)
            self.x, self.y = xp.asarray(x), xp.asarray(y)
        self._loss = float("nan")            # a device scalar on the GPU: read only when asked
        # graph: forward, loss and backward captured in a CUDA graph (train/graphstep.py), replayed
        # from the third step: "cuda", or "host" (NumPy: graphstep.replay_on_host, the stand-in)
        self.captured = None
        if graph is not None:
            from scalesgd.train import graphstep as GS  # noqa: PLC0415
            capture = GS.cuda_capture if graph == "cuda" else GS.replay_on_host(self.model)
            self.captured = GS.CapturedStep(self.model, xp, capture=capture)

    def _memory(self):
        return self.memory.active() if self.memory is not None else contextlib.nullcontext()

    def step(self) -> None:
        with self._memory():
            self._step()

    def _step(self) -> None:
        m = self.model
        if self.captured is not None:
            self._loss = self.captured(self.x, self.y)[0]
        else:
            logits, cache = m.forward(self.x, True)
            self._loss, dlogits, _ = L.softmax_cross_entropy(logits, self.y)   # via the module: profilable
            m.backward(dlogits, cache)
        self.opt.step(m.ps.params, m.ps.grads, self.lr)

    @property
    def loss(self) -> float:
        return float(self._loss)

    def threads(self, n: int):
        """Context manager: BLAS limited to ``n`` threads (threadpoolctl)."""
        return threadpool_limits(limits=n, user_api="blas")

    def sync(self) -> None:
        if self.xp is not np:
            self.xp.cuda.get_current_stream().synchronize()

    def peak_bytes(self) -> int | None:
        """The most device bytes this runner held at once (its model, optimizer, batch and every
        step's temporaries), None on NumPy."""
        return None if self.memory is None else self.memory.peak


def timed(runner, nsteps: int) -> list[float]:
    """Seconds of each of ``nsteps`` steps of an OursRunner or a TorchRunner, each step synchronised
    (a no-op on the CPU) so that it is timed whole."""
    out = []
    runner.sync()
    for _ in range(nsteps):
        t0 = time.perf_counter()
        runner.step()
        runner.sync()
        out.append(time.perf_counter() - t0)
    return out
