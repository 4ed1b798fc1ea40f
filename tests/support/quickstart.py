"""The README's Quickstart as steps a test can run: the files it shows (``python``
blocks whose first line is ``# <name>.py``) and the commands of its ``console``
blocks (``$ ...`` lines, with the output lines the block shows after each)."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
# Commands that run until they are stopped (a terminal of their own in the README).
SERVICES = frozenset({"emitter", "worker", "status-view"})
_TIME = re.compile(r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(\.\d+)?Z")


@dataclass
class Step:
    line: str  # as written, without "$ "
    argv: list[str]
    output: list[str] = field(default_factory=list)

    @property
    def service(self) -> bool:
        return len(self.argv) > 1 and self.argv[0] == "dueflow" and self.argv[1] in SERVICES


def section(text: str, title: str = "Quickstart") -> str:
    """The ``## title`` section (its ``###`` subsections included)."""
    return text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def quickstart(readme: Path = README) -> tuple[dict[str, str], list[Step]]:
    """(file name -> content, the commands in order) of the README's Quickstart."""
    text = section(readme.read_text())
    files: dict[str, str] = {}
    steps: list[Step] = []
    for lang, body in re.findall(r"```(\w*)\n(.*?)\n```", text, flags=re.S):
        lines = body.splitlines()
        if lang == "python" and lines and re.fullmatch(r"# [\w/.-]+\.py", lines[0]):
            files[lines[0][2:]] = body + "\n"
        elif lang == "console":
            for line in lines:
                if line.startswith("$ "):
                    command = line[2:]
                    steps.append(Step(command, shlex.split(command, comments=True)))
                elif steps and line.strip():
                    steps[-1].output.append(line)
    return files, steps


def same_line(shown: str, got: str) -> bool:
    """Whether an output line is the one the README shows, times aside."""
    return _TIME.sub("<time>", shown.strip()) == _TIME.sub("<time>", got.strip())
