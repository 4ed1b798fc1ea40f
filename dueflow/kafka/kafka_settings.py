"""The ``[kafka]`` pass-through settings (librdkafka keys) and which of them are secret.

``Settings.kafka`` carries whatever the user gives as ``[kafka]`` in the TOML
file or ``DUEFLOW_KAFKA_*`` in the environment, to every client dueflow makes.
Some of those values are passwords (``sasl.password``, ``ssl.key.password``,
an OAuth client secret, a private key as PEM), and settings objects end up in
reprs, log lines and test failure output. :class:`KafkaSettings` is the
read-only mapping that holds them: its repr names every key and shows the
value of none that :func:`is_secret` flags (pure).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

REDACTED = "[redacted]"

# librdkafka marks these sensitive (rdkafka_conf.c, _RK_SENSITIVE), and so does any
# key that says it holds a password, a secret, a passphrase or a private key.
_SECRET_KEYS = frozenset({"ssl.key.pem", "ssl_key", "sasl.oauthbearer.config"})
_SECRET_WORDS = ("password", "secret", "passphrase", "private.key")


def is_secret(key: str) -> bool:
    """Whether the value of librdkafka setting ``key`` may be a secret (pure)."""
    k = key.strip().lower()
    return k in _SECRET_KEYS or any(word in k for word in _SECRET_WORDS)


def redacted(conf: Mapping[str, object]) -> dict[str, object]:
    """``conf`` with the value of every secret key replaced by ``[redacted]`` (pure)."""
    return {k: (REDACTED if is_secret(str(k)) else v) for k, v in conf.items()}


class KafkaSettings(Mapping[str, str]):
    """librdkafka settings, read-only; the repr hides secret values."""

    __slots__ = ("_data",)

    def __init__(self, data: Mapping[str, str] | None = None) -> None:
        self._data: dict[str, str] = dict(data or {})

    def __getitem__(self, key: str) -> str:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"KafkaSettings({redacted(self._data)!r})"

    __str__ = __repr__

    def __reduce__(self) -> tuple[type[KafkaSettings], tuple[dict[str, str]]]:
        # worker processes receive their settings pickled
        return (KafkaSettings, (self._data,))
