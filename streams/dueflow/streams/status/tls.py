"""The status view's TLS: the server context from ``observability.status_tls_cert``
and ``status_tls_key`` (I/O edge: reads the two files).

Both set: the view serves HTTPS only, TLS 1.2 or later, no client certificates;
neither: plain HTTP. A file that cannot be read or loaded is a
:class:`~dueflow.errors.ConfigError` naming the setting and the file, raised
before the view connects to Kafka or binds its port.
"""

from __future__ import annotations

import ssl
from pathlib import Path

from dueflow.config import ObservabilitySettings
from dueflow.errors import ConfigError

CERT_SETTING = "observability.status_tls_cert"
KEY_SETTING = "observability.status_tls_key"
CERT_ACCEPTED = "a readable PEM file with the view's certificate (then its chain, if any)"
KEY_ACCEPTED = "a readable PEM file with the unencrypted private key of status_tls_cert"


def _read(setting: str, path: str, accepted: str) -> str:
    try:
        return Path(path).read_text(encoding="ascii", errors="replace")
    except OSError as exc:
        raise ConfigError(setting, path, f"{accepted} ({exc.strerror or exc})") from exc


def server_context(obs: ObservabilitySettings) -> ssl.SSLContext | None:
    """The view's server-side TLS context; None when TLS is off (neither file set)."""
    cert, key = obs.status_tls_cert, obs.status_tls_key
    if cert is None and key is None:
        return None
    if cert is None or key is None:  # Settings.validate says so first; kept for callers
        missing = CERT_SETTING if cert is None else KEY_SETTING
        raise ConfigError(missing, None, "set with the other TLS file of the status view")
    cert_text = _read(CERT_SETTING, cert, CERT_ACCEPTED)
    key_text = _read(KEY_SETTING, key, KEY_ACCEPTED)
    if "-----BEGIN CERTIFICATE-----" not in cert_text:
        raise ConfigError(CERT_SETTING, cert, f"{CERT_ACCEPTED}: it holds no PEM certificate")
    if "PRIVATE KEY-----" not in key_text:
        raise ConfigError(KEY_SETTING, key, f"{KEY_ACCEPTED}: it holds no PEM private key")
    if "ENCRYPTED" in key_text:
        raise ConfigError(KEY_SETTING, key, f"{KEY_ACCEPTED}: this key is encrypted")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        # The password callback keeps OpenSSL from prompting on a terminal.
        ctx.load_cert_chain(cert, key, password=lambda: b"")
    except ssl.SSLError as exc:
        reason = exc.reason or str(exc)
        if "KEY_VALUES_MISMATCH" in str(reason).upper():
            raise ConfigError(
                KEY_SETTING, key, f"the private key of the certificate in {cert} (it is not)"
            ) from exc
        raise ConfigError(
            f"{CERT_SETTING}, {KEY_SETTING}",
            f"{cert}, {key}",
            f"a PEM certificate and its unencrypted PEM private key (OpenSSL: {reason})",
        ) from exc
    return ctx
