"""Who may call the status view: the checks its HTTP layer applies (pure functions).

Every request: its ``Host`` must name the address the request arrived at
(``localhost`` too when that is a loopback address) or one of
``observability.status_allowed_hosts``. A web page on another site cannot
then reach the view through a DNS name it rebinds to this address.

State-changing requests (every method but GET, HEAD and OPTIONS) also need:

- ``Origin``, when the browser sends one, equal to the page's own origin: scheme
  (the connection's, or ``X-Forwarded-Proto`` from a reverse proxy), host and port;
- ``Authorization: Bearer <token>`` with the view's token (compared in
  constant time);
- a JSON body (``Content-Type: application/json``): a cross-site form or a
  ``text/plain`` fetch cannot send one without a CORS preflight, which the
  view never grants.

A check returns ``None`` (allowed) or a :class:`Refusal` (status and message).
Messages never contain the token, sent or expected.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple
from urllib.parse import urlsplit

import orjson

from dueflow.config import Settings
from dueflow.errors import ConfigError

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
TOKEN_SETTING = "observability.status_token"
TOKEN_ENV = "DUEFLOW_OBSERVABILITY_STATUS_TOKEN"
HOSTS_SETTING = "observability.status_allowed_hosts"
HOSTS_ENV = "DUEFLOW_OBSERVABILITY_STATUS_ALLOWED_HOSTS"
_LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


class Refusal(NamedTuple):
    status: int
    message: str


@dataclass(frozen=True, slots=True)
class StatusAccess:
    """The view's token and the host names it answers to besides its own address.

    ``generated``: the token was made at start (none was configured)."""

    token: str = field(repr=False)
    allowed_hosts: tuple[str, ...] = ()
    generated: bool = False


def is_loopback_bind(bind: str) -> bool:
    """Whether binding ``bind`` serves this machine only (``localhost``, 127/8, ::1).

    The wildcard (``0.0.0.0``, ``::``, empty) and any other name or address is not."""
    if bind.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(bind.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name other than localhost: it may resolve anywhere


def require_token_beyond_loopback(settings: Settings) -> None:
    """:class:`ConfigError` naming the setting when the view would bind beyond
    loopback without a configured token."""
    obs = settings.observability
    if obs.status_token is None and not is_loopback_bind(obs.status_bind):
        raise ConfigError(
            TOKEN_SETTING,
            None,
            f"a token (at least 16 characters; env {TOKEN_ENV}) when the status view binds "
            f"beyond loopback (observability.status_bind is {obs.status_bind!r}); "
            "or bind 127.0.0.1",
        )


# ------------------------------------------------------------------- Host


def split_host(host: str) -> tuple[str, int | None] | None:
    """``(name, port)`` of a ``Host`` header value (lower-cased); ``None`` if malformed."""
    host = host.strip().lower()
    if host.startswith("["):
        name, sep, rest = host[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            return None
        port_text = rest[1:] if rest else None
    elif host.count(":") == 1:
        name, port_text = host.split(":")
    elif ":" in host:
        return None  # a bare IPv6 address: it must be bracketed
    else:
        name, port_text = host, None
    name = name.rstrip(".")
    if not name:
        return None
    if port_text is None:
        return name, None
    if not port_text.isdigit() or not 0 < int(port_text) <= 65535:
        return None
    return name, int(port_text)


def check_host(
    host: str | None, *, local_addr: str, local_port: int, allowed: Iterable[str]
) -> Refusal | None:
    """``Host`` must name this address (``local_addr:local_port``, the socket the
    request arrived on; ``localhost`` too on loopback) or an allowed host
    (``name``: any port; ``name:port``: that port)."""
    parsed = split_host(host or "")
    if parsed is not None:
        name, port = parsed
        local_addr = _unmapped(local_addr)
        own = {local_addr.lower()}
        if is_loopback_bind(local_addr):
            own.update(_LOOPBACK_NAMES)
        if name in own and (port or 80) == local_port:
            return None
        for entry in allowed:
            want = split_host(entry)
            if want is not None and want[0] == name and want[1] in (None, port or 80):
                return None
    return Refusal(
        403,
        f"Host {host!r} is not an address of this status view: use its address, or add the "
        f"name to {HOSTS_SETTING} (env {HOSTS_ENV}); names not listed are refused "
        "(DNS-rebinding defence)",
    )


def _unmapped(addr: str) -> str:
    """An IPv4 address as such when a dual-stack socket reports it IPv4-mapped."""
    try:
        ip = ipaddress.ip_address(addr)
    except ValueError:
        return addr
    mapped = getattr(ip, "ipv4_mapped", None)
    return str(mapped) if mapped is not None else addr


# --------------------------------------------------------- state changes


_DEFAULT_PORTS = {"http": 80, "https": 443}


def page_scheme(transport_scheme: str, forwarded_proto: str | None) -> str:
    """The scheme the page was loaded with: ``X-Forwarded-Proto`` when a reverse proxy
    in front of the view set it (its first value), else the scheme of the connection.

    Trusting the header is safe for this check: a cross-site page cannot add it to a
    browser's request without a CORS preflight, which the view never grants, and a
    client that is no browser sends no ``Origin`` to check."""
    if forwarded_proto:
        first = forwarded_proto.split(",")[0].strip().lower()
        if first in _DEFAULT_PORTS:
            return first
    return transport_scheme.lower()


def origin_of(scheme: str, host: str) -> tuple[str, str, int] | None:
    """``(scheme, host name, port)`` of a page of ``scheme`` on ``Host`` ``host`` (the
    port defaults by scheme); ``None`` for a malformed ``Host``."""
    parsed = split_host(host)
    if parsed is None or scheme not in _DEFAULT_PORTS:
        return None
    name, port = parsed
    return scheme, name, port if port is not None else _DEFAULT_PORTS[scheme]


def parse_origin(origin: str) -> tuple[str, str, int] | None:
    """``(scheme, host name, port)`` of an ``Origin`` header (RFC 6454: scheme, host and
    an optional port, nothing else); ``None`` for ``null``, another scheme, user info,
    a path, a query or anything malformed."""
    try:
        parts = urlsplit(origin.strip())
        port = parts.port
    except ValueError:  # a bad port, an unclosed IPv6 bracket
        return None
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not parts.netloc or parts.path or parts.query:
        return None
    if parts.fragment or "@" in parts.netloc:
        return None
    parsed = split_host(parts.netloc)
    if parsed is None:
        return None
    return scheme, parsed[0], port if port is not None else _DEFAULT_PORTS[scheme]


def check_origin(origin: str | None, *, host: str, scheme: str = "http") -> Refusal | None:
    """``Origin``, when present, must be this page's whole origin: the ``scheme`` it was
    loaded with (:func:`page_scheme`), and the host and port of the request's ``Host``
    (default ports by scheme: ``http://h`` is ``h:80``, ``https://h`` is ``h:443``)."""
    if origin is None:
        return None  # not a browser, or a same-origin request of an old browser
    page = origin_of(scheme, host)
    if page is not None and parse_origin(origin) == page:
        return None
    expected = "this page's origin" if page is None else f"{page[0]}://{host.strip().lower()}"
    return Refusal(
        403,
        f"cross-origin request refused: Origin {origin!r} is not {expected} (scheme, host "
        "and port must all match); state-changing calls come from the status page itself "
        "or from a client that sends no Origin",
    )


def check_token(authorization: str | None, *, token: str) -> Refusal | None:
    """``Authorization: Bearer <token>`` with this view's token (constant-time compare).
    A header that cannot be read (another scheme, no token, bytes that are not text)
    is a 401 like a wrong token, never an error of the view."""
    scheme, _, sent = (authorization or "").strip().partition(" ")
    if scheme.lower() != "bearer" or not sent.strip():
        return Refusal(
            401,
            "this call changes state and needs the status view's token "
            "(Authorization: Bearer <token>): open the page URL that `dueflow status-view` "
            f"printed at start (it ends in ?token=...), or use the configured {TOKEN_SETTING} "
            f"(env {TOKEN_ENV})",
        )
    try:
        sent_bytes = sent.strip().encode()
    except UnicodeEncodeError:  # header bytes that are not UTF-8 (aiohttp keeps them escaped)
        return Refusal(
            401,
            "the Authorization header is not text (bytes that are not UTF-8): send "
            "Authorization: Bearer <token> with the status view's token",
        )
    if not hmac.compare_digest(sent_bytes, token.encode()):
        return Refusal(
            401,
            "wrong token: it is not this status view's token (a view without a configured "
            f"{TOKEN_SETTING} makes a new one at every start: open the URL it printed)",
        )
    return None


def check_json_body(content_type: str, body: bytes) -> Refusal | None:
    """A state-changing call takes JSON: 415 for another media type."""
    if content_type.lower() != "application/json":
        return Refusal(
            415,
            f"state-changing calls take a JSON body: send Content-Type: application/json "
            f"(got {content_type or 'none'!r})",
        )
    if body.strip():
        try:
            orjson.loads(body)
        except orjson.JSONDecodeError:
            return Refusal(400, "the body is not valid JSON (send {} or nothing)")
    return None


def page_banner(access: StatusAccess, *, bind: str, port: int, scheme: str = "http") -> str:
    """What the view prints once at start: the page URL, with the token when it was
    generated (never a configured one: its owner has it, and logs keep stderr)."""
    host = "127.0.0.1" if bind in ("0.0.0.0", "", "::") else bind
    host = f"[{host}]" if ":" in host else host
    url = f"{scheme}://{host}:{port}/"
    if access.generated:
        return (
            f"dueflow status view: open {url}?token={access.token}\n"
            "  (a token made for this run: the redrive button and every other "
            "state-changing call need it; set observability.status_token or "
            "DUEFLOW_OBSERVABILITY_STATUS_TOKEN to choose one)\n"
            # The fragment never reaches a server: the console logs in with it.
            f"  operator console: {url}console#token={access.token}\n"
        )
    return (
        f"dueflow status view: open {url}?token=<observability.status_token>\n"
        "  (state-changing calls need that token; read-only pages need none)\n"
        f"  operator console: {url}console (log in with a token)\n"
    )
