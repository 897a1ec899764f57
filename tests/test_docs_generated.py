"""The docs' generated blocks equal what the code renders, and the import rules they state hold.

``docs/generate.py`` rewrites the blocks (the protocol's tag and header tables in methods.md, the
import table in architecture.md); ``--check`` is what a stale doc fails here, naming the command.
"""
import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from scalesgd.comm import wire as P

ROOT = Path(__file__).resolve().parents[1]
GENERATE = ROOT / "docs" / "generate.py"


def generate(*args, cwd=ROOT):
    return subprocess.run([sys.executable, str(GENERATE), *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120)


def load_generator():
    spec = importlib.util.spec_from_file_location("docs_generate", GENERATE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_generated_blocks_are_current():
    p = generate("--check")
    assert p.returncode == 0, p.stderr          # the message says: run `python docs/generate.py`


def test_a_stale_block_is_named_rewritten_and_the_rest_kept(tmp_path):
    # Real copies of the two pages, one table cell changed in each, a line added outside the blocks.
    docs = tmp_path / "docs"
    docs.mkdir()
    for name in ("methods.md", "architecture.md"):
        shutil.copy(ROOT / "docs" / name, docs / name)
    m, a = docs / "methods.md", docs / "architecture.md"
    m.write_text(m.read_text().replace("| `PUSH_HEADER` | `0x5101` |", "| `PUSH_HEADER` | `0x9999` |", 1)
                 + "\nhand-written tail\n")
    a.write_text(a.read_text().replace("| `comm/` |", "| `comm/` | `train/` |", 1))
    p = generate("--check", "--docs", str(docs))
    assert p.returncode == 1
    assert "methods.md: block 'protocol'" in p.stderr and "architecture.md: block 'imports'" in p.stderr
    assert "python docs/generate.py" in p.stderr, p.stderr
    assert "0x9999" in m.read_text()             # --check changes nothing
    p = generate("--docs", str(docs))
    assert p.returncode == 0 and "rewrote methods.md" in p.stdout, p.stdout + p.stderr
    text = m.read_text()
    assert "`0x9999`" not in text and "| `PUSH_HEADER` | `0x5101` |" in text
    assert text.endswith("\nhand-written tail\n")
    assert generate("--check", "--docs", str(docs)).returncode == 0


def test_an_unknown_block_name_is_refused(tmp_path):
    (tmp_path / "x.md").write_text("<!-- generated: nonsense -->\nold\n<!-- end generated: nonsense -->\n")
    p = generate("--check", "--docs", str(tmp_path))
    assert p.returncode != 0 and "unknown generated block 'nonsense'" in p.stderr, p.stderr


def test_protocol_tables_follow_the_definitions():
    md = P.reference_markdown()
    for t in P.Tag:
        assert f"| `{t.name}` | `{t.value:#06x}` |" in md
    for cls in (P.PushHeader, P.ReplyHeader):
        assert f"`{cls.__name__}`, int64[{cls.SIZE}]:" in md
        for i, name, meaning in P.header_fields(cls):
            assert getattr(cls, name) == i and f"| {i} | `{name}` | {meaning} |" in md
    assert [n for _, n, _ in P.header_fields(P.PushHeader)][-2:] == ["STOP", "CKPT"]
    assert "`EASGD` = 1, `ASGD` = 2" in md


def test_an_undescribed_field_or_tag_cannot_be_rendered(monkeypatch):
    class Grown:                                 # a field added without its meaning
        A, B, C = range(3)
        SIZE = 3
        FIELDS = ("a", "b")

    with pytest.raises(ValueError, match="Grown: .* match SIZE = 3"):
        P.header_fields(Grown)
    monkeypatch.delitem(P.TAG_MESSAGES, P.Tag.FUNNEL_DATA)
    with pytest.raises(ValueError, match="does not describe FUNNEL_DATA"):
        P.reference_markdown()


def test_the_scan_resolves_relative_and_lazy_imports(tmp_path):
    # A real package tree: relative imports at two levels, a lazy and an eager outside import.
    src = tmp_path / "scalesgd"
    (src / "a").mkdir(parents=True)
    (src / "errors.py").write_text("import os\n")
    (src / "a" / "__init__.py").write_text("")
    (src / "a" / "x.py").write_text("import numpy as np\nfrom ..errors import E\nfrom . import y\n"
                                    "def f():\n    import mpi4py\n    from nvidia.dali import fn\n")
    (src / "a" / "y.py").write_text("from scalesgd import errors\nimport mpi4py\n")
    (src / "top.py").write_text("def g():\n    from .a.x import f\n")
    gen = load_generator()
    graph = gen.import_graph(src)
    assert graph == {"a/": {"+numpy": False, "errors.py": False, "+mpi4py": False, "+nvidia.dali": True},
                     "errors.py": {}, "top.py": {"a/": True}}
    assert gen.dependency_order(graph) == ["errors.py", "a/", "top.py"]
    table = gen.imports_block(src)
    assert "| `a/` | `errors.py` | `mpi4py`, `numpy`; lazily `nvidia.dali` |" in table
    assert "| `top.py` | lazily `a/` | – |" in table


def test_the_import_rules_architecture_md_states():
    gen = load_generator()
    graph = gen.import_graph(gen.SRC)
    gen.dependency_order(graph)                 # raises on an import cycle
    mpi = sorted(u for u, deps in graph.items() if "+mpi4py" in deps)
    assert mpi == ["comm/"], mpi
    leaves = {u for u, deps in graph.items() if not any(not d.startswith("+") for d in deps)}
    assert {d for d in graph["comm/"] if not d.startswith("+")} <= leaves, graph["comm/"]
    for numerics in ("nn/", "optim/"):
        assert not {"+mpi4py", "+h5py", "+nvidia.dali"} & set(graph[numerics]), graph[numerics]
    # the network's closed forms import nothing; one performance model (the virtual cluster) uses them
    assert not graph["netmodel.py"], graph["netmodel.py"]
    assert sorted(u for u, deps in graph.items() if "netmodel.py" in deps) == ["virtual/"]
    for lazy in ("+nvidia.dali", "+PIL", "+simplejpeg", "+sklearn", "+cupy"):
        assert graph["data/"].get(lazy) is True, (lazy, graph["data/"])


# ---------------------------------------------------------------------------- links between the docs
def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)   # not in code
    return {slug(m.group(1)) for m in re.finditer(r"^#+ (.*)$", text, flags=re.M)}


def broken_links(root: Path) -> list[str]:
    """'page: target' for every relative Markdown link whose file or heading does not exist."""
    bad = []
    for page in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+:", target):                        # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists() or (anchor and dest.suffix == ".md" and anchor not in anchors(dest)):
                bad.append(f"{page.relative_to(root)}: {target}")
    return bad


def test_links_between_the_docs_resolve():
    assert not broken_links(ROOT), "\n".join(broken_links(ROOT))


def test_the_link_check_finds_a_missing_file_and_heading(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("[ok](docs/a.md#two-words) [gone](docs/b.md) [no](docs/a.md#nope)\n")
    (tmp_path / "docs" / "a.md").write_text("# A\n## Two words\n```\n# not a heading\n```\n[self](#a)\n")
    assert broken_links(tmp_path) == ["README.md: docs/b.md", "README.md: docs/a.md#nope"]
