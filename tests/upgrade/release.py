"""A release of dueflow as runnable processes: this work tree, or a previous one by git tag.

The previous release is the tree of its git tag (``git archive``), installed
in a virtualenv of its own under the dueflow cache
(``$DUEFLOW_CACHE`` or ``~/.cache/dueflow``)::

    releases/v0.1.0-00bf8b0xxxxx/
        wheels/     the release's wheel and every dependency (``pip wheel``,
                    from the package index or pip's cache; kept, so a
                    rebuild of the virtualenv needs no network)
        venv/       ``pip install --no-index`` from wheels/
        freeze.txt  what the virtualenv holds

keyed by the tag's commit, built once and reused by every later run. A
build holds a file lock, so two test processes never build it twice, and
writes ``venv/.dueflow-release`` last: a build that was interrupted is
thrown away and made again.

``python -m tests.upgrade.release`` builds it ahead of time (``make
releases``, which ``make test`` runs first) and prints the figures.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import os
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from dueflow.broker.local import default_cache_dir

ROOT = Path(__file__).resolve().parents[2]
# The release the upgrade tests start from.
PREVIOUS_TAG = "v0.1.0"
PREVIOUS = PREVIOUS_TAG
# The commit of each release tag: a clone made without tags (as CI makes) still has
# the commit in its history, so the release is found by it.
RELEASE_COMMITS = {"v0.1.0": "00bf8b0de1b08ae9bece77f283a62f673f5c8c41"}
# What this work tree is called in ledgers and reports.
CURRENT = "current"
_STAMP = ".dueflow-release"


class ReleaseUnavailable(Exception):
    """The previous release cannot be had here; the message says how to fix it."""


@dataclass(frozen=True, slots=True)
class Release:
    """One version of dueflow that can be run: an interpreter that imports it."""

    name: str  # the tag, or CURRENT
    commit: str
    python: Path
    # Serves /livez and /readyz beside /metrics (the previous release has no probes).
    serves_probes: bool

    @property
    def is_current(self) -> bool:
        return self.name == CURRENT

    def argv(self, *args: str) -> list[str]:
        """``python -m dueflow ARGS`` of this release."""
        return [str(self.python), "-m", "dueflow", *args]


def current_release() -> Release:
    """This work tree, as the test session's interpreter imports it."""
    return Release(CURRENT, _git("rev-parse", "HEAD"), Path(sys.executable), serves_probes=True)


def tag_commit(tag: str, repo: Path = ROOT) -> str:
    """The commit of ``tag`` (or, for a known release, its commit in a clone made without
    tags); :class:`ReleaseUnavailable` naming the fix when the clone has neither."""
    for ref in (tag, RELEASE_COMMITS.get(tag)):
        if ref is None:
            continue
        try:
            return _git("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", repo=repo)
        except subprocess.CalledProcessError:
            continue
    shallow = _git("rev-parse", "--is-shallow-repository", repo=repo) == "true"
    how = (
        "this is a shallow clone: run `git fetch --unshallow --tags origin`"
        if shallow
        else "run `git fetch --tags origin`"
    )
    raise ReleaseUnavailable(
        f"the upgrade tests run the previous release, git tag {tag}, which this clone "
        f"({repo}) does not have; {how}, then run the tests again"
    )


def release_home(tag: str, commit: str, cache: Path | None = None) -> Path:
    """Where the release's wheels and virtualenv live (keyed by the tag's commit)."""
    return (cache or default_cache_dir()) / "releases" / f"{tag}-{commit[:12]}"


def previous_release(
    tag: str = PREVIOUS_TAG,
    *,
    cache: Path | None = None,
    say: Callable[[str], None] | None = None,
) -> Release:
    """The release of ``tag``, built on first use (see the module doc), else reused."""
    commit = tag_commit(tag)
    home = release_home(tag, commit, cache)
    venv = home / "venv"
    release = Release(tag, commit, venv / "bin" / "python", serves_probes=False)
    if _built(venv, commit):
        return release
    home.mkdir(parents=True, exist_ok=True)
    with _locked(home / "build.lock"):
        if not _built(venv, commit):  # another process may have built it meanwhile
            _build(tag, commit, home, say or (lambda _line: None))
    return release


def _built(venv: Path, commit: str) -> bool:
    stamp = venv / _STAMP
    return stamp.is_file() and stamp.read_text().strip() == commit


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _build(tag: str, commit: str, home: Path, say: Callable[[str], None]) -> None:
    started = time.monotonic()
    wheels = home / "wheels"
    if not (wheels / _STAMP).is_file():
        src = home / "src"
        shutil.rmtree(src, ignore_errors=True)
        shutil.rmtree(wheels, ignore_errors=True)
        _extract(commit, src)
        say(f"{tag}: wheels of the release and its dependencies (pip wheel) into {wheels}")
        _run(
            [sys.executable, "-m", "pip", "wheel", "--quiet", "--wheel-dir", str(wheels), str(src)]
        )
        (wheels / _STAMP).write_text(commit + "\n")
        shutil.rmtree(src)
    venv = home / "venv"
    shutil.rmtree(venv, ignore_errors=True)
    say(f"{tag}: virtualenv {venv} from the wheels (no index)")
    # Without a pip of its own: this interpreter's pip installs into it (--python).
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python = venv / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", str(python)]
    _run([*pip, "install", "--quiet", "--no-index", "--find-links", str(wheels), "dueflow"])
    where = _run([str(python), "-c", "import dueflow; print(dueflow.__file__)"], cwd=home)
    if not where.startswith(str(venv)):
        raise ReleaseUnavailable(f"{tag}: the virtualenv imports dueflow from {where}")
    freeze = _run([*pip, "freeze"])
    (home / "freeze.txt").write_text(freeze + "\n")
    (venv / _STAMP).write_text(commit + "\n")
    say(f"{tag}: built in {time.monotonic() - started:.0f} s ({home})")


def _extract(commit: str, dest: Path) -> None:
    """The commit's tree, as ``git archive`` gives it, into ``dest``."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", commit],
        check=True,
        capture_output=True,
    ).stdout
    dest.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(dest, filter="data")


def _run(argv: list[str], cwd: Path | None = None) -> str:
    # The release's own environment: nothing of this tree's (PYTHONPATH) may leak in.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise ReleaseUnavailable(
            f"{' '.join(argv[:6])} ... failed ({done.returncode}):\n{done.stdout}{done.stderr}"
        )
    return done.stdout.strip()


def _git(*args: str, repo: Path = ROOT) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True
    ).stdout.strip()


def main() -> int:
    """Build (or find) the previous release and say where it is and how long it took."""
    started = time.monotonic()
    try:
        release = previous_release(say=print)
    except ReleaseUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    took = time.monotonic() - started
    print(f"{release.name} ({release.commit[:12]}): {release.python} ({took:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
