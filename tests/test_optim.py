"""SGD updates against hand-computed values; schedules against their definitions."""
import numpy as np
import pytest

from scalesgd.optim.schedule import ScheduleConfig, lr_at
from scalesgd.optim.sgd import SGD, SGDConfig


def run(cfg, p0, grads, lr, mask=None):
    p = np.array(p0, dtype=np.float64)
    opt = SGD(p, cfg, mask)
    for g in grads:
        opt.step(p, np.array(g, dtype=np.float64), lr)
    return p, opt.momentum


def test_plain_sgd():
    p, _ = run(SGDConfig(momentum=0.0, weight_decay=0.0), [1.0, -2.0], [[0.5, 1.0]], 0.1)
    np.testing.assert_allclose(p, [0.95, -2.1])


def test_momentum_two_steps_by_hand():
    # step 1: buf = g1 = 1; p = 1 - 0.1*1 = 0.9
    # step 2: buf = 0.9*1 + 2 = 2.9; p = 0.9 - 0.1*2.9 = 0.61
    p, buf = run(SGDConfig(momentum=0.9, nesterov=False, weight_decay=0.0), [1.0], [[1.0], [2.0]], 0.1)
    np.testing.assert_allclose(p, [0.61])
    np.testing.assert_allclose(buf, [2.9])


def test_nesterov_two_steps_by_hand():
    # step 1: buf = 1; p = 1 - 0.1*(1 + 0.9*1) = 0.81
    # step 2: buf = 0.9 + 2 = 2.9; p = 0.81 - 0.1*(2 + 0.9*2.9) = 0.349
    p, buf = run(SGDConfig(momentum=0.9, nesterov=True, weight_decay=0.0), [1.0], [[1.0], [2.0]], 0.1)
    np.testing.assert_allclose(p, [0.349])
    np.testing.assert_allclose(buf, [2.9])


def test_weight_decay_and_mask():
    # d = g + wd*p = 0.5 + 0.1*2 = 0.7 where decayed, 0.5 where masked out; nesterov mu=0.5:
    # p -= lr*(d + 0.5*d) = 1.5*lr*d
    cfg = SGDConfig(momentum=0.5, nesterov=True, weight_decay=0.1)
    mask = np.array([1.0, 0.0])
    p, _ = run(cfg, [2.0, 2.0], [[0.5, 0.5]], 0.2, mask)
    np.testing.assert_allclose(p, [2.0 - 0.2 * 1.5 * 0.7, 2.0 - 0.2 * 1.5 * 0.5])
    # decay_bn_and_bias=True ignores the mask
    p, _ = run(SGDConfig(momentum=0.5, weight_decay=0.1, decay_bn_and_bias=True), [2.0, 2.0],
               [[0.5, 0.5]], 0.2, mask)
    np.testing.assert_allclose(p, [2.0 - 0.2 * 1.5 * 0.7] * 2)


def test_matches_pytorch_reference_formula_over_many_steps():
    rng = np.random.default_rng(0)
    p0, gs = rng.standard_normal(50), rng.standard_normal((7, 50))
    cfg = SGDConfig(momentum=0.9, nesterov=True, weight_decay=5e-4, decay_bn_and_bias=True)
    p, _ = run(cfg, p0, gs, 0.05)
    ref, buf = p0.copy(), np.zeros(50)
    for g in gs:                        # torch.optim.SGD's documented algorithm
        d = g + 5e-4 * ref
        buf = 0.9 * buf + d
        ref = ref - 0.05 * (d + 0.9 * buf)
    np.testing.assert_allclose(p, ref, rtol=1e-12)


@pytest.mark.parametrize("cfg", [SGDConfig(), SGDConfig(nesterov=False), SGDConfig(momentum=0.0),
                                 SGDConfig(decay_bn_and_bias=True), SGDConfig(weight_decay=0.0)])
def test_chunked_numpy_update_is_bitwise_the_whole_buffer_update(cfg, monkeypatch):
    """The NumPy update runs chunk by chunk (cache-sized); with the chunk larger than the buffer it
    is one pass per operation: the two give the same bits, a last chunk shorter than the others too."""
    import scalesgd.optim.sgd as sgd_mod
    rng = np.random.default_rng(0)
    p0, mask = rng.standard_normal(1000).astype(np.float32), (rng.random(1000) < 0.8).astype(np.float32)
    grads = [rng.standard_normal(1000).astype(np.float32) for _ in range(3)]
    out = []
    for chunk in (1 << 20, 96):                                      # one chunk; 10 full + 1 of 40
        monkeypatch.setattr(sgd_mod, "CHUNK", chunk)
        p = p0.copy()
        opt = SGD(p, cfg, None if cfg.decay_bn_and_bias else mask)
        for g in grads:
            opt.step(p, g, 0.1)
        out.append((p, opt.momentum))
    np.testing.assert_array_equal(out[0][0], out[1][0])
    np.testing.assert_array_equal(out[0][1], out[1][1])


def test_decay_mask_is_required_when_bn_and_bias_are_exempt():
    """Without the mask the flat buffer cannot tell BN gamma/beta from weights: refuse, don't decay them."""
    from scalesgd.nn.resnet import ResNet
    ps = ResNet("resnet20", 10, width=0.25, dtype="float64").ps
    with pytest.raises(ValueError, match="decay_bn_and_bias=False needs decay_mask"):
        SGD(ps.params, SGDConfig())
    with pytest.raises(ValueError, match="decay_mask has shape"):
        SGD(ps.params, SGDConfig(), ps.decay_mask()[:-1])
    SGD(ps.params, SGDConfig(weight_decay=0.0))                     # nothing to decay: no mask needed
    SGD(ps.params, SGDConfig(decay_bn_and_bias=True))               # decays everything, as documented
    # with the model's mask, a zero-gradient step decays conv weights but leaves BN gamma at 1
    p = ps.params.copy()
    SGD(p, SGDConfig(momentum=0.0, weight_decay=0.1), ps.decay_mask()).step(p, np.zeros_like(p), 1.0)
    views = ps.layout.views(p)
    assert np.all(views["bn1.weight"] == 1.0) and np.all(views["fc.bias"] == ps.p["fc.bias"])
    np.testing.assert_allclose(views["conv1.weight"], 0.9 * ps.p["conv1.weight"], rtol=1e-15)


def test_step_schedule_and_warmup():
    c = ScheduleConfig(lr=0.1, schedule="step", milestones=(30, 60), gamma=0.1, warmup_epochs=5,
                       warmup_start_factor=0.0)
    assert lr_at(c, 0.0, 256) == 0.0
    assert lr_at(c, 2.5, 256) == pytest.approx(0.05)
    assert lr_at(c, 5.0, 256) == pytest.approx(0.1)
    assert lr_at(c, 29.99, 256) == pytest.approx(0.1)
    assert lr_at(c, 30.0, 256) == pytest.approx(0.01)
    assert lr_at(c, 61.0, 256) == pytest.approx(0.001)


def test_cosine_and_linear_scaling():
    c = ScheduleConfig(lr=0.1, schedule="cosine", epochs=10, linear_scaling=True, reference_batch=256)
    assert lr_at(c, 0.0, 512) == pytest.approx(0.2)
    assert lr_at(c, 5.0, 512) == pytest.approx(0.1)
    assert lr_at(c, 10.0, 512) == pytest.approx(0.0, abs=1e-15)
    assert lr_at(c, 12.0, 512) == pytest.approx(0.0, abs=1e-15)
    assert lr_at(ScheduleConfig(lr=0.3, schedule="constant"), 99.0, 1) == 0.3
