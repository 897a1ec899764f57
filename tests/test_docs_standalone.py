"""The repository stands alone: no file points at notes or paths outside it.

Facts the project relies on are stated in its own docs (docs/*.md, with where and when they were
measured), never by reference to the development machine's folders or the team's private notes.
The patterns are built from pieces so that this file does not match itself.
"""
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_OUTSIDE = [
    re.escape("/" + "work/"),                       # absolute paths of the development machine
    re.escape(".." + "/shared"),                    # the folder next to the checkout
    re.escape("shared" + "/"),
    "(?:CLUSTER|PERF|DALI)" + "_" + "NOTES",        # the team's note files, with or without .md
    r"(?:DESIGN|PAPERS)\." + "md",
]
PATTERN = re.compile("|".join(_OUTSIDE))
# Used when there is no git (an unpacked source archive): the folders a checkout ships.
_FALLBACK = ["src", "docs", "benchmarks", "tests", "slurm", "jobs", "README.md", "Makefile", "setup.cfg"]


def repo_files(root: Path) -> list[Path]:
    """Tracked plus untracked-but-not-ignored files (new files are checked before they are committed)."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=root,
                             capture_output=True, check=True).stdout
        return [root / n for n in out.decode().split("\0") if n]
    except (OSError, subprocess.CalledProcessError):
        paths = [root / n for n in _FALLBACK]
        return [f for p in paths for f in ([p] if p.is_file() else p.rglob("*")) if f.is_file()
                and "__pycache__" not in f.parts]


def outside_references(root: Path) -> list[str]:
    """'file:line: text' for every line of a text file under root that points outside the repo."""
    hits = []
    for path in repo_files(root):
        try:
            data = path.read_bytes()
        except OSError:                             # listed by git but deleted in the work tree
            continue
        if b"\0" in data:                           # binary (figures, HDF5)
            continue
        text = data.decode("utf-8", errors="replace")
        for no, line in enumerate(text.splitlines(), 1):
            if PATTERN.search(line):
                hits.append(f"{path.relative_to(root)}:{no}: {line.strip()[:120]}")
    return hits


def test_no_file_points_outside_the_repository():
    hits = outside_references(ROOT)
    assert not hits, "state the fact in the repo's own docs instead of pointing outside it:\n" + \
        "\n".join(hits)


def test_the_scan_finds_each_pattern(tmp_path):
    # Real files in a folder without git: the fallback walk, one planted reference per pattern.
    bad = ["see /" + "work/main/x", "in ../" + "shared" + "/tools", "PERF" + "_NOTES says",
           "follows DESIGN." + "md", "CLUSTER" + "_NOTES.md section 6"]
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("fine\n" + "\n".join(bad) + "\n")
    (tmp_path / "README.md").write_text("shared memory and /dev/shm are fine\n")
    hits = outside_references(tmp_path)
    assert [h.split(":")[:2] for h in hits] == [["docs/a.md", str(i)] for i in range(2, 2 + len(bad))]
