"""The status view's TLS settings: both files or neither, the URL's scheme, the files'
errors, the CLI flags and the client's pin (no certificate needed: loading a real one
is proven in tests/integration/test_console_tls.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from dueflow.apps.cli.main import build_parser
from dueflow.config import ObservabilitySettings, load_settings
from dueflow.errors import ConfigError
from dueflow.observability.metrics import Metrics
from dueflow.producers.view_client import pinned_view_context
from dueflow.streams.status.access import StatusAccess, page_banner
from dueflow.streams.status.console_access import Sessions
from dueflow.streams.status.tls import server_context
from dueflow.streams.status.web import build_web_app
from tests.unit.test_console_access import OPERATOR, Console, FakeOps
from tests.unit.test_status_job_search import Source

CERT_ENV = "DUEFLOW_OBSERVABILITY_STATUS_TLS_CERT"
KEY_ENV = "DUEFLOW_OBSERVABILITY_STATUS_TLS_KEY"


def test_tls_is_off_by_default_and_the_url_is_http() -> None:
    obs = load_settings(env={}).observability
    assert obs.status_tls_cert is None
    assert obs.status_tls_key is None
    assert obs.status_base_url == "http://127.0.0.1:6066"
    assert server_context(obs) is None


def test_both_files_from_the_environment_make_the_url_https() -> None:
    obs = load_settings(env={CERT_ENV: "/etc/view/cert.pem", KEY_ENV: "/etc/view/key.pem"})
    assert obs.observability.status_tls_cert == "/etc/view/cert.pem"
    assert obs.observability.status_tls_key == "/etc/view/key.pem"
    assert obs.observability.status_base_url == "https://127.0.0.1:6066"


def test_toml_sets_them_too(tmp_path: Path) -> None:
    cfg = tmp_path / "dueflow.toml"
    cfg.write_text('[observability]\nstatus_tls_cert = "c.pem"\nstatus_tls_key = "k.pem"\n')
    obs = load_settings(config_file=cfg, env={}).observability
    assert (obs.status_tls_cert, obs.status_tls_key) == ("c.pem", "k.pem")


@pytest.mark.parametrize(
    ("env", "missing", "named"),
    [
        ({CERT_ENV: "/etc/view/cert.pem"}, "observability.status_tls_key", "/etc/view/cert.pem"),
        ({KEY_ENV: "/etc/view/key.pem"}, "observability.status_tls_cert", "/etc/view/key.pem"),
        # An empty value is unset: the other one alone is refused.
        ({CERT_ENV: "/c.pem", KEY_ENV: ""}, "observability.status_tls_key", "/c.pem"),
    ],
)
def test_one_file_without_the_other_is_refused_naming_both(
    env: dict[str, str], missing: str, named: str
) -> None:
    with pytest.raises(ConfigError) as err:
        load_settings(env=env)
    assert err.value.setting == missing
    message = str(err.value)
    assert "\n" not in message
    assert missing in message
    assert named in message  # the file that was given


def both(tmp_path: Path, cert: str, key: str) -> ObservabilitySettings:
    c, k = tmp_path / "cert.pem", tmp_path / "key.pem"
    c.write_text(cert)
    k.write_text(key)
    return ObservabilitySettings(status_tls_cert=str(c), status_tls_key=str(k))


CERT = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
KEY = "-----BEGIN PRIVATE KEY-----\nMIIB\n-----END PRIVATE KEY-----\n"


def test_a_missing_file_names_its_setting_and_path(tmp_path: Path) -> None:
    obs = ObservabilitySettings(
        status_tls_cert=str(tmp_path / "nope.pem"), status_tls_key=str(tmp_path / "k.pem")
    )
    with pytest.raises(ConfigError) as err:
        server_context(obs)
    assert err.value.setting == "observability.status_tls_cert"
    assert str(tmp_path / "nope.pem") in str(err.value)
    assert "No such file" in str(err.value)


@pytest.mark.parametrize(
    ("cert", "key", "setting", "says"),
    [
        ("just text", KEY, "observability.status_tls_cert", "no PEM certificate"),
        (CERT, "just text", "observability.status_tls_key", "no PEM private key"),
        (
            CERT,
            "-----BEGIN ENCRYPTED PRIVATE KEY-----\nMIIB\n-----END ENCRYPTED PRIVATE KEY-----\n",
            "observability.status_tls_key",
            "encrypted",
        ),
        # Markers but no certificate inside: OpenSSL's reason, both files named.
        (CERT, KEY, "observability.status_tls_cert, observability.status_tls_key", "OpenSSL"),
    ],
)
def test_a_file_that_does_not_load_names_its_setting(
    tmp_path: Path, cert: str, key: str, setting: str, says: str
) -> None:
    with pytest.raises(ConfigError) as err:
        server_context(both(tmp_path, cert, key))
    assert err.value.setting == setting
    assert says in str(err.value)
    assert "\n" not in str(err.value)
    assert str(tmp_path) in str(err.value)


def test_status_view_flags_name_the_settings(capsys: pytest.CaptureFixture[str]) -> None:
    args = build_parser().parse_args(
        ["status-view", "--tls-cert", "/c.pem", "--tls-key", "/k.pem", "--port", "0"]
    )
    assert (args.tls_cert, args.tls_key) == ("/c.pem", "/k.pem")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["status-view", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "observability.status_tls_cert" in help_text
    assert "observability.status_tls_key" in help_text


def test_a_client_pins_the_views_certificate_only_for_the_views_own_address(
    tmp_path: Path,
) -> None:
    obs = ObservabilitySettings(status_tls_cert=str(tmp_path / "absent.pem"))
    assert pinned_view_context(obs) is None  # not readable here: the system's CAs
    named = ObservabilitySettings(
        status_tls_cert=str(tmp_path / "absent.pem"), status_url="https://view.example:6066"
    )
    assert pinned_view_context(named) is None  # a named URL is verified as any https one
    assert pinned_view_context(ObservabilitySettings()) is None


def cookie_of(tls: bool, headers: dict[str, str]) -> str:
    app = build_web_app(
        Source(),
        Metrics(),
        access=StatusAccess(token=OPERATOR),
        console=Console(FakeOps()),
        sessions=Sessions(operator_token=OPERATOR, viewer_token=None),
        tls=tls,
    )

    async def run() -> str:
        async with TestClient(TestServer(app)) as client:
            resp = await client.post(
                "/api/login", json={"token": OPERATOR, "name": "alice"}, headers=headers
            )
            assert resp.status == 200
            return resp.headers["Set-Cookie"]

    return asyncio.run(run())


def test_the_session_cookie_is_secure_whenever_the_view_serves_tls() -> None:
    # A proxy's X-Forwarded-Proto cannot take Secure off a view that serves TLS itself.
    assert "Secure" in cookie_of(True, {"X-Forwarded-Proto": "http"})
    assert "Secure" in cookie_of(True, {})
    assert "Secure" not in cookie_of(False, {})  # plain HTTP on a laptop: no Secure
    assert "Secure" in cookie_of(False, {"X-Forwarded-Proto": "https"})


def test_the_banner_and_its_console_url_say_https() -> None:
    access = StatusAccess(token="t" * 32, generated=True)
    banner = page_banner(access, bind="0.0.0.0", port=6443, scheme="https")
    assert "open https://127.0.0.1:6443/?token=" in banner
    assert "https://127.0.0.1:6443/console#token=" in banner
