"""How every benchmark reports: a two-column table on stdout, the JSON file (with where
it comes from: :func:`provenance`)."""

from __future__ import annotations

import json
import sys
from collections.abc import Collection, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


def provenance(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """When and how a result was measured, for the benchmarks page: the UTC time, the
    command (``python -m benchmarks.<name> ...`` without ``--json PATH``) and the
    machine (:func:`benchmarks.suite.machine`)."""
    from benchmarks.suite import machine

    argv = list(sys.argv if argv is None else argv)
    module = "benchmarks." + Path(argv[0]).stem if argv else "benchmarks"
    args: list[str] = []
    rest = argv[1:]
    i = 0
    while i < len(rest):
        if rest[i] == "--json":
            i += 2
            continue
        if not rest[i].startswith("--json="):
            args.append(rest[i])
        i += 1
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": " ".join(["python", "-m", module, *args]),
        "machine": machine(),
    }


def show(
    result: Mapping[str, Any], json_path: str | Path | None, *, hide: Collection[str] = ()
) -> None:
    """Print ``result`` (but the keys in ``hide``) and write all of it to ``json_path``."""
    width = max(len(k) for k in result)
    for key, value in result.items():
        if key not in hide:
            print(f"{key:<{width}}  {value}")
    if json_path:
        path = Path(json_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        doc = {**result, "measured": result.get("measured") or provenance()}
        path.write_text(json.dumps(doc, indent=2) + "\n")
