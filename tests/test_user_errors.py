"""User error or bug: only ``errors.UserError`` is a one-line error; anything else shows its traceback.

Real one-rank processes of ``python -m src.main`` (or of ``cli.main`` with one function replaced by
a bug, since a bug cannot be caused from the command line on purpose)."""
import ast
import os
import subprocess
import sys
from pathlib import Path

from helpers import ROOT, TINY, demo_data, one_line_error, run_cli

from scalesgd import errors


def test_every_user_error_derives_from_the_base_and_stays_where_it_was():
    from scalesgd import backend, cli, config
    from scalesgd.comm import topology
    from scalesgd.data import shards
    from scalesgd.io import checkpoint
    from scalesgd.methods import base
    from scalesgd.train import loop
    old_homes = {config.ConfigError: 2, shards.DataError: 1, shards.ShardError: 1,
                 checkpoint.CheckpointError: 1, base.MethodError: 1, backend.BackendError: 1,
                 topology.TopologyError: 1, cli.ResumeError: 1, base.PhaseError: 1, loop.Diverged: 1,
                 errors.RunDirError: 1}
    for cls, code in old_homes.items():
        assert issubclass(cls, errors.UserError) and cls.exit_code == code, cls
    assert issubclass(config.ConfigError, ValueError)       # library callers catching it still do
    tree = ast.parse(Path(errors.__file__).read_text())     # import-free: any module may use it
    imports = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert [getattr(n, "module", None) for n in imports] == ["__future__"]


BUG = """
import sys
from scalesgd import cli
def bug(cfg, workers=None):
    raise {exc}("operands could not be broadcast together with shapes (3,) (4,)")
cli.dry_run = bug
sys.exit(cli.main(["--dry-run"]))
"""


def _python(code: str, tmp_path) -> subprocess.CompletedProcess:
    env = dict(os.environ, SCALESGD_DATA=demo_data(tmp_path), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=120)


def test_a_bug_raising_valueerror_or_oserror_prints_its_traceback(tmp_path):
    """Before errors.py, cli.py took every ValueError/OSError for bad input: one line, no traceback."""
    for exc in ("ValueError", "OSError", "KeyError"):
        p = _python(BUG.format(exc=exc), tmp_path)
        assert p.returncode == 1, p.stderr
        assert "Traceback (most recent call last)" in p.stderr and "in bug" in p.stderr, p.stderr
        assert f"scalesgd: error: unexpected {exc}: " in p.stderr, p.stderr


def test_an_injected_fault_is_a_bug_and_a_run_dir_in_the_way_a_user_error(tmp_path):
    env_fault = dict(os.environ, SCALESGD_DATA=demo_data(tmp_path), OMP_NUM_THREADS="1",
                     SCALESGD_INJECT_FAULT="0:1")
    p = subprocess.run([sys.executable, "-m", "src.main", *TINY, "--run-dir", str(tmp_path / "f2")],
                       cwd=ROOT, env=env_fault, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                       timeout=180)
    assert p.returncode == 1 and "Traceback" in p.stderr, p.stderr
    assert "scalesgd: error: unexpected RuntimeError: injected fault" in p.stderr, p.stderr
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    p = run_cli([*TINY, "--run-dir", str(blocker / "run")], tmp_path)
    assert p.returncode == 1
    one_line_error(p, f"--run-dir {blocker / 'run'}: cannot write the run directory (Not a directory)")
