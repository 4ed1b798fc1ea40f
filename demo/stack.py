"""Everything the demo runs: a broker (unless ``DUEFLOW_BOOTSTRAP``), its topics,
two emitters, a worker supervisor with two processes and the status view.

:class:`DemoStack` is a context manager: whatever it started is stopped on
exit, by pid, in reverse order (workers first, so they commit what they
ran), also after Ctrl-C or a failure; the broker last. The settings every
process shares are written to ``<workdir>/dueflow.toml``.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from confluent_kafka.admin import AdminClient

from demo.ledger import ENV as LEDGER_ENV
from demo.processes import Child, http_ok, scrape, wait_for
from dueflow.broker.local import LocalBroker
from dueflow.broker.ports import free_port, free_port_pair
from dueflow.config import Settings, load_settings
from dueflow.kafka.clients import make_admin
from dueflow.kafka.topic_admin import TopicAdmin
from dueflow.kafka.topics import names, topic_layout

QUEUES = {"emails": 6, "reports": 3}
# Short retry tiers, so a failing job is retried (and the hopeless one dead)
# within seconds; a short emitter session, so the takeover is quick to watch.
RETRY_TIERS_MS = (500, 2_000)
EMITTER_SESSION_MS = 3_000
EMITTER_HEARTBEAT_MS = 300
DEFAULT_BROKER_PORT = 19192  # below the ephemeral range; not the compose file's ports
# The demo's broker lives for a minute, on the two cores every process shares.
# With the JVM's default tiered JIT its C2 compiler took about a third of the
# broker's CPU all through the run (0.27 of a core beside 0.41 on the request
# path); C1 alone compiles in seconds. Fewer request and network threads than
# the local broker's default (4 and 2) cost the broker 7 % less CPU per job in
# the e2e benchmark. The serial collector instead of G1: 5 % less broker CPU
# (36.6-37.7 s a run against 38.8-39.6 s) and a third off the p50, for young
# pauses of 30-50 ms every 3-4 s (the parallel collector paused up to 465 ms,
# p99 203 ms and 9.3 s in its 2 runs). Measured (issue 18, make demo, start lateness outside the
# takeover, p50 / p99): default JIT 51-64 / 278-315 ms; C1 only 30-31 /
# 121-129 ms; C1 and 2 + 1 threads 26-31 / 98-116 ms (4 runs), and with the
# status view folding in batches 26-30 / 94-120 ms (4 runs); then the serial
# collector: 18-19 / 66-146 ms (5 runs: 66, 82, 91, 92, 146). A long-lived
# broker wants C2: the e2e benchmark's warmed broker took as much CPU per job
# either way.
DEMO_BROKER_JVM = ("-XX:TieredStopAtLevel=1", "-XX:-UseG1GC", "-XX:+UseSerialGC")
DEMO_BROKER_PROPERTIES = {"num.io.threads": "2", "num.network.threads": "1"}
# Settings taken from the caller's environment: how to reach and secure the
# cluster. Everything else comes from the demo's own file.
_PASSED_ENV = (
    "DUEFLOW_KAFKA_",
    "DUEFLOW_REPLICATION_FACTOR",
    "DUEFLOW_MIN_INSYNC_REPLICAS",
    # DUEFLOW_EMITTER_TRANSACTIONAL=true: the demo with the emitter in transactions
    "DUEFLOW_EMITTER_TRANSACTIONAL",
)


def config_text(*, bootstrap: str, prefix: str, status_port: int, workdir: Path) -> str:
    """The TOML every demo process reads (``DUEFLOW_CONFIG``)."""
    lines = [f'bootstrap = "{bootstrap}"', f'topic_prefix = "{prefix}"', ""]
    for name, partitions in QUEUES.items():
        lines += [
            "[[queues]]",
            f'name = "{name}"',
            f"partitions = {partitions}",
            f"retry_tiers_ms = [{', '.join(map(str, RETRY_TIERS_MS))}]",
            "",
        ]
    lines += [
        "[emitter]",
        f"session_timeout_ms = {EMITTER_SESSION_MS}",
        f"heartbeat_interval_ms = {EMITTER_HEARTBEAT_MS}",
        "",
        "[worker]",
        "concurrency = 64",
        "session_timeout_ms = 6000",
        "",
        "[observability]",
        'log_format = "json"',
        f"status_port = {status_port}",
        f'status_data_dir = "{workdir / "status"}"',
    ]
    return "\n".join(lines) + "\n"


@dataclass
class DemoStack:
    """The demo's cluster and processes (see the module docstring)."""

    workdir: Path
    external_bootstrap: str | None = None
    status_view: bool = True
    keep_topics: bool = False
    on_step: Callable[[str], None] = print
    broker: LocalBroker | None = None
    settings: Settings | None = None
    emitters: list[Child] = field(default_factory=list)
    workers: Child | None = None
    view: Child | None = None
    env: dict[str, str] = field(default_factory=dict)
    broker_pid: int | None = None
    status_token: str = field(default="", repr=False)

    @property
    def ledger_dir(self) -> Path:
        return self.workdir / "ledger"

    @property
    def logs_dir(self) -> Path:
        return self.workdir / "logs"

    @property
    def children(self) -> list[Child]:
        return [*self.emitters, *([self.workers] if self.workers else []), *self.view_list]

    @property
    def view_list(self) -> list[Child]:
        return [self.view] if self.view else []

    # ------------------------------------------------------------ start
    def __enter__(self) -> DemoStack:
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _start(self) -> None:
        shutil.rmtree(self.workdir, ignore_errors=True)
        self.workdir.mkdir(parents=True)
        bootstrap = self.external_bootstrap
        if not bootstrap:
            self.broker = LocalBroker(
                port=free_port_pair(DEFAULT_BROKER_PORT),
                state_dir=self.workdir / "broker",
                jvm_options=DEMO_BROKER_JVM,
                extra_properties=DEMO_BROKER_PROPERTIES,
            )
            t0 = time.monotonic()
            pid, _ = self.broker.start()
            self.broker_pid = pid
            self._write_pids()
            bootstrap = self.broker.bootstrap
            self.on_step(
                f"local Kafka broker on {bootstrap} (pid {pid}), "
                f"ready in {time.monotonic() - t0:.1f} s"
            )
        else:
            self.on_step(f"using the Kafka cluster at {bootstrap}")
        prefix = f"demo{uuid.uuid4().hex[:6]}"
        config = self.workdir / "dueflow.toml"
        status_port = free_port()
        config.write_text(
            config_text(
                bootstrap=bootstrap, prefix=prefix, status_port=status_port, workdir=self.workdir
            )
        )
        self.env = child_env(os.environ, config=config, ledger=self.ledger_dir)
        self.settings = load_settings(env=self.env)
        t0 = time.monotonic()
        admin = TopicAdmin(
            make_admin(self.settings), replication_factor=self.settings.replication_factor
        )
        report = admin.ensure(topic_layout(self.settings))
        if not report.ok:
            raise RuntimeError(f"topics differ from dueflow's layout: {report.differences}")
        self.on_step(
            f"{len(report.created)} topics under prefix {prefix!r} "
            f"ready in {time.monotonic() - t0:.1f} s"
        )
        self._spawn(status_port)

    def _spawn(self, status_port: int) -> None:
        for name in ("emitter-a", "emitter-b"):
            port = free_port()
            self.emitters.append(
                Child(
                    name,
                    ["emitter", "--metrics-port", str(port)],
                    self.env,
                    self.logs_dir / f"{name}.log",
                    port,
                ).start()
            )
        port = free_port()
        self.workers = Child(
            "workers",
            [
                "worker",
                "--app",
                "demo.tasks",
                "--queues",
                ",".join(QUEUES),
                "--processes",
                "2",
                "--metrics-port",
                str(port),
            ],
            self.env,
            self.logs_dir / "workers.log",
            port,
        ).start()
        if self.status_view:
            # The view's token for the redrive button: only the view gets it; the
            # demo shows the page URL with it, as the view itself would.
            self.status_token = secrets.token_urlsafe(32)
            self.view = Child(
                "status-view",
                ["status-view", "--port", str(status_port)],
                {**self.env, "DUEFLOW_OBSERVABILITY_STATUS_TOKEN": self.status_token},
                self.logs_dir / "status-view.log",
                status_port,
            ).start()
        started = ", ".join(f"{c.name} (pid {c.pid})" for c in self.children)
        self._write_pids()
        self.on_step(f"started {started}")

    def pids(self) -> dict[str, int]:
        """Every process this stack started, by name."""
        out = {c.name: c.pid for c in self.children}
        if self.broker_pid:
            out["broker"] = self.broker_pid
        return out

    def _write_pids(self) -> None:
        # What the demo started, for whoever has to check or clean up after it.
        (self.workdir / "pids.json").write_text(json.dumps(self.pids(), indent=2) + "\n")

    def wait_for(
        self, what: str, predicate: Callable[[], bool], timeout_s: float, interval_s: float = 0.1
    ) -> None:
        """:func:`wait_for` that fails at once when a child exits, and says what
        every child was doing (alive or its exit code, the end of its log)."""

        def ready() -> bool:
            dead = [c for c in self.children if not c.alive()]
            if dead:
                raise TimeoutError(f"{what}: {dead[0].name} exited\n{self.report()}")
            return predicate()

        try:
            wait_for(what, ready, timeout_s, interval_s)
        except TimeoutError as exc:
            if "\n" in str(exc):
                raise
            raise TimeoutError(f"{exc}\n{self.report()}") from None

    def report(self, lines: int = 15) -> str:
        """Each child's state and the last ``lines`` lines of its log."""
        out = []
        for c in self.children:
            rc = c.proc.poll() if c.proc is not None else None
            state = "running" if rc is None else f"exited {rc}"
            out.append(f"--- {c.name} (pid {c.pid}, {state}), {c.log_path}:\n{c.log_tail(lines)}")
        return "\n".join(out)

    # ------------------------------------------------------------ state
    def leader(self) -> Child | None:
        """The emitter whose ``dueflow_emitter_leader`` gauge is 1."""
        for em in self.emitters:
            if em.alive() and em.port is not None:
                got = scrape(em.port)
                if got and got.get("dueflow_emitter_leader", 0.0) >= 1.0:
                    return em
        return None

    def workers_ready(self, members: int = 2) -> bool:
        """Every queue's worker group is stable with ``members`` members."""
        assert self.settings is not None
        admin = make_admin(self.settings)
        groups = [names(self.settings).worker_group(q) for q in QUEUES]
        try:
            for fut in admin.describe_consumer_groups(groups, request_timeout=5).values():
                desc = fut.result(10)
                if len(desc.members) < members or "STABLE" not in str(desc.state).upper():
                    return False
        except Exception:
            return False
        return True

    def status_ready(self) -> bool:
        return self.view is not None and http_ok(f"http://127.0.0.1:{self.view.port}/")

    def endpoints(self) -> dict[str, str]:
        out = {
            f"metrics {c.name}": f"http://127.0.0.1:{c.port}/metrics"
            for c in [*self.emitters, *([self.workers] if self.workers else [])]
        }
        if self.view is not None:
            out["status page"] = self.status_page_url()
        return out

    def status_page_url(self) -> str:
        """The page with the view's token (the page keeps it and drops it from the URL)."""
        assert self.view is not None
        return f"http://127.0.0.1:{self.view.port}/?token={self.status_token}"

    # ------------------------------------------------------------ stop
    def stop_children(self) -> dict[str, int | None]:
        """Workers first (they commit what they ran), then emitters and the view."""
        codes: dict[str, int | None] = {}
        order = [*([self.workers] if self.workers else []), *self.emitters, *self.view_list]
        for child in order:
            codes[child.name] = child.stop()
        return codes

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.stop_children()
        if self.external_bootstrap and self.settings is not None and not self.keep_topics:
            with contextlib.suppress(Exception):
                delete_topics(make_admin(self.settings), self.settings.topic_prefix)
        if self.broker is not None:
            broker, self.broker = self.broker, None
            broker.stop()
            shutil.rmtree(broker.paths.data, ignore_errors=True)
            self.on_step("local Kafka broker stopped")


def child_env(base: Mapping[str, str], *, config: Path, ledger: Path) -> dict[str, str]:
    """The caller's environment without its dueflow settings (except how to reach and
    secure the cluster), plus the demo's config file and ledger directory."""
    env = {
        k: v for k, v in base.items() if not k.startswith("DUEFLOW_") or k.startswith(_PASSED_ENV)
    }
    env["DUEFLOW_CONFIG"] = str(config)
    env[LEDGER_ENV] = str(ledger)
    # the workers load the demo's tasks (``--app demo.tasks``) from the folder
    # that holds demo/, wherever they are started from
    here = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (here, base.get("PYTHONPATH")) if p)
    return env


def delete_topics(admin: AdminClient, prefix: str) -> None:
    topics = [t for t in admin.list_topics(timeout=10).topics if t.startswith(prefix + ".")]
    if topics:
        for fut in admin.delete_topics(topics, operation_timeout=30).values():
            with contextlib.suppress(Exception):
                fut.result()
