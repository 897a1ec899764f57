"""benchmarks/: the shared module (launcher, placement probe, runners) and the scripts run as a user
runs them: real processes, a real compiler, a real mpiexec."""
import json
import math
import os
import re
import shutil
import subprocess
import sys

import pytest

from mpirun import ROOT, logging_launcher, uses_mpi

BENCH = ROOT / "benchmarks"

import benchlib  # noqa: E402


def test_scripts_take_the_package_from_the_install_not_from_a_path_they_edit():
    """The editable install (or PYTHONPATH=src) provides scalesgd; no script edits sys.path, builds
    from a path outside the repository, or keeps a second copy of the shared runners."""
    scripts = sorted(BENCH.rglob("*.py"))
    assert any(p.parent.name == "crossover" for p in scripts)            # (the packages too)
    for path in scripts:
        text = path.read_text()
        assert not re.search(r"sys\.path\s*(\.\s*(insert|append|extend)\b|(\[[^]]*\])?\s*\+?=)", text), \
            f"{path.name} edits sys.path: the install provides scalesgd, and a script's siblings " \
            "import as they are (benchmarks/ is sys.path[0])"
        assert not re.search(r"\b[Ii]ssue \d+", text), \
            f"{path.name} names an issue: a tool says what it measures, the history is git's"
        absolute = re.findall(r"[\"'](/(?:home|work|opt|root|srv)/[^\"']*)", text)
        assert not absolute, (path.name, absolute)
        if path.name not in ("benchlib.py", "torch_resnet.py"):     # the one runner pair, one probe
            assert not re.search(r"^class (OursRunner|TorchRunner|TResNet|TBasicBlock|TBottleneck)\b", text,
                                 re.M), path.name
            assert "c2c" not in text or '"gcc"' not in text, f"{path.name} builds the probe itself"


@pytest.mark.skipif(shutil.which("gcc") is None or len(os.sched_getaffinity(0)) < 2,
                    reason="the probe needs gcc and two CPUs")
def test_placement_probe_is_built_from_the_repo_source(tmp_path):
    probe = benchlib.Probe()
    assert probe.exe is not None and probe.exe.exists()
    # on a busy host each round trip waits for both pinned threads to be scheduled at once (with
    # four jobs on the two CPUs, 2026-12-07: 500, 50 and once 5 round trips took over the probe's 5 s,
    # 50 measured 3-44 ms one way, where an idle host measures tens of ns): a number, whatever the load
    ns = probe.run(5, timeout=120)
    assert ns is not None and ns > 0
    edited = tmp_path / "c2c.c"                            # a changed source gets its own binary
    edited.write_text(benchlib.C2C_SRC.read_text() + "\n// edited\n")
    assert benchlib.Probe(edited).exe not in (None, probe.exe)
    assert benchlib.Probe(tmp_path / "absent.c").run() is None
    assert benchlib.fmt_probe(31.2) == "31 ns (shared L3)" and benchlib.fmt_probe(None) == "n/a"
    assert benchlib.fmt_probe(172.0) == "172 ns (no shared L3)"


def test_bench_cpu_smallest_run_with_profile(tmp_path):
    """bench_cpu.py end to end at its smallest (one step per block), per-geometry profile included:
    the loss goes through the profiled module, every conv geometry's GEMMs are timed and their shapes
    timed again alone, and the taps and im2col copies are charged to their conv."""
    out = tmp_path / "b.json"
    proc = subprocess.run([sys.executable, str(BENCH / "bench_cpu.py"), "--threads", "1", "--models",
                           "resnet20", "--repeats", "1", "--steps", "1", "--warmup", "1",
                           "--profile-steps", "1", "--no-torch", "--json", str(out),
                           "--c2c", str(tmp_path / "none.c")],          # no probe: seconds on a busy host
                          capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    res = json.loads(out.read_text())
    r = res["results"][0]
    assert r["scalesgd"]["median_img_s"] > 0 and r["scalesgd_im2col"]["median_img_s"] > 0
    p = res["profiles"]["resnet20"]
    convs = {c["conv"]: c for c in p["convs"]}
    assert len(convs) == 16                     # 8 geometries (3x3/1 at 3 sizes + stem, 2 strided, 2 1x1) x 2
    for name, c in convs.items():               # auto: Winograd at 8x8x64, GEMMs elsewhere
        if "8x8 64->64" in name:
            assert c["winograd_ms"] > 0 and c["gemm_ms"] == 0, c
        else:
            assert c["gemm_ms"] > 0 and c["gemm_gflops"] > 0 and c["openblas_alone_ms"] > 0, c
    assert convs["fwd 3x3/1 32x32 16->16"]["im2col_ms"] > 0          # taps copy (auto: taps here)
    assert convs["bwd 3x3/2 32x32 16->32"]["col2im_ms"] > 0
    assert convs["fwd 3x3/2 32x32 16->32"]["im2col_ms"] > 0          # whole-batch im2col
    assert p["others"]["avg pool + linear + loss"] > 0 and p["others"]["SGD update"] > 0


@uses_mpi
def test_benchmarks_launch_mpi_through_MPIEXEC_and_MPIEXEC_ARGS(tmp_path):
    """comm.py starts its ranks with $MPIEXEC and $MPIEXEC_ARGS before -n, as the tests do (so Open
    MPI or a site launcher works): a wrapper launcher logs its argv, drops a marker argument and
    runs the real launcher."""
    _, log, env = logging_launcher(tmp_path, "--bench-marker")
    proc = subprocess.run([sys.executable, str(BENCH / "comm.py"), "--ranks", "2", "--floats", "10000",
                           "--repeats", "1", "--warmup", "0"], env=env, capture_output=True, text=True,
                          timeout=180, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "MPI.Allreduce raw" in proc.stdout
    argv = log.read_text().split()
    assert argv[0] == "--bench-marker" and argv[argv.index("-n") + 1] == "2" and "--worker" in argv


def test_torch_twin_has_scalesgd_parameter_counts_and_trains():
    """The one PyTorch ResNet (basic and bottleneck blocks) against scalesgd's counts; a step of
    each runner on the same batch gives a finite loss (only where torch is installed)."""
    pytest.importorskip("torch")
    from torch_resnet import TorchRunner  # noqa: PLC0415
    for name, classes, size in (("resnet20", 10, 32), ("resnet18", 1000, 32), ("resnet50", 1000, 32)):
        ours = benchlib.OursRunner(name, classes, size, 2)
        twin = TorchRunner(name, classes, size, 2, ours.model.num_params, channels_last=False)
        assert (twin.x.permute(0, 2, 3, 1).numpy() == ours.x).all()
        benchlib.timed(ours, 1)
        benchlib.timed(twin, 1)
        assert math.isfinite(ours.loss) and math.isfinite(twin.loss), (name, ours.loss, twin.loss)


def test_glyphs_proxy_data_set_is_deterministic_with_a_separate_tune_split(tmp_path):
    """benchmarks/glyphs.py: every image is a function of (seed, split, index); OUT/main and OUT/tune
    hold the same train images; tune and val are different draws; all 10 classes occur; the shards
    open as a data set."""
    import glyphs  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415
    from scalesgd.data.shards import ShardSet  # noqa: PLC0415
    a, b = glyphs.images("train", 300, 16, 0), glyphs.images("train", 300, 16, 0)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    assert set(a[1].tolist()) == set(range(10)) and a[0].shape == (300, 16, 16, 3)
    assert not np.array_equal(glyphs.images("val", 50, 16, 0)[0], glyphs.images("tune", 50, 16, 0)[0])
    assert not np.array_equal(a[0], glyphs.images("train", 300, 16, 1)[0])        # the seed matters
    glyphs.build(tmp_path, train=64, val=16, tune=24, shards=2)
    main, tune = ShardSet.open(tmp_path / "main", "train"), ShardSet.open(tmp_path / "tune", "train")
    assert main.num_samples == tune.num_samples == 64 and main.num_classes == 10
    assert ShardSet.open(tmp_path / "main", "val").num_samples == 16
    assert ShardSet.open(tmp_path / "tune", "val").num_samples == 24


@uses_mpi
def test_buckets_benchmark_measures_every_setting_against_its_baseline(tmp_path):
    """benchmarks/buckets.py (issue 24, item 3) in its local mode on 2 ranks: each setting's step,
    its bucket count and its exposed time against the no-all-reduce baseline of the same run."""
    out = tmp_path / "b.json"
    proc = subprocess.run([sys.executable, str(BENCH / "buckets.py"), "--local", "--ranks", "2",
                           "--models", "resnet20", "--rounds", "1", "--steps", "1", "--json", str(out)],
                          capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    r = json.loads(out.read_text())["results"]["resnet20"]
    s = r["settings"]
    assert [s[k]["buckets"] for k in ("no all-reduce", "25 MB", "auto", "0.25 MB")] == [0, 1, 8, 4]
    assert s["no all-reduce"]["exposed_s"] == 0
    assert s["auto"]["exposed_s"] == s["auto"]["median_s"] - s["no all-reduce"]["median_s"]
    assert "| resnet20 (1.09 MB) | local | auto | 8 |" in proc.stdout


@uses_mpi
def test_oversubscribe_runs_both_waits_and_the_yield_launch_sets_the_variables(tmp_path):
    """benchmarks/oversubscribe.py at its smallest, with --cpus 2 so that 3 ranks oversubscribe the
    node on any machine: the spinning launch has none of the yield variables, the yielding one has
    what prepare_waiting set (and said), and the runs alternate spin, yield, yield, spin."""
    out = tmp_path / "o.json"
    proc = subprocess.run([sys.executable, str(BENCH / "oversubscribe.py"), "--ranks", "3", "--cpus", "2",
                           "--iters", "2", "--rounds", "1", "--repeats", "3", "--json", str(out)],
                          capture_output=True, text=True, timeout=300, env=benchlib.rank_env())
    assert proc.returncode == 0, proc.stderr
    r = json.loads(out.read_text())
    assert r["ranks"] == 3 and "3 ranks on this node's 2 CPUs" in r["prepare_waiting_said"]
    assert r["order"] == ["spin", "yield", "yield", "spin"]
    assert [len(r["runs"][m]) for m in ("spin", "yield")] == [2, 2]
    assert all(len(launch) == 3 and all(len(row) == 2 and min(row) > 0 for row in launch)   # repeats x
               for m in r["runs"] for launch in r["runs"][m])                                 # workers
    assert len(r["alone_s"]) == 6 and min(r["alone_s"]) > 0                  # 3 before, 3 after
    assert not any(r["env"]["spin"].values()), r["env"]
    assert r["env"]["yield"]["MPIR_CVAR_ENABLE_HEAVY_YIELD"] == "1", r["env"]
    assert r["env"]["yield"]["OMPI_MCA_mpi_yield_when_idle"] == "1", r["env"]
    assert r["over_spin"]["spin"] == 1 and math.isfinite(r["over_spin"]["yield"])
    assert set(r["over_alone"]) == {"spin", "yield"}
    assert r["thread_levels"] == {"spin": ["multiple"] * 2, "yield": ["multiple"] * 2}
    assert "x spin" in proc.stdout


@uses_mpi
def test_oversubscribe_names_a_launcher_and_python_that_form_no_job(tmp_path):
    """--ranks 3 launched as 2 ranks (a launcher that starts jobs of another size than asked, as one
    library's mpiexec does with the other library's mpi4py): one message naming --python, no
    statistics traceback."""
    fake = tmp_path / "mpiexec"              # the real launcher, with -n 2 whatever it is asked
    fake.write_text(f'#!/bin/bash\na=("$@"); for i in "${{!a[@]}}"; do [ "${{a[$i]}}" = -n ] && '
                    f'a[$((i+1))]=2; done\nexec {benchlib.mpiexec()} "${{a[@]}}"\n')
    fake.chmod(0o755)
    proc = subprocess.run([sys.executable, str(BENCH / "oversubscribe.py"), "--ranks", "3", "--iters", "1",
                           "--rounds", "1", "--repeats", "1"], capture_output=True, text=True, timeout=300,
                          env={**benchlib.rank_env(), "MPIEXEC": str(fake), "MPIEXEC_ARGS": ""})
    assert proc.returncode != 0 and "--python" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
