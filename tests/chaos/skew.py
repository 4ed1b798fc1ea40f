"""Processes with a skewed wall clock: Debian's libfaketime, preloaded.

``FAKETIME="+2.000"`` offsets ``CLOCK_REALTIME`` (``time.time()``,
``datetime.now()``, librdkafka's message timestamps, the JSON log's ``ts``)
by a constant. What was measured with Debian bookworm's libfaketime 0.9.10
and CPython 3.11 (see ``docs/operations.md``, "Clock skew"):

- It fakes ``CLOCK_MONOTONIC`` too, as ``start wall time + offset + elapsed``:
  a constant offset from the kernel's monotonic clock, the rate unchanged,
  so intervals measured on it (asyncio, librdkafka's timers) stay right.
- The waits it wraps (``clock_nanosleep``, ``pthread_cond_timedwait``,
  ``sem_timedwait``, ``poll``, ``epoll_wait``, ...) get their deadlines moved
  back onto the kernel's clock; ``sem_clockwait`` is not wrapped, and CPython
  waits on every lock with a timeout through it: ``Event.wait(0.5)`` hangs
  for good. Nor is glibc's C11 ``cnd_timedwait``, which librdkafka (as bundled
  with confluent-kafka) waits with: 2 s ahead, a 1 s consumer poll took 11 s;
  2 s behind, its waits spin. ``clockwait.c`` (preloaded first, compiled here
  with ``cc``) moves those deadlines onto the kernel's clock as well.
- ``FAKETIME_DONT_FAKE_MONOTONIC=1`` is no way out: 0.9.10's
  ``clock_nanosleep`` wrapper still translates absolute monotonic deadlines,
  and ``time.sleep`` fails with ``EINVAL``.

A missing libfaketime or compiler raises :class:`SkewUnavailable`: a chaos run
that was asked for clock skew fails instead of skipping the fault kinds.
"""

from __future__ import annotations

import glob
import hashlib
import random
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

LIBFAKETIME_GLOBS = (
    "/usr/lib/*/faketime/libfaketime.so.1",
    "/usr/lib/faketime/libfaketime.so.1",
    "/usr/local/lib/faketime/libfaketime.so.1",
)
SHIM_SOURCE = Path(__file__).with_name("clockwait.c")
SKEW_MS = 2_000


class SkewUnavailable(RuntimeError):
    """libfaketime or a C compiler is missing: clock-skew faults cannot run."""


def draw_skew_ms(rng: random.Random, *, magnitude_ms: int = SKEW_MS) -> int:
    """+magnitude or -magnitude, at random."""
    return magnitude_ms if rng.random() < 0.5 else -magnitude_ms


def faketime_spec(skew_ms: int) -> str:
    """The ``FAKETIME`` value for a constant offset: seconds with a sign, e.g. ``+2.000``.

    (libfaketime reads a leading ``+``/``-`` as an offset from the real time,
    in seconds unless an ``m``/``h``/``d``/``y`` follows.)
    """
    return f"{skew_ms / 1000:+.3f}"


def skewed_env(
    env: Mapping[str, str], *, skew_ms: int, libfaketime: Path, shim: Path
) -> dict[str, str]:
    """``env`` for a process whose wall clock runs ``skew_ms`` ahead (negative: behind).

    The shim comes first in ``LD_PRELOAD`` so its waits resolve before libc's and its
    ``clock_gettime`` calls reach libfaketime's. ``NO_FAKE_STAT``: file times stay
    real (a faked process would otherwise write .pyc files with faked source times).
    """
    out = dict(env)
    preload = [str(shim), str(libfaketime)]
    if out.get("LD_PRELOAD"):
        preload.append(out["LD_PRELOAD"])
    out["LD_PRELOAD"] = " ".join(preload)
    out["FAKETIME"] = faketime_spec(skew_ms)
    out["NO_FAKE_STAT"] = "1"
    out.pop("FAKETIME_DONT_FAKE_MONOTONIC", None)
    return out


def faketime_command(argv: list[str], *, skew_ms: int) -> list[str]:
    """The same through Debian's ``faketime`` wrapper, for a shell (it forks: the pid
    it returns is the wrapper's, so the suite preloads the library itself)."""
    return ["faketime", "-f", faketime_spec(skew_ms), *argv]


def find_libfaketime() -> Path:
    for pattern in LIBFAKETIME_GLOBS:
        found = sorted(glob.glob(pattern))
        if found:
            return Path(found[0])
    raise SkewUnavailable(
        "libfaketime.so.1 not found (looked in "
        + ", ".join(LIBFAKETIME_GLOBS)
        + "): install Debian's faketime package (`make faketime-deps`)"
    )


def build_shim(out_dir: Path) -> Path:
    """Compile ``clockwait.c`` into ``out_dir`` (once per source version)."""
    source = SHIM_SOURCE.read_bytes()
    target = out_dir / f"clockwait-{hashlib.sha256(source).hexdigest()[:12]}.so"
    if target.exists():
        return target
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise SkewUnavailable("no C compiler (cc) to build the clock-skew shim clockwait.c")
    out_dir.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    proc = subprocess.run(
        [cc, "-shared", "-fPIC", "-O2", "-o", str(partial), str(SHIM_SOURCE), "-ldl"],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise SkewUnavailable(f"building clockwait.c failed:\n{proc.stderr}")
    partial.rename(target)
    return target


class ClockSkewer:
    """Environment for skewed children; :meth:`prepare` finds and builds what it needs."""

    def __init__(self, work_dir: Path) -> None:
        self.work_dir = work_dir
        self._libfaketime: Path | None = None
        self._shim: Path | None = None

    def prepare(self) -> tuple[Path, Path]:
        """libfaketime and the shim; raises :class:`SkewUnavailable` when clock skew
        cannot be had here."""
        if self._libfaketime is None or self._shim is None:
            self._libfaketime = find_libfaketime()
            self._shim = build_shim(self.work_dir)
        return self._libfaketime, self._shim

    def env(self, base: Mapping[str, str], skew_ms: int) -> dict[str, str]:
        if skew_ms == 0:
            return dict(base)
        libfaketime, shim = self.prepare()
        return skewed_env(base, skew_ms=skew_ms, libfaketime=libfaketime, shim=shim)
