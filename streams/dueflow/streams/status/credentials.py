"""Broker URL and security settings for faust, from dueflow's librdkafka settings.

dueflow's settings hold librdkafka keys (``DUEFLOW_KAFKA_*``); faust talks to
Kafka through aiokafka, which takes the same information in another shape.
Only the common cases are mapped; anything else is refused with a clear error
rather than silently connecting without security. Errors name the setting,
never its value: any ``kafka.*`` value may be a password.

What maps to what (librdkafka -> aiokafka through faust's credentials):

- ``security.protocol``: ``PLAINTEXT``, ``SSL``, ``SASL_PLAINTEXT``, ``SASL_SSL``;
- ``sasl.mechanism`` (``PLAIN``, ``SCRAM-SHA-256``, ``SCRAM-SHA-512``; librdkafka's
  default, GSSAPI, is refused: a Kerberos login is not mapped), ``sasl.username``,
  ``sasl.password``: ``faust.SASLCredentials`` (username and password required);
- ``ssl.ca.location`` (a PEM file or a directory), ``ssl.certificate.location``,
  ``ssl.key.location``, ``ssl.key.password``: the ``ssl.SSLContext`` (default: the
  system's CAs), which checks the broker's host name unless
  ``ssl.endpoint.identification.algorithm`` is ``none``, as librdkafka does.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import faust

from dueflow.config import Settings
from dueflow.errors import ConfigError

_MAPPED = {
    "security.protocol",
    "sasl.mechanism",
    "sasl.mechanisms",
    "sasl.username",
    "sasl.password",
    "ssl.ca.location",
    "ssl.certificate.location",
    "ssl.key.location",
    "ssl.key.password",
    "ssl.endpoint.identification.algorithm",
    "client.id",
}
_SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
# librdkafka tuning keys that do not matter to the status view's connection.
_IGNORED_PREFIXES = ("socket.", "reconnect.", "metadata.", "topic.metadata.", "log", "debug")


def faust_broker_options(settings: Settings) -> dict[str, Any]:
    """``broker=`` and ``broker_credentials=`` for :class:`faust.App`."""
    urls = [f"kafka://{b.strip()}" for b in settings.bootstrap.split(",")]
    return {"broker": urls, "broker_credentials": credentials(settings.kafka)}


def credentials(conf: Mapping[str, str]) -> Any:
    """faust credentials for ``security.protocol`` and friends (``None``: plaintext)."""
    for key in conf:
        if key not in _MAPPED and not key.startswith(_IGNORED_PREFIXES):
            raise ConfigError(
                f"kafka.{key}",
                None,
                "a setting the status view can pass to aiokafka: " + ", ".join(sorted(_MAPPED)),
                secret=True,
            )
    protocol = conf.get("security.protocol", "PLAINTEXT").upper()
    if protocol == "PLAINTEXT":
        return None
    if protocol not in ("SSL", "SASL_PLAINTEXT", "SASL_SSL"):
        raise ConfigError(
            "kafka.security.protocol", protocol, "PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL"
        )
    context = tls_context(conf) if protocol in ("SSL", "SASL_SSL") else None
    if protocol == "SSL":
        return faust.SSLCredentials(context)
    mechanism = conf.get("sasl.mechanism", conf.get("sasl.mechanisms", "GSSAPI")).upper()
    if mechanism not in _SASL_MECHANISMS:
        raise ConfigError(
            "kafka.sasl.mechanism",
            mechanism,
            " or ".join(_SASL_MECHANISMS) + " (the status view maps no other SASL login)",
        )
    for key in ("sasl.username", "sasl.password"):
        if not conf.get(key):
            raise ConfigError(
                f"kafka.{key}", None, f"set, for a {mechanism} login over {protocol}", secret=True
            )
    return faust.SASLCredentials(
        username=conf["sasl.username"],
        password=conf["sasl.password"],
        mechanism=mechanism,
        ssl_context=context,
    )


def tls_context(conf: Mapping[str, str]) -> ssl.SSLContext:
    """The TLS context of librdkafka's ``ssl.*`` settings; a file that cannot be read
    is named (its path), never the key's password."""
    ca = conf.get("ssl.ca.location")
    try:
        if ca and Path(ca).is_dir():
            context = ssl.create_default_context(capath=ca)
        else:
            context = ssl.create_default_context(cafile=ca)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            "kafka.ssl.ca.location", ca, f"a readable PEM file of CA certificates ({exc})"
        ) from exc
    if conf.get("ssl.certificate.location"):
        try:
            context.load_cert_chain(
                conf["ssl.certificate.location"],
                conf.get("ssl.key.location"),
                conf.get("ssl.key.password"),
            )
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                "kafka.ssl.certificate.location",
                conf["ssl.certificate.location"],
                "a readable PEM certificate whose key ssl.key.location holds and "
                f"ssl.key.password opens ({type(exc).__name__})",
            ) from exc
    check = conf.get("ssl.endpoint.identification.algorithm", "https").lower()
    if check not in ("https", "none"):
        raise ConfigError("kafka.ssl.endpoint.identification.algorithm", check, "https or none")
    context.check_hostname = check == "https"
    return context
