"""A deployment of mixed releases on the test's broker and topic prefix.

:class:`Deployment` starts emitters, workers and status views of any release (``python -m
dueflow emitter|worker`` of that release's interpreter), all sharing one
settings file, one ledger and the handler of ``tests/upgrade/app``; replaces
one process by another as a rolling update does (the new one started and
ready, then SIGTERM to the old one, which must leave by itself within its
grace period); runs any release's CLI; and stops every process it started by
pid. :class:`Stream` is the scheduling service: ``tests/upgrade/stream.py``
run by one release's interpreter, switched to another's without a gap.

Every process runs in the test's temporary directory with only the handler's
folder on ``PYTHONPATH``, so a process of the previous release imports its own
dueflow, never this tree's.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient

from dueflow.broker.ports import free_port
from dueflow.config import Settings, load_settings
from dueflow.kafka.clients import make_admin
from dueflow.kafka.topics import names
from tests.integration.pipeline_support import Proc, log_ms, wait_for
from tests.upgrade.ledger import Ledger
from tests.upgrade.release import Release

HERE = Path(__file__).resolve().parent
APP_DIR = HERE / "app"
APP = "upgrade_tasks"
STREAM_SCRIPT = HERE / "stream.py"
QUEUE = "jobs"
RETRY_TIERS_MS = (2_000, 4_000)

# Settings every release reads (nothing newer than the oldest release knows). The
# wheel turns in seconds up to a level of 12 s slots (96 s), so a job due a minute
# out waits in a slot the previous release's SDK chose until the current emitter
# opens it; retries wait 2 s, then 4 s.
CONFIG = f"""
[wheel]
levels = "8x100,8x500,8x2000,8x12000"
near_partitions = 2
near_window_ms = 300
lookahead_ms = 100

[emitter]
session_timeout_ms = 3000
heartbeat_interval_ms = 300
batch_max_ms = 10
housekeeping_interval_ms = 300

[[queues]]
name = "{QUEUE}"
partitions = 3
retry_tiers_ms = [{", ".join(str(t) for t in RETRY_TIERS_MS)}]

[worker]
session_timeout_ms = 3000
transaction_timeout_ms = 5000
commit_interval_ms = 50
shutdown_grace_s = 10.0

[observability]
log_format = "json"
"""

# What a Deployment would give each pod (SIGKILL after it fails the test).
GRACE_S = {"emitter": 20.0, "worker": 25.0, "status": 30.0}


@dataclass
class Member:
    """One process of the deployment."""

    role: str  # "emitter", "worker" or "status"
    release: Release
    proc: Proc
    metrics_port: int  # a status view's HTTP port
    app_id: str | None = None  # a status view's app id (its consumer group, changelogs)

    @property
    def name(self) -> str:
        return self.proc.name

    @property
    def pid(self) -> int:
        return self.proc.pid


@dataclass
class Replacement:
    """One step of a rolling update, as the report shows it."""

    old: Member
    new: Member
    term_ms: int  # wall time of the SIGTERM
    exit_s: float  # SIGTERM to exit
    was_active: bool  # an emitter that held the lease
    busy: tuple[int, int] | None = None  # a worker's jobs running, retries pending
    takeover_s: float | None = None

    def row(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "replaced": f"{self.old.name} ({self.old.release.name})",
            "by": f"{self.new.name} ({self.new.release.name})",
            "exit_s": self.exit_s,
        }
        if self.old.role == "emitter":
            out["active"] = self.was_active
        if self.busy is not None:
            out["running"], out["retries_pending"] = self.busy
        if self.takeover_s is not None:
            out["takeover_s"] = self.takeover_s
        return out


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass
class Deployment:
    """The processes of one test: its settings file, ledger, and every process by pid."""

    bootstrap: str
    prefix: str
    tmp: Path
    members: list[Member] = field(default_factory=list)  # running
    retired: list[Member] = field(default_factory=list)  # replaced or stopped
    replacements: list[Replacement] = field(default_factory=list)
    serial: int = 0

    def __post_init__(self) -> None:
        self.config = self.tmp / "dueflow.toml"
        self.config.write_text(CONFIG)
        self.settings: Settings = load_settings(config_file=self.config, env=self._cluster_env())
        self.ledger = Ledger(self.tmp / "ledger.db")
        self._others: list[Proc] = []  # streams, one-off commands left running
        self._admin: AdminClient | None = None

    # ------------------------------------------------------------ environment
    def _cluster_env(self) -> dict[str, str]:
        return {"DUEFLOW_BOOTSTRAP": self.bootstrap, "DUEFLOW_TOPIC_PREFIX": self.prefix}

    def env(self, release: Release, extra: dict[str, str] | None = None) -> dict[str, str]:
        """A process's environment: the cluster, the settings file, the handler's folder
        only on PYTHONPATH, the ledger and the release's name."""
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("DUEFLOW_", "OTEL_", "PROMETHEUS_", "PYTHON"))
        }
        env.update(self._cluster_env())
        env["DUEFLOW_CONFIG"] = str(self.config)
        env["PYTHONPATH"] = str(APP_DIR)
        env["DUEFLOW_UPGRADE_LEDGER"] = str(self.ledger.path)
        env["DUEFLOW_UPGRADE_RELEASE"] = release.name
        env.update(extra or {})
        return env

    def spawn(
        self, name: str, argv: list[str], release: Release, env: dict[str, str] | None = None
    ) -> Proc:
        """Start ``argv`` with its output in ``<tmp>/<name>.log``; stopped in :meth:`stop_all`."""
        log_path = self.tmp / f"{name}.log"
        with log_path.open("ab") as out:
            popen = subprocess.Popen(
                argv,
                env=self.env(release, env),
                cwd=self.tmp,  # never this tree: its dueflow/ would shadow the release's
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        return Proc(name, popen, log_path)

    # ------------------------------------------------------------ processes
    def start(
        self,
        role: str,
        release: Release,
        env: dict[str, str] | None = None,
        *,
        app_id: str | None = None,
    ) -> Member:
        """Start an emitter, a worker or a status view (``app_id``: its faust app id,
        default ``<prefix>.status``; its data directory is new) of ``release``, not
        waiting for it to be ready."""
        self.serial += 1
        port = free_port()
        name = f"{role}-{self.serial}-{release.name}"
        if role == "status":
            app_id = app_id or f"{self.prefix}.status"
            data = self.tmp / f"{name}-data"
            argv = release.argv(
                "status-view", "--port", str(port), "--app-id", app_id, "--data-dir", str(data)
            )
        elif role == "emitter":
            argv = release.argv("emitter", "--metrics-port", str(port))
        elif role == "worker":
            argv = release.argv(
                "worker", "--app", APP, "--queues", QUEUE, "--metrics-port", str(port)
            )
        else:
            raise ValueError(f"role: got {role!r}; accepted: 'emitter', 'worker' or 'status'")
        member = Member(role, release, self.spawn(name, argv, release, env), port, app_id)
        self.members.append(member)
        return member

    def wait_ready(self, member: Member, timeout: float = 120.0) -> None:
        """Until ``member`` is ready: ``/readyz`` where the release serves it; else an
        emitter in the emitter group, a worker with its partitions assigned."""

        def ready() -> bool:
            if not member.proc.alive():
                raise AssertionError(
                    f"{member.name} exited with {member.proc.popen.returncode}:\n"
                    f"{member.proc.log()[-4000:]}"
                )
            if member.role == "status":  # every release's view answers /healthz
                return _http_status(member.metrics_port, "/healthz") == 200
            if member.release.serves_probes:
                return _http_status(member.metrics_port, "/readyz") == 200
            if member.role == "emitter":
                return member.pid in self.emitter_group()
            return bool(member.proc.events("partitions assigned"))

        wait_for(f"{member.name} ready", ready, timeout)

    def emitters(self) -> list[Member]:
        return [m for m in self.members if m.role == "emitter"]

    def workers(self) -> list[Member]:
        return [m for m in self.members if m.role == "worker"]

    def status_view(self, app_id: str | None = None) -> Member:
        """The running status view of ``app_id`` (default ``<prefix>.status``)."""
        want = app_id or f"{self.prefix}.status"
        return next(m for m in self.members if m.role == "status" and m.app_id == want)

    def emitter_group(self) -> dict[int, bool]:
        """Pid of each member of the emitter group -> whether it holds the lease (the
        active emitter). Read from the group's description, which every release gives
        alike (its client id ends in its pid)."""
        if self._admin is None:
            self._admin = make_admin(self.settings)
        group = names(self.settings).emitter_group
        try:
            desc = self._admin.describe_consumer_groups([group], request_timeout=10)[group].result()
        except Exception:  # no coordinator yet, or the group is empty
            return {}
        out: dict[int, bool] = {}
        for m in desc.members:
            pid = m.client_id.rsplit("-", 1)[-1]
            if pid.isdigit():
                parts = m.assignment.topic_partitions if m.assignment else []
                out[int(pid)] = any(tp.partition == 0 for tp in parts)
        return out

    def active_emitter(self, timeout: float = 60.0) -> Member:
        """The emitter that holds the lease (waits while nobody does)."""

        def find() -> Member | None:
            holders = {pid for pid, active in self.emitter_group().items() if active}
            return next((m for m in self.emitters() if m.pid in holders), None)

        found: Member = wait_for("an active emitter", find, timeout)
        return found

    def standby_emitter(self) -> Member:
        active = self.active_emitter()
        return next(m for m in self.emitters() if m is not active)

    def replace(
        self,
        old: Member,
        release: Release,
        env: dict[str, str] | None = None,
        *,
        when_busy: bool = True,
    ) -> Member:
        """A rolling update's step: start the new process, wait until it is ready, SIGTERM
        the old one; it must leave by itself (exit 0) within its grace period.
        ``when_busy``: a worker is told to stop at a moment when it runs a job and has
        failed one whose retry has not run yet (both then go on elsewhere)."""
        new = self.start(old.role, release, env, app_id=old.app_id)
        self.wait_ready(new)
        busy = None
        if when_busy and old.role == "worker":

            def in_hand() -> tuple[int, int] | None:
                running, retries = self.ledger.busy(old.pid, _wall_ms())
                return (running, retries) if running and retries else None

            busy = wait_for(f"{old.name} running a job with a retry pending", in_hand, 60)
        was_active = old.role == "emitter" and self.emitter_group().get(old.pid, False)
        term_ms = _wall_ms()
        term = time.monotonic()
        os.kill(old.pid, signal.SIGTERM)
        grace = GRACE_S[old.role]
        try:
            code = old.proc.popen.wait(grace)
        except subprocess.TimeoutExpired:
            old.proc.stop()
            raise AssertionError(f"{old.name} outlived its grace period of {grace} s") from None
        assert code == 0, f"{old.name} exited with {code}\n{old.proc.log()[-3000:]}"
        self.members.remove(old)
        self.retired.append(old)
        step = Replacement(
            old, new, term_ms, round(time.monotonic() - term, 2), was_active, busy=busy
        )
        if was_active:  # until another emitter holds the lease
            self.active_emitter()
            step.takeover_s = round((_wall_ms() - term_ms) / 1000, 2)
        self.replacements.append(step)
        return new

    # ------------------------------------------------------------ commands
    def cli(
        self, release: Release, *argv: str, timeout: float = 120.0
    ) -> subprocess.CompletedProcess[str]:
        """``dueflow ARGV`` of ``release`` against this deployment's cluster and topics."""
        return subprocess.run(
            release.argv(*argv),
            env=self.env(release),
            cwd=self.tmp,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def cli_json(self, release: Release, *argv: str, ok: tuple[int, ...] = (0,)) -> Any:
        """A command's ``--json`` answer; its exit code must be one of ``ok``."""
        done = self.cli(release, *argv, "--json")
        assert done.returncode in ok, (
            f"dueflow {' '.join(argv)} ({release.name}) exited {done.returncode}:\n"
            f"{done.stdout[-3000:]}{done.stderr[-3000:]}"
        )
        return json.loads(done.stdout)

    # ------------------------------------------------------------ teardown
    def track(self, proc: Proc) -> Proc:
        self._others.append(proc)
        return proc

    def everyone(self) -> list[Proc]:
        return [m.proc for m in self.members + self.retired] + self._others

    def _worker_events(self, *what: str) -> Iterator[tuple[int, dict[str, Any]]]:
        """(worker pid, event) for each of its log events named in ``what``."""
        for member in self.members + self.retired:
            if member.role != "worker":
                continue
            for name in what:
                for e in member.proc.events(name):
                    yield member.proc.pid, e

    def aborted_commits(self) -> dict[int, list[int]]:
        """Worker pid -> when it forgot the attempts it had not committed (epoch ms, from
        its log): it started a queue over from the committed offsets (a commit aborted
        or past its commit window), or lost its partitions (its session expired: what
        it had not committed there is the next owner's to run)."""
        out: dict[int, list[int]] = {}
        for pid, e in self._worker_events("worker restarting queue", "partitions lost"):
            out.setdefault(pid, []).append(log_ms(e))
        return out

    def attempt_ends(self) -> dict[tuple[str, int, int], int]:
        """(job id, attempt, worker pid) -> when that worker ended the attempt (epoch
        ms, from its log): later than the handler's own end when the handler's
        result reached the worker late, or the worker timed it out."""
        out: dict[tuple[str, int, int], int] = {}
        for pid, e in self._worker_events("job.succeeded", "job.failed", "job.dead_letter"):
            key = _attempt_of(e, pid)
            out[key] = max(out.get(key, 0), log_ms(e))
        return out

    def attempt_starts(self) -> dict[tuple[str, int, int], list[int]]:
        """(job id, attempt, worker pid) -> when that worker started the attempt, each
        time (epoch ms, from its log): earlier than the handler's own start when the
        handler's thread began late."""
        out: dict[tuple[str, int, int], list[int]] = {}
        for pid, e in self._worker_events("job.started"):
            out.setdefault(_attempt_of(e, pid), []).append(log_ms(e))
        return out

    def logs(self) -> str:
        return "\n".join(f"===== {p.name}\n{p.log()[-6000:]}" for p in self.everyone())

    def stop_all(self) -> None:
        """Every process this deployment started, by pid (SIGTERM, then SIGKILL)."""
        for proc in reversed(self.everyone()):
            with contextlib.suppress(Exception):
                proc.stop()


def _attempt_of(e: dict[str, Any], pid: int) -> tuple[str, int, int]:
    """(job id, attempt, worker pid) of a worker's job event."""
    return (str(e.get("job_id")), int(e.get("attempt") or 0), pid)


def _http_status(port: int, path: str) -> int | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=3) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return None


class Stream:
    """The scheduling service: ``stream.py`` of one release at a time, writing what it
    scheduled to ``<tmp>/stream-<n>.jsonl``."""

    def __init__(self, deployment: Deployment, rate: int = 20) -> None:
        self.deployment = deployment
        self.rate = rate
        self.outputs: list[Path] = []
        self.current: Proc | None = None
        self.next_index = 0

    def start(
        self,
        release: Release,
        *,
        far: int = 0,
        far_delay_s: float = 60.0,
        cron: tuple[str, ...] = (),
    ) -> None:
        """Start ``release``'s stream and wait until its scheduler is started; then
        stop the one before it (no gap in the stream)."""
        n = len(self.outputs) + 1
        out = self.deployment.tmp / f"stream-{n}.jsonl"
        self.outputs.append(out)
        argv = [
            str(release.python),
            str(STREAM_SCRIPT),
            "--out",
            str(out),
            "--sdk",
            release.name,
            "--rate",
            str(self.rate),
            "--first",
            str(self.next_index),
            "--far",
            str(far),
            "--far-delay-s",
            str(far_delay_s),
        ]
        for spec in cron:
            argv += ["--cron", spec]
        self.next_index += 1_000_000  # each stream its own range of job indexes
        proc = self.deployment.track(
            self.deployment.spawn(f"stream-{n}-{release.name}", argv, release)
        )

        def started() -> bool:
            if not proc.alive():
                raise AssertionError(f"{proc.name} exited:\n{proc.log()[-4000:]}")
            return any(d["type"] == "job" for d in _read_jsonl(out))

        wait_for(f"{proc.name} scheduling", started, 60)
        before, self.current = self.current, proc
        if before is not None:
            _stop_stream(before)

    def stop(self) -> None:
        if self.current is not None:
            _stop_stream(self.current)
            self.current = None

    def facts(self) -> list[dict[str, Any]]:
        return [doc for out in self.outputs for doc in _read_jsonl(out)]


def _stop_stream(proc: Proc) -> None:
    os.kill(proc.pid, signal.SIGTERM)
    code = proc.popen.wait(30)
    assert code == 0, f"{proc.name} exited with {code}:\n{proc.log()[-3000:]}"


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.endswith("}")]
