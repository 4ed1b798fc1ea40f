"""Run a single-node Apache Kafka 4.x broker in KRaft combined mode, no Docker.

The jars come from Maven Central through ``broker/dueflow/broker/pom.xml``
(``mvn dependency:copy-dependencies`` into a cache directory); nothing is
fetched by URL. Storage is formatted on first start. ``start`` returns only
when the broker answers a metadata request; ``stop`` ends exactly the pid in
the pid file and waits for it.
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient

from dueflow.broker.security import (
    BROKER_USER,
    CLIENT_USER,
    PLAINTEXT,
    SASL_SSL,
    SECURITY_MODES,
    ListenerSecurity,
    SecurityFiles,
    client_settings,
    ensure_material,
    keytool_for,
    listener_properties,
    private_argfile,
    read_secrets,
    redact,
    scram_format_args,
    write_private,
)
from dueflow.errors import BrokerError

_ASSETS = "dueflow.broker"
MAIN_CLASS = "kafka.Kafka"
STORAGE_TOOL = "kafka.tools.StorageTool"


def _pom_text() -> str:
    return (resources.files(_ASSETS) / "pom.xml").read_text()


def kafka_version() -> str:
    """The Kafka version pinned in ``broker/dueflow/broker/pom.xml``."""
    found = re.search(r"<kafka.version>([^<]+)</kafka.version>", _pom_text())
    if not found:  # pragma: no cover - the pom is part of the package
        raise BrokerError("broker/dueflow/broker/pom.xml has no <kafka.version>")
    return found.group(1)


def default_cache_dir() -> Path:
    """``$DUEFLOW_CACHE`` or ``~/.cache/dueflow``: jars are shared by every checkout."""
    env = os.environ.get("DUEFLOW_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "dueflow"


def fetch_jars(cache_dir: Path | None = None, *, quiet: bool = True) -> Path:
    """Resolve the broker jars with Maven into ``<cache>/kafka-<version>/jars``; reuse them.

    Returns the jar directory. Raises :class:`BrokerError` when Maven is missing
    or fails (its output is included).
    """
    cache_dir = cache_dir or default_cache_dir()
    version = kafka_version()
    home = cache_dir / f"kafka-{version}"
    jars = home / "jars"
    marker = home / ".complete"
    if marker.exists() and any(jars.glob("kafka_2.13-*.jar")):
        return jars
    mvn = shutil.which("mvn")
    if mvn is None:
        raise BrokerError("Maven (mvn) is not on PATH: it is needed once to fetch the broker jars")
    home.mkdir(parents=True, exist_ok=True)
    pom = home / "pom.xml"
    pom.write_text(_pom_text())
    tmp = home / "jars.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    cmd = [
        mvn,
        "-B",
        *(["-q"] if quiet else []),
        "-f",
        str(pom),
        "dependency:copy-dependencies",
        f"-DoutputDirectory={tmp}",
        "-DincludeScope=runtime",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise BrokerError(
            f"mvn dependency:copy-dependencies failed ({proc.returncode}):\n"
            f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
        )
    shutil.rmtree(jars, ignore_errors=True)
    tmp.rename(jars)
    marker.write_text(version + "\n")
    return jars


@dataclass(frozen=True, slots=True)
class BrokerPaths:
    """Files of one local broker, all under ``root``."""

    root: Path

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def properties(self) -> Path:
        return self.root / "server.properties"

    @property
    def pid_file(self) -> Path:
        return self.root / "broker.pid"

    @property
    def log_file(self) -> Path:
        return self.logs / "server.log"

    @property
    def stdout_file(self) -> Path:
        return self.logs / "stdout.log"

    @property
    def formatted_marker(self) -> Path:
        return self.data / "meta.properties"

    @property
    def security_mode(self) -> Path:
        """``plaintext`` or ``sasl_ssl``: how the storage was formatted (written then)."""
        return self.root / "security.mode"

    @property
    def format_args(self) -> Path:
        return self.root / "format.args"


def recorded_security(root: Path) -> str | None:
    """The security mode the broker in ``root`` was formatted for; ``None`` when it was
    not formatted yet (storage formatted before modes were recorded: ``plaintext``)."""
    paths = BrokerPaths(root)
    try:
        mode = paths.security_mode.read_text().strip()
    except FileNotFoundError:
        return PLAINTEXT if paths.formatted_marker.exists() else None
    return mode if mode in SECURITY_MODES else PLAINTEXT


def default_state_dir(port: int) -> Path:
    """``$DUEFLOW_HOME/broker-<port>``, default ``./.dueflow/broker-<port>``."""
    return Path(os.environ.get("DUEFLOW_HOME", ".dueflow")) / f"broker-{port}"


def server_properties(
    *,
    port: int,
    controller_port: int,
    data_dir: Path,
    node_id: int = 1,
    voters: str | None = None,
    replication_factor: int = 1,
    min_insync_replicas: int = 1,
    security: ListenerSecurity | None = None,
    extra: dict[str, str] | None = None,
) -> dict[str, str]:
    """Broker settings for one combined broker+controller node (pure).

    ``voters`` is the static quorum (``id@host:port,...``; default: this node
    alone). ``replication_factor`` and ``min_insync_replicas`` apply to the
    defaults of new topics and to every internal topic (consumer offsets,
    transaction state, share-group state). ``security``: the client port is
    SASL_SSL with these files and passwords (``dueflow.broker.security``), else
    PLAINTEXT.
    """
    rf, isr = str(replication_factor), str(min_insync_replicas)
    props = {
        "process.roles": "broker,controller",
        "node.id": str(node_id),
        # Static quorum: no --standalone needed when formatting.
        "controller.quorum.voters": voters or f"{node_id}@127.0.0.1:{controller_port}",
        **listener_properties(port=port, controller_port=controller_port, security=security),
        "log.dirs": str(data_dir),
        "metadata.log.dir": str(data_dir),
        # The internal topics are replicated like the project's own.
        "offsets.topic.replication.factor": rf,
        "offsets.topic.num.partitions": "8",
        "transaction.state.log.replication.factor": rf,
        "transaction.state.log.min.isr": isr,
        "transaction.state.log.num.partitions": "8",
        "share.coordinator.state.topic.replication.factor": rf,
        "share.coordinator.state.topic.min.isr": isr,
        "default.replication.factor": rf,
        "min.insync.replicas": isr,
        "num.partitions": "1",
        "auto.create.topics.enable": "false",
        "group.initial.rebalance.delay.ms": "0",
        # Fast failover tests need short sessions; production clusters keep 6 s+.
        "group.min.session.timeout.ms": "500",
        "group.consumer.min.session.timeout.ms": "1000",
        "group.consumer.min.heartbeat.interval.ms": "500",
        # The 128 MiB default dedupe buffer does not fit a small heap.
        "log.cleaner.dedupe.buffer.size": "16777216",
        "log.cleaner.backoff.ms": "1000",
        "log.retention.check.interval.ms": "30000",
        "transaction.abort.timed.out.transaction.cleanup.interval.ms": "5000",
        "num.network.threads": "2",
        "num.io.threads": "4",
        "num.recovery.threads.per.data.dir": "2",
    }
    props.update(extra or {})
    return props


def new_cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes, URL-safe base64, not starting with '-'."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


class LocalBroker:
    """One local broker: start, stop, status. Stateless apart from its files."""

    def __init__(
        self,
        *,
        port: int = 9092,
        controller_port: int | None = None,
        state_dir: Path | None = None,
        cache_dir: Path | None = None,
        heap: str = "1g",
        java: str | None = None,
        extra_properties: dict[str, str] | None = None,
        jvm_options: Sequence[str] = (),
        node_id: int = 1,
        voters: str | None = None,
        replication_factor: int = 1,
        min_insync_replicas: int = 1,
        cluster_id: str | None = None,
        security: str | None = None,
        security_dir: Path | None = None,
    ) -> None:
        """One node; a node of a cluster (``dueflow.broker.cluster``) also gets its
        ``node_id``, the quorum's ``voters``, the replication settings and the
        ``cluster_id`` its storage is formatted with (default: a new one).

        ``security``: ``plaintext`` or ``sasl_ssl`` (``dueflow.broker.security``);
        default: what the state directory was formatted for, else ``plaintext``. A
        state directory keeps the mode it was formatted for: another one is refused.
        ``security_dir`` holds the TLS material and passwords (default
        ``<state dir>/security``; the nodes of a cluster share one)."""
        self.port = port
        self.controller_port = controller_port or port + 1
        self.paths = BrokerPaths((state_dir or default_state_dir(port)).resolve())
        self.cache_dir = cache_dir
        self.heap = heap
        self.java = java
        self.extra_properties = extra_properties or {}
        self.jvm_options = list(jvm_options)  # after the defaults, so they override them
        self.node_id = node_id
        self.voters = voters
        self.replication_factor = replication_factor
        self.min_insync_replicas = min_insync_replicas
        self.cluster_id = cluster_id
        if security is not None and security not in SECURITY_MODES:
            raise BrokerError(f"security {security!r}: accepted: {', '.join(SECURITY_MODES)}")
        self.security = security or recorded_security(self.paths.root) or PLAINTEXT
        self.security_files = SecurityFiles(
            (security_dir or self.paths.root / "security").resolve()
        )
        self._listener: ListenerSecurity | None = None  # loaded or made by prepare
        self._proc: subprocess.Popen[bytes] | None = None  # set when this object started it

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def secured(self) -> bool:
        return self.security == SASL_SSL

    def client_settings(self) -> dict[str, str]:
        """librdkafka settings a client needs besides the bootstrap: none for
        ``plaintext``; for ``sasl_ssl`` the SCRAM login (password read from its file)
        and the CA. Give them to dueflow as ``Settings.kafka`` / ``DUEFLOW_KAFKA_*``."""
        if not self.secured:
            return {}
        return client_settings(
            self.security_files, read_secrets(self.security_files).client_password
        )

    def client_config(self, **extra: Any) -> dict[str, Any]:
        """A librdkafka configuration for this broker: bootstrap, security, ``extra``."""
        return {"bootstrap.servers": self.bootstrap, **self.client_settings(), **extra}

    # ------------------------------------------------------------------ status
    def running_pid(self) -> int | None:
        """Pid of this broker if it is running; removes a stale pid file."""
        if self._proc is not None and self._proc.poll() is not None:
            self._proc = None  # our child exited on its own: reaped now, not left a zombie
        pid_file = self.paths.pid_file
        try:
            pid = int(pid_file.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None
        if _is_our_broker(pid, self.paths.properties):
            return pid
        pid_file.unlink(missing_ok=True)  # stale: the process is gone or is another program
        return None

    def is_ready(self, timeout_s: float = 2.0, *, brokers: int = 1) -> bool:
        """True when the broker answers a metadata request listing ``brokers`` brokers."""
        return _answers(self._admin(), timeout_s, brokers=brokers)

    def _admin(self) -> AdminClient:
        # log_level 0: no "connection refused" lines while the broker boots
        return AdminClient(
            self.client_config(
                log_level=0, **{"reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 200}
            )
        )

    # ------------------------------------------------------------------- start
    def start(self, *, timeout_s: float = 90.0) -> tuple[int, bool]:
        """Start the broker unless it runs; return ``(pid, started_now)``."""
        pid, started = self.launch()
        if started:
            self.wait_ready(timeout_s=timeout_s)
        return pid, started

    def launch(self) -> tuple[int, bool]:
        """Format (first time) and spawn the broker without waiting for it; return
        ``(pid, started_now)``. A node of a cluster answers only once a majority of
        the quorum runs, so a cluster launches every node before it waits."""
        self._check_security_mode()  # a running broker of the other kind is not "started"
        pid = self.running_pid()
        if pid is not None:
            return pid, False
        if _port_busy(self.port) or _port_busy(self.controller_port):
            raise BrokerError(
                f"port {self.port} or {self.controller_port} on 127.0.0.1 is in use by "
                "another process; choose another with --port"
            )
        java, jars = self.prepare()
        log4j = resources.files(_ASSETS) / "log4j2.yaml"
        cmd = [
            java,
            f"-Xmx{self.heap}",
            f"-Xms{self.heap}",
            "-server",
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            "-XX:InitiatingHeapOccupancyPercent=35",
            "-XX:+ExplicitGCInvokesConcurrent",
            "-Djava.awt.headless=true",
            *self.jvm_options,
            f"-Dkafka.logs.dir={self.paths.logs}",
            f"-Dlog4j2.configurationFile={log4j}",
            "-cp",
            f"{jars}/*",
            MAIN_CLASS,
            str(self.paths.properties),
        ]
        with self.paths.stdout_file.open("ab") as out:
            proc = subprocess.Popen(
                cmd,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # not killed with the shell that started it
                preexec_fn=_raise_file_limit,
            )
        self._proc = proc
        self.paths.pid_file.write_text(f"{proc.pid}\n")
        return proc.pid, True

    def prepare(self) -> tuple[str, Path]:
        """Write the settings and format the storage the first time (no process is left
        running); ``(java, jar directory)``. Safe to run for several nodes at once, in
        threads; :meth:`launch` is not (``preexec_fn``)."""
        jars = fetch_jars(self.cache_dir)
        java = self.java or _java()
        self._check_security_mode()
        if self.secured:
            self.prepare_security(java)
        self.write_config()
        if not self.paths.formatted_marker.exists():
            self._format(java, jars)
        self.paths.logs.mkdir(parents=True, exist_ok=True)
        return java, jars

    def _check_security_mode(self) -> None:
        recorded = recorded_security(self.paths.root)
        if recorded is not None and recorded != self.security:
            raise BrokerError(
                f"the broker in {self.paths.root} was formatted for --security {recorded}, "
                f"not {self.security}: start it with --security {recorded}, or use another "
                "--dir for a broker of the other kind"
            )

    def prepare_security(self, java: str | None = None) -> ListenerSecurity:
        """Load (or make, the first time) the TLS material and passwords of the SASL_SSL
        listener. A cluster calls it once before its nodes prepare, which share them."""
        if self._listener is None:
            secrets_ = ensure_material(
                self.security_files,
                keytool=keytool_for(java or self.java or _java()),
                formatted=self.paths.formatted_marker.exists(),
            )
            self._listener = ListenerSecurity(self.security_files, secrets_)
        return self._listener

    def wait_ready(self, *, timeout_s: float = 90.0, brokers: int = 1) -> None:
        """Until the broker answers a metadata request that lists at least ``brokers``
        brokers; stops it and raises :class:`BrokerError` when it exits or the
        deadline passes."""
        proc = self._proc
        deadline = time.monotonic() + timeout_s
        admin = None
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                self.paths.pid_file.unlink(missing_ok=True)
                self._proc = None
                raise BrokerError(
                    f"broker exited with code {proc.returncode} during startup; "
                    f"errors and signals logged:\n{self.log_errors()}\nlast log lines:\n"
                    + self.log_tail()
                )
            # Both listening (a controller that could not bind its port ends the
            # process a moment after the client port answered), then metadata.
            if _port_busy(self.port) and _port_busy(self.controller_port):
                admin = admin or self._admin()
                if _answers(admin, 1.0, brokers=brokers) and (proc is None or proc.poll() is None):
                    return
            time.sleep(0.05)
        self.stop()
        raise BrokerError(f"broker did not answer within {timeout_s:.0f}s:\n" + self.log_tail())

    def write_config(self) -> None:
        """Write ``server.properties`` (every start: settings changes take effect). It
        holds the stores' and the broker user's passwords when secured: mode 0600."""
        self.paths.root.mkdir(parents=True, exist_ok=True)
        self.paths.data.mkdir(parents=True, exist_ok=True)
        listener = self.prepare_security() if self.secured else None
        props = server_properties(
            port=self.port,
            controller_port=self.controller_port,
            data_dir=self.paths.data.resolve(),
            node_id=self.node_id,
            voters=self.voters,
            replication_factor=self.replication_factor,
            min_insync_replicas=self.min_insync_replicas,
            security=listener,
            extra=self.extra_properties,
        )
        text = "".join(f"{k}={v}\n" for k, v in props.items())
        write_private(self.paths.properties, text)

    def _format(self, java: str, jars: Path) -> None:
        jvm = [
            java,
            "-Xmx256m",
            "-Dlog4j2.configurationFile=" + str(resources.files(_ASSETS) / "log4j2.yaml"),
            f"-Dkafka.logs.dir={self.paths.logs}",
            "-cp",
            f"{jars}/*",
        ]
        tool = [
            STORAGE_TOOL,
            "format",
            "-t",
            self.cluster_id or new_cluster_id(),
            "-c",
            str(self.paths.properties),
        ]
        hidden: list[str] = []
        self.paths.logs.mkdir(parents=True, exist_ok=True)
        with contextlib.ExitStack() as stack:
            if self.secured:
                pw = self.prepare_security().secrets
                hidden = list(pw.values())
                tool += scram_format_args(
                    {CLIENT_USER: pw.client_password, BROKER_USER: pw.broker_password}
                )
                # the java launcher reads the arguments from the file: `ps` shows no password
                tool = [
                    "@" + str(stack.enter_context(private_argfile(self.paths.format_args, tool)))
                ]
            proc = subprocess.run([*jvm, *tool], capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            said = redact(f"{proc.stdout}\n{proc.stderr}", hidden)
            raise BrokerError(f"formatting storage failed:\n{said}")
        self.paths.security_mode.write_text(self.security + "\n")

    # -------------------------------------------------------------------- stop
    def stop(self, *, timeout_s: float = 30.0) -> int | None:
        """Stop the broker of the pid file; return its pid, or ``None`` if none ran."""
        pid = self.running_pid()
        if pid is None:
            return None
        _signal(pid, signal.SIGTERM)
        _signal(pid, signal.SIGCONT)  # a stopped (SIGSTOP) broker acts on SIGTERM once continued
        if not self._wait(pid, timeout_s):
            _signal(pid, signal.SIGKILL)
            self._wait(pid, 10.0)
        self.paths.pid_file.unlink(missing_ok=True)
        return pid

    def _wait(self, pid: int, timeout_s: float) -> bool:
        proc = self._proc
        if proc is not None and proc.pid == pid:
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                return False
            self._proc = None
            return True
        return _wait_gone(pid, timeout_s)

    def kill(self) -> int | None:
        """kill -9 the broker (for fault-injection tests)."""
        pid = self.running_pid()
        if pid is None:
            return None
        _signal(pid, signal.SIGKILL)
        self._wait(pid, 10.0)
        self.paths.pid_file.unlink(missing_ok=True)
        return pid

    def destroy(self) -> None:
        """Stop and delete all state (data, logs)."""
        self.stop()
        shutil.rmtree(self.paths.root, ignore_errors=True)

    def log_errors(self, lines: int = 10) -> str:
        """The last ERROR / FATAL lines and signals of the server log (why it stopped)."""
        try:
            text = self.paths.log_file.read_text(errors="replace")
        except OSError:
            return ""
        wanted = re.compile(r"\] (ERROR|FATAL) |due to signal|Exiting Kafka")
        return "\n".join([x for x in text.splitlines() if wanted.search(x)][-lines:])

    def log_tail(self, lines: int = 30) -> str:
        chunks = []
        for f in (self.paths.stdout_file, self.paths.log_file):
            if f.exists():
                chunks.extend(f.read_text(errors="replace").splitlines()[-lines:])
        return "\n".join(chunks[-lines:])


def _raise_file_limit() -> None:
    """Let the broker open many segment files (each partition holds several).

    Runs in the child before exec. The soft limit goes up to the hard one, and
    the hard one too where the process may raise it (root), up to the kernel's
    ceiling: a wheel topic has hundreds of partitions and tests create many.
    """
    import resource

    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 1 << 20
    try:
        ceiling = int(Path("/proc/sys/fs/nr_open").read_text())
    except (OSError, ValueError):
        ceiling = hard
    for limit in (min(want, ceiling), hard):
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))
            return
        except (ValueError, OSError):
            continue


def _answers(admin: AdminClient, timeout_s: float, *, brokers: int = 1) -> bool:
    try:
        md = admin.list_topics(timeout=timeout_s)
    except Exception:
        return False
    return len(md.brokers) >= max(1, brokers)


def _java() -> str:
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return str(Path(home) / "bin" / "java")
    java = shutil.which("java")
    if java is None:
        raise BrokerError("java is not on PATH (Java 17+ is needed to run the broker)")
    return java


def _is_our_broker(pid: int, properties: Path) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    args = [a.decode(errors="replace") for a in cmdline]
    return MAIN_CLASS in args and str(properties) in args


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def _wait_gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            # Reap it if it is our child; otherwise just probe.
            done, _ = os.waitpid(pid, os.WNOHANG)
            if done == pid:
                return True
        except ChildProcessError:
            pass
        if not Path(f"/proc/{pid}").exists() or _is_zombie(pid):
            return True
        time.sleep(0.05)
    return False


def _is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] == "Z"


def _port_busy(port: int) -> bool:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0
