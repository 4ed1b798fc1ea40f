"""The in-memory example of docs/scheduling.md, "Unique and debounced jobs", runs as written."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

DOC = Path(__file__).resolve().parents[2] / "docs" / "scheduling.md"


def test_the_unique_jobs_example_runs() -> None:
    text = DOC.read_text()
    section = text[text.index("## Unique and debounced jobs") :]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)
    (example,) = [b for b in blocks if "InMemoryPipeline" in b]
    namespace: dict[str, Any] = {"__name__": "docs_scheduling_unique"}
    exec(compile(example, str(DOC), "exec"), namespace)
    assert namespace["sent"] == [{"user": 7, "n": 2}, {"user": 42, "n": 1}]
