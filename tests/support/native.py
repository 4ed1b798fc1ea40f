"""The modules setup.py compiles with mypyc, and whether a build of them is stale."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def native_sources() -> list[Path]:
    """The ``.py`` files setup.py lists in ``NATIVE``."""
    text = (ROOT / "setup.py").read_text()
    listed = re.search(r"^NATIVE = \[(.*?)\]", text, re.S | re.M)
    assert listed is not None, "setup.py lists no NATIVE modules"
    return [ROOT / p for p in re.findall(r'"([^"]+\.py)"', listed.group(1))]


def module_name(source: Path) -> str:
    """``dueflow/records/worker_decoder.py`` -> ``dueflow.records.worker_decoder``."""
    return ".".join(source.relative_to(ROOT).with_suffix("").parts)


def stale_builds() -> list[str]:
    """Compiled modules older than their source: Python would import the old build."""
    out = []
    for source in native_sources():
        for built in source.parent.glob(f"{source.stem}.*.so"):
            if built.stat().st_mtime < source.stat().st_mtime:
                out.append(f"{built.relative_to(ROOT)} is older than {source.name}")
    return out
