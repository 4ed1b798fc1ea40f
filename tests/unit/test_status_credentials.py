"""The status view's librdkafka -> aiokafka security mapping: SCRAM over TLS as the
local SASL_SSL broker needs it, and errors that name settings, never secrets."""

from __future__ import annotations

from pathlib import Path

import faust
import pytest
from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth
from faust.types.auth import AuthProtocol, SASLMechanism

from dueflow.errors import ConfigError
from dueflow.streams.status.credentials import credentials

CA = str(Path(__file__).parent / "data" / "test-ca.pem")  # a CA certificate, no key kept
PASSWORD = "s3cret-Scram-Pass-771"


def _scram(**extra: str) -> dict[str, str]:
    return {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "dueflow",
        "sasl.password": PASSWORD,
        "ssl.ca.location": CA,
        **extra,
    }


def test_scram_over_tls_reaches_aiokafka_as_the_local_broker_needs_it() -> None:
    cred = credentials(_scram())
    assert isinstance(cred, faust.SASLCredentials)
    assert cred.protocol is AuthProtocol.SASL_SSL
    assert cred.mechanism is SASLMechanism.SCRAM_SHA_512
    auth = credentials_to_aiokafka_auth(cred)
    assert auth["security_protocol"] == "SASL_SSL"
    assert auth["sasl_mechanism"] == "SCRAM-SHA-512"
    assert (auth["sasl_plain_username"], auth["sasl_plain_password"]) == ("dueflow", PASSWORD)
    context = auth["ssl_context"]
    assert context.check_hostname  # the broker's certificate must name 127.0.0.1
    subjects = [dict(x[0] for x in c["subject"]) for c in context.get_ca_certs()]
    assert subjects == [{"commonName": "dueflow unit-test CA (no key kept)"}]
    assert PASSWORD not in repr(cred)


def test_scram_sha_256_and_sasl_plaintext_map_too() -> None:
    cred = credentials(_scram(**{"sasl.mechanism": "SCRAM-SHA-256"}))
    assert cred.mechanism is SASLMechanism.SCRAM_SHA_256
    plain = credentials({**_scram(), "security.protocol": "SASL_PLAINTEXT"})
    assert plain.protocol is AuthProtocol.SASL_PLAINTEXT
    assert plain.ssl_context is None


def test_endpoint_identification_none_turns_the_host_name_check_off() -> None:
    cred = credentials(_scram(**{"ssl.endpoint.identification.algorithm": "none"}))
    assert cred.ssl_context.check_hostname is False
    with pytest.raises(ConfigError, match=r"endpoint\.identification\.algorithm"):
        credentials(_scram(**{"ssl.endpoint.identification.algorithm": "sometimes"}))


@pytest.mark.parametrize("missing", ["sasl.username", "sasl.password"])
def test_a_login_without_its_user_or_password_is_named(missing: str) -> None:
    conf = _scram()
    del conf[missing]
    with pytest.raises(ConfigError) as err:
        credentials(conf)
    assert f"kafka.{missing}" in str(err.value)
    assert PASSWORD not in str(err.value)


def test_a_missing_ca_file_is_named_and_no_secret_shows() -> None:
    with pytest.raises(ConfigError) as err:
        credentials(_scram(**{"ssl.ca.location": "/nonexistent/ca.pem"}))
    assert "kafka.ssl.ca.location" in str(err.value)
    assert "/nonexistent/ca.pem" in str(err.value)  # a path is not a secret
    assert PASSWORD not in str(err.value)


def test_a_mechanism_it_cannot_map_is_refused_not_tried() -> None:
    conf = _scram()
    del conf["sasl.mechanism"]  # librdkafka's default: GSSAPI (Kerberos)
    with pytest.raises(ConfigError, match=r"kafka\.sasl\.mechanism"):
        credentials(conf)
    with pytest.raises(ConfigError, match=r"kafka\.sasl\.mechanism"):
        credentials(_scram(**{"sasl.mechanism": "OAUTHBEARER"}))
