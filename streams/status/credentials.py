"""Broker URL and security settings for faust, from dueflow's librdkafka settings.

dueflow's settings hold librdkafka keys (``DUEFLOW_KAFKA_*``); faust talks to
Kafka through aiokafka, which takes the same information in another shape.
Only the common cases are mapped; anything else is refused with a clear error
rather than silently connecting without security. Errors name the setting,
never its value: any ``kafka.*`` value may be a password.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
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
    "client.id",
}
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
    context = None
    if protocol in ("SSL", "SASL_SSL"):
        context = ssl.create_default_context(cafile=conf.get("ssl.ca.location"))
        if conf.get("ssl.certificate.location"):
            context.load_cert_chain(
                conf["ssl.certificate.location"],
                conf.get("ssl.key.location"),
                conf.get("ssl.key.password"),
            )
    if protocol == "SSL":
        return faust.SSLCredentials(context)
    if protocol in ("SASL_PLAINTEXT", "SASL_SSL"):
        mechanism = conf.get("sasl.mechanism", conf.get("sasl.mechanisms", "PLAIN")).upper()
        return faust.SASLCredentials(
            username=conf.get("sasl.username"),
            password=conf.get("sasl.password"),
            mechanism=mechanism,
            ssl_context=context,
        )
    raise ConfigError(
        "kafka.security.protocol", protocol, "PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL"
    )
