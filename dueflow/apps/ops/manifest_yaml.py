"""YAML text of Kubernetes manifests (plain data: mappings, lists, strings, numbers).

The runtime has no YAML library, and manifests need only a small part of
YAML: block mappings and sequences, and scalars. Strings are written
JSON-quoted (valid YAML, never read as a number, boolean or null), or as a
literal block (``|``) when they span lines, so an embedded settings file
stays readable. tests/unit/test_kubernetes_manifests.py reads every rendered
file back with a real YAML parser.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

_PLAIN_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_./-]*$")
_RESERVED = frozenset({"null", "true", "false", "y", "n", "yes", "no", "on", "off"})


def dump_documents(documents: Iterable[Mapping[str, Any]]) -> str:
    """Documents separated by ``---``, each ending in a newline."""
    return "---\n".join(dump(doc) for doc in documents)


def dump(value: Mapping[str, Any]) -> str:
    """One document: a mapping at the top."""
    return "".join(_mapping(value, 0))


def _key(key: str) -> str:
    # Words YAML reads as null or a boolean (1.1: y, n, on, off, yes, no) are quoted.
    if _PLAIN_KEY.match(key) and key.lower() not in _RESERVED:
        return key
    return json.dumps(key, ensure_ascii=False)


def _scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return json.dumps(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    raise TypeError(f"not a manifest scalar: {value!r}")


def _block(text: str, indent: int) -> list[str]:
    """A literal block scalar: ``|`` (keeps the final newline) or ``|-``."""
    chomp = "" if text.endswith("\n") else "-"
    body = text[:-1] if text.endswith("\n") else text
    pad = " " * indent
    lines = [f"|{chomp}\n"]
    lines += [f"{pad}{line}\n" if line else "\n" for line in body.split("\n")]
    return lines


def _is_block(value: Any) -> bool:
    """A multi-line string YAML can hold as a literal block and read back the same."""
    if not isinstance(value, str) or "\n" not in value:
        return False
    lines = value.rstrip("\n").split("\n")
    return (
        not value.endswith("\n\n")
        and bool(lines[0])
        and not lines[0][0].isspace()
        and all(line == line.rstrip() and "\t" not in line for line in lines)
    )


def _mapping(value: Mapping[str, Any], indent: int) -> list[str]:
    pad = " " * indent
    out: list[str] = []
    for key, item in value.items():
        head = f"{pad}{_key(str(key))}:"
        out += _entry(head, item, indent)
    return out


def _sequence(value: Sequence[Any], indent: int) -> list[str]:
    pad = " " * indent
    out: list[str] = []
    for item in value:
        if isinstance(item, Mapping) and item:
            inner = _mapping(item, indent + 2)
            out.append(f"{pad}- {inner[0].lstrip()}")
            out += inner[1:]
        else:
            out += _entry(f"{pad}-", item, indent)
    return out


def _entry(head: str, item: Any, indent: int) -> list[str]:
    if isinstance(item, Mapping):
        return [f"{head} {{}}\n"] if not item else [f"{head}\n", *_mapping(item, indent + 2)]
    if isinstance(item, list | tuple):
        return [f"{head} []\n"] if not item else [f"{head}\n", *_sequence(item, indent + 2)]
    if _is_block(item):
        first, *rest = _block(item, indent + 2)
        return [f"{head} {first}", *rest]
    return [f"{head} {_scalar(item)}\n"]
