"""The SASL_SSL local broker's pure parts: listener settings, SCRAM and JAAS values,
the java argument file, the client settings it prints, and how secrets are kept."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from dueflow.broker.cluster import LocalCluster, cluster_layout, node_properties
from dueflow.broker.local import LocalBroker, recorded_security, server_properties
from dueflow.broker.security import (
    BROKER_USER,
    SCRAM_MECHANISMS,
    BrokerSecrets,
    ListenerSecurity,
    SecurityFiles,
    client_exports,
    client_settings,
    ensure_material,
    env_name,
    java_argfile,
    listener_properties,
    redact,
    scram_format_args,
    scram_jaas_config,
    write_private,
)
from dueflow.config import load_settings
from dueflow.errors import BrokerError
from dueflow.kafka.clients import security_hint

STORE, BROKER, CLIENT = "store-Pw-1111", "broker-Pw-2222", "client-Pw-3333"
FILES = SecurityFiles(Path("/state/security"))
SECURE = ListenerSecurity(FILES, BrokerSecrets(STORE, BROKER, CLIENT))


def test_plaintext_listeners_are_unchanged() -> None:
    p = listener_properties(port=9092, controller_port=9093)
    assert p == {
        "listeners": "PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093",
        "advertised.listeners": "PLAINTEXT://127.0.0.1:9092",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
    }


def test_sasl_ssl_replaces_plaintext_on_the_client_port() -> None:
    p = listener_properties(port=9092, controller_port=9093, security=SECURE)
    # the client port speaks SASL_SSL only; the controller stays PLAINTEXT on loopback
    assert p["listeners"] == "SASL_SSL://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093"
    assert p["advertised.listeners"] == "SASL_SSL://127.0.0.1:9092"
    assert p["listener.security.protocol.map"] == "CONTROLLER:PLAINTEXT,SASL_SSL:SASL_SSL"
    assert "PLAINTEXT://" not in p["listeners"]
    # brokers replicate over it too, as their own SCRAM user
    assert p["inter.broker.listener.name"] == "SASL_SSL"
    assert p["sasl.mechanism.inter.broker.protocol"] == "SCRAM-SHA-512"
    assert p["sasl.enabled.mechanisms"] == "SCRAM-SHA-512,SCRAM-SHA-256"
    # the broker refuses to start unless every enabled mechanism has a login config
    for mechanism in SCRAM_MECHANISMS:
        assert p[f"listener.name.sasl_ssl.{mechanism.lower()}.sasl.jaas.config"] == (
            "org.apache.kafka.common.security.scram.ScramLoginModule required "
            f'username="{BROKER_USER}" password="{BROKER}";'
        )
    assert p["ssl.keystore.type"] == p["ssl.truststore.type"] == "PKCS12"
    assert p["ssl.keystore.location"] == "/state/security/broker.keystore.p12"
    assert p["ssl.truststore.location"] == "/state/security/broker.truststore.p12"
    assert p["ssl.keystore.password"] == p["ssl.truststore.password"] == STORE
    assert p["ssl.client.auth"] == "none"
    assert p["ssl.endpoint.identification.algorithm"] == "https"
    assert CLIENT not in "".join(p.values())  # the client's password is the client's


def test_server_and_node_properties_carry_the_listener() -> None:
    one = server_properties(port=9092, controller_port=9093, data_dir=Path("/d"), security=SECURE)
    assert one["listeners"].startswith("SASL_SSL://127.0.0.1:9092,")
    specs = cluster_layout(nodes=3, base_port=30000)
    for spec in specs:
        p = node_properties(
            spec,
            specs=specs,
            data_dir=Path("/d"),
            replication_factor=3,
            min_insync_replicas=2,
            security=SECURE,
        )
        assert p["advertised.listeners"] == f"SASL_SSL://127.0.0.1:{spec.port}"
        assert p["controller.quorum.voters"].count("@127.0.0.1:") == 3
        assert p["ssl.keystore.location"] == str(FILES.keystore)  # one certificate for all


def test_secrets_are_never_in_a_repr() -> None:
    for text in (repr(SECURE), repr(SECURE.secrets)):
        for pw in (STORE, BROKER, CLIENT):
            assert pw not in text


def test_scram_credentials_for_every_user_and_mechanism() -> None:
    args = scram_format_args({"dueflow": CLIENT, BROKER_USER: BROKER})
    assert args == [
        "--add-scram",
        f'SCRAM-SHA-512=[name=dueflow,password="{CLIENT}"]',
        "--add-scram",
        f'SCRAM-SHA-256=[name=dueflow,password="{CLIENT}"]',
        "--add-scram",
        f'SCRAM-SHA-512=[name={BROKER_USER},password="{BROKER}"]',
        "--add-scram",
        f'SCRAM-SHA-256=[name={BROKER_USER},password="{BROKER}"]',
    ]


@pytest.mark.parametrize("bad", ['has"quote', "back\\slash", "new\nline", ""])
def test_a_password_that_cannot_be_quoted_is_refused(bad: str) -> None:
    with pytest.raises(BrokerError) as err:
        scram_jaas_config("u", bad)
    assert bad not in str(err.value) or not bad
    with pytest.raises(BrokerError):
        scram_format_args({"u": bad})


def test_a_user_name_that_breaks_the_scram_syntax_is_refused() -> None:
    with pytest.raises(BrokerError, match="may not hold"):
        scram_format_args({"a,b": "pw"})


def test_java_argfile_quotes_each_argument() -> None:
    text = java_argfile(["kafka.tools.StorageTool", '/a dir/x "q" \\b', 'S=[name=a,password="p"]'])
    assert text.splitlines() == [
        '"kafka.tools.StorageTool"',
        '"/a dir/x \\"q\\" \\\\b"',
        '"S=[name=a,password=\\"p\\"]"',
    ]
    with pytest.raises(BrokerError):
        java_argfile(["two\nlines"])


def test_client_settings_and_the_env_dueflow_reads_them_from() -> None:
    conf = client_settings(FILES, CLIENT)
    assert conf == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "dueflow",
        "sasl.password": CLIENT,
        "ssl.ca.location": "/state/security/ca.pem",
    }
    env = {env_name(k): v for k, v in conf.items()}
    assert load_settings(env=env).kafka == conf  # DUEFLOW_KAFKA_* round-trips


def test_the_printed_exports_read_the_password_from_its_file() -> None:
    lines = client_exports(bootstrap="127.0.0.1:9092", files=SecurityFiles(Path("/my dir/sec")))
    assert lines == [
        "export DUEFLOW_BOOTSTRAP=127.0.0.1:9092",
        "export DUEFLOW_KAFKA_SECURITY_PROTOCOL=SASL_SSL",
        "export DUEFLOW_KAFKA_SASL_MECHANISM=SCRAM-SHA-512",
        "export DUEFLOW_KAFKA_SASL_USERNAME=dueflow",
        "export DUEFLOW_KAFKA_SASL_PASSWORD=\"$(cat '/my dir/sec/client.password')\"",
        "export DUEFLOW_KAFKA_SSL_CA_LOCATION='/my dir/sec/ca.pem'",
    ]


def test_redact_hides_every_secret_in_tool_output() -> None:
    said = f"bad argument SCRAM-SHA-512=[name=a,password={CLIENT}] with {STORE}"
    assert redact(said, [CLIENT, STORE, ""]) == (
        "bad argument SCRAM-SHA-512=[name=a,password=[redacted]] with [redacted]"
    )


def test_private_files_are_the_owners_only(tmp_path: Path) -> None:
    path = tmp_path / "client.password"
    write_private(path, "x\n")
    write_private(path, "y\n")  # replaced, still 0600
    assert path.read_text() == "y\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_no_new_passwords_for_storage_formatted_with_the_old_ones(tmp_path: Path) -> None:
    files = SecurityFiles(tmp_path / "security")
    with pytest.raises(BrokerError, match=r"password files .* are gone"):
        ensure_material(files, keytool="/nonexistent/keytool", formatted=True)
    assert stat.S_IMODE(files.root.stat().st_mode) == 0o700


def test_a_state_dir_keeps_the_security_it_was_formatted_for(tmp_path: Path) -> None:
    assert recorded_security(tmp_path) is None  # never formatted
    broker = LocalBroker(port=30100, state_dir=tmp_path)
    assert broker.security == "plaintext"
    assert not broker.secured
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "meta.properties").write_text("")
    assert recorded_security(tmp_path) == "plaintext"  # formatted before modes were kept
    (tmp_path / "security.mode").write_text("sasl_ssl\n")
    assert LocalBroker(port=30100, state_dir=tmp_path).secured  # the default follows it
    with pytest.raises(BrokerError, match="formatted for --security sasl_ssl"):
        LocalBroker(port=30100, state_dir=tmp_path, security="plaintext")._check_security_mode()
    with pytest.raises(BrokerError, match="accepted"):
        LocalBroker(port=30100, state_dir=tmp_path, security="tls")


CLOSED = (
    "[thrd:127.0.0.1:9092/bootstrap]: 127.0.0.1:9092/bootstrap: Disconnected: connection "
    "closed by peer: receive 0 after POLLIN (after 2ms in state APIVERSION_QUERY)"
)


def test_plaintext_to_a_tls_port_gets_a_hint() -> None:
    """librdkafka says only "connection closed by peer" when a PLAINTEXT client reaches
    the SASL_SSL listener (seen on the real broker); the probe says what to set."""
    hint = security_hint("PLAINTEXT", [CLOSED])
    assert hint is not None
    assert "may expect TLS" in hint
    assert "DUEFLOW_KAFKA_SECURITY_PROTOCOL" in hint
    assert security_hint("SASL_SSL", [CLOSED]) is None  # it speaks TLS already
    assert security_hint("PLAINTEXT", ["Connect to ipv4#127.0.0.1:1 failed: refused"]) is None


def test_the_nodes_of_a_secured_cluster_share_one_set_of_material(tmp_path: Path) -> None:
    cluster = LocalCluster(nodes=3, base_port=30200, state_dir=tmp_path, security="sasl_ssl")
    assert cluster.secured
    shared = {cluster.broker(n).security_files for n in cluster.node_ids()}
    assert shared == {SecurityFiles((tmp_path / "security").resolve())}
    assert cluster.security_files == shared.pop()
    # formatted nodes keep their mode; a cluster without --security follows node 1
    for n in cluster.node_ids():
        (tmp_path / f"node-{n}").mkdir()
        (tmp_path / f"node-{n}" / "security.mode").write_text("sasl_ssl\n")
    assert LocalCluster(nodes=3, base_port=30200, state_dir=tmp_path).secured
