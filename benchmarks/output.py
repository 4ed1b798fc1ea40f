"""How every benchmark reports: a two-column table on stdout, the JSON file."""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any


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
        path.write_text(json.dumps(result, indent=2) + "\n")
