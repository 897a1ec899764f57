"""Figures from two tiny real runs (single, allreduce -n 2) and virtual ones, and time-to-target
from val records."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from mpirun import mpi_launcher, uses_mpi
from synth import make_dataset
from helpers import ROOT, TINY, run_cli

from scalesgd.io.runs import load_run, sliding_mean, training_curve
from scalesgd.io.summary import time_to_targets
from scalesgd.plot import main as plot_main, plot_runs, split_path

# one worker for the module: its module-scoped fixture (runs made once) is built once under -n 2
pytestmark = pytest.mark.xdist_group("plot")


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("plotruns")
    data = make_dataset(tmp / "data", n=48, n_val=20, num_classes=4)
    common = ["--data", str(data), *TINY, "--epochs", "2", "--eval-every", "0.5"]
    single, ar = tmp / "single", tmp / "ar"
    p = run_cli([*common, "--run-dir", str(single)], tmp)
    assert p.returncode == 0, p.stderr
    p = run_cli([*common, "--method", "allreduce", "--run-dir", str(ar)], tmp, timeout=120,
                launcher=mpi_launcher(2))
    assert p.returncode == 0, p.stderr
    return single, ar


@uses_mpi
def test_plot_of_two_runs_has_one_line_per_run_in_every_panel(two_runs, tmp_path):
    out = tmp_path / "fig.png"
    res = plot_runs(two_runs, out, window=3, target=0.9)
    for path in (out, split_path(out)):
        assert path.exists() and path.stat().st_size > 10_000, path
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert set(res.panels) == {"train_time", "train_epochs", "val_time", "val_epochs"}
    for name, series in res.panels.items():
        assert [s.label for s in series] == ["single \u00d71", "allreduce \u00d72"], name
    steps = {"single \u00d71": 12, "allreduce \u00d72": 6}    # 48 samples / (8 x workers) x 2 epochs
    for s in res.panels["train_epochs"]:
        assert len(s.x) == len(s.y) == steps[s.label]
        assert np.all(np.diff(s.x) > 0) and np.all((0 <= s.y) & (s.y <= 1))
    for s in res.panels["val_epochs"]:
        assert list(s.x) == [0.5, 1.0, 1.5, 2.0]
    assert set(res.split) == set(steps) and res.split["allreduce \u00d72"]["comm"] > 0
    assert res.split["single \u00d71"]["comm"] == 0
    assert set(res.reached) == set(steps)


@uses_mpi
def test_plot_command_line(two_runs, tmp_path, capsys):
    out = tmp_path / "sub" / "cmp.png"
    assert plot_main([*map(str, two_runs), "-o", str(out), "--target", "0.99", "--merge-workers"]) == 0
    text = capsys.readouterr().out
    assert out.exists() and (tmp_path / "sub" / "cmp_time.png").exists()
    assert "single \u00d71: reached 99%" in text and "allreduce \u00d72: reached 99%" in text


def test_plot_of_a_directory_without_metrics_is_a_clear_error(tmp_path, capsys):
    assert plot_main([str(tmp_path), "-o", str(tmp_path / "f.png")]) == 1
    assert "no metrics/rank-*.jsonl" in capsys.readouterr().err


@uses_mpi
def test_merged_workers_series_holds_every_workers_steps(two_runs):
    run = load_run(two_runs[1])
    t, e, err = training_curve(run, window=400, merge=True)
    assert len(t) == 12 and np.all(np.diff(t) >= 0)


def test_sliding_mean_is_trailing_with_partial_start():
    np.testing.assert_allclose(sliding_mean([1, 0, 1, 1, 0], 2), [1, 0.5, 0.5, 1, 0.5])
    np.testing.assert_allclose(sliding_mean([4, 2], 400), [4, 3])


def test_time_to_targets_first_record_at_or_below_each_target():
    val = [dict(epoch=e, global_samples=100 * e, train_seconds=10.0 * e, val_top1_accuracy=a)
           for e, a in [(3, 0.6), (1, 0.2), (2, 0.55), (4, 0.75)]]       # out of order on purpose
    got = time_to_targets(val, [0.5, 0.45, 0.3, 0.05])
    assert list(got) == ["0.5", "0.45", "0.3", "0.05"]
    assert got["0.5"]["epoch"] == 2 and got["0.5"]["train_seconds"] == 20.0
    assert got["0.45"]["epoch"] == 2 and got["0.45"]["val_top1_error"] == pytest.approx(0.45)   # <= reaches
    assert got["0.3"]["epoch"] == 4 and got["0.3"]["global_samples"] == 400
    assert got["0.05"] is None
    assert json.loads(json.dumps(got)) == got
    assert time_to_targets([], [0.5]) == {"0.5": None}


@uses_mpi
def test_window_is_capped_to_the_run_and_the_title_says_so(two_runs, tmp_path):
    """400 minibatches over a 12-step run would be a cumulative mean: the window becomes 12 // 4."""
    single = two_runs[0]
    res = plot_runs([single], tmp_path / "fig.png")                      # window 400 asked
    assert (res.window, res.window_asked, res.shortest) == (3, 400, 12)
    errors = [r["top1_error"] for r in load_run(single).steps[0]]
    np.testing.assert_allclose(res.panels["train_epochs"][0].y, sliding_mean(errors, 3))
    assert not np.allclose(res.panels["train_epochs"][0].y, sliding_mean(errors, 400))
    axes = res.figures[0].axes
    assert axes[0].get_title().startswith("training top-1 error, 3-minibatch sliding window")
    assert "window 400 capped" in axes[0].get_title()
    assert all(ax.get_ylim() == (0, 100) for ax in axes)               # error axes fixed to 0-100 %
    res = plot_runs([single], tmp_path / "fig2.png", window=2)          # under the cap: as asked
    assert res.window == 2 and "capped" not in res.figures[0].axes[0].get_title()


@uses_mpi
def test_four_runs_with_long_labels_fit_the_figures(two_runs, tmp_path):
    """Four runs whose labels carry their directory names: the legend lies inside the figure and
    the time split's run labels do not overlap."""
    import shutil
    dirs = []
    for i in range(4):
        d = tmp_path / f"2025010{i}-12000{i}-allreduce-resnet20"
        shutil.copytree(two_runs[1], d)
        dirs.append(d)
    res = plot_runs(dirs, tmp_path / "fig.png", target=0.5)
    assert all("(2025010" in label for label in res.split)             # long labels indeed
    curves, split = res.figures
    renderer = curves.canvas.get_renderer()
    box = curves.legends[0].get_window_extent(renderer)
    assert 0 <= box.x0 and box.x1 <= curves.bbox.width, (box, curves.bbox)
    renderer = split.canvas.get_renderer()
    ticks = [t.get_window_extent(renderer) for t in split.axes[0].get_xticklabels()]
    assert len(ticks) == 4
    for a, b in zip(ticks, ticks[1:]):
        assert a.x1 < b.x0, (a, b)


@uses_mpi
def test_plot_without_output_writes_next_to_the_first_run(two_runs, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    single = two_runs[0]
    assert plot_main([str(single), str(two_runs[1])]) == 0
    fig, split = single.parent / f"{single.name}_fig.png", single.parent / f"{single.name}_fig_time.png"
    assert fig.exists() and split.exists()
    assert f"wrote {fig}" in capsys.readouterr().out
    assert not list(tmp_path.glob("*.png"))


def virtual_cli(args, tmp):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, "-m", "scalesgd.virtual", *args], cwd=ROOT, env=env,
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]


@uses_mpi
def test_virtual_replayed_and_retimed_runs_are_marked_in_the_legend(two_runs, tmp_path, capsys):
    """A virtual run's label names its profile, a replay says so, a re-timed run names the profile
    it was re-timed to; a real run's label is unchanged, and a label given is used as it is."""
    ar = two_runs[1]
    data = ar.parent / "data"
    model, replay, retimed = tmp_path / "virtual", tmp_path / "replay", tmp_path / "retimed"
    virtual_cli(["--method", "allreduce", "--workers", "2", "--profile", "a100-100gbit", "--data",
                 str(data), *TINY, "--epochs", "2", "--eval-every", "0.5", "--run-dir", str(model)],
                tmp_path)
    virtual_cli(["--replay", str(ar), "--run-dir", str(replay)], tmp_path)
    # a re-timed run is a virtual run's directory with virtual.json's timeline "retime" and the
    # profile it was re-timed to (what `python -m scalesgd.virtual retime` writes)
    shutil.copytree(model, retimed)
    meta = json.loads((retimed / "virtual.json").read_text())
    meta.update(timeline="retime", profile=dict(meta["profile"], name="titanx-fdr-resnet18"))
    (retimed / "virtual.json").write_text(json.dumps(meta))
    res = plot_runs([ar, model, replay, retimed], tmp_path / "fig.png")
    want = ["allreduce \u00d72", "allreduce \u00d72 (virtual, a100-100gbit)", "allreduce \u00d72 (replay)",
            "allreduce \u00d72 (re-timed, titanx-fdr-resnet18)"]
    assert [s.label for s in res.panels["val_time"]] == want
    assert [t.get_text() for t in res.figures[0].legends[0].get_texts()] == want
    res = plot_runs([ar, model], tmp_path / "fig2.png", labels=["real", "simulated"])
    assert [s.label for s in res.panels["val_time"]] == ["real", "simulated"]
    (retimed / "virtual.json").write_text("{not json")
    assert plot_main([str(retimed), "-o", str(tmp_path / "f.png")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "virtual.json: not JSON" in err[0], err
