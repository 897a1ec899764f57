"""Every layer's backward against float64 central finite differences."""
import zlib

import numpy as np
import pytest

from scalesgd.nn import layers as L

from gradcheck import numeric_grad, rel_error, sample_idx

TOL = 1e-7


@pytest.fixture
def rand(request):
    """``rand(*shape)``: standard normal draws from this test's own generator, seeded from its name
    (parameters included), so a test's inputs are the same whether it runs alone, in another order
    or after any other test."""
    rng = np.random.default_rng(zlib.crc32(request.node.name.encode()))
    return lambda *shape: rng.standard_normal(shape)


def check_input_and_param_grads(forward, backward, inputs: dict, out_shape, rand, n_checks=60):
    """forward(**inputs) -> out; backward(dout) -> dict name -> analytic grad; loss = sum(out * R),
    R drawn with ``rand`` (the test's generator)."""
    R = rand(*out_shape)

    def loss():
        return float(np.sum(forward(**inputs) * R))

    grads = backward(R.copy())
    for name, g in grads.items():
        x = inputs[name]
        idx = sample_idx(x.size, n_checks)
        num = numeric_grad(loss, x, idx)
        err = rel_error(g.reshape(-1)[idx], num)
        assert err < TOL, f"{name}: relative error {err:.2e}"


@pytest.mark.parametrize("k,stride,pad,hw", [(3, 1, 1, 7), (3, 2, 1, 7), (3, 2, 1, 8), (1, 1, 0, 5),
                                             (1, 2, 0, 6), (7, 2, 3, 11), (3, 1, 0, 6), (5, 1, 2, 6)])
@pytest.mark.parametrize("workspace,plan", [(False, None), (True, None), (True, ("blocked", 1)),
                                            (False, ("blocked", 2)), (True, ("taps", 1)),
                                            (False, ("taps", 1)), (False, ("winograd", 4)),
                                            (False, ("winograd", 2))])
def test_conv2d(k, stride, pad, hw, workspace, plan, rand):
    """Whole-batch im2col (plan None), blocked (1 and 2 images per block of a batch of 3: the last
    block is shorter), taps (where it applies: stride-1 "same" convolutions) and Winograd F(4x4) and
    F(2x2) (3x3, stride 1, pad 1; 7 and 8 wide: partial and whole tiles)."""
    if plan and plan[0] == "taps" and not (stride == 1 and pad == k // 2 and k > 1):
        pytest.skip("taps: stride-1 same convolutions only")
    if plan and plan[0] == "winograd" and (k, stride, pad) != (3, 1, 1):
        pytest.skip("winograd: 3x3, stride 1, pad 1 only")
    x, w = rand(3, hw, hw + 1, 3), rand(k, k, 3, 3)
    ws = L.Workspace() if workspace else None
    out, cache = L.conv2d_forward(x, w, stride, pad, ws, plan)

    def backward(d):
        dw = np.zeros_like(w)
        dx = L.conv2d_backward(d, cache, dw, ws=ws)
        return {"x": dx, "w": dw}

    # the forward passes of the finite differences reuse the same workspace buffers
    check_input_and_param_grads(lambda x, w: L.conv2d_forward(x, w, stride, pad, ws, plan)[0], backward,
                                {"x": x, "w": w}, out.shape, rand)


@pytest.mark.parametrize("k,stride,pad,plan", [(3, 1, 1, ("blocked", 2)), (3, 2, 1, ("blocked", 2)),
                                               (7, 2, 3, ("blocked", 2)), (1, 2, 0, ("blocked", 2)),
                                               (5, 1, 2, ("blocked", 2)), (3, 1, 1, ("taps", 1)),
                                               (5, 1, 2, ("taps", 1))])
def test_conv_algorithms_equal_whole_batch_in_float32(k, stride, pad, plan, rand):
    """float32: the blocked and taps algorithms' output, dx and dw equal the whole-batch im2col's to
    rounding (the same products, summed in another order)."""
    x, w = rand(5, 9, 8, 4).astype(np.float32), rand(k, k, 4, 6).astype(np.float32)
    y0, c0 = L.conv2d_forward(x, w, stride, pad)
    y1, c1 = L.conv2d_forward(x, w, stride, pad, L.Workspace(), plan)
    d = rand(*y0.shape).astype(np.float32)
    dw0, dw1 = np.empty_like(w), np.empty_like(w)
    dx0, dx1 = L.conv2d_backward(d, c0, dw0), L.conv2d_backward(d, c1, dw1)
    for a, b in ((y0, y1), (dx0, dx1), (dw0, dw1)):
        assert a.dtype == b.dtype == np.float32
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5 * float(np.abs(a).max()))


def test_conv_plans():
    """auto on NumPy: Winograd for 3x3/1 layers of >= 64 channels on >= 8x8 images; taps for stride-1
    same convs of >= TAPS_MIN_PIXELS pixels and TAPS_MIN_MACS
    multiply-adds per image; blocked where the whole batch's im2col exceeds BLOCKED_ABOVE and a block
    has >= F rows (blocks hold at most BLOCK_BYTES, at least one image, and are equal); else the
    whole batch.  1x1 convs, the im2col algorithm and CuPy under auto run whole-batch im2col;
    ``blocked`` blocks whatever does not fit one block; an unknown name is refused."""
    x = (64, 32, 32, 16)                                             # ResNet-20's first stage
    assert L.conv_plan("auto", np, x, 3, 3, 1, 1, 4, 16) == ("taps", 1)
    assert L.conv_plan("auto", np, (8, 16, 16, 8), 3, 3, 1, 1, 4, 8) is None       # the proxy
    assert L.conv_plan("auto", np, (64, 8, 8, 64), 3, 3, 1, 1, 4, 64) == ("winograd", 4)
    assert L.conv_plan("auto", np, (64, 8, 8, 32), 3, 3, 1, 1, 4, 32) is None      # 4.7 MB: whole
    assert L.conv_plan("auto", np, (16, 4, 4, 256), 3, 3, 1, 1, 4, 256) is None    # < 8x8: im2col
    assert L.conv_plan("auto", np, (16, 2, 2, 512), 3, 3, 1, 1, 4, 512) is None    # dW > a block
    assert L.conv_plan("winograd", np, (16, 2, 2, 512), 3, 3, 1, 1, 4, 512) == ("winograd", 2)
    assert L.conv_plan("winograd", np, x, 3, 3, 2, 1, 4, 32) is None              # strided: as auto
    assert L.conv_plan("auto", np, (64, 224, 224, 3), 7, 7, 2, 3, 4, 64) == ("blocked", 1)  # 470 MB
    assert L.conv_plan("taps", np, x, 3, 3, 2, 1, 4, 32) is None                   # strided: as auto
    assert L.conv_plan("taps", np, (64, 8, 8, 64), 3, 3, 1, 1, 4, 64) == ("taps", 1)
    assert L.conv_plan("auto", np, (64, 8, 8, 64), 5, 5, 1, 2, 4, 64) == ("blocked", 2)  # 3x3 only
    assert L.conv_plan("blocked", np, x, 3, 3, 1, 1, 4, 16) == ("blocked", 1)
    assert L.conv_plan("blocked", np, (16, 2, 2, 512), 3, 3, 1, 1, 4, 512) == ("blocked", 8)  # not 14+2
    assert L.conv_plan("blocked", np, (4, 8, 8, 16), 3, 3, 1, 1, 4, 16) is None    # fits one block
    assert L.conv_plan("auto", np, x, 1, 1, 1, 0, 4, 32) is None                   # 1x1: no im2col
    assert L.conv_plan("im2col", np, x, 3, 3, 1, 1, 4, 16) is None
    cupy_like = type("M", (), {"__name__": "cupy"})
    assert L.conv_plan("auto", cupy_like, x, 3, 3, 1, 1, 4, 16) is None
    with pytest.raises(ValueError, match="conv algorithm 'fast'"):
        L.conv_plan("fast", np, x, 3, 3, 1, 1, 4)


def test_conv2d_matches_direct_sum(rand):
    """The NHWC/HWIO im2col convolution equals the textbook 7-loop definition."""
    x, w = rand(1, 5, 6, 2), rand(3, 3, 2, 3)
    out, _ = L.conv2d_forward(x, w, 2, 1)
    xp_ = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
    ref = np.zeros_like(out)
    for oh in range(out.shape[1]):
        for ow in range(out.shape[2]):
            patch = xp_[0, 2 * oh:2 * oh + 3, 2 * ow:2 * ow + 3, :]
            ref[0, oh, ow] = np.einsum("ijc,ijcf->f", patch, w)
    np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("relu", [False, True])
def test_batchnorm_train(relu, rand):
    x = rand(4, 3, 3, 5) * 2 + 1
    gamma, beta = rand(5), rand(5)

    def fwd(x, gamma, beta):
        out, _ = L.batchnorm_forward(x, gamma, beta, np.zeros(5), np.ones(5), True)
        return np.maximum(out, 0) if relu else out

    out, cache = L.batchnorm_forward(x, gamma, beta, np.zeros(5), np.ones(5), True)

    def backward(d):
        if relu:
            d = L.relu_backward(d, np.maximum(out, 0))
        dg, db = np.zeros(5), np.zeros(5)
        dx = L.batchnorm_backward(d, cache, dg, db)
        return {"x": dx, "gamma": dg, "beta": db}

    check_input_and_param_grads(fwd, backward, {"x": x, "gamma": gamma, "beta": beta}, out.shape, rand)


def test_batchnorm_statistics_and_eval(rand):
    x = rand(8, 4, 4, 3) * 3 + 2
    rm, rv = np.zeros(3), np.ones(3)
    gamma, beta = np.array([1.0, 2.0, 0.5]), np.array([0.0, -1.0, 3.0])
    out, _ = L.batchnorm_forward(x, gamma, beta, rm, rv, True)
    x2 = x.reshape(-1, 3)
    mean, var = x2.mean(0), x2.var(0)
    np.testing.assert_allclose(out.reshape(-1, 3), (x2 - mean) / np.sqrt(var + 1e-5) * gamma + beta,
                               rtol=1e-10)
    # running stats: momentum 0.1, unbiased variance (PyTorch semantics)
    np.testing.assert_allclose(rm, 0.1 * mean, rtol=1e-12)
    np.testing.assert_allclose(rv, 0.9 + 0.1 * x2.var(0, ddof=1), rtol=1e-12)
    # eval mode uses the running statistics, not the batch's, and leaves them untouched
    rm0, rv0 = rm.copy(), rv.copy()
    ev, cache = L.batchnorm_forward(x, gamma, beta, rm, rv, False)
    assert cache is None
    np.testing.assert_allclose(ev.reshape(-1, 3), (x2 - rm0) / np.sqrt(rv0 + 1e-5) * gamma + beta,
                               rtol=1e-10)
    np.testing.assert_array_equal(rm, rm0)
    np.testing.assert_array_equal(rv, rv0)


def test_relu(rand):
    x = rand(3, 4, 4, 2)
    x[np.abs(x) < 1e-3] = 0.5          # keep away from the kink
    out, cache = L.relu_forward(x.copy())
    check_input_and_param_grads(lambda x: np.maximum(x, 0),
                                lambda d: {"x": L.relu_backward(d, cache)}, {"x": x}, out.shape, rand)


def test_maxpool(rand):
    x = rand(2, 9, 8, 3)               # continuous random values: no ties
    out, cache = L.maxpool_forward(x)
    assert out.shape == (2, 5, 4, 3)
    check_input_and_param_grads(lambda x: L.maxpool_forward(x)[0],
                                lambda d: {"x": L.maxpool_backward(d, cache)}, {"x": x}, out.shape, rand)


def test_avgpool_and_linear(rand):
    x, w, b = rand(3, 4, 5, 6), rand(6, 7), rand(7)

    def fwd(x, w, b):
        return L.linear_forward(L.avgpool_forward(x)[0], w, b)[0]

    pooled, shape = L.avgpool_forward(x)
    out, lc = L.linear_forward(pooled, w, b)

    def backward(d):
        dw, db = np.zeros_like(w), np.zeros_like(b)
        dx = L.avgpool_backward(L.linear_backward(d, lc, dw, db), shape)
        return {"x": dx, "w": dw, "b": db}

    check_input_and_param_grads(fwd, backward, {"x": x, "w": w, "b": b}, out.shape, rand)


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_softmax_cross_entropy(smoothing, rand):
    logits, labels = rand(5, 4) * 3, np.array([0, 3, 1, 1, 2])
    loss, grad, pred = L.softmax_cross_entropy(logits, labels, smoothing)
    # closed form
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    q = np.full_like(p, smoothing / 4)
    q[np.arange(5), labels] += 1 - smoothing
    assert loss == pytest.approx(-(q * np.log(p)).sum(1).mean(), rel=1e-12)
    np.testing.assert_array_equal(pred, logits.argmax(1))
    num = numeric_grad(lambda: L.softmax_cross_entropy(logits, labels, smoothing)[0], logits)
    assert rel_error(grad, num) < TOL


def test_conv2d_backward_refuses_a_stale_workspace_cache(rand):
    """forward A, forward B of the same shape (reusing A's im2col buffer), backward A: an error, not
    gradients of B; a forward of another shape in between leaves A's cache valid."""
    x_a, x_b, w = rand(2, 6, 6, 4), rand(2, 6, 6, 4), rand(3, 3, 4, 4)
    ws = L.Workspace()
    out, cache = L.conv2d_forward(x_a, w, 1, 1, ws)
    d = rand(*out.shape)
    dw_ref = np.zeros_like(w)
    dx_ref = L.conv2d_backward(d, L.conv2d_forward(x_a, w, 1, 1)[1], dw_ref)
    L.conv2d_forward(x_b, w, 1, 1, ws)
    with pytest.raises(RuntimeError, match="stale forward cache"):
        L.conv2d_backward(d, cache, np.zeros_like(w), ws=ws)
    out, cache = L.conv2d_forward(x_a, w, 1, 1, ws)
    L.conv2d_forward(x_b[:1], w, 1, 1, ws)                          # other shape, other buffer
    dw = np.zeros_like(w)
    np.testing.assert_array_equal(L.conv2d_backward(d, cache, dw, ws=ws), dx_ref)
    np.testing.assert_array_equal(dw, dw_ref)


@pytest.mark.parametrize("rows", [100, 128 * 7 + 5, 802816])
def test_batchnorm_float32_sums_stay_accurate_at_many_rows(rows):
    """Per-channel statistics and parameter gradients in float32 stay within ~1e-6 of float64 at any
    row count (a plain float32 GEMV was off by ~4e-4 at 802,816 rows); the leftover rows of the
    two-stage sum (rows not a multiple of its fold) are included."""
    g = np.random.default_rng(rows)
    x = (g.standard_normal((rows, 4)) * 2 + 1).astype(np.float32)
    dy = (g.standard_normal((rows, 4)) + 0.5).astype(np.float32)
    gamma, beta = np.array([1.0, 2.0, 0.5, 1.5], np.float32), np.zeros(4, np.float32)
    rm, rv = np.zeros(4, np.float32), np.ones(4, np.float32)
    _, cache = L.batchnorm_forward(x, gamma, beta, rm, rv, True)
    dg, db = np.empty(4, np.float32), np.empty(4, np.float32)
    L.batchnorm_backward(dy, cache, dg, db)
    assert rm.dtype == dg.dtype == np.float32
    x64, dy64 = x.astype(np.float64), dy.astype(np.float64)
    mean, var = x64.mean(0), x64.var(0)
    xhat = (x64 - mean) / np.sqrt(var + 1e-5)

    def rel(got, ref):
        return float(np.max(np.abs(got - ref) / np.abs(ref)))
    assert rel(rm, 0.1 * mean) < 1e-6
    assert rel(rv, 0.9 + 0.1 * x64.var(0, ddof=1)) < 1e-6
    assert rel(db, dy64.sum(0)) < 1e-6
    prod = dy64 * xhat                                   # mixed signs: error relative to sum |terms|
    assert float(np.max(np.abs(dg - prod.sum(0)) / np.abs(prod).sum(0))) < 1e-6


def test_batchnorm_wide_rows_change_no_bit(rand):
    """BN's per-channel passes run over rows of ~1024 elements (channel vectors tiled): the same
    operations on the same elements in the same order as the plain (M, C) broadcast, bit for bit."""
    x, dy = rand(6, 5, 4, 8).astype(np.float32), rand(6, 5, 4, 8).astype(np.float32)
    gamma, beta = rand(8).astype(np.float32), rand(8).astype(np.float32)
    out, (xc, g, invstd) = L.batchnorm_forward(x, gamma, beta, np.zeros(8, np.float32),
                                               np.ones(8, np.float32), True)
    x2 = x.reshape(-1, 8)
    mean = L._colsum(x2) / x2.shape[0]
    np.testing.assert_array_equal(xc, x2 - mean)
    np.testing.assert_array_equal(out.reshape(-1, 8), (x2 - mean) * (gamma * invstd) + beta)
    dg, db = np.empty(8, np.float32), np.empty(8, np.float32)
    dx = L.batchnorm_backward(dy, (xc, g, invstd), dg, db)
    m, d2 = x2.shape[0], dy.reshape(-1, 8)
    ref = xc * (invstd * dg / m)
    ref -= d2
    ref += db / m
    ref *= -(gamma * invstd)
    np.testing.assert_array_equal(dx.reshape(-1, 8), ref)
    assert L._wide(x2)[0].shape == (15, 64)                  # 120 rows: gcd(120, 1024 / 8) = 8 at a time


@pytest.mark.parametrize("m,bound", [(4, 1e-4), (2, 1e-5)])
def test_winograd_float32_error_against_the_float64_direct_convolution(m, bound, rand):
    """Winograd's float32 output, dx and dw against the float64 im2col convolution, relative to the
    largest value: F(4x4) measures ~1e-5 at ResNet sizes (conv_candidates.py: 9e-6; the direct
    convolution 7e-7), F(2x2) ~1e-6; the bounds leave 10x room; a wrong transform is off by O(1)."""
    x, w = rand(4, 16, 16, 64), rand(3, 3, 64, 32) / 24.0
    y64, c64 = L.conv2d_forward(x, w, 1, 1)
    d = rand(*y64.shape)
    dw64 = np.empty_like(w)
    dx64 = L.conv2d_backward(d, c64, dw64)
    f = np.float32
    y, cache = L.conv2d_forward(x.astype(f), w.astype(f), 1, 1, None, ("winograd", m))
    dw = np.empty(w.shape, f)
    dx = L.conv2d_backward(d.astype(f), cache, dw)
    for got, ref in ((y, y64), (dx, dx64), (dw, dw64)):
        assert got.dtype == np.float32
        err = float(np.abs(got - ref).max() / np.abs(ref).max())
        assert err < bound, err
