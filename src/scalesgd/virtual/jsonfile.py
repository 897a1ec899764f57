"""Profiles and conditions are JSON files, shipped by name or given as a path: one reader for both."""
from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

from ..errors import ConfigError


def read(spec: str, shipped: dict[str, Path], what: str, where: str) -> tuple[dict, str]:
    """(the JSON object, where it came from for messages) of ``spec``: a shipped one's name (a key
    of ``shipped``) or a ``.json`` file's path; ``what`` names the kind (profile, condition),
    ``where`` the flag or key that gave it."""
    path = Path(spec)
    if path.suffix != ".json":
        if spec not in shipped:
            raise ConfigError(f"{where} {spec}: no such {what} (shipped: {', '.join(shipped)}; "
                              "or give a JSON file, see docs/virtual.md)")
        path = shipped[spec]
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{where} {path}: cannot read the {what} ({exc})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{where} {path}: a {what} is a JSON object")
    return raw, f"{where} {path}"


def refuse_unknown(raw: dict, cls, origin: str) -> None:
    """A one-line error naming the keys of ``raw`` that the dataclass ``cls`` does not have."""
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(f"{origin}: unknown key(s) {', '.join(unknown)} "
                          f"(known: {', '.join(sorted(known))})")


_TYPES = {"float": (int, float), "int": (int,), "str": (str,), "dict": (dict,), "bool": (bool,),
          "list": (list,), "None": (type(None),)}


def refuse_mistyped(raw: dict, cls, origin: str) -> None:
    """A one-line error naming the first key of ``raw`` whose value is not of its field's type in
    the dataclass ``cls`` (a number given as a string, say), instead of a TypeError later."""
    for f in fields(cls):
        if f.name not in raw:
            continue
        text = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
        names = [t.strip() for t in text.split("|")]
        allowed = tuple(t for n in names for t in _TYPES.get(n, (object,)))
        value = raw[f.name]
        if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
            raise ConfigError(f"{origin}: {f.name} is {' or '.join(names)}, got {json.dumps(value)}")
