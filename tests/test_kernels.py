"""Fused kernels' reference twins vs the unfused layers/optimizer; CUDA sources compile with nvcc;
cuDNN graph construction (shapes, strides, keys, call sequence) against a fake ``cudnn`` module."""
import shutil
import subprocess
import sys
import types

import numpy as np
import pytest

import cuda_host
import cudnn_stub
from scalesgd.nn import cudnn_checks as CK
from scalesgd.nn import cudnn_conv as CC
from scalesgd.nn import kernels as K
from scalesgd.nn import layers as L
from scalesgd.optim.sgd import SGD, SGDConfig

DTYPES = ["float32", "float64"]
TOL = {"float32": 2e-5, "float64": 1e-12}


@pytest.fixture
def rng():
    return np.random.default_rng(7)


@pytest.mark.parametrize("dt", DTYPES)
def test_bn_apply_matches_batchnorm_relu(rng, dt):
    x = (rng.standard_normal((3, 5, 4, 6)) * 2 + 0.3).astype(dt)
    gamma, beta = rng.standard_normal(6).astype(dt), rng.standard_normal(6).astype(dt)
    ref, cache = L.batchnorm_forward(x, gamma, beta, np.zeros(6, dt), np.ones(6, dt), True)
    ref, _ = L.relu_forward(ref)
    xc, _, invstd = cache
    mean = x.reshape(-1, 6).mean(axis=0)
    scale = gamma * invstd
    got = K.bn_apply(x, scale, beta - mean * scale, relu=True)
    assert got.dtype == x.dtype
    np.testing.assert_allclose(got, ref, rtol=TOL[dt], atol=TOL[dt])
    assert (got > 0).any() and (got == 0).any()


@pytest.mark.parametrize("dt", DTYPES)
def test_add_relu_matches_residual_join(rng, dt):
    h, s = rng.standard_normal((2, 3, 3, 8)).astype(dt), rng.standard_normal((2, 3, 3, 8)).astype(dt)
    ref, _ = L.relu_forward(h + s)
    got = K.add_relu(h.copy(), s)
    np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("mu,nesterov,wd,masked", [(0.9, True, 1e-2, True), (0.9, False, 1e-2, False),
                                                    (0.0, True, 1e-2, True), (0.9, True, 0.0, True)])
def test_sgd_update_matches_optimizer(rng, dt, mu, nesterov, wd, masked):
    n = 1001
    p0 = rng.standard_normal(n).astype(dt)
    mask = (rng.random(n) < 0.6).astype(dt) if masked else None
    cfg = SGDConfig(momentum=mu, nesterov=nesterov, weight_decay=wd, decay_bn_and_bias=not masked)
    opt = SGD(p0.copy(), cfg, mask)
    p_ref, p, buf = p0.copy(), p0.copy(), np.zeros(n, dt)
    for step in range(3):
        g = rng.standard_normal(n).astype(dt)
        opt.step(p_ref, g, 0.1 / (step + 1))
        K.sgd_update(p, g, buf, mask, 0.1 / (step + 1), mu, wd, nesterov)
    np.testing.assert_allclose(p, p_ref, rtol=TOL[dt], atol=TOL[dt])
    if mu:
        np.testing.assert_allclose(buf, opt.momentum, rtol=TOL[dt], atol=TOL[dt])
    assert not np.array_equal(p, p0)


def test_selection_and_launch_config():
    assert not K.use_fast(np.ones(3)) and not K.Kernels().use_fast(np.ones(3), kernel="add_relu")
    assert K.launch_config(1) == ((1,), (256,)) and K.launch_config(0)[0] == (1,)
    assert K.launch_config(10**9)[0][0] == 65535 * 8
    assert K.dtype_name(np.float32) == "float32" and K.dtype_name("bfloat16") == "bfloat16"
    with pytest.raises(TypeError):
        K.dtype_name(np.int32)
    assert "cupy" not in sys.modules            # importing kernels did not import CuPy


def test_kernels_choice_belongs_to_the_run_not_the_process_or_the_environment(monkeypatch):
    """model.kernels reaches the model and the optimizer as one Kernels object built by the run's
    set-up; two runs in one process do not see each other's choice or disabled kernels, and the old
    SCALESGD_KERNELS variable is not read."""
    from scalesgd import config as C
    from scalesgd.nn.resnet import ResNet
    monkeypatch.setenv("SCALESGD_KERNELS", "reference")
    monkeypatch.setattr(K, "get_array_module", lambda *a: types.SimpleNamespace())   # "CuPy" arrays
    assert K.Kernels().impl == "fused" and K.Kernels().use_fast(np.ones(3), kernel="add_relu")
    assert C.build(None, {"model": {"kernels": "reference"}}).model.kernels == "reference"
    assert C.build(None, {}).model.kernels == "fused"
    with pytest.raises(C.ConfigError, match="kernels"):
        C.build(None, {"model": {"kernels": "fast"}})
    with pytest.raises(ValueError, match="model.kernels"):
        K.Kernels("fast")
    with pytest.raises(ValueError, match="no kernel"):
        K.Kernels().disable("relu")
    one, other = K.Kernels(), K.Kernels("reference")
    one.disable("add_relu")
    assert not one.use_fast(np.ones(3), kernel="add_relu") and one.use_fast(np.ones(3), kernel="bn_apply")
    assert not other.use_fast(np.ones(3), kernel="bn_apply")
    assert K.Kernels().disabled == frozenset() and one.disabled == {"add_relu"}
    model = ResNet("resnet8", 10, 0.25, kernels=one)
    opt = SGD(model.ps.params, SGDConfig(), model.ps.decay_mask(), model.kernels)
    blocks = [m for m in model.net.mods if hasattr(m, "main")]
    assert opt.kernels is one and len(blocks) == 3 and all(b.kernels is one for b in blocks)
    assert ResNet("resnet8", 10, 0.25).kernels.disabled == frozenset()


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH: CUDA sources not compiled")
@pytest.mark.parametrize("act,par", [("float32", "float32"), ("float64", "float64"),
                                     ("bfloat16", "float32")])
def test_cuda_sources_compile_sm90(tmp_path, act, par):
    src = tmp_path / f"k_{act}.cu"
    src.write_text(K.module_source(act, par))
    ptx = tmp_path / "k.ptx"
    r = subprocess.run(["nvcc", "--ptx", "-arch=sm_90", "-std=c++17", "-o", str(ptx), str(src)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    text = ptx.read_text()
    for name in K.KERNEL_NAMES:
        assert f".entry {name}(" in text, name


# ----------------------------------------------------------------------------- the CUDA source on the host
# tests/cuda_host.py builds nn/kernels.py's own CUDA C for the CPU, so the kernels' arithmetic is
# checked against the _ref twins in every run (the GPU itself: tests/gpu/test_gpu_parity.py).
HOST_CASES = [("bn_apply", "float32", "float32"), ("add_relu", "float32", "float32"),
              ("sgd_update", "float32", "float32"), ("bn_apply", "float64", "float64"),
              ("add_relu", "float64", "float64"), ("sgd_update", "float64", "float64"),
              ("bn_apply", "bfloat16", "float32"), ("add_relu", "bfloat16", "float32")]
HOST_TOL = {"float32": 1e-6, "float64": 1e-13, "bfloat16": 1e-2}


@pytest.mark.skipif(cuda_host.available() is not None, reason=str(cuda_host.available()))
@pytest.mark.parametrize("name,act,par", HOST_CASES)
def test_the_cuda_kernels_built_for_the_host_match_their_twins(name, act, par):
    if act == "bfloat16":
        pytest.importorskip("ml_dtypes", reason="bf16 inputs need ml_dtypes")
    fast, ref = K.check_case(name, np, act, par, fast=cuda_host.FAST[name])
    for got, want in zip(fast(), ref(), strict=True):
        got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
        assert np.isfinite(got).all()
        assert np.linalg.norm(got - want) <= HOST_TOL[act] * np.linalg.norm(want), name


@pytest.mark.skipif(cuda_host.available() is not None, reason=str(cuda_host.available()))
@pytest.mark.parametrize("dt", DTYPES)
def test_the_fused_kernels_propagate_nan_as_their_twins_do(dt):
    """A NaN (or inf) entering a residual join or a BN must leave it, as the twins let it: a
    diverging run is then caught by the divergence check at once, not hidden as zeros (issue 25,
    finding 4: add_relu's ``v > 0 ? v : 0`` turned NaN into 0)."""
    bad = np.array([np.nan, -np.nan, np.inf, -np.inf, -1.0, 2.0, 0.0, np.nan], dt)
    other = np.array([1.0, -3.0, 1.0, 5.0, 0.5, -1.0, np.nan, 0.0], dt)
    h = bad.copy()
    want = K.add_relu_ref(bad.copy(), other)
    got = cuda_host.add_relu(h, other)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(got[~np.isnan(want)], want[~np.isnan(want)])
    x = bad.reshape(2, 1, 1, 4)
    scale, shift = np.ones(4, dt), np.zeros(4, dt)
    for relu in (True, False):
        want = K.bn_apply_ref(x.copy(), scale, shift, relu)
        got = cuda_host.bn_apply(np.ascontiguousarray(x), scale, shift, relu)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))


# ----------------------------------------------------------------------------- cudnn_conv, no device
def test_descriptors_match_numpy_strides():
    x = np.empty((2, 5, 7, 3), np.float32)
    dims, strides = CC.nhwc_desc(x.shape)
    nchw = x.transpose(0, 3, 1, 2)
    assert dims == list(nchw.shape) and strides == [s // 4 for s in nchw.strides]
    w = np.empty((3, 3, 4, 8), np.float32)                  # HWIO, our buffer
    dims, strides = CC.filter_desc(w.shape, "hwio")
    kcrs = w.transpose(3, 2, 0, 1)
    assert dims == list(kcrs.shape) and strides == [s // 4 for s in kcrs.strides]
    krsc = np.ascontiguousarray(w.transpose(3, 0, 1, 2))   # the shadow CudnnEngine keeps
    dims, strides = CC.filter_desc(w.shape, "krsc")
    assert strides == [s // 4 for s in krsc.transpose(0, 3, 1, 2).strides]
    assert CC.channel_desc(6) == ([1, 6, 1, 1], [6, 1, 6, 6])
    assert CC.out_hw(224, 224, 7, 7, 2, 3) == (112, 112)


def test_types_keys_and_choice():
    assert CC.type_names("bf16")["io"] == "BFLOAT16" and CC.type_names("tf32")["tf32"]
    with pytest.raises(ValueError):
        CC.type_names("fp32", "float64")
    k1 = CC.graph_key("fprop", (2, 8, 8, 3), (3, 3, 3, 4), 1, 1, "fp32")
    assert k1 == CC.graph_key("fprop", [2, 8, 8, 3], [3, 3, 3, 4], 1, 1, "fp32")
    assert k1 != CC.graph_key("fprop", (2, 8, 8, 3), (3, 3, 3, 4), 1, 1, "bf16")
    assert CC.choose_conv_impl("auto", True, True, True)[0] == "cudnn"
    assert CC.choose_conv_impl("auto", True, False, True) == \
        ("im2col", "auto: missing the cudnn frontend module")
    assert CC.choose_conv_impl("auto", False, False, False)[0] == "im2col"
    assert CC.choose_conv_impl("im2col", True, True, True)[0] == "im2col"
    assert CC.choose_conv_impl("auto", True, True, True, "float64")[0] == "im2col"
    with pytest.raises(RuntimeError, match="missing"):
        CC.choose_conv_impl("cudnn", True, False, True)
    cpu = types.SimpleNamespace(is_gpu=False)
    assert CC.resolve("auto", cpu)[0] == "im2col"
    assert CC.attach(None, "auto", "fp32", cpu) is None
    cache = CC.GraphCache()
    assert cache.get(k1, lambda: "g") == cache.get(k1, lambda: "other") == "g" and cache.builds == 1


@pytest.mark.parametrize("op", ["fprop", "dgrad", "wgrad"])
def test_build_conv_call_sequence(op):
    """Against the stand-in with the bindings' real signatures (tests/cudnn_stub.py)."""
    b = CC.build_conv(cudnn_stub.module(), None, op, (2, 9, 9, 16), (3, 3, 16, 32), 2, 1, "bf16")
    names = [c[0] for c in b.graph.calls]
    assert names == [f"conv_{op}", "validate", "build_operation_graph", "create_execution_plans",
                     "check_support", "build_plans"]
    kw = b.graph.calls[0][1]
    assert kw["padding"] == [1, 1] and kw["stride"] == [2, 2] and kw["dilation"] == [1, 1]
    assert b.graph.io_data_type == "BFLOAT16" and b.workspace == 0
    out = {"fprop": "Y", "dgrad": "DX", "wgrad": "DW"}[op]
    assert b.tensors[out].is_output
    if op == "dgrad":
        assert b.tensors["DX"].dim == [2, 16, 9, 9]
    if op == "wgrad":              # bf16 I/O: DW in bf16 too, as every Frontend sample has it
        assert b.tensors["DW"].dim == [32, 16, 3, 3] and b.tensors["DW"].data_type == "BFLOAT16"
    if op != "wgrad":
        assert b.tensors["W"].stride == CC.filter_desc((3, 3, 16, 32), "krsc")[1]


@pytest.mark.parametrize("refused,built", [("FLOAT", "BFLOAT16"), ("BFLOAT16", "FLOAT")])
def test_bf16_wgrad_has_an_engine_or_falls_back_for_that_graph_alone(monkeypatch, refused, built):
    """Issue 38, defect 4: bf16 wgrad graphs took bf16 X/dY and wrote a FLOAT dW, which no Frontend
    sample does; with no engine for it the graph raised, the self-check failed the layer, and bf16
    fell back to float32 im2col for the whole model.  dW is now written in bf16 (cast into the
    float32 gradient view in the transpose), and a graph no engine takes that way is built with a
    FLOAT dW instead, that graph alone.  The stand-in refuses ``refused`` dW from bf16 inputs;
    float16 stands in for bf16 arrays (NumPy has no bf16 without ml_dtypes)."""
    def no_engine(g):
        if g.io_data_type == "BFLOAT16" and cudnn_stub.wgrad_dw_type(g) == refused:
            return f"bf16 X/dY with a {refused} dW"
        return None
    monkeypatch.setattr(CC, "_io_dtype", lambda xp, p: np.float16 if p == "bf16" else np.float32)
    engine = CC.CudnnEngine(cudnn_stub.module(no_engine), cudnn_stub.HostXP(), "bf16")
    fast, ref = CK.conv_check(engine, (2, 9, 9, 8), (3, 3, 8, 16), 2, 1)
    got, want = fast(), ref()
    for name, a, b in zip(("y", "dx", "dw"), got, want):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        assert np.linalg.norm(a - b) / np.linalg.norm(b) < 5e-3, name
    assert got[2].dtype == np.float32                      # the master gradient view stays float32
    key = CC.graph_key("wgrad", (2, 9, 9, 8), (3, 3, 8, 16), 2, 1, "bf16")
    assert engine.cache._graphs[key].out_type == built
    both = CC.CudnnEngine(cudnn_stub.module(lambda g: cudnn_stub.wgrad_dw_type(g) and "none"),
                          cudnn_stub.HostXP(), "bf16")
    with pytest.raises(RuntimeError, match="no engine for dW BFLOAT16 .*; dW FLOAT"):
        CK.conv_check(both, (2, 9, 9, 8), (3, 3, 8, 16), 2, 1)[0]()
    fp32 = cudnn_stub.module(lambda g: cudnn_stub.wgrad_dw_type(g) and "none")
    with pytest.raises(cudnn_stub.cudnnGraphNotSupportedError):      # fp32: no other type to try
        CC.build_wgrad(fp32, None, (2, 9, 9, 8), (3, 3, 8, 16), 2, 1, "fp32")


@pytest.mark.parametrize("op", ["fwd", "bwd"])
def test_build_bn_uses_the_bindings_real_signature(op):
    """Issue 25, finding 6: ``pygraph.batchnorm`` has no ``norm_forward_phase`` parameter in any
    cudnn-frontend 1.x (v1.0.0 to v1.22, python/pygraph/norm.cpp), so every training BN graph
    raised TypeError and fell back (bf16: the whole model to float32 im2col)."""
    b = CC.build_bn(cudnn_stub.module(), None, op, (2, 5, 5, 8), "fp32")
    assert b.graph.calls[0][0] == ("batchnorm" if op == "fwd" else "batchnorm_backward")
    outs = ("Y", "mean", "invstd", "rmean_out", "rvar_out") if op == "fwd" else ("DX", "DS", "DB")
    assert all(b.tensors[t].is_output for t in outs)


@pytest.mark.parametrize("precision,strict_fp32", [("fp32", True), ("tf32", False), ("bf16", False)])
def test_fp32_convolutions_exclude_tensor_core_plans(precision, strict_fp32):
    """Issue 25, finding 3: ``precision = fp32`` built the same graphs as tf32, so cuDNN could run
    float32 convolutions on TF32 tensor cores (10-bit mantissa).  fp32 now deselects the plans with
    the TENSOR_CORE numerical note (the filter applies to the plans create_execution_plans made, so
    it comes between that and check_support), as PyTorch does for float convolutions without TF32;
    tf32 and bf16 keep them."""
    for op in ("fprop", "dgrad", "wgrad"):
        b = CC.build_conv(cudnn_stub.module(), None, op, (2, 8, 8, 4), (3, 3, 4, 8), 1, 1, precision)
        names = [c[0] for c in b.graph.calls]
        if strict_fp32:
            i = names.index("deselect_numeric_notes")
            assert names[i - 1] == "create_execution_plans" and names[i + 1] == "check_support"
            assert b.graph.calls[i][1]["notes"] == ["TENSOR_CORE"]
        else:
            assert "deselect_numeric_notes" not in names


@pytest.mark.parametrize("width", [0.25, 0.3])
def test_the_engine_on_the_stand_in_trains_as_the_xp_layers(width):
    """The real CudnnEngine (weight shadow, packs, BN running statistics, ReLU, evaluation path) on
    NumPy through the stand-in: one training step and an evaluation give what the xp layers give.
    Width 0.3 (5, 10, 19 channels) puts the BN vectors at 4-byte offsets of the flat buffers, which
    the stand-in refuses as the Frontend's 16-byte alignment would (issue 25, finding 8)."""
    from scalesgd.nn.resnet import ResNet
    from scalesgd.train.step import train_step
    model, plain = ResNet("resnet8", 10, width, seed=0), ResNet("resnet8", 10, width, seed=0)
    model.set_engine(CC.CudnnEngine(cudnn_stub.module(), cudnn_stub.HostXP(), "fp32", model.kernels))
    rng = np.random.default_rng(5)
    x, y = rng.standard_normal((4, 8, 8, 3)).astype(np.float32), np.arange(4)
    train_step(model, x, y)
    train_step(plain, x, y)
    np.testing.assert_allclose(model.ps.grads, plain.ps.grads, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(model.ps.buffers, plain.ps.buffers, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(model.forward(x, False)[0], plain.forward(x, False)[0], rtol=1e-4, atol=1e-5)
    assert cudnn_stub.handles["created"] == 1 and cudnn_stub.handles["streams"] > 0


def test_an_evaluation_forward_on_the_engine_uses_the_live_weights():
    """Issue 25, finding 1: the engine rebuilt its KRSC copy of a conv's weights only in training
    forwards, so an evaluation right after an update ("update then forward") or after loading
    another model into the buffers (the EASGD center, a gossip average, a resumed model: "load then
    evaluate") ran the convolutions with the weights of the last training forward."""
    from scalesgd.nn.resnet import Conv, ResNet, _leaves
    rng = np.random.default_rng(3)
    model, plain = ResNet("resnet8", 10, 0.25, seed=0), ResNet("resnet8", 10, 0.25, seed=0)
    model.set_engine(CC.CudnnEngine(cudnn_stub.module(), cudnn_stub.HostXP(), "fp32", model.kernels))
    convs = [m for m in _leaves(model.net) if isinstance(m, Conv)]
    x = rng.standard_normal((2, 8, 8, 3)).astype(np.float32)
    np.testing.assert_allclose(model.forward(x, False)[0], plain.forward(x, False)[0], rtol=1e-4, atol=1e-5)
    model.forward(x, True)                       # a training forward: the shadow is built
    plain.forward(x, True)                       # (the same BN running statistics)
    step = (0.05 * rng.standard_normal(model.ps.params.shape)).astype(np.float32)
    for ps in (model.ps, plain.ps):              # "update then forward"
        ps.params += step
    np.testing.assert_allclose(model.forward(x, False)[0], plain.forward(x, False)[0], rtol=1e-4, atol=1e-5)
    other = ResNet("resnet8", 10, 0.25, seed=7)  # "load then evaluate"
    model.ps.params[...] = other.ps.params
    model.ps.buffers[...] = other.ps.buffers
    np.testing.assert_allclose(model.forward(x, False)[0], other.forward(x, False)[0], rtol=1e-4, atol=1e-5)
    assert len(convs) == 9


def test_the_cudnn_stand_in_checks_each_operand_against_its_declaration():
    """The stand-in holds the arrays it is handed to what the graph declared, as cuDNN reads a
    device pointer with the declared type, dims and strides: a float32 array in a BFLOAT16 slot
    (the class of the H200's bf16 BN defect), too few elements, or a strided view are refused; the
    lax stand-in before computed with each of them."""
    b = CC.build_conv(cudnn_stub.module(), None, "fprop", (2, 5, 5, 8), (3, 3, 8, 16), 1, 1, "bf16")
    g, t = b.graph, b.tensors
    x = np.zeros((2, 5, 5, 8), np.float16)                 # (float16 stands in for bf16 on a CPU)
    w = np.zeros((16, 3, 3, 8), np.float16)
    y = np.zeros((2, 5, 5, 16), np.float16)
    g.execute({t["X"]: x, t["W"]: w, t["Y"]: y}, None)     # as declared: runs
    bad = {"a float32 array in a BFLOAT16 slot": (x.astype(np.float32), "declared BFLOAT16 but handed"),
           "too few elements": (x[:1], "declares dims"),
           "a strided view": (np.zeros((2, 5, 5, 16), np.float16)[..., ::2], "strided view")}
    for what, (xx, msg) in bad.items():
        with pytest.raises(RuntimeError, match=msg):
            g.execute({t["X"]: xx, t["W"]: w, t["Y"]: y}, None)


def test_an_engine_replaced_or_closed_destroys_its_cudnn_handle(monkeypatch):
    """Every CudnnEngine made a cuDNN handle that nothing destroyed (one per engine, held until the
    process ended: the parity, results and self-check cases each made theirs).  Closing an engine
    destroys its handle once; a model whose engine is replaced (``set_engine``: the fast-path
    fallback to im2col) closes the old one."""
    from scalesgd.nn.resnet import ResNet
    cudnn = cudnn_stub.module()
    monkeypatch.setattr(CC, "_io_dtype", lambda xp, p: np.float32)
    model = ResNet("resnet20", 10, 0.25, seed=0)
    first = CC.CudnnEngine(cudnn, cudnn_stub.HostXP(), "fp32")
    model.set_engine(first)
    model.set_engine(first)                                 # the same engine again: kept open
    assert cudnn_stub.handles["destroyed"] == 0
    second = CC.CudnnEngine(cudnn, cudnn_stub.HostXP(), "fp32")
    model.set_engine(second)                                # replaced: the first one is closed
    assert cudnn_stub.handles["destroyed"] == 1 and first.handle is None
    model.set_engine(None)
    second.close()                                          # closing twice destroys once
    assert cudnn_stub.handles == {"created": 2, "streams": 0, "destroyed": 2}
    third = CC.CudnnEngine(cudnn, cudnn_stub.HostXP(), "fp32")
    model.set_engine(third)
    model.stem_conv.engine = None               # one layer's own check fell back (fastpaths/parts.py)
    model.set_engine(None)                      # the others' engine is still closed
    assert third.handle is None and cudnn_stub.handles["destroyed"] == 3


def test_a_training_step_hands_the_frontend_addresses_and_tells_the_stream_once(monkeypatch):
    """The host's calls per step on the cuDNN path, counted on the stand-in: every operand goes to
    ``execute`` as its address (an array became a DLPack capsule per operand per call in the real
    Frontend: 1,428 a ResNet-50 step, 564 a ResNet-20 one), and the handle is told its stream once,
    not before every one of the step's graphs (264 a ResNet-50 step, 104 here).  The stand-in reads
    each address through the graph's declaration, as cuDNN does, so the step's numbers are checked
    by the references as before."""
    from scalesgd.nn.resnet import ResNet
    from scalesgd.train.step import train_step
    monkeypatch.setattr(CC, "_io_dtype", lambda xp, p: np.float32)
    cudnn = cudnn_stub.module()
    model = ResNet("resnet20", 10, 0.25, seed=0)
    model.set_engine(CC.CudnnEngine(cudnn, cudnn_stub.HostXP(), "fp32", model.kernels))
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((2, 32, 32, 3)).astype(np.float32), np.array([1, 2])
    loss0, _ = train_step(model, x, y)
    assert cudnn_stub.handles["streams"] == 1                       # the first graph's run
    cudnn_stub.operands.update(arrays=0, addresses=0, executes=0)
    loss1, _ = train_step(model, x, y)
    assert cudnn_stub.operands == {"arrays": 0, "addresses": 564, "executes": 104}, cudnn_stub.operands
    assert cudnn_stub.handles["streams"] == 1 and np.isfinite(loss1) and loss1 == loss0
    ref = ResNet("resnet20", 10, 0.25, seed=0)                          # the xp layers: the same step
    assert abs(train_step(ref, x, y)[0] - loss0) < 1e-4 * abs(loss0)
