"""The in-memory example of docs/workers.md, "Steering jobs", runs as written."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

DOC = Path(__file__).resolve().parents[2] / "docs" / "workers.md"


def test_the_in_memory_steering_example_runs() -> None:
    text = DOC.read_text()
    start = text.index("## Steering jobs")
    section = text[start : text.index("\n## ", start)]  # to the next section
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)
    (example,) = [b for b in blocks if "InMemoryPipeline" in b]
    namespace: dict[str, Any] = {"__name__": "docs_workers_steering"}
    exec(compile(example, str(DOC), "exec"), namespace)
    assert namespace["sent"] == [{"text": "new"}]
