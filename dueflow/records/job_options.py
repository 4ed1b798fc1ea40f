"""The keywords of a job, declared once: :class:`JobOptions`, :class:`RequestOptions`.

Every scheduling surface takes them as ``**options: Unpack[...]`` (the SDK's
``schedule``, ``ctx.schedule``; :class:`~dueflow.records.job_request.JobRequest`
has them as fields), so IDEs complete them and mypy checks them at the call;
:func:`check_keywords` is the run-time half: :class:`UnknownKeyword` names a
keyword a call does not take. The SDK's other keyword sets (a unique key, a
cron schedule) are in :mod:`dueflow.producers.call_options`.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, TypedDict

from dueflow.errors import InvalidInput

if TYPE_CHECKING:  # the types of the keywords only: no import at run time
    from dueflow.records.job_request import BackoffSpec, Duration, Instant


class JobOptions(TypedDict, total=False):
    """The keywords of every job after ``task`` and ``payload``, as every scheduling
    call takes them (``Scheduler.schedule``, ``ctx.schedule``, ...): all optional,
    ``None`` is the default. See :class:`JobRequest` for what each one means."""

    run_at: Instant | None
    delay: Duration | None
    queue: str | None
    job_id: str | None
    idempotency_key: str | None
    max_attempts: int | None
    backoff: BackoffSpec | None
    timeout: Duration | None
    jitter: Duration | None
    labels: Mapping[str, str] | None


class RequestOptions(JobOptions, total=False):
    """:class:`JobOptions` and a deadline: the keywords of :class:`JobRequest` after
    ``task`` and ``payload`` (a follow-up job, ``ctx.schedule``, has no deadline)."""

    expires: Instant | None
    max_lateness: Duration | None


def keywords_of(options: type) -> frozenset[str]:
    """The keywords a ``TypedDict`` of options declares (required and optional)."""
    return frozenset(options.__required_keys__ | options.__optional_keys__)  # type: ignore[attr-defined]


JOB_KEYWORDS = keywords_of(JobOptions)
REQUEST_KEYWORDS = keywords_of(RequestOptions)


class UnknownKeyword(InvalidInput, TypeError):
    """A keyword a scheduling call does not take (a ``TypeError`` too, as Python
    raises for a keyword a function does not declare); names it and what is accepted,
    with the closest one when it looks misspelled."""

    def __init__(self, call: str, keyword: str, value: object, accepted: Iterable[str]) -> None:
        names = sorted(accepted)
        close = difflib.get_close_matches(keyword, names, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        super().__init__(keyword, value, f"a keyword of {call}(): {', '.join(names)}{hint}")
        self.call = call


def check_keywords(call: str, given: Mapping[str, object], accepted: frozenset[str]) -> None:
    """Raise :class:`UnknownKeyword` for the first keyword of ``given`` (by name) that
    ``call`` does not take: the runtime half of a ``**options: Unpack[...]`` (type
    checkers and IDEs check the keywords before the call runs)."""
    if given.keys() <= accepted:
        return
    first = min(given.keys() - accepted)
    raise UnknownKeyword(call, first, given[first], accepted)
