"""The reference table of every key and flag in docs/cli.md, rendered from the schema."""
from __future__ import annotations

import typing

from .schema import SECTIONS, Config, fields_of, flag_name


def reference_markdown() -> str:
    """The table of every key and flag, as included in docs/cli.md (a test keeps them equal):
    ``python -c "from scalesgd.config import reference_markdown as r; print(r())"``."""
    defaults, out = Config(), []
    for sec, cls in SECTIONS.items():
        out += [f"### [{sec}]", "", "| key | flag | type | default | meaning |", "|---|---|---|---|---|"]
        hints = typing.get_type_hints(cls)
        for f, meta in fields_of(sec):
            flag = flag_name(sec, f.name).replace("_", "-")
            typ = hints[f.name]
            flags = f"`--{flag}` / `--no-{flag}`" if typ is bool else f"`--{flag}`"
            value = getattr(getattr(defaults, sec), f.name)
            shown = "[" + ", ".join(map(str, value)) + "]" if isinstance(value, tuple) else \
                ('""' if value == "" else str(value))
            text = meta.get("help", "")
            if meta.get("choices"):
                text += " (" + " \\| ".join(map(str, meta["choices"])) + ")"
            tname = getattr(typ, "__name__", str(typ).replace("typing.", ""))
            out.append(f"| `{f.name}` | {flags} | {tname} | `{shown}` | {text} |")
        out.append("")
    return "\n".join(out)
