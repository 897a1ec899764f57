"""Rewrites the blocks of docs/*.md whose truth is the code.

    python docs/generate.py            # rewrite every generated block in place
    python docs/generate.py --check    # exit 1 naming each stale block (tests/test_docs_generated.py)

A block is the text between ``<!-- generated: NAME ... -->`` and ``<!-- end generated: NAME -->``
(HTML comments: invisible on a rendered page); everything outside the blocks is left as it is.
NAME is a key of ``BLOCKS``:

- ``protocol``: the parameter-server tags and header layouts, from ``scalesgd.comm.wire``;
- ``imports``: which part of the package imports which (read from the source with ``ast``, nothing
  imported), in dependency order.
"""
from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
SRC = DOCS.parent / "src" / "scalesgd"
BLOCK = re.compile(r"(<!-- generated: (\w+)[^\n]*-->\n)(.*?)(<!-- end generated: \2 -->)", re.S)
NAMESPACES = {"nvidia"}              # shown with their second component: nvidia.dali


def protocol_block(src: Path) -> str:
    import mpi4py                    # noqa: PLC0415 - the tables need no MPI: do not initialise it
    mpi4py.rc.initialize = False
    from scalesgd.comm import wire  # noqa: PLC0415
    return wire.reference_markdown()


# ---------------------------------------------------------------------------- the import table
def unit_of(rel: Path) -> str:
    """``nn/layers.py`` -> ``nn/``; ``cli.py`` -> ``cli.py``: a subpackage or a top-level module."""
    return rel.parts[0] + "/" if len(rel.parts) > 1 else rel.name


def _in_function(node, parents) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return True
    return False


def imports_of(path: Path, src: Path) -> list[tuple[str, bool, bool]]:
    """[(target, internal, lazy)] of one file: an internal target is a unit of the package, an
    external one a top-level module outside the standard library; lazy = inside a function."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    parents = {c: p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}
    pkg = list(path.relative_to(src).parts[:-1])
    units = {unit_of(p.relative_to(src)) for p in src.rglob("*.py")}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level:    # relative: inside the package
            base = pkg[:len(pkg) - node.level + 1] + (node.module or "").split(".")
            names = [".".join(p for p in base + [a.name] if p) for a in node.names]
            names = ["scalesgd." + n for n in names]
        elif isinstance(node, ast.ImportFrom):
            names = [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        lazy = _in_function(node, parents)
        for name in names:
            parts = name.split(".")
            if parts[0] == "scalesgd" and len(parts) > 1:
                u = next((c for c in (parts[1] + "/", parts[1] + ".py") if c in units), None)
                if u is not None:
                    out.append((u, True, lazy))
            elif parts[0] != "scalesgd" and parts[0] not in sys.stdlib_module_names \
                    and parts[0] != "__future__":
                out.append((".".join(parts[:2]) if parts[0] in NAMESPACES else parts[0], False, lazy))
    return out


def import_graph(src: Path) -> dict[str, dict[str, bool]]:
    """unit -> {target: lazy}: a target is lazy when every import of it in the unit is."""
    graph: dict[str, dict[str, bool]] = {}
    for path in sorted(src.rglob("*.py")):
        u = unit_of(path.relative_to(src))
        if u == "__init__.py":                   # the package's own marker: nothing to show
            continue
        deps = graph.setdefault(u, {})
        for target, internal, lazy in imports_of(path, src):
            key = target if internal else "+" + target
            if target != u:
                deps[key] = deps.get(key, True) and lazy
    return graph


def dependency_order(graph: dict[str, dict[str, bool]]) -> list[str]:
    """Units with their dependencies first (ties by name); a cycle raises, naming its units."""
    order, left = [], sorted(graph)
    while left:
        ready = [u for u in left if all(d in order for d in graph[u] if not d.startswith("+"))]
        if not ready:
            raise ValueError(f"import cycle among {', '.join(left)}")
        order += ready
        left = [u for u in left if u not in ready]
    return order


def _cell(deps: dict[str, bool]) -> str:
    now = [f"`{d}`" for d, lazy in sorted(deps.items()) if not lazy]
    later = [f"`{d}`" for d, lazy in sorted(deps.items()) if lazy]
    return ", ".join(now) + ("; " if now and later else "") + ("lazily " + ", ".join(later) if later else "")


def imports_block(src: Path) -> str:
    graph = import_graph(src)
    out = ["| part | imports from the package | imports from outside (not the standard library) |",
           "|---|---|---|"]
    for u in dependency_order(graph):
        inner = {d: lazy for d, lazy in graph[u].items() if not d.startswith("+")}
        outer = {d[1:]: lazy for d, lazy in graph[u].items() if d.startswith("+")}
        out.append(f"| `{u}` | {_cell(inner) or '–'} | {_cell(outer) or '–'} |")
    return "\n".join(out)


BLOCKS = {"protocol": protocol_block, "imports": imports_block}


# ---------------------------------------------------------------------------- rewriting the docs
def render(text: str, src: Path, where: str) -> tuple[str, list[str]]:
    """``text`` with every block regenerated, and the names of the blocks that changed."""
    stale = []

    def fill(m):
        if m.group(2) not in BLOCKS:
            raise SystemExit(f"{where}: unknown generated block {m.group(2)!r} (known: {', '.join(BLOCKS)})")
        body = BLOCKS[m.group(2)](src) + "\n"
        if body != m.group(3):
            stale.append(m.group(2))
        return m.group(1) + body + m.group(4)

    return BLOCK.sub(fill, text), stale


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 if a block is stale")
    ap.add_argument("--docs", type=Path, default=DOCS, help="the folder of Markdown files (default: docs/)")
    ap.add_argument("--src", type=Path, default=SRC, help="the package source (default: src/scalesgd)")
    args = ap.parse_args(argv)
    stale = []
    for page in sorted(args.docs.glob("*.md")):
        text = page.read_text(encoding="utf-8")
        new, changed = render(text, args.src, str(page))
        stale += [f"{page.name}: block '{name}'" for name in changed]
        if changed and not args.check:
            page.write_text(new, encoding="utf-8")
    if stale and args.check:
        print("stale generated docs (the code changed; run `python docs/generate.py` and commit the "
              "result):\n  " + "\n  ".join(stale), file=sys.stderr)
        return 1
    print("\n".join(f"rewrote {s}" for s in stale) or "generated blocks are current")
    return 0


if __name__ == "__main__":
    sys.exit(main())
