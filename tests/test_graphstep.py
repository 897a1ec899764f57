"""The captured training step (``train/graphstep.py``, ``train.cuda_graph``) on CPU, through a
stand-in for CUDA's capture: capturing runs the step's host side once with its device effects
undone (a real capture records the kernels and runs none), and each launch runs the step again on
the static buffers (a real graph replays the recorded kernels on the same addresses).  What this
checks is the wiring: the batch reaches the static inputs, the outputs are the static ones, the
warm-up, the gradient hook off while capturing, a new shape or ``invalidate`` recapturing, and that
``captured_matches_eager`` sees a step that reads a stale batch.  CUDA's own semantics (a
temporary's address, a host value baked into a kernel) are checked on a GPU only."""
import numpy as np

from scalesgd import config as C
from scalesgd.nn.resnet import ResNet
from scalesgd.train import graphstep as G
from scalesgd.train.step import train_step


stand_in = G.replay_on_host           # (capture runs nothing; a launch runs the step again)


def batch(seed, n=4, hw=16):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, hw, hw, 3)).astype(np.float32), rng.integers(0, 10, n)


def model():
    return ResNet("resnet20", 10, 0.25, seed=0)


def test_warm_up_then_one_capture_then_replays_that_equal_eager_steps():
    m, ref = model(), model()
    step = G.CapturedStep(m, np, warmup=2, capture=stand_in(m))
    for k in range(5):
        x, y = batch(k)
        got = [float(v) for v in step(x, y)]
        want = [float(v) for v in train_step(ref, x, y)]
        assert got == want, (k, got, want)
        assert np.array_equal(m.ps.grads, ref.ps.grads) and np.array_equal(m.ps.buffers, ref.ps.buffers), k
    assert (step.captures, step.replays, step.eager) == (1, 3, 2)


def test_a_new_shape_or_invalidate_warms_up_and_captures_again():
    m = model()
    step = G.CapturedStep(m, np, warmup=1, capture=stand_in(m))
    for x, y in (batch(0), batch(1), batch(2)):
        step(x, y)
    assert (step.captures, step.replays) == (1, 2)
    step(*batch(3, n=2))                         # another batch size: eager again, then a capture
    step(*batch(4, n=2))
    assert (step.captures, step.replays) == (2, 3)
    step.invalidate()                            # (after an evaluation)
    step(*batch(5, n=2))
    assert step.launch is None and step.pool is None and step.eager == 1
    step(*batch(6, n=2))
    assert (step.captures, step.replays) == (3, 4)


def test_the_gradient_hook_is_off_in_every_captured_step_and_back_afterwards():
    """Warm-up, capture and replays call no gradient hook (a replay cannot: so neither may the
    steps around it); the model's hook is set again after each step."""
    m = model()
    called = []
    m.set_grad_hook(lambda names: called.append(tuple(names)))
    step = G.CapturedStep(m, np, warmup=1, capture=stand_in(m))
    for k in range(3):
        step(*batch(k))
    assert (step.captures, step.replays, called) == (1, 2, [])
    train_step(m, *batch(3))
    assert called, "the hook is set again after the captured steps"


def test_the_check_passes_a_sound_capture_and_fails_one_that_reads_a_stale_batch(monkeypatch):
    m = model()
    x, y = batch(0)
    got = G.captured_matches_eager(m, x, y, np, capture=stand_in(m))
    assert set(got) == set(G.OUTPUTS) and max(got.values()) == 0.0, got

    def stale(self, x, y):                       # the old bug class: replay on the captured batch
        if self.launch is None:
            self._capture(x, y)
            self.x[...], self.y[...] = x, y
        self.launch()
        self.replays += 1
        return self.out
    monkeypatch.setattr(G.CapturedStep, "__call__", stale)
    m2 = model()
    bad = G.captured_matches_eager(m2, x, y, np, capture=stand_in(m2))
    assert bad["grads"] > 1e-3 and bad["loss"] > 0, bad


def test_the_run_captures_only_on_a_gpu_with_the_key_on_and_the_check_passed():
    """On NumPy the key changes nothing (as the other GPU-only keys: said once at start-up); on a
    GPU the step is captured only where the start-up check used it (not where it fell back, was
    off or did not run); with the key on no rank's backward calls the gradient hook (a replay
    calls none, and every rank must start its sums alike: found by review)."""
    import types

    from scalesgd.fastpaths import Report
    cpu, gpu = types.SimpleNamespace(is_gpu=False, xp=np), types.SimpleNamespace(is_gpu=True, xp=np)
    on, off = C.build(overrides={"train": {"cuda_graph": True}}), C.build(None, {})

    def report(status):
        r = Report("auto")
        r.components[G.GRAPH_COMPONENT] = {"status": status}
        return r
    m = model()
    plain = G.stepper_for(off, m, gpu, 0.5, report("used"))
    assert isinstance(plain, G.EagerStep) and plain.hooks
    for backend, rep in ((cpu, report("used")), (gpu, None), (gpu, Report("auto")), (gpu, report("off")),
                         (gpu, report("fell back"))):
        step = G.stepper_for(on, m, backend, 0.5, rep)
        assert isinstance(step, G.EagerStep) and not step.hooks, (backend, rep)
    step = G.stepper_for(on, m, gpu, 0.5, report("used"))
    assert isinstance(step, G.CapturedStep) and step.grad_scale == 0.5
    called = []
    m.set_grad_hook(lambda names: called.append(1))
    for k in range(4):                            # warm-up, capture, replays: never the hook
        step.capture = stand_in(m)
        step(*batch(k))
    G.EagerStep(m, hooks=False)(*batch(5))
    assert not called
    G.EagerStep(m)(*batch(6))
    assert called
    assert G.graph_components(m, cpu, on, 4) == [] and G.graph_components(m, gpu, off, 4) == []


def test_the_step_has_no_boolean_mask_assignment():
    """CuPy's ``a[mask] = v`` reads the mask's count on the host, a sync that a CUDA graph's capture
    refuses (found by review in max pooling, on every ImageNet-stem ResNet): no assignment through
    a comparison in the layers, the model or the step (a NumPy run cannot show it)."""
    import ast
    from pathlib import Path
    src = Path(G.__file__).resolve().parents[1]
    found = []
    for f in (src / "nn" / "layers.py", src / "nn" / "resnet.py", src / "train" / "step.py"):
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            aug = [node.target] if isinstance(node, ast.AugAssign) else []
            for t in getattr(node, "targets", []) + aug:
                if isinstance(t, ast.Subscript) and any(isinstance(n, ast.Compare)
                                                        for n in ast.walk(t.slice)):
                    found.append(f"{f.name}:{node.lineno}: {ast.unparse(node)[:80]}")
    assert not found, found
    probe = "a = b\na[b == c] = 1\n"
    assert any(isinstance(t, ast.Subscript) and isinstance(t.slice, ast.Compare)
               for n in ast.walk(ast.parse(probe)) for t in getattr(n, "targets", []))


def test_the_start_up_check_uses_a_sound_capture_and_fails_a_stale_one():
    """The ``cuda graph`` component (fastpaths.check's last round) through the fast-path framework:
    the stand-in capture is used; one whose graph lost its last kernels (the replay leaves the
    gradients at zero) falls back, and the run's step is then the eager one."""
    import types

    from scalesgd import fastpaths as F
    gpu = types.SimpleNamespace(is_gpu=True, xp=np)
    cfg = C.build(overrides={"train": {"cuda_graph": True}, "data": {"image_size": 16}})
    m = model()
    (comp,) = G.graph_components(m, gpu, cfg, 4, capture=stand_in(m))
    report = F.Report("auto")
    F.validate([comp], "auto", report=report)
    assert report.components[G.GRAPH_COMPONENT]["status"] == "used", report.components

    def truncated(xp, fn):
        launch, pool = stand_in(m)(xp, fn)

        def replay():
            launch()
            m.ps.grads[...] = 0
        return replay, pool
    (bad,) = G.graph_components(m, gpu, cfg, 4, capture=truncated)
    report = F.Report("auto")
    F.validate([bad], "auto", report=report)
    assert report.components[G.GRAPH_COMPONENT]["status"] == "fell back", report.components
    assert isinstance(G.stepper_for(cfg, m, gpu, 1.0, report), G.EagerStep)
