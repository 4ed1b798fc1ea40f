"""Who is using the console: roles, login sessions and CSRF (the checks of :mod:`.access`
extended; pure but for the session table, which lives in memory).

Two roles:

- **operator**: the view's token (``observability.status_token``); may change
  state (cancel, retry, redrive, pause, ...) and read payloads;
- **viewer**: ``observability.status_viewer_token``; reads only, and reads
  payloads only when ``observability.status_payloads`` is ``"viewer"``.

Without a viewer token reads stay open to whoever reaches the view (as the
status page always was), as a viewer; with one, reads of data (everything
but the pages' static files, ``/healthz``, ``/livez``, ``/readyz``,
``/metrics`` and the login) need a session or a bearer token.

A browser logs in once: ``POST /api/login`` with ``{"token": ..., "name":
...}`` in a JSON body (never in a URL: a URL lands in proxy and browser
logs) answers with a session cookie (``HttpOnly``, ``SameSite=Strict``,
``Secure`` when the page is https; 12 hours) and the session's CSRF token,
which every state-changing call made with the cookie returns in
``X-CSRF-Token`` (compared in constant time). A cross-site page can make the
browser send the cookie only on top-level navigations (SameSite), cannot
read the CSRF token, and cannot send JSON without a preflight the view
never grants. Clients that are no browser send ``Authorization: Bearer
<token>`` as before: no cookie, no CSRF token needed.

``who`` in the action log is the name typed at login (as the person says:
a shared token names no one), the role and the client's address; the log's
``credential`` says what the caller proved: ``session <ref>`` (``ref``: a
digest of the session id, the same in the ``console.login`` line, so an
action leads to its login) or ``bearer <role> token``. No token or session
id is ever logged.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from dueflow.streams.status.access import Refusal

OPERATOR = "operator"
VIEWER = "viewer"
COOKIE = "dueflow_session"
CSRF_HEADER = "X-CSRF-Token"
SESSION_TTL_S = 12 * 3600.0
MAX_SESSIONS = 10_000
NAME_MAX = 64

LOGIN_PATHS = frozenset({"/api/login", "/api/logout"})
# Paths anyone may read even when reads need a login: the pages' own files, the
# probes, the metrics and the login itself.
OPEN_PATHS = frozenset(
    {
        "/",
        "/console",
        "/console.js",
        "/console.css",
        "/healthz",
        "/livez",
        "/readyz",
        "/metrics",
        "/api/session",
    }
)


def session_ref(session_id: str) -> str:
    """A session's name in logs: a digest of its id (the id is the cookie, a secret;
    the digest cannot be turned back into it)."""
    return hashlib.sha256(session_id.encode()).hexdigest()[:12]


@dataclass(slots=True)
class Session:
    id: str = field(repr=False)
    role: str
    who: str
    csrf: str = field(repr=False)
    expires_at: float

    @property
    def ref(self) -> str:
        return session_ref(self.id)


@dataclass(frozen=True, slots=True)
class Caller:
    """Who made a request: role, name for the action log, session (None: a bearer
    token or nobody)."""

    role: str | None
    who: str
    session: Session | None = None
    bearer: bool = False  # the role comes from an Authorization header
    remote: str = "?"

    @property
    def credential(self) -> str:
        """What the caller proved, fit for logs (never the token or the session id)."""
        if self.session is not None:
            return f"session {self.session.ref}"
        if self.bearer:
            return f"bearer {self.role or 'unknown'} token"
        return "none"

    def audit(self) -> dict[str, Any]:
        """The caller's fields of an audit log line (``console.action``)."""
        return {
            "who": self.who,
            "role": self.role,
            "credential": self.credential,
            "remote": self.remote,
        }


# Where the access middleware leaves the caller for the handlers.
CALLER: web.RequestKey[Caller] = web.RequestKey("dueflow_caller", Caller)


def _same(sent: str, want: str | None) -> bool:
    if want is None:
        return False
    try:
        return hmac.compare_digest(sent.encode(), want.encode())
    except UnicodeEncodeError:
        return False


def role_of_token(token: str, *, operator_token: str, viewer_token: str | None) -> str | None:
    """The role ``token`` gives (constant-time compares); None: no role."""
    if _same(token, operator_token):
        return OPERATOR
    if _same(token, viewer_token):
        return VIEWER
    return None


def clean_name(name: object) -> str:
    """A login name fit for logs: printable, at most :data:`NAME_MAX` characters."""
    text = name if isinstance(name, str) else ""
    kept = "".join(c for c in text if c.isprintable())[:NAME_MAX].strip()
    return kept or "anonymous"


class Sessions:
    """The console's login sessions (in memory: a restart logs everyone out)."""

    def __init__(
        self,
        *,
        operator_token: str,
        viewer_token: str | None,
        ttl_s: float = SESSION_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._operator_token = operator_token
        self._viewer_token = viewer_token
        self.ttl_s = ttl_s
        self._clock = clock
        self._by_id: OrderedDict[str, Session] = OrderedDict()

    @property
    def reads_need_login(self) -> bool:
        return self._viewer_token is not None

    def role_of(self, token: str) -> str | None:
        return role_of_token(
            token, operator_token=self._operator_token, viewer_token=self._viewer_token
        )

    def login(self, token: str, *, name: object, remote: str) -> Session | None:
        """A new session for ``token``'s role; None when the token gives none."""
        role = self.role_of(token)
        if role is None:
            return None
        session = Session(
            id=secrets.token_urlsafe(32),
            role=role,
            who=f"{clean_name(name)} ({role}, {remote})",
            csrf=secrets.token_urlsafe(32),
            expires_at=self._clock() + self.ttl_s,
        )
        self._by_id[session.id] = session
        while len(self._by_id) > MAX_SESSIONS:
            self._by_id.popitem(last=False)
        return session

    def get(self, session_id: str | None) -> Session | None:
        if not session_id:
            return None
        found = self._by_id.get(session_id)
        if found is None:
            return None
        if found.expires_at <= self._clock():
            del self._by_id[session_id]
            return None
        return found

    def logout(self, session_id: str | None) -> None:
        if session_id:
            self._by_id.pop(session_id, None)


def bearer(authorization: str | None) -> str | None:
    scheme, _, sent = (authorization or "").strip().partition(" ")
    return sent.strip() if scheme.lower() == "bearer" and sent.strip() else None


def caller_of(
    sessions: Sessions, *, authorization: str | None, cookie: str | None, remote: str
) -> Caller:
    """Who the request is from: a bearer token's role, else the session's, else
    nobody (role None; a viewer when reads need no login)."""
    token = bearer(authorization)
    if token is not None:
        role = sessions.role_of(token)
        return Caller(
            role, f"bearer token ({role or 'none'}, {remote})", bearer=True, remote=remote
        )
    session = sessions.get(cookie)
    if session is not None:
        return Caller(session.role, session.who, session, remote=remote)
    return Caller(
        None if sessions.reads_need_login else VIEWER, f"anonymous ({remote})", remote=remote
    )


def check_read(caller: Caller, path: str, sessions: Sessions) -> Refusal | None:
    """A read needs a role when reads need a login (but :data:`OPEN_PATHS`)."""
    if not sessions.reads_need_login or path in OPEN_PATHS or caller.role is not None:
        return None
    return Refusal(
        401,
        "reading this view needs a login: open /console and log in with the viewer or "
        "operator token, or send Authorization: Bearer <token>",
    )


def check_mutation(caller: Caller, csrf: str | None) -> Refusal | None:
    """A state change needs the operator role, and from a session its CSRF token."""
    if caller.role != OPERATOR:
        if caller.role == VIEWER and (caller.session is not None or caller.bearer):
            return Refusal(403, "the viewer role reads only: log in with the operator token")
        return None  # no role: the bearer-token check that follows says what is needed
    if caller.session is not None and not _same(csrf or "", caller.session.csrf):
        return Refusal(
            403,
            f"missing or wrong {CSRF_HEADER}: a state-changing call of a login session "
            "sends the CSRF token the login answered with (reload the console)",
        )
    return None


def payloads_allowed(caller: Caller, setting: str) -> bool:
    """Whether ``caller`` may read payloads and results (``status_payloads``)."""
    return caller.role == OPERATOR or (setting == VIEWER and caller.role == VIEWER)
