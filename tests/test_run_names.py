"""Default run directories are named by the clock (``io.files.stamped``): two runs started within
the same second must get two directories, never one refused ("already holds a run") or shared."""
import threading

from scalesgd.io import files


def test_runs_of_one_second_get_directories_of_their_own(tmp_path, monkeypatch):
    monkeypatch.setattr(files.time, "strftime", lambda fmt: "20000101-000000")
    base = files.stamped("allreduce-resnet20", tmp_path / "runs")
    assert base == tmp_path / "runs" / "20000101-000000-allreduce-resnet20"
    assert files.free_name(base) == base                      # nothing there yet: the name itself
    first = files.reserve_dir(base)
    assert first == base and first.is_dir()
    assert files.free_name(base) == base.with_name(base.name + ".2")
    # eight processes' worth of starts in the same second, at once: eight directories, each once
    got, start = [], threading.Barrier(8)

    def one():
        start.wait()
        got.append(files.reserve_dir(base))
    threads = [threading.Thread(target=one) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(p.name for p in got) == sorted(f"{base.name}.{n}" for n in range(2, 10))
    assert all(p.is_dir() for p in got)


def test_a_dangling_link_does_not_hold_up_the_next_name(tmp_path):
    base = tmp_path / "runs" / "20000101-000000-x"
    base.parent.mkdir()
    base.symlink_to(tmp_path / "gone")                 # exists() is False, but mkdir refuses it
    assert files.free_name(base) == base.with_name(base.name + ".2")
    assert files.reserve_dir(base).name == base.name + ".2"


def test_a_default_run_directory_that_cannot_be_made_is_one_line(tmp_path):
    """``runs`` a file where the default run directory goes: the run ends with one line naming it,
    no traceback (rank 0 makes the directory and tells every rank)."""
    import os
    import subprocess
    import sys

    from helpers import ROOT, TINY, one_line_error
    from synth import make_dataset
    tiny_data = make_dataset(tmp_path / "data", n=48, n_val=16, num_classes=4)
    (tmp_path / "runs").write_text("not a folder")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT / "src"))
    p = subprocess.run([sys.executable, "-m", "scalesgd", "--data", str(tiny_data), *TINY], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)
    one_line_error(p, "cannot create a run directory under runs/")
