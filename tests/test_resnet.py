"""Whole-network checks: parameter counts, flat-buffer aliasing, end-to-end gradients."""
import numpy as np
import pytest

from scalesgd.nn import conv
from scalesgd.nn import layers as L
from scalesgd.nn.resnet import ARCHS, Conv, ResNet, _leaves

from gradcheck import numeric_grad, rel_error, sample_idx


@pytest.mark.parametrize("name,count", [("resnet18", 11_689_512), ("resnet34", 21_797_672),
                                        ("resnet50", 25_557_032), ("resnet101", 44_549_160),
                                        ("resnet152", 60_192_808)])
def test_parameter_counts_match_reference(name, count):
    assert ResNet(name, 1000, seed=None).num_params == count


def test_cifar_resnets_have_expected_depth():
    # 6n + 2 layers: conv1 + 3 stages x n blocks x 2 convs + fc
    for name, n in [("resnet8", 1), ("resnet20", 3), ("resnet32", 5), ("resnet56", 9)]:
        m = ResNet(name, 10)
        convs = [s for s in m.ps.layout.specs if s.name.endswith(".weight") and len(s.shape) == 4
                 and "downsample" not in s.name]
        assert len(convs) + 1 == 6 * n + 2
    assert set(ARCHS) == {"resnet18", "resnet34", "resnet50", "resnet101", "resnet152", "resnet8",
                          "resnet20", "resnet32", "resnet56"}


def test_unknown_model_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown model 'resnet19'"):
        ResNet("resnet19")


def test_views_alias_the_flat_buffers():
    m = ResNet("resnet20", 10, width=0.5)
    ps = m.ps
    for views, flat in [(ps.p, ps.params), (ps.g, ps.grads), (ps.b, ps.buffers)]:
        for name, v in views.items():
            assert np.shares_memory(v, flat), name
            v[...] = 7.0
        assert np.all(flat == 7.0)            # every element belongs to exactly one view
    total = sum(v.size for v in ps.p.values())
    assert total == ps.params.size == m.num_params
    # writing the flat buffer is seen through the layer's view, and vice versa
    ps.params[:] = np.arange(ps.params.size, dtype=ps.params.dtype)
    off0, off1 = ps.layout.offsets["fc.bias"]
    np.testing.assert_array_equal(ps.p["fc.bias"], np.arange(off0, off1))


def test_init_is_deterministic_and_he_scaled():
    a, b = ResNet("resnet20", 10), ResNet("resnet20", 10)
    a.ps.initialize(3)
    b.ps.initialize(3)
    np.testing.assert_array_equal(a.ps.params, b.ps.params)
    w = a.ps.p["layer3.0.conv2.weight"]              # 3x3x64x64, fan_out = 576
    assert np.std(w) == pytest.approx(np.sqrt(2 / 576), rel=0.05)
    assert np.all(a.ps.p["bn1.weight"] == 1) and np.all(a.ps.b["bn1.running_var"] == 1)
    z = ResNet("resnet20", 10, zero_init_residual=True)
    z.ps.initialize(3)
    assert np.all(z.ps.p["layer1.0.bn2.weight"] == 0) and np.all(z.ps.p["layer1.0.bn1.weight"] == 1)


def test_a_constructed_model_is_initialised_from_its_seed():
    """No all-zero model by default: ResNet(seed=s) equals ps.initialize(s), bit for bit."""
    a = ResNet("resnet20", 10, width=0.5)                            # seed 0
    assert np.std(a.ps.p["conv1.weight"]) > 0 and np.all(a.ps.b["bn1.running_var"] == 1)
    logits, _ = a.forward(np.ones((1, 8, 8, 3), np.float32), True)
    assert np.any(logits != 0)
    b = ResNet("resnet20", 10, width=0.5, seed=None)                 # caller initialises or loads
    assert not np.any(b.ps.params)
    for seed in (0, 5):
        b.ps.initialize(seed)
        c = ResNet("resnet20", 10, width=0.5, seed=seed)
        np.testing.assert_array_equal(b.ps.params, c.ps.params)
        np.testing.assert_array_equal(b.ps.buffers, c.ps.buffers)
    before = a.ps.params.copy()
    a.ps.initialize(0)                                               # the training loop's call
    np.testing.assert_array_equal(a.ps.params, before)


def test_backward_refuses_a_cache_overwritten_by_an_eval_forward():
    """forward(A, train), forward(B, eval) of the same shape, backward(A): stale im2col -> error;
    an eval forward of another shape leaves A's buffers alone and A's gradients exact."""
    m = ResNet("resnet20", 4, width=0.25, dtype="float64", conv_algo="im2col")   # the buffer-reusing one
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((2, 8, 8, 3)), rng.standard_normal((2, 8, 8, 3))
    logits, cache = m.forward(a, True)
    _, d, _ = L.softmax_cross_entropy(logits, np.array([1, 3]))
    m.backward(d, cache)
    ref = m.ps.grads.copy()
    logits, cache = m.forward(a, True)
    m.forward(b, False)
    with pytest.raises(RuntimeError, match="stale forward cache"):
        m.backward(d, cache)
    logits, cache = m.forward(a, True)
    m.forward(b[:1], False)                                          # other shape: other buffers
    m.backward(d, cache)
    np.testing.assert_array_equal(m.ps.grads, ref)


@pytest.mark.parametrize("name,width,hw", [("resnet20", 0.25, 8), ("resnet18", 1 / 16, 32),
                                           ("resnet50", 1 / 16, 64)])
@pytest.mark.parametrize("algo", ["im2col", "blocked", "taps", "winograd"])
def test_whole_network_gradients_float64(name, width, hw, algo, monkeypatch):
    """Parameter and input gradients of a small ResNet (train mode, loss = CE) vs finite differences,
    with every conv algorithm (blocked: one image per block, the batch of 3 in three blocks)."""
    monkeypatch.setattr(conv, "BLOCK_BYTES", 1)
    m = ResNet(name, 5, width=width, dtype="float64", conv_algo=algo)
    m.ps.initialize(0)
    rng = np.random.default_rng(0)
    m.ps.params += 0.1 * rng.standard_normal(m.ps.params.size)   # break symmetries (BN gamma=1, beta=0)
    x = rng.standard_normal((3, hw, hw, 3))
    y = np.array([0, 4, 2])

    def loss():
        logits, _ = m.forward(x, True)
        return L.softmax_cross_entropy(logits, y, 0.1)[0]

    logits, cache = m.forward(x, True)
    _, dlogits, _ = L.softmax_cross_entropy(logits, y, 0.1)
    dx = m.backward(dlogits, cache, need_dx=True)
    idx = sample_idx(m.ps.params.size, 80)
    assert rel_error(m.ps.grads[idx], numeric_grad(loss, m.ps.params, idx)) < 1e-7
    xi = sample_idx(x.size, 30, seed=1)
    assert rel_error(dx.reshape(-1)[xi], numeric_grad(loss, x, xi)) < 1e-7


def test_conv_algos_agree_in_float32_and_are_selectable(monkeypatch):
    """blocked, taps, winograd and im2col give the same logits and gradients to float32 rounding; the model's
    conv_algo reaches every Conv; an unknown name is refused."""
    monkeypatch.setattr(conv, "BLOCK_BYTES", 8 * 8 * 9 * 4 * 4 * 2)  # 2 images per block at the stem
    x = np.random.default_rng(0).standard_normal((5, 8, 8, 3)).astype(np.float32)
    y = np.array([0, 1, 2, 3, 0])
    out = {}
    for algo in ("im2col", "blocked", "taps", "winograd"):
        m = ResNet("resnet20", 4, width=0.25, seed=0, conv_algo=algo)
        assert {c.algo for c in _leaves(m.net) if isinstance(c, Conv)} == {algo}
        logits, cache = m.forward(x, True)
        m.backward(L.softmax_cross_entropy(logits, y)[1], cache)
        out[algo] = logits, m.ps.grads.copy()
    for algo, tol in (("blocked", 1e-5), ("taps", 1e-5), ("winograd", 1e-4)):   # Winograd: ~10x rounding
        for a, b in zip(out["im2col"], out[algo]):
            np.testing.assert_allclose(b, a, rtol=10 * tol, atol=tol * float(np.abs(a).max()))
    with pytest.raises(ValueError, match="conv algorithm 'fft'"):
        ResNet("resnet20", 4, width=0.25, conv_algo="fft")


def test_eval_mode_is_batch_independent():
    m = ResNet("resnet20", 10, width=0.25, dtype="float64")
    m.ps.initialize(0)
    x = np.random.default_rng(0).standard_normal((4, 8, 8, 3))
    for _ in range(3):
        m.forward(x, True)                           # populate running statistics
    full, _ = m.forward(x, False)
    one, _ = m.forward(x[:1], False)
    np.testing.assert_allclose(one, full[:1], rtol=1e-10)


def test_grad_hook_reports_each_tensor_once_when_final():
    """The hook a bucketed all-reduce relies on: every tensor reported exactly once, and its
    gradient never changes after it was reported."""
    m = ResNet("resnet20", 4, width=0.25, dtype="float64")
    m.ps.initialize(0)
    snapshots = {}

    def hook(names):
        for n in names:
            assert n not in snapshots, f"{n} reported twice"
            snapshots[n] = m.ps.g[n].copy()

    m.set_grad_hook(hook)
    x = np.random.default_rng(0).standard_normal((2, 8, 8, 3))
    logits, cache = m.forward(x, True)
    _, d, _ = L.softmax_cross_entropy(logits, np.array([1, 3]))
    m.ps.grads[...] = np.nan
    m.backward(d, cache)
    assert set(snapshots) == set(m.ps.p)
    for n, g in snapshots.items():
        np.testing.assert_array_equal(g, m.ps.g[n], err_msg=n)
    assert list(snapshots)[0].startswith("fc.")       # backward starts at the classifier
