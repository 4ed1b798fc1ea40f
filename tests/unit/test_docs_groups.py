"""The in-memory example of docs/workers.md, "Groups", runs as written."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

DOC = Path(__file__).resolve().parents[2] / "docs" / "workers.md"


def test_the_in_memory_groups_example_runs() -> None:
    text = DOC.read_text()
    start = text.index("## Groups: a callback")
    section = text[start : text.index("\n## ", start)]  # to the next section
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)
    (example,) = [b for b in blocks if "InMemoryPipeline" in b]
    namespace: dict[str, Any] = {"__name__": "docs_workers_groups"}
    exec(compile(example, str(DOC), "exec"), namespace)
    (states,) = namespace["published"]
    assert len(states) == 5
