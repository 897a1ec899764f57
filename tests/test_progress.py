"""The progress line and the training log with an injected stream and clock; the mode on a real pty and
under real mpiexec."""
import dataclasses
import io
import os
import re
import subprocess
import sys

import pytest

from helpers import ROOT, TINY, demo_data, run_cli
from mpirun import mpi_launcher, uses_mpi
from synth import make_dataset

from scalesgd.config import TrainConfig
from scalesgd.choices import PROGRESS_MODES
from scalesgd.io.progress import (LAUNCHER_VARS, ProgressLine, Smoothed, TrainLog, eta_seconds,
                                  format_duration, resolve_mode)


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_plain_lines_every_n_steps_with_eta_and_smoothing():
    out, clock = io.StringIO(), Clock()
    bar = ProgressLine(total_epochs=10, every=2, stream=out, clock=clock, smoothing=0.5)
    for step in range(1, 5):
        bar.update(step, epoch=0.5 * (step - 1), loss=float(step), error=0.5, images_per_second=1234.0,
                   lr=0.1)
        clock.t += 60.0
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and "\r" not in out.getvalue()
    assert lines[0].startswith("step 2 epoch 0.50/10 ETA 19:00 1,234 img/s")   # 60 s per 0.5 epoch
    # bias-corrected EMA of 1, 2, 3, 4 with beta 0.5: (0.5*4+0.25*3+0.125*2+0.0625*1)/(1-0.5**4)
    assert "loss 3.2667" in lines[1] and "top1-err 50.0%" in lines[1] and "lr 0.1" in lines[1]
    bar.message("validation top-1 90%")
    assert out.getvalue().endswith("validation top-1 90%\n")


def test_terminal_redraws_one_line_and_messages_start_a_new_one():
    out, clock = io.StringIO(), Clock()
    bar = ProgressLine(total_epochs=1, stream=out, clock=clock, mode="bar", min_interval=1.0, width=80)
    bar.update(1, 0.0, 2.0, 1.0, 10.0)
    bar.update(2, 0.1, 2.0, 1.0, 10.0)            # same instant: not redrawn
    clock.t += 2
    bar.update(3, 0.2, 2.0, 1.0, 10.0)
    text = out.getvalue()
    assert text.count("\r") == 1 and "\n" not in text and "step 3 " in text and "step 2 " not in text
    bar.message("eval")
    bar.close()                                    # nothing more: the bar was already ended
    assert out.getvalue().endswith("\neval\n")
    assert all(len(part) == 80 for part in text.split("\r"))


class Tty(io.StringIO):
    def isatty(self):
        return True


def test_auto_draws_the_bar_only_on_a_terminal_that_no_launcher_captures():
    assert ProgressLine(1, stream=Tty(), environ={}).tty
    assert not ProgressLine(1, stream=io.StringIO(), environ={}).tty
    for var in ("OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"):   # Open MPI's pty, hydra, srun
        assert resolve_mode("auto", Tty(), {var: "0"}) == "lines", var
    assert resolve_mode("bar", io.StringIO(), {"PMI_RANK": "0"}) == "bar"           # a flag decides
    assert resolve_mode("lines", Tty(), {}) == "lines"
    with pytest.raises(ValueError, match="'fancy' is not one of auto, bar, lines, off"):
        resolve_mode("fancy", Tty(), {})
    choices = {f.name: f for f in dataclasses.fields(TrainConfig)}["progress"].metadata["choices"]
    assert choices is PROGRESS_MODES


def test_off_prints_no_step_lines_but_messages():
    out = io.StringIO()
    bar = ProgressLine(1, every=1, stream=out, mode="off")
    for step in range(1, 4):
        bar.update(step, 0.1 * step, 1.0, 0.5, 10.0)
    bar.message("eval")
    bar.close()
    assert out.getvalue() == "eval\n"


def test_helpers():
    assert format_duration(3725) == "1:02:05" and format_duration(65) == "1:05"
    assert format_duration(float("nan")) == "?"
    s = Smoothed(0.9)
    assert s.add(3.0) == 3.0 and abs(s.add(3.0) - 3.0) < 1e-12
    assert eta_seconds(60.0, 0.5, 10.0) == 1140.0 and eta_seconds(5.0, 3, 2) == 0.0
    assert eta_seconds(5.0, 0, 10) != eta_seconds(5.0, 0, 10)          # nan before any work


def test_train_log_gives_each_rank_its_lines():
    """First worker: step lines; rank 0: validation lines; a rank that is both mixes them through
    the bar; a rank that is neither prints nothing (the loop builds one on every rank)."""
    outs = {}
    for steps, evals in ((True, True), (True, False), (False, True), (False, False)):
        out = outs[steps, evals] = io.StringIO()
        log = TrainLog(steps, evals, every=2, epochs=3, mode="lines", stream=out)
        for step in range(1, 5):
            log.step(0.25 * step, step, loss=1.0, err=0.5, lr=0.1, ips=100.0)
        log.evaluation(1.0, 3, 0.9, 0.99, 12.0, 1.5, {"consensus_distance": 0.01234})
        log.close()
    val = ("epoch 1.00/3 validation top-1 90.00% top-5 99.00% "
           "(train 12.0s, eval 1.5s, consensus_distance 0.01234)\n")
    assert outs[False, False].getvalue() == ""
    assert outs[False, True].getvalue() == val
    steps_only = outs[True, False].getvalue().splitlines()
    assert [ln.split(" epoch")[0] for ln in steps_only] == ["step 2", "step 4"]
    assert outs[True, True].getvalue() == "\n".join(steps_only) + "\n" + val


# ---------------------------------------------------------------- real processes
def bare_cr(text: str) -> int:
    """Carriage returns that redraw a line (a pty turns every \\n into \\r\\n: those do not count)."""
    return len(re.findall(r"\r(?!\n)", text))


def run_on_pty(args, tmp_path) -> str:
    """``python -m src.main ARGS`` with stdout on a fresh pty, as in a terminal; returns its output."""
    master, slave = os.openpty()
    env = dict(os.environ, SCALESGD_DATA=demo_data(tmp_path), OMP_NUM_THREADS="1")
    for var in LAUNCHER_VARS:                     # pytest itself may run under a launcher
        env.pop(var, None)
    with open(tmp_path / "stderr", "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "src.main", *args], cwd=ROOT, env=env,
                                stdin=subprocess.DEVNULL, stdout=slave, stderr=err)
    os.close(slave)
    chunks = []
    while True:                                   # read until the child closes the pty (EIO)
        try:
            data = os.read(master, 65536)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    assert proc.wait(timeout=120) == 0, (tmp_path / "stderr").read_text()
    return b"".join(chunks).decode(errors="replace")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("progress"), n=48, n_val=16, num_classes=4)


def test_a_terminal_gets_the_bar_and_the_flag_overrides_it(tmp_path, tiny):
    """The bar is padded to its width and redrawn (how often depends on the clock: at least the
    first step is drawn); lines are plain, one per step here (log_every 1, 48 / 8 steps)."""
    common = ["--data", str(tiny), *TINY]
    auto = run_on_pty([*common, "--run-dir", str(tmp_path / "a")], tmp_path)
    assert re.search(r"^step 1 epoch [^\r\n]* {20}(\r|\n)", auto, re.M) and "validation top-1" in auto, auto
    lines = run_on_pty([*common, "--run-dir", str(tmp_path / "b"), "--progress", "lines"], tmp_path)
    assert bare_cr(lines) == 0 and "    " not in lines, lines
    assert len(re.findall(r"^step \d+ epoch", lines, re.M)) == 6, lines


@uses_mpi
def test_under_a_launcher_the_log_gets_plain_lines(tmp_path, tiny):
    """Open MPI gives rank 0 a pty even when the job's output goes to a pipe or a file: auto must
    still print plain lines there, one per log_every steps, and no \\r."""
    p = run_cli(["--data", str(tiny), "--run-dir", str(tmp_path / "run"), "--method", "allreduce", *TINY],
                tmp_path, timeout=120, launcher=mpi_launcher(2))
    assert p.returncode == 0, p.stderr
    assert "\r" not in p.stdout, repr(p.stdout[:500])
    assert len(re.findall(r"^step \d+ epoch", p.stdout, re.M)) == 3, p.stdout   # 48 / (2 x 8) steps
