"""Docs that cannot drift: every code name the prose quotes still exists.

The backticked spans of ``docs/*.md``, ``README.md`` and of every module docstring under ``src/``
and ``benchmarks/`` are resolved against the code (parsed with ``ast``, nothing imported):

- a file path (``methods/server.py``, ``benchmarks/report.py``) exists, relative to the repository
  or to ``src/scalesgd``; ``path:LINE`` has that many lines; ``path: name`` defines ``name``;
- a dotted name whose head is one of the project's modules or classes (``ServerMethod.serve``,
  ``comm.mpi.abort``, ``assemble.build``) names things defined somewhere in the project (a module, class,
  function, method, attribute, field or parameter);
- a call written with plain argument names (``method.serve(ps, phases)``) matches the parameters of
  some function of that name (names under 3 letters, and a name that is a prefix of the other, pass:
  ``read(g)``, ``at(tab, nbytes)``).

Spans that are not code names of this project (``np.zeros``, ``--flag``, ``summary.json``) are
left alone.  The test lists every stale span with its file.
"""
import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "scalesgd"
CODE_DIRS = (SRC, ROOT / "benchmarks", ROOT / "tests")
DOTTED = re.compile(r"^([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(\((.*)\))?$")
CALL = re.compile(r"^([A-Za-z_]\w*)\((.*)\)$")
PATH = re.compile(r"^([\w./-]+\.(?:py|md|toml|json|sh|c|cfg))(?::(\d+)(?:-\d+)?|:\s*(\w+))?$")
PATH_ROOTS = (ROOT, SRC)


class Index:
    """Every name the project's Python defines, with each function's parameter names."""

    def __init__(self):
        self.names: set[str] = set()
        self.heads: set[str] = set()          # module stems and class names
        self.params: dict[str, list[list[str]]] = {}
        self.defined: dict[Path, set[str]] = {}
        for d in CODE_DIRS:
            for path in d.rglob("*.py"):
                self._add(path)

    def _add(self, path: Path) -> None:
        tree = ast.parse(path.read_text(), str(path))
        mine = self.defined.setdefault(path.resolve(), set())
        parts = path.relative_to(ROOT).with_suffix("").parts
        for p in parts:
            if p not in ("src", "__init__", "__main__"):
                self.names.add(p)
                self.heads.add(p)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = [a.arg for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs]
                self.params.setdefault(node.name, []).append([a for a in args if a not in ("self", "cls")])
                self.names.update(args)
                self.names.add(node.name)
                mine.add(node.name)
            elif isinstance(node, ast.ClassDef):
                self.names.add(node.name)
                self.heads.add(node.name)
                mine.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                self.names.add(node.attr)
                mine.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                self.names.add(node.id)
                mine.add(node.id)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                self.names.add(node.target.id)
                mine.add(node.target.id)
            elif isinstance(node, ast.keyword) and node.arg:
                self.names.add(node.arg)          # dict(key=...) and dataclass-style fields
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.isidentifier():
                self.names.add(node.value)        # keys of dicts and JSON records


def spans() -> list[tuple[str, str]]:
    """(where, span) of every backticked span in the docs and module docstrings."""
    out = []
    for md in [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]:
        text = re.sub(r"```.*?```", "", md.read_text(), flags=re.S)       # not code blocks
        out += [(md.name, s) for s in re.findall(r"`([^`\n]+)`", text)]
    for d in (SRC, ROOT / "benchmarks"):
        for path in sorted(d.rglob("*.py")):
            doc = ast.get_docstring(ast.parse(path.read_text())) or ""
            doc = re.sub(r"::\n\n(?:(?: {4}.*)?\n)+", "\n", doc)             # not literal blocks
            where = str(path.relative_to(ROOT))
            out += [(where, s) for s in re.findall(r"``([^`\n]+)``", doc)]
    return out


def problem(span: str, ix: Index) -> str | None:
    """Why ``span`` does not resolve, or None (resolved, or not a code name of this project)."""
    s = span.strip()
    m = PATH.match(s)
    placeholder = m and any(re.fullmatch(r"[A-Z][A-Z0-9_]*", Path(c).stem) for c in m.group(1).split("/"))
    if m and "/" in m.group(1) and not placeholder and not any(c in s for c in "*<>{}") \
            and not s.startswith(("/", "~")):
        rel, line, name = m.groups()
        found = [r / rel for r in PATH_ROOTS if (r / rel).is_file()]
        top = rel.split("/")[0]
        known_top = (ROOT / top).is_dir() or (SRC / top).is_dir()
        if not found:
            return f"no file {rel}" if known_top else None
        if name and name not in ix.defined.get(found[0].resolve(), set()):
            return f"{rel} defines no {name}"
        if line and int(line) > len(found[0].read_text().splitlines()):
            return f"{rel} has fewer than {line} lines"
        return None
    m = DOTTED.match(s)
    if m:
        parts = m.group(1).split(".")
        missing = [p for p in parts[1:] if p not in ix.names]
        if parts[0] in ix.heads and missing:
            return f"{'.'.join(missing)} is defined nowhere"
        if m.group(2):                             # a call: whatever the object is named
            return _call_problem(parts[-1], m.group(3), ix)
        return None
    m = CALL.match(s)
    if m and m.group(1) in ix.params:
        return _call_problem(m.group(1), m.group(2), ix)
    return None


def _call_problem(func: str, args: str, ix: Index) -> str | None:
    """A call quoted with plain positional argument names must match some ``func``'s parameters."""
    names = [a.strip() for a in args.split(",") if a.strip()]
    if not names or not all(n.isidentifier() for n in names) or func not in ix.params:
        return None
    def same(doc: str, param: str) -> bool:      # short names (g, e, id) and prefixes (tab/table) pass
        return len(doc) < 3 or doc.startswith(param) or param.startswith(doc)
    for params in ix.params[func]:
        if len(params) >= len(names) and all(same(d, q) for d, q in zip(names, params)):
            return None
    return f"{func}({', '.join(names)}): no {func} takes these (it takes " + \
        "; ".join(f"({', '.join(p)})" for p in ix.params[func]) + ")"


def test_every_code_name_in_the_docs_exists():
    ix = Index()
    stale = sorted({f"{where}: `{span}`: {why}" for where, span in spans()
                    if (why := problem(span, ix)) is not None})
    assert not stale, "stale names in the docs:\n" + "\n".join(stale)


def test_the_checker_finds_what_the_review_found():
    """The stale spans the design review listed are caught; live ones pass."""
    ix = Index()
    assert problem("method.serve(ps, check)", ix) is not None
    assert problem("method.serve(ps, phases)", ix) is None
    assert problem("methods/server.py: _push_during_phase", ix) is not None
    assert problem("methods/server.py: poll_in_phase", ix) is None
    assert problem("ServerMethod.poll_in_phase", ix) is None
    assert problem("ServerMethod.no_such_method", ix) is not None
    assert problem("comm/no_such_module.py", ix) is not None
    assert problem("src/scalesgd/config/schema.py:99999", ix) is not None
    assert problem("src/scalesgd/config/schema.py:3", ix) is None
    assert problem("np.zeros", ix) is None and problem("summary.json", ix) is None
