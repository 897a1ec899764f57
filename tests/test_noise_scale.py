"""benchmarks/noise_scale.py: B_simple = tr(Sigma) / |G|^2 from per-batch gradients (McCandlish et
al. 2018, appendix A), checked against gradients of known noise, and measured end to end on the
checkpoints of a small virtual one-worker run."""
import math
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]

import noise_scale as N  # noqa: E402


def noisy(rng, n: int, dim: int, g2: float, sigma: float) -> np.ndarray:
    """n gradients: a true gradient of squared norm g2 plus isotropic noise (tr(Sigma) = dim sigma^2)."""
    g = np.zeros(dim)
    g[0] = math.sqrt(g2)
    return g + sigma * rng.standard_normal((n, dim))


def test_b_simple_recovers_a_known_noise_scale_and_its_interval_covers_it():
    """tr(Sigma_8) = 64 x 0.25 = 16 against |G|^2 = 0.05, which |mean|^2 overstates by tr / N =
    0.016 (so the correction matters: without it B_simple reads ~24% low): B_simple = 8 x 16 / 0.05
    = 2,560.  The point estimate lands near it; the jackknife's standard error matches the spread
    of the estimates over independent draws, and its 95% interval covers the truth in about 95 of 100
    draws (the draws are fixed: the count is too)."""
    rng = np.random.default_rng(0)
    truth, covered, inv, width = 2560.0, 0, [], []
    for _ in range(100):
        e = N.estimate(noisy(rng, 1024, 64, 0.05, 0.5), 8)
        inv.append(1 / e["b_simple"])
        covered += e["lo"] <= truth <= e["hi"]
        width.append(1 / e["lo"] - 1 / e["hi"])          # the interval of r = 1 / B_simple
        assert e["lo"] < e["b_simple"] < e["hi"]
    assert abs(np.median(inv) * truth - 1) < 0.05, 1 / np.median(inv)
    se = np.mean(width) / (2 * N.C.t975(N.GROUPS - 1))
    assert 0.8 < se / np.std(inv) < 1.25, (se, np.std(inv))
    assert 88 <= covered <= 99, covered
    e = N.estimate(noisy(rng, 1024, 64, 0.05, 0.5), 8)
    assert e["trace_sigma"] == pytest.approx(16, rel=0.05) and e["grad_sq"] == pytest.approx(0.05, rel=0.3)


def test_a_gradient_lost_in_its_noise_is_not_resolved():
    """|G|^2 = 0: no finite B_simple and no finite upper end in nearly every draw.  |G|^2 = 0.003
    against tr / N = 0.0625 (B_simple 42,667, far beyond what 256 gradients can place): mostly not
    resolved either, and the lower end stays below the truth (a lower bound, as a 95% one should)."""
    rng = np.random.default_rng(1)
    draws = [N.estimate(noisy(rng, 256, 64, 0.0, 0.5), 8) for _ in range(100)]
    assert sum(e["b_simple"] is not None for e in draws) <= 6
    assert all(e["hi"] == math.inf and e["lo"] > 0 for e in draws if e["b_simple"] is None)
    draws = [N.estimate(noisy(rng, 256, 64, 0.003, 0.5), 8) for _ in range(100)]
    assert sum(e["b_simple"] is None for e in draws) >= 80
    assert sum(e["lo"] <= 8 * 16 / 0.003 for e in draws) >= 93


def test_the_value_at_the_target_is_interpolated_at_the_first_crossing():
    pts = [dict(samples=s, val_error=v, b_simple=b, lo=b / 2, hi=b * 2)
           for s, v, b in ((100, 0.6, 100.0), (200, 0.5, 400.0), (300, 0.3, 800.0), (400, 0.45, 50.0))]
    t = N.at_target(pts, 0.40)
    assert t["samples"] == pytest.approx(250) and t["b_simple"] == pytest.approx(math.sqrt(400 * 800))
    assert t["lo"] == pytest.approx(t["b_simple"] / 2)
    assert N.at_target(pts[:2], 0.40) is None


def test_measured_on_the_checkpoints_of_a_virtual_one_worker_run(tmp_path):
    """A small glyphs set, one virtual worker with a checkpoint at each validation; each checkpoint's
    gradients are taken at its weights (the same batches give the same gradients, whatever came
    before: weights and BN state are set again for every batch), and each point carries the
    validation error of the run at its samples."""
    import glyphs  # noqa: PLC0415
    glyphs.build(tmp_path / "g", train=256, val=64, tune=16, shards=2)
    data = tmp_path / "g" / "main"
    run = tmp_path / "run"
    argv = N.train(run, data, "F0.05", 2, 0.5, 0, tree=ROOT)
    assert "--checkpoint-every" in argv and "--stop-at-error" not in argv
    pts = N.measure(run, data, 12)
    errs = N.history(run)
    assert [p["samples"] for p in pts] == sorted(errs) == [128, 256, 384, 512]
    assert all(p["val_error"] == errs[p["samples"]] and p["gradients"] == 12 for p in pts)
    from scalesgd.io import checkpoint as ckpt  # noqa: PLC0415
    from scalesgd.data.shards import ShardSet  # noqa: PLC0415
    cfg = N.V.build(N.V.load_toml(ROOT / "jobs" / "glyphs.toml"))
    shards = ShardSet.open(data, "train")
    _, arrays, _ = ckpt.read_rank(ckpt.listing(ckpt.checkpoint_dir(run))[-1], 0)
    a = N.gradients(cfg, shards, arrays["params"], arrays["buffers"], 6, epoch=1000)
    b = N.gradients(cfg, shards, arrays["params"], arrays["buffers"], 3, epoch=1000)
    assert np.array_equal(a[:3], b) and not np.array_equal(a[0], a[1]) and np.isfinite(a).all()
    # the third gradient is a fresh model's, at the checkpoint's weights, on the third batch alone
    from scalesgd.data.pipeline import Loader  # noqa: PLC0415
    from scalesgd.nn.kernels import Kernels  # noqa: PLC0415
    from scalesgd.nn.resnet import ResNet  # noqa: PLC0415
    m, d = cfg.model, cfg.data
    fresh = ResNet(m.model, shards.num_classes, m.width, m.zero_init_residual, np, m.dtype, seed=7,
                   conv_algo=m.conv_algo, kernels=Kernels(m.kernels))
    fresh.ps.params[...] = arrays["params"]
    with Loader(shards, train=True, augment=d.augment, scale=d.scale, flip=d.flip, batch_size=d.batch_size,
                image_size=d.image_size, mean=d.mean, std=d.std, seed=cfg.train.seed) as loader:
        x, y = [xy for _, xy in zip(range(3), loader.epoch(1000))][-1]
        N.train_step(fresh, x, y)
    assert np.array_equal(fresh.ps.grads, a[2])


def test_the_study_reads_p_against_the_measured_b_simple(tmp_path):
    """crossover.report: the workload's ImageNet GPUs are read from the fitted B_noise where it is
    resolved, else from the measured B_simple at the target (its range near the target kept beside
    it), else from the fit's lower bound (at most)."""
    import json  # noqa: PLC0415
    from crossover import report as R  # noqa: PLC0415
    pts = [dict(samples=s, val_error=v, b_simple=b, lo=b * 0.9, hi=b * 1.1, gradients=64)
           for s, v, b in ((100, 0.6, 200.0), (200, 0.43, 300.0), (300, 0.38, 500.0), (400, 0.2, 900.0))]
    f = tmp_path / "noise-scale.json"
    f.write_text(json.dumps(dict(points=pts, target=0.40, at_target=N.at_target(pts, 0.40), config="F0.05",
                                 seed=0, batch=8, same_as_study_run=dict(validations=3, equal=True))))
    m = R.measured_noise(f)
    assert m["near"] == dict(low=300.0, high=500.0, errors=[0.38, 0.43], checkpoints=2, unresolved=0)
    assert m["along"] == [200.0, 900.0] and m["unresolved"] == 0
    assert m["b_simple"] == pytest.approx(math.exp(0.4 * math.log(300) + 0.6 * math.log(500)))
    w = R.workload(dict(measured=m, b_noise=None, b_noise_lo=744.0))
    assert w["source"] == "measured" and not w["bound"]
    assert w["factor"] == pytest.approx(8 / m["b_simple"] * R.IMAGENET_B_NOISE / R.IMAGENET_BATCH_PER_GPU)
    w = R.workload(dict(measured=m, b_noise=800.0, b_noise_lo=600.0))
    assert w["source"] == "fit" and not w["bound"] and w["factor"] == pytest.approx(8 / 800 * 10_000 / 32)
    w = R.workload(dict(measured=None, b_noise=None, b_noise_lo=744.0))
    assert w["source"] == "fit" and w["bound"] == "at most" \
        and w["factor"] == pytest.approx(8 / 744 * 10_000 / 32)
    assert R.measured_noise(tmp_path / "none.json") is None
    # another seed's run (same configuration) joins the mean; one of another configuration does not
    b0 = m["b_simple"]
    for seed, config, b in ((1, "F0.05", 300.0), (2, "F0.1", 900.0)):
        (tmp_path / f"noise-scale-s{seed}.json").write_text(json.dumps(dict(
            config=config, seed=seed, at_target=dict(samples=250.0, b_simple=b, lo=b * 0.9, hi=b * 1.1))))
    m = R.measured_noise(f)
    assert [e["seed"] for e in m["seeds"]] == [0, 1] and m["seeds"][1]["lo"] == pytest.approx(270.0)
    assert m["b_simple"] == pytest.approx((b0 + 300.0) / 2) and m["near"]["checkpoints"] == 2
