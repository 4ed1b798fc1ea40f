"""The whole pipeline through a SASL_SSL (SCRAM-SHA-512) listener (issue 16, item 2).

A broker of its own (``secure_broker``: ``LocalBroker(security="sasl_ssl")`` on free
loopback ports in a temporary directory, stopped by pid) has no PLAINTEXT port at all.
The SDK schedules in this process; ``dueflow emitter``, ``dueflow worker`` and
``dueflow status-view`` run as processes with the settings ``dueflow broker env``
prints, and the ops commands run as the CLI. A wrong password and a plaintext client
fail with one clear line that holds no password; no log line of any process holds
one.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from dueflow.broker.local import LocalBroker
from dueflow.broker.ports import free_port, free_port_pair
from dueflow.broker.security import env_name, read_secrets
from dueflow.kafka.topics import names
from dueflow.producers.scheduler import Scheduler
from tests.integration.pipeline_support import APP, QUEUE, ROOT, Pipeline, scrape, wait_for
from tests.integration.status_support import ViewProcess, start_view
from tests.integration.worker_support import outcomes_of, read_topic

WRONG_PASSWORD = "not-the-Password-5c1e"


@pytest.fixture(scope="module")
def secure_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBroker]:
    """A SASL_SSL broker of this module: never the session's PLAINTEXT one, whatever
    DUEFLOW_BOOTSTRAP says."""
    broker = LocalBroker(
        port=free_port_pair(),
        state_dir=tmp_path_factory.mktemp("sasl-broker"),
        heap=os.environ.get("DUEFLOW_TEST_HEAP", "512m"),
        security="sasl_ssl",
    )
    try:
        broker.start(timeout_s=120)
        yield broker
    finally:
        broker.stop()


def client_env(broker: LocalBroker) -> dict[str, str]:
    """What ``eval "$(dueflow broker env)"`` exports, the password read from its file."""
    return {env_name(k): v for k, v in broker.client_settings().items()}


def secrets_of(broker: LocalBroker) -> list[str]:
    return list(read_secrets(broker.security_files).values())


@dataclass
class SecurePipeline(Pipeline):
    """The pipeline's processes and settings with the SASL_SSL client settings."""

    security_env: dict[str, str] = field(default_factory=dict)
    emitter_port: int = 0

    def _dueflow_env(self) -> dict[str, str]:
        return {**super()._dueflow_env(), **self.security_env}


@pytest.fixture
def pipeline(secure_broker: LocalBroker, prefix: str, tmp_path: Path) -> Iterator[SecurePipeline]:
    p = SecurePipeline(
        secure_broker.bootstrap, prefix, tmp_path, security_env=client_env(secure_broker)
    )
    try:
        yield p
    finally:
        p.stop_all()


def dueflow_cli(
    *argv: str, env: dict[str, str], timeout: float = 60.0
) -> subprocess.CompletedProcess[str]:
    """``python -m dueflow <argv>`` with exactly ``env``'s DUEFLOW_* settings."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("DUEFLOW_")}
    return subprocess.run(
        [sys.executable, "-m", "dueflow", *argv],
        env={**clean, "PYTHONPATH": str(ROOT), **env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def assert_no_secret(text: str, secrets: list[str], where: str) -> None:
    for secret in secrets:
        assert secret not in text, f"a password shows in {where}"


@pytest.mark.timeout(300)
def test_sdk_emitter_worker_status_view_and_ops_commands_over_sasl_ssl(
    secure_broker: LocalBroker, pipeline: SecurePipeline, tmp_path: Path
) -> None:
    p = pipeline
    assert p.settings.kafka["security.protocol"] == "SASL_SSL"  # the test's own clients too
    p.emitter_port = free_port()
    p.emitter(p.emitter_port)
    p.worker(free_port(), "--log-format", "json")
    view: ViewProcess = start_view(
        p.settings,
        port=free_port(),
        data_dir=tmp_path / "status",
        log_path=tmp_path / "view.log",
        queues=f"{QUEUE}:3",
        env=p.security_env,
    )
    try:
        _run_the_pipeline(secure_broker, p, view)
    finally:
        view.stop()


def _run_the_pipeline(secure_broker: LocalBroker, p: SecurePipeline, view: ViewProcess) -> None:
    em_port = p.emitter_port
    view.wait_ready(timeout_s=90)

    def leader() -> bool:
        samples = scrape(em_port)
        return samples is not None and samples.value("dueflow_emitter_leader") == 1

    wait_for("an active emitter over SASL_SSL", leader, timeout=90)

    # --- the SDK schedules through SASL_SSL; the emitter fires, the worker runs
    with Scheduler(p.settings) as sdk:
        ok = [sdk.schedule("ok", {"i": i}, queue=QUEUE, delay=0.2 + 0.1 * i) for i in range(5)]
        doomed = sdk.schedule("doomed", {"i": 99}, queue=QUEUE, delay=0.2)
    jobs = {j.job_id for j in ok} | {doomed.job_id}

    def final(records: list[Any]) -> bool:
        done = {o["job_id"] for o in outcomes_of(records) if o["state"] in ("succeeded", "dead")}
        return done >= jobs

    outs = outcomes_of(read_topic(p.settings, names(p.settings).outcomes, until=final, timeout=90))
    last = {o["job_id"]: o["state"] for o in outs if o["state"] in ("succeeded", "dead")}
    assert last == {**{j.job_id: "succeeded" for j in ok}, doomed.job_id: "dead"}, p.logs()

    # --- the status view (faust/aiokafka, SCRAM over TLS) answers for a job over HTTP
    seen = view.wait_job(ok[0].job_id, "succeeded", timeout_s=60)
    assert seen["queue"] == QUEUE
    assert view.wait_job(doomed.job_id, "dead", timeout_s=60)["task"] == "doomed"

    # --- the ops commands
    env = p._dueflow_env()
    dlq = dueflow_cli("dlq", "list", "--queue", QUEUE, "--queues", f"{QUEUE}:3", "--json", env=env)
    assert dlq.returncode == 0, dlq.stderr
    entries = json.loads(dlq.stdout)["entries"]
    assert [e["job_id"] for e in entries] == [doomed.job_id]
    queues = dueflow_cli("queue", "list", "--config", str(p.config), "--json", env=env)
    assert queues.returncode == 0, queues.stderr
    assert [q["name"] for q in json.loads(queues.stdout)["queues"]] == [QUEUE]
    topics = dueflow_cli("topics", "describe", "--config", str(p.config), "--json", env=env)
    assert topics.returncode == 0, topics.stderr
    described = json.loads(topics.stdout)
    assert {t["status"] for t in described} == {"ok"}
    assert f"{p.prefix}.exec.{QUEUE}" in {t["topic"] for t in described}

    # --- no password in any process's output, the broker's logs or a command's output
    secrets = secrets_of(secure_broker)
    p.stop_all()
    view.stop()
    assert_no_secret(p.logs(), secrets, "the emitter's or the worker's log")
    assert_no_secret(view.log_path.read_text(errors="replace"), secrets, "the status view log")
    for run in (dlq, queues, topics):
        assert_no_secret(run.stdout + run.stderr, secrets, f"`dueflow {' '.join(run.args[3:])}`")
    broker_logs = "".join(
        f.read_text(errors="replace") for f in secure_broker.paths.logs.glob("*.log")
    )
    assert "SASL_SSL://127.0.0.1" in broker_logs  # the logs are there and say the listener
    assert_no_secret(broker_logs, secrets, "the broker's logs")


def test_a_wrong_password_fails_clearly_and_is_never_shown(
    secure_broker: LocalBroker, prefix: str
) -> None:
    env = {
        "DUEFLOW_BOOTSTRAP": secure_broker.bootstrap,
        "DUEFLOW_TOPIC_PREFIX": prefix,
        **client_env(secure_broker),
        "DUEFLOW_KAFKA_SASL_PASSWORD": WRONG_PASSWORD,
    }
    secrets = [WRONG_PASSWORD, *secrets_of(secure_broker)]
    for argv in (
        ("queue", "list"),
        ("topics", "describe"),
        ("worker", "--app", APP, "--queues", QUEUE),
        ("status-view", "--port", str(free_port()), "--queues", QUEUE),
    ):
        run = dueflow_cli(*argv, env=env)
        said = run.stderr.strip()
        assert run.returncode == 3, (argv, run.stdout, run.stderr)
        assert said.startswith("dueflow: cannot reach the Kafka cluster at 127.0.0.1:"), said
        assert "Authentication failed" in said, said
        assert "invalid credentials with SASL mechanism SCRAM-SHA-512" in said, said
        assert len(said.splitlines()) == 1, said
        assert_no_secret(run.stdout + run.stderr, secrets, f"`dueflow {' '.join(argv)}`")


def test_plaintext_to_the_sasl_port_fails_clearly(secure_broker: LocalBroker, prefix: str) -> None:
    env = {"DUEFLOW_BOOTSTRAP": secure_broker.bootstrap, "DUEFLOW_TOPIC_PREFIX": prefix}
    run = dueflow_cli("topics", "describe", env=env)
    said = run.stderr.strip()
    assert run.returncode == 3, (run.stdout, run.stderr)
    assert said.startswith("dueflow: cannot reach the Kafka cluster at 127.0.0.1:"), said
    assert "the port may expect TLS (security.protocol is PLAINTEXT)" in said, said
    assert "DUEFLOW_KAFKA_SECURITY_PROTOCOL" in said, said
    # and a TLS client that does not trust the broker's CA is told so
    untrusting = {
        **env,
        **{k: v for k, v in client_env(secure_broker).items() if "SSL_CA" not in k},
    }
    run = dueflow_cli("topics", "describe", env=untrusting)
    assert run.returncode == 3, (run.stdout, run.stderr)
    assert "certificate verify failed" in run.stderr, run.stderr


def test_broker_env_prints_the_settings_and_the_password_file_never_the_password(
    secure_broker: LocalBroker,
) -> None:
    where = ["--port", str(secure_broker.port), "--dir", str(secure_broker.paths.root)]
    run = dueflow_cli("broker", "env", *where, env={})
    assert run.returncode == 0, run.stderr
    files = secure_broker.security_files
    assert run.stdout.splitlines() == [
        f"export DUEFLOW_BOOTSTRAP={secure_broker.bootstrap}",
        "export DUEFLOW_KAFKA_SECURITY_PROTOCOL=SASL_SSL",
        "export DUEFLOW_KAFKA_SASL_MECHANISM=SCRAM-SHA-512",
        "export DUEFLOW_KAFKA_SASL_USERNAME=dueflow",
        f'export DUEFLOW_KAFKA_SASL_PASSWORD="$(cat {files.client_password})"',
        f"export DUEFLOW_KAFKA_SSL_CA_LOCATION={files.ca_pem}",
    ]
    # what a shell does with them logs in
    shell = subprocess.run(
        ["bash", "-c", 'eval "$EXPORTS"; exec "$0" -m dueflow queue list', sys.executable],
        env={
            **{k: v for k, v in os.environ.items() if not k.startswith("DUEFLOW_")},
            "EXPORTS": run.stdout,
            "PYTHONPATH": str(ROOT),
        },
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert shell.returncode == 0, shell.stderr
    assert "default" in shell.stdout  # the queue table, read over SASL_SSL
    status = dueflow_cli("broker", "status", *where, env={})
    assert status.returncode == 0, status.stderr
    assert "answers" in status.stdout
    for run_ in (run, shell, status):
        assert_no_secret(run_.stdout + run_.stderr, secrets_of(secure_broker), "the output")
    # the password files are the owner's only, and so is the broker's settings file
    for path in (files.client_password, files.broker_secrets, secure_broker.paths.properties):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert stat.S_IMODE(files.root.stat().st_mode) == 0o700
    assert not (files.root / "tls.partial").exists()  # the CA's private key is gone
    assert not secure_broker.paths.format_args.exists()  # and so is the SCRAM argument file
