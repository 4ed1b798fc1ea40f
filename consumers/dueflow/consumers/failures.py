"""How a handler attempt failed, as data."""

from __future__ import annotations

import traceback
from dataclasses import dataclass

from dueflow.byte_size import format_byte_size
from dueflow.errors import DueflowError, JobError

_SUMMARY_MAX = 200
_MESSAGE_MAX = 2_000
_TRACEBACK_MAX = 16_000


class JobTimeout(JobError):
    """The handler overran its timeout (retriable, like any other failure)."""


class WorkerMemoryExceeded(JobError):
    """The worker process passed its hard memory ceiling during the attempt (retriable)."""


@dataclass(frozen=True, slots=True)
class Failure:
    """One failed attempt: what was raised, and whether retrying can help."""

    error_type: str
    message: str
    traceback: str = ""
    permanent: bool = False
    timed_out: bool = False

    @property
    def short_message(self) -> str:
        """The message alone (the type travels beside it), as short as :attr:`summary`."""
        return self.message[:_SUMMARY_MAX]

    @property
    def summary(self) -> str:
        """``<type>: <message>``, short enough for a header."""
        text = f"{self.error_type}: {self.message}" if self.message else self.error_type
        return text[:_SUMMARY_MAX]


def failure_of(exc: BaseException) -> Failure:
    """The :class:`Failure` an exception raised by a handler stands for.

    Any exception is retriable except those whose ``retriable`` is False
    (:class:`~dueflow.errors.PermanentJobError` and other non-retriable
    dueflow errors).
    """
    kind = type(exc)
    name = (
        kind.__qualname__
        if kind.__module__ == "builtins"
        else f"{kind.__module__}.{kind.__qualname__}"
    )
    permanent = isinstance(exc, DueflowError) and not exc.retriable
    text = "".join(traceback.format_exception(exc))
    return Failure(
        error_type=name,
        message=str(exc)[:_MESSAGE_MAX],
        traceback=text[-_TRACEBACK_MAX:],
        permanent=permanent,
        timed_out=isinstance(exc, JobTimeout),
    )


def timeout_failure(timeout_s: float) -> Failure:
    return Failure(
        error_type=f"{JobTimeout.__module__}.{JobTimeout.__qualname__}",
        message=f"handler overran its timeout of {timeout_s:g} s",
        timed_out=True,
    )


def blocked_failure(timeout_s: float, blocked_s: float) -> Failure:
    """An async handler held the event loop past its timeout (a timeout: retriable)."""
    return Failure(
        error_type=f"{JobTimeout.__module__}.{JobTimeout.__qualname__}",
        message=(
            f"handler overran its timeout of {timeout_s:g} s blocking the event loop "
            f"({blocked_s:.1f} s; an async handler must not make blocking calls)"
        ),
        timed_out=True,
    )


def memory_failure(rss: int, ceiling: int) -> Failure:
    """The worker process passed its hard memory ceiling while this attempt ran alone."""
    return Failure(
        error_type=f"{WorkerMemoryExceeded.__module__}.{WorkerMemoryExceeded.__qualname__}",
        message=(
            f"worker process at {format_byte_size(rss)} resident, past its ceiling of "
            f"{format_byte_size(ceiling)} (worker.max_memory_hard), while this attempt ran alone"
        ),
    )


def permanent(error_type: str, message: str) -> Failure:
    """A failure found before any handler ran (unknown task, undecodable record)."""
    return Failure(error_type=error_type, message=message[:_MESSAGE_MAX], permanent=True)
