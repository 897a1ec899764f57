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
