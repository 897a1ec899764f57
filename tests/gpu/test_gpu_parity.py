"""Parity of every GPU fast path with the float64 NumPy reference, one body per check run on each
backend (gpu_backends.py): conv fprop/dgrad/wgrad over the geometries ResNets use, BN forward and
backward, each fused kernel, the SGD optimizer, one ResNet-20 training step (NumPy, CuPy with the
im2col layers, CuPy with cuDNN), DALI's GPU decode against its CPU decode, and the device all-reduce
on 2 ranks.  Here (no GPU) the NumPy cases and the doubles' cases (the real cuDNN engine on the
Frontend stand-in, the host transport's device path on tests/device_double.py) run, and the others
are skipped with the reason."""
import io
import os
import subprocess
import sys
from pathlib import Path as FsPath

import numpy as np
import pytest

from gpu_backends import FLOAT64, PATHS, XP, NEEDS_GPU, assert_close, batchnorm, conv, make_path
from mpirun import check, run_mpi, uses_mpi
from scalesgd import fastpaths
from scalesgd.backend import to_numpy
from scalesgd.nn import kernels as K
from scalesgd.nn.resnet import ResNet
from scalesgd.optim.sgd import SGD, SGDConfig
from scalesgd.train.step import train_step

HERE = FsPath(__file__).resolve().parent


@pytest.fixture(params=PATHS)
def path(request):
    return make_path(request.param)


@pytest.fixture(params=XP)
def xp(request):
    return make_path(request.param).xp


def rand(seed, *shape):
    return np.random.default_rng([seed, *shape]).standard_normal(shape)


# (H=W, C, K, R, stride): each kind of convolution of the ResNets, odd sizes included
GEOMETRIES = [(16, 3, 8, 3, 1),      # CIFAR stem
              (16, 8, 8, 3, 1),      # basic block
              (15, 8, 16, 3, 2),     # first conv of a stage, stride 2, odd input
              (16, 8, 16, 1, 2),     # projection shortcut
              (9, 16, 8, 1, 1),      # bottleneck 1x1
              (23, 3, 8, 7, 2)]      # ImageNet stem


@pytest.mark.parametrize("hw,c,k,r,stride", GEOMETRIES)
def test_conv_fprop_dgrad_wgrad(path, hw, c, k, r, stride):
    x, w = rand(1, 2, hw, hw, c), rand(2, r, r, c, k) / np.sqrt(r * r * c)
    ho = (hw + 2 * (r // 2) - r) // stride + 1
    dy = rand(3, 2, ho, ho, k)
    got = conv(path, *(a.astype(np.float32) for a in (x, w, dy)), stride, r // 2)
    want = conv(FLOAT64, x, w, dy, stride, r // 2)
    assert_close(got, want, path.tol, ("y", "dx", "dw"), f"{path.name} conv {r}x{r}/s{stride}")


@pytest.mark.parametrize("relu", [False, True])
def test_batchnorm_forward_backward(path, relu):
    x, dy = rand(4, 4, 6, 5, 16) * 2 + 0.5, rand(5, 4, 6, 5, 16)
    gamma, beta = rand(6, 16), rand(7, 16)
    got = batchnorm(path, *(a.astype(np.float32) for a in (x, gamma, beta, dy)), relu)
    want = batchnorm(FLOAT64, x, gamma, beta, dy, relu)
    assert_close(got, want, path.tol, ("y", "dx", "dgamma", "dbeta", "rmean", "rvar"), path.name)


@pytest.mark.parametrize("name", K.KERNEL_NAMES)
def test_fused_kernel(xp, name):
    """The public kernel (fused on CuPy, the twin on NumPy) in float32 against the twin in float64."""
    fast, _ = K.check_case(name, xp, "float32", "float32")
    _, ref = K.check_case(name, np, "float64", "float64")
    assert_close(fast(), ref(), 1e-5, what=name)


def test_sgd_optimizer(xp):
    """optim.SGD (one fused kernel on CuPy) in float32 against itself in float64: 3 Nesterov steps
    with masked weight decay."""
    n = 1001
    p, mask = rand(8, n), (rand(9, n) > 0).astype(np.float64)
    cfg = SGDConfig(momentum=0.9, nesterov=True, weight_decay=1e-2, decay_bn_and_bias=False)
    p32, p64 = xp.asarray(p.astype(np.float32)), p.copy()
    o32, o64 = SGD(p32, cfg, xp.asarray(mask.astype(np.float32))), SGD(p64, cfg, mask)
    for step in range(3):
        g = rand(10 + step, n)
        o32.step(p32, xp.asarray(g.astype(np.float32)), 0.1)
        o64.step(p64, g, 0.1)
    assert_close((p32, o32.momentum), (p64, o64.momentum), 1e-5, ("params", "momentum"))


def test_resnet20_training_step(path):
    """One whole step (forward, loss, backward) of a float32 ResNet-20 on ``path`` against the same
    weights and batch in float64 on NumPy: loss and every gradient."""
    xp = path.xp
    model = ResNet("resnet20", 10, 0.5, xp=xp, dtype="float32", seed=0)
    if path.engine is not None:
        model.set_engine(path.engine)
    ref = ResNet("resnet20", 10, 0.5, dtype="float64", seed=None)
    ref.ps.params[...] = to_numpy(model.ps.params)
    ref.ps.buffers[...] = to_numpy(model.ps.buffers)
    x, y = rand(11, 8, 32, 32, 3), np.arange(8) % 10
    loss, _ = train_step(model, xp.asarray(x.astype(np.float32)), xp.asarray(y))
    loss64, _ = train_step(ref, x, y)
    assert_close((loss, model.ps.grads), (loss64, ref.ps.grads), 1e-5 if path.engine is None else 5e-3,
                 ("loss", "grads"), path.name)


def _jpegs(k=3):
    from PIL import Image
    rng, out = np.random.default_rng(12), []
    for h, w in [(40, 56), (33, 61), (64, 64)][:k]:
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(buf, "JPEG")
        out.append(np.frombuffer(buf.getvalue(), np.uint8))
    return out


def test_dali_decode(xp):
    """NumPy: DALI's CPU decode of the crops equals libjpeg-turbo's (simplejpeg) decode, cropped.
    CuPy: DALI's GPU ("mixed") decode of the same crops against its CPU decode."""
    pytest.importorskip("nvidia.dali")
    jpegs = _jpegs()
    cpu = fastpaths.decode_crops(jpegs, "cpu")
    if xp is np:
        import simplejpeg
        for j, got in zip(jpegs, cpu):
            full = simplejpeg.decode_jpeg(j.tobytes(), colorspace="RGB")
            h, w = full.shape[:2]
            np.testing.assert_array_equal(got, full[h // 4:h - h // 4, w // 8:w - w // 8])
    else:
        assert_close(fastpaths.decode_crops(jpegs, "mixed", 0), cpu, fastpaths.DECODE_TOL, what="mixed")


@uses_mpi
@pytest.mark.parametrize("backend", [pytest.param("numpy"), pytest.param("double"),
                                     pytest.param("cupy", marks=NEEDS_GPU)])
def test_device_allreduce_two_ranks(backend):
    """Every transport this machine can run sums a bucketed buffer to the closed form on 2 ranks."""
    out = check(run_mpi(2, [str(HERE / "allreduce_parity.py"), backend], timeout=120))
    assert "transports_sum_to_the_closed_form: ok" in out, out


@pytest.mark.parametrize("backend", [pytest.param("double"), pytest.param("cupy", marks=NEEDS_GPU)])
def test_nccl_one_rank_create_allreduce_destroy(backend):
    """A NCCL communicator's whole life through comm/mpi/device.py on one rank (gpu_check's ``nccl``
    case: one GPU cannot run the 2-rank NCCL test): created from CuPy 14's ``bytes`` id (the
    double refuses anything else, as CuPy 14 does: issue 38, defect 1), one all-reduce, destroyed."""
    proc = subprocess.run([sys.executable, str(HERE / "nccl_one_rank.py"), backend], capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL,
                          env=dict(os.environ, PYTHONPATH=str(HERE.parents[1] / "src")))
    if "nccl skipped:" in proc.stdout:
        pytest.skip(proc.stdout.strip())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for step in ("nccl create: ok", "nccl allreduce: sums agree", "nccl destroy: ok"):
        assert step in proc.stdout, proc.stdout
