"""The README and the docs pages: links that resolve, one quickstart, no history.

``make docs`` (``mkdocs build --strict``) checks the links between docs pages;
the README is outside the site, so its links are checked here."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from tests.support.quickstart import quickstart

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
# History belongs in the commit messages and the dated log, not in what users read.
HISTORY = r"issue [0-9]+|this session|previous session|that session|to be measured again"
CODE = ["dueflow", "producers", "consumers", "streams", "broker", "schemas"]


def anchors(page: Path) -> set[str]:
    """The heading anchors of a markdown page (lower case, punctuation dropped)."""
    out = set()
    for line in page.read_text().splitlines():
        m = re.match(r"#+ (.*)", line)
        if m:
            text = re.sub(r"[^\w\- ]", "", m.group(1).lower()).strip()
            out.add(re.sub(r"[ ]+", "-", text))
    return out


def test_every_link_of_the_readme_resolves() -> None:
    bad = []
    for target in LINK.findall(README.read_text()):
        if target.startswith(("http://", "https://", "#")):
            continue
        path, _, anchor = target.partition("#")
        missing = not (ROOT / path).exists()
        if missing or (anchor and anchor not in anchors(ROOT / path)):
            bad.append(target)
    assert bad == []


def test_the_readme_is_a_front_page() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= 300
    assert lines[3:5] == [
        "make demo    # the main job: a real pipeline on a local Kafka broker, in about a minute",
        "make test    # the lint gate, the docs build and every test tier against a real broker",
    ]


def test_getting_started_has_the_readme_s_quickstart() -> None:
    readme_files, readme_steps = quickstart(README)
    page_files, page_steps = quickstart(DOCS / "getting-started.md")
    assert page_files == readme_files
    assert [s.line for s in page_steps] == [s.line for s in readme_steps]


def test_no_history_in_the_readme_the_docs_or_the_code() -> None:
    found = subprocess.run(
        ["grep", "-rniE", HISTORY, "README.md", "docs", *CODE, "--include=*.md", "--include=*.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    ).stdout.splitlines()
    assert [f for f in found if not f.startswith("docs/benchmarks-log.md:")] == []
