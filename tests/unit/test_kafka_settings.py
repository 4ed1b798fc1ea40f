"""Secrets in the ``[kafka]`` settings never show in a repr (issue 16, item 2)."""

from __future__ import annotations

import pickle

import pytest

from dueflow.config import Settings, load_settings
from dueflow.kafka.kafka_settings import REDACTED, KafkaSettings, is_secret, redacted

PASSWORD = "hunter2-Very-Secret-9f3a"


@pytest.mark.parametrize(
    ("key", "secret"),
    [
        ("sasl.password", True),
        ("SASL.PASSWORD", True),
        ("ssl.key.password", True),
        ("ssl.keystore.password", True),
        ("ssl.key.pem", True),
        ("ssl_key", True),
        ("sasl.oauthbearer.client.secret", True),
        ("sasl.oauthbearer.config", True),
        ("sasl.oauthbearer.assertion.private.key.passphrase", True),
        ("security.protocol", False),
        ("sasl.mechanism", False),
        ("sasl.username", False),
        ("ssl.ca.location", False),
        ("sasl.oauthbearer.token.endpoint.url", False),
        ("client.id", False),
    ],
)
def test_which_librdkafka_settings_are_secret(key: str, secret: bool) -> None:
    assert is_secret(key) is secret


def test_redacted_keeps_keys_and_hides_secret_values() -> None:
    conf = {"sasl.username": "alice", "sasl.password": PASSWORD, "linger.ms": 5}
    assert redacted(conf) == {"sasl.username": "alice", "sasl.password": REDACTED, "linger.ms": 5}


def _secure_env() -> dict[str, str]:
    return {
        "DUEFLOW_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "DUEFLOW_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
        "DUEFLOW_KAFKA_SASL_USERNAME": "alice",
        "DUEFLOW_KAFKA_SASL_PASSWORD": PASSWORD,
        "DUEFLOW_KAFKA_SSL_KEY_PASSWORD": PASSWORD + "-key",
    }


def test_settings_repr_names_the_password_setting_without_its_value() -> None:
    """The dataclass repr of Settings printed sasl.password in clear text."""
    s = load_settings(env=_secure_env())
    for text in (repr(s), str(s), repr(s.kafka), str(s.kafka), f"{s.kafka}"):
        assert PASSWORD not in text
    assert "'sasl.password': '[redacted]'" in repr(s)
    assert "'ssl.key.password': '[redacted]'" in repr(s)
    assert "'sasl.username': 'alice'" in repr(s)  # what is not secret still helps
    assert "'security.protocol': 'SASL_SSL'" in repr(s)


def test_the_clients_still_get_the_password() -> None:
    s = load_settings(env=_secure_env())
    conf = s.client_config()
    assert conf["sasl.password"] == PASSWORD
    assert conf["security.protocol"] == "SASL_SSL"
    assert type(conf) is dict  # what librdkafka is given is a plain dict


def test_settings_built_directly_hide_it_too_and_stay_read_only() -> None:
    s = Settings(kafka={"sasl.password": PASSWORD})
    assert isinstance(s.kafka, KafkaSettings)
    assert PASSWORD not in repr(s)
    assert s.kafka == {"sasl.password": PASSWORD}
    with pytest.raises(TypeError):
        s.kafka["sasl.password"] = "other"  # type: ignore[index]


def test_kafka_settings_survive_pickling_for_worker_processes() -> None:
    s = load_settings(env=_secure_env())
    back = pickle.loads(pickle.dumps(s))
    assert back == s
    assert isinstance(back.kafka, KafkaSettings)
    assert back.client_config()["sasl.password"] == PASSWORD
