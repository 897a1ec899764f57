"""The start-up self-check of the fast paths (fastpaths/) on CPU: the framework with components
that are plain NumPy functions (right, wrong, raising, NaN, misshapen), the real builders with a
deliberately broken fused kernel and a deliberately wrong conv engine on a real ResNet-20, the
decode check's reference, ranks agreeing under mpiexec, and a NumPy run having nothing to check."""
import json
import logging
import types

import cuda_host
import numpy as np
import pytest

from helpers import run_cli
from mpirun import check as check_mpi
from mpirun import run_mpi, uses_mpi
from scalesgd import config as C
from scalesgd import fastpaths as F
from scalesgd.backend import Backend
from scalesgd.errors import BackendError, UserError
from scalesgd.nn import kernels as K
from scalesgd.nn import layers as L
from scalesgd.nn.resnet import ResNet
from scalesgd.train.step import train_step

NUMPY = Backend(np, "numpy", None)


def fake(name, run, disabled, tol=1e-6):
    """A component on NumPy: ``run`` against the reference x**2 of a fixed x; ``disable`` records."""
    x = np.linspace(-1, 2, 17)
    return F.Component(name, lambda: run(x), lambda: x ** 2, tol, f"the reference of {name}",
                       lambda: disabled.append(name), ("y",))


def fakes(disabled, calls=None):
    def ran(fn):
        return lambda x: (calls.append(1) if calls is not None else None, fn(x))[1]
    return [fake("right", ran(lambda x: x * x), disabled),
            fake("wrong", ran(lambda x: x ** 2 * 1.01), disabled),
            fake("raising", ran(lambda x: 1 / 0), disabled),
            fake("nan", ran(lambda x: np.where(x > 0, np.nan, x * x)), disabled),
            fake("misshapen", ran(lambda x: (x ** 2)[:-1]), disabled)]


def test_auto_turns_each_failure_off_with_one_line(caplog):
    disabled = []
    with caplog.at_level(logging.INFO, logger="scalesgd"):
        report = F.Report("auto")
        out = F.validate(fakes(disabled), "auto", report=report)
    assert disabled == ["wrong", "raising", "nan", "misshapen"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 4
    for name, words in [("wrong", "y: relative error 1.00e-02 > tolerance 1e-06"),
                        ("raising", "ZeroDivisionError: division by zero"),
                        ("nan", "y: 11 non-finite values"), ("misshapen", "y: shape (16,)")]:
        line = next(w for w in warnings if f"fast path {name} " in w)
        assert words in line and f"using the reference of {name} instead" in line, line
        assert out[name]["status"] == "fell back" and words in out[name]["error"]
    assert out["right"]["status"] == "used" and out["right"]["rel_error"] < 1e-15
    rep = report.to_dict()
    assert rep["mode"] == "auto" and rep["seconds"] > 0 and set(rep["components"]) == set(out)
    assert rep["components"]["wrong"]["fallback"] == "the reference of wrong"
    assert rep == json.loads(json.dumps(rep, allow_nan=False))        # summary.json-ready


def test_the_reference_runs_even_when_the_fast_path_raises():
    """For a collective component (the all-reduce transport) the reference is a collective too:
    a rank whose fast path raised must still enter it, or the ranks' collectives stop matching."""
    refs, disabled = [], []
    x = np.linspace(-1, 2, 17)
    c = F.Component("raising", lambda: 1 / 0, lambda: (refs.append(1), x ** 2)[1], 1e-6, "the reference",
                    lambda: disabled.append("raising"), ("y",))
    out = F.validate([c], "auto", speak=False)
    assert refs == [1] and disabled == ["raising"]
    assert "ZeroDivisionError" in out["raising"]["error"]


def test_strict_fails_the_run_with_one_line_and_turns_nothing_off():
    disabled = []
    with pytest.raises(BackendError) as info:
        F.validate(fakes(disabled), "strict")
    msg = str(info.value)
    assert isinstance(info.value, UserError) and "\n" not in msg
    assert msg.startswith("model.fast_paths = strict: fast path wrong failed its start-up check (y: relative")
    assert "3 more failed: raising, nan, misshapen" in msg and "--fast-paths auto would use" in msg
    assert disabled == []
    assert F.validate(fakes(disabled)[:1], "strict")["right"]["status"] == "used"   # all good: runs


def test_a_strict_failure_keeps_every_components_evidence():
    """The raised error carries the report: every component's status, relative error and seconds,
    and the failed ones' errors (the strict self-check of a GPU run is what collects the per-tensor
    evidence; before, the report was empty once strict raised)."""
    report = F.Report("strict")
    with pytest.raises(BackendError) as info:
        F.validate(fakes([]), "strict", report=report)
    got = info.value.report.to_dict()["components"]
    assert info.value.report is report and set(got) == {"right", "wrong", "raising", "nan", "misshapen"}
    assert got["right"]["status"] == "passed" and got["right"]["rel_error"] < 1e-6
    assert got["wrong"]["status"] == "failed" and got["wrong"]["rel_error"] > 1e-3
    assert got["wrong"]["error"].startswith("y: relative") and got["raising"]["error"]
    assert all("seconds" in v and v["fallback"] for v in got.values())
    assert BackendError("x").report is None                   # (any other BackendError: none)


def test_off_runs_nothing_and_uses_only_references():
    disabled, calls = [], []
    report = F.Report("off")
    out = F.validate(fakes(disabled, calls), "off", report=report)
    assert calls == [] and len(disabled) == 5
    assert all(v == {"status": "off", "fallback": f"the reference of {k}"} for k, v in out.items())
    assert report.to_dict() == {"mode": "off", "seconds": 0.0, "gflops": 0.0, "components": out}
    with pytest.raises(ValueError, match="model.fast_paths"):
        F.validate([], "fast")


def test_a_numpy_run_has_nothing_to_check_and_spends_no_time():
    model = ResNet("resnet20", 10, 0.25)
    cfg = C.build(None, {})
    assert cfg.model.fast_paths == "auto"
    assert F.components(model, NUMPY, cfg, (), None) == []
    # several ranks with train.device = cpu: not even an agreement (comm=None would fail if used)
    topo = types.SimpleNamespace(size=4, comm=None, is_root=True)
    cfg = C.build(None, {"train": {"device": "cpu"}})
    assert F.check(cfg, topo, model, NUMPY).to_dict() == {"mode": "auto", "seconds": 0.0, "gflops": 0.0,
                                                          "components": {}}


# ----------------------------------------------------------------------------- the real builders
def test_a_broken_fused_kernel_is_detected_and_its_twin_runs():
    def add_without_relu(h, s):
        h += s
        return h
    kernels = K.Kernels()
    comps = F.kernel_components(kernels, np, ("float32",), "float32", fast={"add_relu": add_without_relu})
    assert [c.name for c in comps] == [
        "kernel bn_apply (float32)", "kernel bn_apply (float32, nan)", "kernel add_relu (float32)",
        "kernel add_relu (float32, nan)", "kernel sgd_update (float32)", "kernel sgd_update (float32, nan)",
        "kernel sgd_update (float32, no mask)", "kernel sgd_update (float32, no momentum)"]
    out = F.validate(comps, "auto")
    assert out["kernel add_relu (float32)"]["status"] == "fell back"
    assert "h: relative error" in out["kernel add_relu (float32)"]["error"]
    assert out["kernel bn_apply (float32)"]["status"] == "used"
    assert kernels.disabled == {("add_relu", "float32")}
    assert K.Kernels().disabled == frozenset()   # a new run starts with every kernel on
    # model.kernels = reference: nothing fused to check
    assert F.kernel_components(K.Kernels("reference"), np) == []


@pytest.mark.skipif(cuda_host.available() is not None, reason=str(cuda_host.available()))
def test_the_self_check_passes_the_real_cuda_kernels_built_for_the_host():
    """The start-up check's kernel components, run on the CUDA source itself (tests/cuda_host.py),
    at the tolerances a run uses: every kernel is kept."""
    kernels = K.Kernels()
    comps = F.kernel_components(kernels, np, ("float32", "float64"), "float32", fast=cuda_host.FAST)
    out = F.validate(comps, "strict")
    assert len(out) == 12 and all(v["status"] == "used" for v in out.values()), out
    assert kernels.disabled == frozenset()


def test_the_self_check_catches_a_kernel_that_turns_nan_into_a_number():
    """Issue 25, deliverable 3: NaN propagation.  The old fused add_relu (``v > 0 ? v : 0``, finding
    4) passed the check on finite inputs and turned a NaN into 0, hiding a diverging run; the
    ``nan`` case fails it (and a kernel that ignores its branches fails ``no mask``)."""
    def add_relu_nan_to_zero(h, s):
        h += s
        h[...] = np.where(h > 0, h, 0)            # NaN > 0 is false: NaN becomes 0
        return h

    def sgd_ignoring_no_mask(p, g, buf, mask, lr, mu, wd, nesterov):
        return K.sgd_update_ref(p, g, buf, np.zeros_like(p) if mask is None else mask, lr, mu, wd, nesterov)
    kernels = K.Kernels()
    comps = F.kernel_components(kernels, np, ("float32",), "float32",
                                fast={"add_relu": add_relu_nan_to_zero, "sgd_update": sgd_ignoring_no_mask})
    out = F.validate(comps, "auto")
    assert out["kernel add_relu (float32)"]["status"] == "used"
    assert out["kernel add_relu (float32, nan)"]["status"] == "fell back"
    assert "where the reference has NaN" in out["kernel add_relu (float32, nan)"]["error"]
    assert out["kernel sgd_update (float32, no mask)"]["status"] == "fell back"
    assert [k for k, v in out.items() if v["status"] != "used"] == [
        "kernel add_relu (float32, nan)", "kernel sgd_update (float32, no mask)"]


def test_a_kernel_failing_in_one_dtype_stays_on_in_the_others(monkeypatch):
    """Issue 25, finding 9: ``disable`` worked per kernel name, so a kernel failing its bf16 check
    also turned off its float32 twin that passed.  Here add_relu is broken for float64 only."""
    def add_relu(h, s):
        h += s
        if h.dtype == np.float64:
            return h                              # no ReLU: wrong
        return np.maximum(h, 0, out=h)
    kernels = K.Kernels()
    comps = F.kernel_components(kernels, np, ("float32", "float64"), "float32", fast={"add_relu": add_relu})
    out = F.validate(comps, "auto")
    assert out["kernel add_relu (float64)"]["status"] == "fell back"
    assert out["kernel add_relu (float32)"]["status"] == "used"
    assert kernels.disabled == {("add_relu", "float64")}
    monkeypatch.setattr(K, "get_array_module", lambda *a: None)   # as CuPy arrays would
    assert kernels.use_fast(np.ones(3, np.float32), kernel="add_relu")
    assert not kernels.use_fast(np.ones(3, np.float64), kernel="add_relu")
    assert kernels.use_fast(np.ones(3, np.float64), kernel="bn_apply")


class TwinEngine:
    """The CudnnEngine interface computed by the xp layers (what cuDNN must compute), except that
    ``broken(w_shape, stride)`` convolutions return a wrong weight gradient."""

    xp, io_dtype, precision = np, np.float32, "fp32"

    def __init__(self, broken=lambda w_shape, stride: False):
        self.broken = broken

    def conv_forward(self, mod, x, train):
        return L.conv2d_forward(x, mod.w, mod.stride, mod.pad)

    def conv_backward(self, mod, dout, cache, need_dx):
        dx = L.conv2d_backward(dout, cache, mod.dw, need_dx)
        if self.broken(mod.w.shape, mod.stride):
            mod.dw[...] = mod.dw[::-1]
        return dx

    def bn_forward(self, mod, x, train):
        y, cache = L.batchnorm_forward(x, mod.gamma, mod.beta, mod.rmean, mod.rvar, train)
        if mod.relu:
            y = np.maximum(y, 0)
        return y, (cache, y if mod.relu else None)

    def bn_backward(self, mod, dout, cache):
        cache, relu_out = cache
        if relu_out is not None:
            dout = dout * (relu_out > 0)
        return L.batchnorm_backward(dout, cache, mod.dgamma, mod.dbeta)


def test_model_layers_match_the_shapes_a_forward_sees():
    model = ResNet("resnet18", 10, 0.125, seed=0)
    seen, seen_bn = [], []

    class Recorder(TwinEngine):
        def conv_forward(self, mod, x, train):
            seen.append((x.shape, mod.w.shape, mod.stride, mod.pad))
            return super().conv_forward(mod, x, train)

        def bn_forward(self, mod, x, train):
            seen_bn.append((x.shape, mod.relu))
            return super().bn_forward(mod, x, train)
    model.set_engine(Recorder())
    logits, _ = model.forward(np.zeros((2, 40, 40, 3), np.float32), False)
    convs, bns = F.model_layers(model, 2, 40)
    assert list(convs) == list(dict.fromkeys(seen)) and sum(map(len, convs.values())) == len(seen) == 20
    assert list(bns) == list(dict.fromkeys(seen_bn)) and sum(map(len, bns.values())) == len(seen_bn) == 20
    assert ((2, 10, 10, 8), True) in bns                                           # after the max-pool
    head, head_in = model.layer_inputs(2, 40)[-1]
    assert head is model.net.mods[-1] and head_in[3] == head.cin and logits.shape == (2, 10)


def test_a_wrong_conv_engine_falls_back_per_geometry_and_the_model_still_trains():
    """ResNet-20's stride-2 3x3 convolutions get a wrong dW from the engine: exactly those layers
    go back to the xp layers, every other layer keeps the engine, and a training step then gives
    the gradients of the plain model."""
    model, plain = ResNet("resnet20", 10, 0.25, seed=0), ResNet("resnet20", 10, 0.25, seed=0)
    model.set_engine(TwinEngine(lambda w, stride: stride == 2 and w[0] == 3))
    comps = F.cudnn_components(model, model.stem_conv.engine, 16)
    out = F.validate(comps, "auto")
    bad = {k for k, v in out.items() if v["status"] == "fell back"}
    assert bad == {"cudnn conv 3x3/s2 4->8 at 16x16", "cudnn conv 3x3/s2 8->16 at 8x8"}
    assert all("dw: relative error" in out[k]["error"] for k in bad)
    assert len(comps) == 8 + 6 and all(v["rel_error"] < 1e-6 for k, v in out.items() if k not in bad)
    convs, _ = F.model_layers(model, 2, 16)
    for (xs, ws, stride, pad), mods in convs.items():
        assert all((m.engine is None) == (stride == 2 and ws[0] == 3) for m in mods)
    x, y = np.random.default_rng(0).standard_normal((4, 16, 16, 3)).astype(np.float32), np.arange(4)
    train_step(model, x, y)
    train_step(plain, x, y)
    np.testing.assert_allclose(model.ps.grads, plain.ps.grads, rtol=1e-5, atol=1e-6)


def test_a_gpu_runs_registry_and_check(caplog):
    """What ``check`` does on a GPU, with NumPy stand-ins for the device (a backend that says GPU, the
    twin engine): every cuDNN geometry and BN shape and each fused kernel is checked, all are used,
    rank 0 says how long it took, and the report holds each one."""
    model = ResNet("resnet20", 10, 0.25, seed=0)
    model.set_engine(TwinEngine())
    cfg = C.build(None, {"data": {"image_size": 16, "scale": [16.0, 20.0]}})
    gpu = types.SimpleNamespace(is_gpu=True, xp=np)
    topo = types.SimpleNamespace(size=1, comm=None, is_root=True)
    with caplog.at_level(logging.INFO, logger="scalesgd"):
        rep = F.check(cfg, topo, model, gpu, (None, None), None).to_dict()
    # 8 conv geometries, 6 BN shapes, 8 kernel cases, then the whole model: one training step
    assert len(rep["components"]) == 8 + 6 + 8 + 1 and rep["seconds"] > 0 and rep["gflops"] > 0
    assert all(v["status"] == "used" for v in rep["components"].values())
    tally = [r.getMessage() for r in caplog.records if r.getMessage().startswith("fast paths: ")]
    assert len(tally) == 1 and tally[0].startswith("fast paths: 23 checked against their references in ")
    assert all(m.engine is not None for ms in F.model_layers(model, 2, 16)[0].values() for m in ms)


class StaleShadowEngine:
    """Builds the real CudnnEngine on the cuDNN stand-in, with finding 1 put back: an evaluation
    forward reuses the KRSC weight copy of the last training forward."""

    @staticmethod
    def make(model):
        import cudnn_stub
        from scalesgd.nn import cudnn_conv as CC

        class Stale(CC.CudnnEngine):
            def conv_forward(self, mod, x, train):
                if train or getattr(mod, "_krsc", None) is None:
                    return super().conv_forward(mod, x, train)
                live, mod.w = mod.w, mod._krsc.transpose(1, 2, 3, 0)   # the copy, not the weights
                try:
                    return super().conv_forward(mod, x, train)
                finally:
                    mod.w = live
        return Stale(cudnn_stub.module(), cudnn_stub.HostXP(), "fp32", model.kernels)


@pytest.mark.parametrize("stale", [False, True])
def test_the_whole_model_check_catches_stale_weights_and_leaves_the_model_as_it_was(stale, tmp_path):
    """Issue 25, deliverable 3: after the per-part checks, the whole model runs as the run uses it,
    on the real CudnnEngine (cuDNN stand-in, tests/cudnn_stub.py): a training step at the training
    batch after an update in place, and each evaluation batch (here 10 full and 3 partial rows)
    after another model was loaded into the flat buffers.  The engine with finding 1 put back passes
    every per-layer check (fresh weights each time) and fails "load then evaluate"; the whole model
    then falls back.  Either way the check leaves params, buffers, gradients and the grad hook as
    they were, and no all-reduce hook fires during it."""
    import cudnn_stub
    from synth import make_dataset
    from scalesgd.data.pipeline import Loader
    from scalesgd.data.shards import ShardSet
    from scalesgd.nn import cudnn_conv as CC
    model = ResNet("resnet8", 10, 0.25, seed=0)
    model.set_engine(StaleShadowEngine.make(model) if stale else
                     CC.CudnnEngine(cudnn_stub.module(), cudnn_stub.HostXP(), "fp32", model.kernels))
    hooked = []
    model.set_grad_hook(hooked.append)
    before = [a.copy() for a in (model.ps.params, model.ps.buffers, model.ps.grads)]
    val = Loader(ShardSet.open(make_dataset(tmp_path / "d", n=4, n_val=13, size=12), "val"),
                 batch_size=10, image_size=8, train=False)
    assert F.run_batches(C.build(None, {"data": {"batch_size": 6}}), (None, val)) == (6, [3, 10])
    cfg = C.build(None, {"data": {"image_size": 8, "batch_size": 6, "scale": [8.0, 10.0]}})
    gpu = types.SimpleNamespace(is_gpu=True, xp=cudnn_stub.HostXP())
    topo = types.SimpleNamespace(size=1, comm=None, is_root=True)
    rep = F.check(cfg, topo, model, gpu, (None, val), None).to_dict()["components"]
    whole = {k: v for k, v in rep.items() if k.startswith("model ")}
    assert list(whole) == ["model train step after an update (6 rows)",
                           "model evaluation after loading another model (3 rows)",
                           "model evaluation after loading another model (10 rows)"]
    per_part = [v["status"] for k, v in rep.items() if not k.startswith("model ")]
    assert per_part and set(per_part) == {"used"}
    statuses = [v["status"] for v in whole.values()]
    if stale:
        assert statuses == ["used", "fell back", "fell back"], whole
        assert whole["model evaluation after loading another model (3 rows)"]["rel_error"] > 0.1
        assert model.stem_conv.engine is None and model.kernels.disabled == set(K.KERNEL_NAMES)
    else:
        assert statuses == ["used"] * 3, whole
        assert max(v["rel_error"] for v in whole.values()) < 1e-4
        assert model.stem_conv.engine is not None
    for a, b in zip((model.ps.params, model.ps.buffers, model.ps.grads), before):
        np.testing.assert_array_equal(a, b)
    assert hooked == []
    x, y = np.random.default_rng(0).standard_normal((2, 8, 8, 3)).astype(np.float32), np.arange(2)
    train_step(model, x, y)
    assert hooked, "the run's grad hook is back"


def test_a_measured_floor_lifts_the_tolerance_to_the_references_own_rounding_noise():
    """An ill-conditioned float32 computation (values 1 +- 1e-5, centred): another rounding
    history, here the same code on inputs moved by other ulps, differs from the reference by ~1e-2,
    far over a fixed 1e-4, and so would any correct float32 implementation.  The fixed tolerance
    fails; then the floor (the reference on inputs moved by one ulp) raises it to FLOOR_FACTOR times
    that noise, it is recorded, and the sound path passes; a path 1.5x off still fails above it.
    A floor beyond FLOOR_CAP leaves the output unjudged (reported), but a non-finite one still fails;
    a floor that raises fails the component with both reasons."""
    rng = np.random.default_rng(0)
    x = (1 + 1e-5 * rng.standard_normal(100_000)).astype(np.float32)
    a, b = (rng.choice([-1.0, 1.0], x.size) for _ in range(2))

    def centred(signs=None, scale=1.0):
        v = x if signs is None else (x * (1 + F.ULP * signs)).astype(np.float32)
        return np.float32(scale) * (v - np.float32(v.sum(dtype=np.float32) / np.float32(v.size)))

    def comp(name, fast, floor):
        return F.Component(name, fast, centred, 1e-4, "the reference", lambda: None, ("y",),
                           floor=floor)

    def broken():
        raise RuntimeError("no memory")
    nan = centred(b)
    nan[3] = np.nan
    out = F.validate([comp("fixed", lambda: centred(b), None),
                      comp("floored", lambda: centred(b), lambda: centred(a)),
                      comp("wrong", lambda: centred(b, 1.5), lambda: centred(a)),
                      comp("unjudged", lambda: centred(b, 1.5), lambda: -centred()),
                      comp("unjudged nan", lambda: nan, lambda: -centred()),
                      comp("no floor", lambda: centred(b), broken)], "auto", speak=False)
    assert out["fixed"]["status"] == "fell back" and 5e-3 < out["fixed"]["rel_error"] < 5e-2, out
    assert "tolerance" not in out["fixed"]
    assert out["floored"]["status"] == "used" and out["floored"]["inconclusive"] == [], out
    tol = out["floored"]["tolerance"]["y"]
    assert F.FLOOR_FACTOR * 5e-3 < tol < F.FLOOR_FACTOR * 5e-2 and out["floored"]["rel_error"] < tol
    assert out["wrong"]["status"] == "fell back" and "> tolerance" in out["wrong"]["error"], out
    assert out["unjudged"]["status"] == "used" and out["unjudged"]["inconclusive"] == ["y"], out
    assert out["unjudged nan"]["status"] == "fell back" and "non-finite" in out["unjudged nan"]["error"]
    assert out["no floor"]["status"] == "fell back", out
    assert "its floor could not be measured: RuntimeError: no memory" in out["no floor"]["error"]


class WrongGrads:
    """The real CudnnEngine on the cuDNN stand-in, with one conv's weight gradient 1.5x too large
    (``conv``) or one BN's bias gradient zeroed (``bn``), by the tensor's name."""

    @staticmethod
    def make(model, precision="fp32", conv=None, bn=None):
        import cudnn_stub
        from scalesgd.nn import cudnn_conv as CC

        class Wrong(CC.CudnnEngine):
            def conv_backward(self, mod, dout, cache, need_dx):
                dx = super().conv_backward(mod, dout, cache, need_dx)
                if mod.param_names[0] == conv:
                    mod.dw *= 1.5
                return dx

            def bn_backward(self, mod, dout, cache):
                dx = super().bn_backward(mod, dout, cache)
                if bn in mod.param_names:
                    mod.dbeta[...] = 0
                return dx
        return Wrong(cudnn_stub.module(), cudnn_stub.HostXP(), precision, model.kernels)


def _train_component(model):
    import cudnn_stub
    cfg = C.build(None, {"data": {"image_size": 8, "batch_size": 6, "scale": [8.0, 10.0]}})
    (step,) = [c for c in F.model_components(model,
                                             types.SimpleNamespace(is_gpu=True, xp=cudnn_stub.HostXP()), cfg)
               if c.name.startswith("model train step")]
    return step


@pytest.mark.parametrize("precision", ["fp32", "tf32"])
def test_the_floor_moves_the_images_by_the_precisions_rounding_unit(precision, monkeypatch):
    """The whole-model step's floor runs only when its fixed tolerance fails, on the images moved
    by the engine's rounding unit (one float32 ulp; TF32's unit roundoff 2^-11); the run and the
    reference see the images as they are."""
    from scalesgd.fastpaths import parts as P
    seen, real = [], P._train_after_update
    monkeypatch.setattr(P, "_train_after_update",
                        lambda *a, **k: seen.append(k.get("move", 0.0)) or real(*a, **k))
    model = ResNet("resnet8", 10, 0.25, seed=0)
    model.set_engine(WrongGrads.make(model, precision))            # nothing wrong: passes at once
    step = _train_component(model)
    assert F.validate([step], "auto", speak=False)[step.name]["status"] == "used" and seen == [0.0, 0.0]
    seen.clear()
    model.set_engine(WrongGrads.make(model, precision, conv="layer2.0.conv1.weight"))
    out = F.validate([_train_component(model)], "auto", speak=False)
    assert seen == [0.0, 0.0, F.MOVE[precision]] and F.MOVE["tf32"] == 2.0 ** -11, out


def test_a_failed_whole_model_step_names_the_tensor_even_under_a_large_floor(monkeypatch):
    """The first GPU run (H200, 2026-12-04) failed the whole-model training step on gradients
    alone while every per-part check passed; the step is now judged per tensor, each against its
    own floor.  One conv's weight gradient 1.5x too large fails and is named.  So is one BN's bias
    gradient left at zero, under images moved 2^-6 for the floor: a noise that leaves the first
    layers unjudgeable (reported) and lifts that bias's own tolerance to ~0.5, still under the 1.0
    of a zero."""
    model = ResNet("resnet8", 10, 0.25, seed=0)
    model.set_engine(WrongGrads.make(model, conv="layer2.0.conv1.weight"))
    step = _train_component(model)
    assert step.outputs[:2] == ("logits", "conv1.weight") and len(step.outputs) == 30
    out = F.validate([step], "auto", speak=False)[step.name]
    assert out["status"] == "fell back" and out["inconclusive"] == [], out
    assert out["error"].startswith("layer2.0.conv1.weight: relative error 5.0"), out["error"]

    monkeypatch.setitem(F.MOVE, "fp32", 2.0 ** -6)
    model = ResNet("resnet8", 10, 0.25, seed=0)
    model.set_engine(WrongGrads.make(model, bn="layer3.0.bn2.bias"))
    out = F.validate([_train_component(model)], "auto", speak=False)
    step_out = next(iter(out.values()))
    assert step_out["status"] == "fell back", step_out
    assert "layer3.0.bn2.bias: relative error 1.00e+00" in step_out["error"], step_out["error"]
    assert "conv1.weight" in step_out["inconclusive"] and "layer3.0.bn2.bias" not in step_out["inconclusive"]
    assert 0.1 < step_out["tolerance"]["layer3.0.bn2.bias"] <= F.FLOOR_CAP


def test_the_transport_check_runs_with_device_work_in_flight(monkeypatch):
    """Issue 25, deliverable 3: the transport is checked on a buffer whose values are still being
    written by queued device work (tests/device_double.py).  A transport that copies a bucket on
    its side stream without waiting for the compute stream reads what was there before (zeros) and
    fails; the host transport, which waits for the compute stream's event, passes."""
    import device_double
    from mpi4py import MPI
    from scalesgd.comm.mpi.buckets import BucketedAllreduce
    from scalesgd.comm.mpi.transport import MPITransport
    from scalesgd.nn.params import Layout, TensorSpec
    cp = device_double.install(monkeypatch)

    class Sound(BucketedAllreduce):
        transport = "sound"

    class NoWait(BucketedAllreduce):
        transport = "no wait"

        def _copy_down(self, lo, hi):
            if self._side is None:
                self._side = cp.cuda.Stream(non_blocking=True)
            self.flat[lo:hi].get(stream=self._side, out=self.buf[lo:hi], blocking=False)
            landed = cp.cuda.Event()
            landed.record(self._side)
            return landed
    lay = Layout([TensorSpec("g", (64,))])
    for cls, status in ((Sound, "used"), (NoWait, "fell back")):
        fell = []
        gradients = types.SimpleNamespace(engine=cls(MPI.COMM_SELF, cp.ndarray(np.zeros(64, np.float32)),
                                                     lay, 64, True),
                                          group=MPITransport(MPI.COMM_SELF),
                                          use_host_transport=lambda: fell.append(1))
        (comp,) = F.transport_components(gradients)
        out = F.validate([comp], "auto")[comp.name]
        assert out["status"] == status, out
        assert bool(fell) is (status == "fell back")


def test_decode_check_reference_and_fallback(tmp_path):
    """The decode component of a GPU loader: its reference (DALI CPU decode of the crops) runs here,
    and falling back makes every GPU loader decode on the CPU (the pipeline is built lazily, so
    nothing of the GPU runs); a CPU loader has nothing to check."""
    from synth import make_dataset
    from scalesgd.data.pipeline import Loader
    from scalesgd.data.shards import ShardSet
    shards = ShardSet.open(make_dataset(tmp_path / "d", n=12, size=24, bad=0), "train")
    args = dict(batch_size=4, image_size=16, train=True)
    gpu, cpu = Loader(shards, device_id=0, **args), Loader(shards, **args)
    assert F.decode_components([cpu, None]) == []
    (comp,) = F.decode_components([gpu, cpu])
    assert comp.name == "dali mixed decode" and gpu.decoder == "mixed" and cpu.decoder == "cpu"
    crops = comp.reference()
    assert len(crops) == F.DECODE_SAMPLES and all(c.shape == (12, 18, 3) for c in crops)  # bad 0 skipped
    comp.disable()
    assert gpu.cpu_decode and gpu.decoder == "cpu"


# ----------------------------------------------------------------------------- ranks and the command line
@uses_mpi
def test_ranks_agree_and_a_broken_transport_falls_back_to_host():
    out = check_mpi(run_mpi(2, ["tests/mpi/fastpaths_check.py"], timeout=120))
    for name in ("a_failure_on_one_rank_is_turned_off_on_every_rank", "strict_fails_every_rank_alike",
                 "a_broken_transport_falls_back_to_host", "a_sound_transport_is_used",
                 "a_numpy_run_only_agrees"):
        assert f"{name}: ok" in out, out


def test_fast_paths_flag(tmp_path):
    assert C.build(None, {"model": {"fast_paths": "off"}}).model.fast_paths == "off"
    proc = run_cli(["--dry-run", "--fast-paths", "sometimes"], tmp_path)
    assert proc.returncode == 2 and "model.fast_paths: expected one of auto, strict, off" in proc.stderr


def test_a_host_reducer_of_two_levels_has_nothing_to_check():
    """All-reduce with ``--hierarchy node`` sums through ``TwoLevelAllreduce``, whose transport is
    "host (two-level)": host MPI, the reference itself, so no component (found by review: it was
    checked against a two-level reducer built without its node groups, which raised)."""
    for name in ("host", "host (two-level)"):
        gradients = types.SimpleNamespace(engine=types.SimpleNamespace(transport=name))
        assert F.transport_components(gradients) == []
    assert F.transport_components(None) == []
