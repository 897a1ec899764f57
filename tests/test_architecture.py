"""What docs/architecture.md says of the code's structure, checked on the code itself.

- No import circle between files of the package, lazy imports (inside functions) included.
- The methods, the training loop and the virtual cluster import no mpi4py, directly or through what
  they import: they import with mpi4py blocked, and a virtual run trains with it blocked.
- CuPy is imported in the files the document names, and nowhere else.
"""
import ast
import configparser
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
PKG = SRC / "scalesgd"
ARCHITECTURE = ROOT / "docs" / "architecture.md"

# Run before anything else in a fresh interpreter: an import of mpi4py (or a submodule) fails.
BLOCK_MPI4PY = """
import sys
class _Blocked:
    def find_spec(self, name, path=None, target=None):
        if name == "mpi4py" or name.startswith("mpi4py."):
            raise ImportError("mpi4py is blocked in this test")
sys.meta_path.insert(0, _Blocked())
"""


def module_of(path: Path) -> str:
    rel = path.relative_to(SRC).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def imported_modules(path: Path, known: set[str]) -> set[str]:
    """The package's modules that ``path`` imports, lazily or not (``from . import x`` names the
    module x when it is one, else the package)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    me = module_of(path)
    pkg = me.split(".") if path.name == "__init__.py" else me.split(".")[:-1]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            cands = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = (pkg[:len(pkg) - node.level + 1] if node.level else []) + (node.module or "").split(".")
            base = ".".join(p for p in base if p)
            cands = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for name in cands:
            while name and name not in known:          # scalesgd.comm.mpi.window.Courier -> ...window
                name = name.rpartition(".")[0]
            if name and name != me:
                out.add(name)
    return out


def import_graph() -> dict[str, set[str]]:
    files = {module_of(p): p for p in PKG.rglob("*.py")}
    known = set(files)
    return {m: imported_modules(p, known) for m, p in files.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), packages' ``__init__``
    imports left out (a package importing its own modules is not a circle of files)."""
    edges = {m: {d for d in deps if not m.startswith(d + ".")} for m, deps in graph.items()}
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    sys.setrecursionlimit(10_000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_no_import_circle_between_files():
    assert circles(import_graph()) == []


def test_the_circle_finder_finds_one_through_a_lazy_import(tmp_path, monkeypatch):
    pkg = tmp_path / "scalesgd"
    (pkg / "a").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a" / "__init__.py").write_text("from . import x\n")
    (pkg / "a" / "x.py").write_text("from .y import f\n")
    (pkg / "a" / "y.py").write_text("def f():\n    from .x import g\n")
    (pkg / "b.py").write_text("from .a import x\n")
    monkeypatch.setattr(sys.modules[__name__], "SRC", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "PKG", pkg)
    assert circles(import_graph()) == [["scalesgd.a.x", "scalesgd.a.y"]]


def _python(code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(SRC), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-c", BLOCK_MPI4PY + code], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_methods_training_and_the_virtual_cluster_import_without_mpi4py():
    code = """
import importlib, pkgutil
import scalesgd.methods, scalesgd.train, scalesgd.virtual
names = []
for pkg in (scalesgd.methods, scalesgd.train, scalesgd.virtual):
    for m in pkgutil.iter_modules(pkg.__path__, pkg.__name__ + "."):
        importlib.import_module(m.name)
        names.append(m.name)
assert not [m for m in sys.modules if m.startswith("mpi4py")]
print(len(names), "modules")
"""
    p = _python(code)
    assert p.returncode == 0, p.stderr[-3000:]
    assert int(p.stdout.split()[0]) >= 30, p.stdout


def test_the_blocker_blocks():
    p = _python("import scalesgd.comm.mpi.collectives")
    assert p.returncode != 0 and "mpi4py is blocked" in p.stderr


def test_a_virtual_run_trains_without_mpi4py(tmp_path):
    from synth import make_dataset
    data = make_dataset(tmp_path / "data", n=32, n_val=8, num_classes=4)
    run = tmp_path / "run"
    code = f"""
import runpy
sys.argv = ["scalesgd.virtual", "--method", "gossip", "--workers", "3", "--model", "resnet8",
            "--width", "0.25", "--image-size", "16", "--scale", "16,20", "--batch-size", "4",
            "--epochs", "1", "--data", {str(data)!r}, "--run-dir", {str(run)!r}]
try:
    runpy.run_module("scalesgd.virtual", run_name="__main__", alter_sys=True)
except SystemExit as e:
    assert not e.code, e.code
assert not [m for m in sys.modules if m.startswith("mpi4py")]
"""
    p = _python(code, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    assert (run / "summary.json").exists()


def cupy_importers() -> set[str]:
    out = set()
    for path in PKG.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            if any(n.split(".")[0] in ("cupy", "cupyx") for n in names):
                out.add(path.relative_to(PKG).as_posix())
    return out


def test_cupy_is_imported_only_where_the_architecture_says():
    text = ARCHITECTURE.read_text(encoding="utf-8")
    para = re.search(r"CuPy is imported, always lazily, in (\w+) files: (.*?)\. `nn/", text, re.S)
    assert para, "architecture.md: the paragraph naming CuPy's importers is gone"
    named = set(re.findall(r"`([\w/]+\.py)`", para.group(2)))
    words = {"two": 2, "three": 3, "four": 4, "five": 5, "six": 6}
    assert words[para.group(1)] == len(named), para.group(0)
    assert cupy_importers() == named


def mpi_calls(path: Path) -> list[str]:
    """Calls of a communicator's MPI method (``....comm.Barrier()``, ``comm.Get_rank()``: a
    capitalised method on a name or attribute called ``comm``) in ``path``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr[:1].isupper():
            owner = node.func.value
            name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
            if name == "comm":
                out.append(f"{path.relative_to(PKG)}:{node.lineno}: {ast.unparse(node.func)}")
    return out


def test_methods_the_loop_the_virtual_cluster_and_the_fast_path_check_make_no_mpi_call():
    calls = [c for sub in ("methods", "train", "virtual", "fastpaths")
             for p in sorted((PKG / sub).glob("*.py")) for c in mpi_calls(p)]
    assert calls == []


def test_the_mpi_call_finder_sees_a_raw_receive(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "PKG", tmp_path)
    f = tmp_path / "loop.py"
    f.write_text("def f(self):\n    self.s.topo.comm.Recv(buf, source=0)\n    x.Barrier()\n")
    assert mpi_calls(f) == ["loop.py:2: self.s.topo.comm.Recv"]


MUTATORS = ("append", "extend", "insert", "pop", "clear", "update", "setdefault", "add", "discard", "remove")


def process_state(path: Path) -> list[str]:
    """Module-level state that functions change: names declared ``global`` in a function, and
    private module-level containers that the module changes (an item or slice assigned, or a
    mutating method called on them); constant tables are not state."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = [f"{path.relative_to(PKG)}: global {n}" for node in ast.walk(tree) if isinstance(node, ast.Global)
           for n in node.names]
    private = [t.id for node in tree.body if isinstance(node, (ast.Assign, ast.AnnAssign))
               for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
               if isinstance(t, ast.Name) and t.id.startswith("_") and not t.id.startswith("__")]
    changed = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
            for t in (node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]):
                if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name):
                    changed.add(t.value.id)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in MUTATORS and isinstance(node.func.value, ast.Name)):
            changed.add(node.func.value.id)
    return out + [f"{path.relative_to(PKG)}: {n}" for n in private if n in changed]


# A flag that logs a line once per process, and compiled CUDA modules cached per process (a cache
# keyed by what was compiled): neither is the state of a run.
PROCESS_STATE_ALLOWED = {"comm/staging.py: global _STAGING_LOGGED", "nn/kernels.py: _MODULES"}


def test_no_module_keeps_a_runs_state():
    """The job's state belongs to objects (the failures a transport survived, the communicators it
    must revoke: ``MPITransport.tracked``, ``successor``), not to module globals."""
    found = [x for p in sorted(PKG.rglob("*.py")) for x in process_state(p)]
    assert sorted(set(found) - PROCESS_STATE_ALLOWED) == [], found


def test_the_state_finder_sees_the_old_globals(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "PKG", tmp_path)
    f = tmp_path / "failures.py"
    f.write_text("import weakref\n_TRACKED = weakref.WeakValueDictionary()\n"
                 "_SURVIVORS = []\n_TABLE = {1: 2}\n"
                 "def f(c):\n    global _COUNT\n    _TRACKED[id(c)] = c\n"
                 "    _SURVIVORS[:] = [c]\n    return _TABLE[1]\n")
    assert process_state(f) == ["failures.py: global _COUNT", "failures.py: _TRACKED",
                                "failures.py: _SURVIVORS"]


METHOD_NAMES = {"allreduce", "easgd", "asgd", "gossip", "localsgd", "single"}


def _name_branches(source: str, where: str) -> list[str]:
    """Comparisons with a method's name in ``source`` (``m.name == "gossip"``, ``x.method in
    ("easgd", "asgd")``): an attribute compared with a string that names a method."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        sides = (node.left, *node.comparators)
        words = {c.value for side in sides for c in ast.walk(side)
                 if isinstance(c, ast.Constant) and isinstance(c.value, str)}
        if words & METHOD_NAMES and any(isinstance(side, ast.Attribute) for side in sides):
            found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_a_change_of_world_is_one_operation_that_never_branches_on_the_method():
    """architecture.md: a resume on the same ranks, on other ranks and the survivors of a lost rank
    all go through one ``Origin`` and one method hook, ``adopt``; train/ never branches on a
    method's name (it finds resuming.py's old ``m.name == "gossip"`` branches), and the hooks each
    case once had are gone."""
    found = [b for f in sorted((PKG / "train").glob("*.py"))
             for b in _name_branches(f.read_text(encoding="utf-8"), f.name)]
    assert not found, found
    old = 'if reshape and m.name == "gossip":\n    pass\nif s.method.name == "asgd" and a != b:\n    pass\n'
    assert len(_name_branches(old, "probe")) == 2          # (what resuming.py had: it finds them)
    from scalesgd.methods.base import Exchange
    from scalesgd.methods.gossip import Gossip
    from scalesgd.methods.hierarchical import NodeLeader
    from scalesgd.methods.server import ServerMethod
    for cls in (Exchange, Gossip, ServerMethod, NodeLeader):
        for gone in ("load_reshaped", "survivor_state", "continue_from"):
            assert not hasattr(cls, gone), (cls.__name__, gone)
    loop = (PKG / "train" / "loop.py").read_text(encoding="utf-8")
    assert "carried" not in loop


def test_no_tracked_python_line_is_longer_than_flake8_allows():
    """Every ``*.py`` file git tracks keeps its lines within setup.cfg's
    ``[flake8] max-line-length``, counted in characters, not bytes (the sources hold ×, — and the like)."""
    cfg = configparser.ConfigParser(interpolation=None)
    cfg.read(ROOT / "setup.cfg", encoding="utf-8")
    limit = cfg.getint("flake8", "max-line-length")
    try:
        ls = subprocess.run(["git", "ls-files", "-z", "*.py"], cwd=ROOT, capture_output=True, text=True,
                            timeout=60)
    except FileNotFoundError:
        pytest.skip("no git on PATH: the tracked files cannot be listed")
    if ls.returncode != 0:
        pytest.skip(f"no git metadata for {ROOT}: {ls.stderr.strip()}")
    long = []
    for name in filter(None, ls.stdout.split("\0")):
        path = ROOT / name
        if not path.is_file():                  # tracked, but deleted in the work tree
            continue
        for i, line in enumerate(path.read_text(encoding="utf-8").split("\n"), 1):
            if len(line) > limit:
                long.append(f"{name}:{i}: {len(line)}")
    assert not long, (f"{len(long)} line(s) longer than {limit} characters (setup.cfg [flake8] "
                      "max-line-length):\n" + "\n".join(long))


def test_front_ends_sit_at_the_top_and_io_knows_no_virtual_time():
    """The command line is a front-end: no part of the package imports it but ``__main__`` (the
    virtual cluster and ``plan`` share ``launch.py`` with it: the parser, the config, the dry run,
    the occupied-directory check, the exit codes).  ``io/`` writes what any run writes and knows
    nothing of the virtual cluster (its clock's stamps are ``virtual/timetape.py``'s)."""
    graph = import_graph()
    users_of_cli = sorted(m for m, deps in graph.items() if "scalesgd.cli" in deps)
    assert users_of_cli == ["scalesgd.__main__"], users_of_cli
    launch_deps = graph["scalesgd.launch"]
    assert not any(d == "scalesgd.cli" or d.startswith("scalesgd.virtual") for d in launch_deps), launch_deps
    io_up = sorted((m, d) for m, deps in graph.items() if m.startswith("scalesgd.io")
                   for d in deps if d.startswith(("scalesgd.virtual", "scalesgd.cli", "scalesgd.train",
                                                  "scalesgd.methods")))
    assert io_up == [], io_up


def test_every_mpi4py_import_is_in_comm_mpi():
    """``comm/`` is the MPI-free vocabulary and ``comm/mpi/`` the MPI half: every import of mpi4py
    in the package, lazy ones included, is in ``comm/mpi/``, and every module there has one."""
    def imports_mpi4py(path: Path) -> bool:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "mpi4py" for a in node.names):
                return True
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "mpi4py":
                return True
        return False
    importers = {str(p.relative_to(PKG)) for p in PKG.rglob("*.py") if imports_mpi4py(p)}
    mpi_half = {str(p.relative_to(PKG)) for p in (PKG / "comm" / "mpi").glob("*.py")
                if p.name != "__init__.py"}
    assert importers == mpi_half, (sorted(importers - mpi_half), sorted(mpi_half - importers))
