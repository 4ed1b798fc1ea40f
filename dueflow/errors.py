"""The exception tree of dueflow.

One root, :class:`DueflowError`. Every subclass says whether retrying the
same operation can help (``retriable``), as data rather than as a type test,
so callers route failures without knowing every class.
"""

from __future__ import annotations

from collections.abc import Iterable


class DueflowError(Exception):
    """Root of every error raised by dueflow."""

    retriable: bool = False

    def __init__(self, message: str, *, cause: BaseException | None = None) -> None:
        super().__init__(message)
        self.message = message
        # Keep the wrapped client error (e.g. a confluent_kafka.KafkaError).
        self.cause = cause
        if cause is not None:
            self.__cause__ = cause


class ConfigError(DueflowError):
    """A setting is missing or has a value that is not accepted."""

    def __init__(self, setting: str, value: object, accepted: str, *, secret: bool = False) -> None:
        # A secret (a password, a token) is named, never shown: messages reach logs.
        got = "a value that is not shown (a secret)" if secret else repr(value)
        super().__init__(f"setting {setting!r}: got {got}; accepted: {accepted}")
        self.setting = setting
        self.value = None if secret else value
        self.accepted = accepted


class InvalidInput(DueflowError):
    """Input at a door of dueflow (SDK, CLI, wire) names a bad field value."""

    def __init__(self, field: str, value: object, accepted: str) -> None:
        shown = value if not isinstance(value, str | bytes) or len(value) <= 200 else value[:200]
        super().__init__(f"{field}: got {shown!r}; accepted: {accepted}")
        self.field = field
        self.value = value
        self.accepted = accepted


class UnknownQueue(InvalidInput):
    """A job, schedule or command names a queue that neither the static config nor
    the queue registry has; the message says how to create it."""

    def __init__(self, queue: object, known: Iterable[str]) -> None:
        shown = sorted(known)
        name = queue if isinstance(queue, str) and queue else "NAME"
        super().__init__(
            "queue",
            queue,
            f"one of the queues {shown}; to create {name!r}: "
            f"`dueflow queue create {name} --partitions N` (docs/queues.md), "
            "or configure it statically (DUEFLOW_QUEUES / [[queues]])",
        )
        self.queue = queue
        self.known = shown


class ConflictError(DueflowError):
    """A job id was reused with different content."""


class BrokerError(DueflowError):
    """The local broker could not be fetched, started, reached or stopped."""


class KafkaOperationError(DueflowError):
    """A Kafka client call failed; ``cause`` holds the client's error."""

    retriable = True


class ClusterUnreachable(KafkaOperationError):
    """No broker of the bootstrap list answered (refused, not resolved, TLS/SASL
    failure, or silence until the deadline); ``reason`` is librdkafka's."""

    def __init__(
        self, bootstrap: str, reason: str, *, waited_s: float = 0.0, refused: bool = False
    ) -> None:
        super().__init__(f"cannot reach the Kafka cluster at {bootstrap}: {reason}")
        self.bootstrap = bootstrap
        self.reason = reason
        self.waited_s = waited_s
        #: the cluster answered and said no (SASL, TLS): waiting does not help
        self.refused = refused


class TopicMismatch(DueflowError):
    """An existing topic differs from the layout dueflow needs."""


class FencedError(DueflowError):
    """Another process took over a transactional id: this one must stop."""


class JobError(DueflowError):
    """Raised by a task handler: the job failed and may be retried."""

    retriable = True


class PermanentJobError(JobError):
    """Raised by a task handler: the job failed and retrying cannot help."""

    retriable = False


class UndecodableRecord(DueflowError):
    """A record's bytes do not match the schema they claim (or any known one)."""


class WorkerStartupFailed(DueflowError):
    """A worker's startup hook raised (or overran its time): the worker did not start.

    ``hook`` names it (``module:qualname``); ``cause`` is what it raised."""

    def __init__(self, hook: str, error: str, *, cause: BaseException | None = None) -> None:
        super().__init__(f"worker startup hook {hook} failed: {error}", cause=cause)
        self.hook = hook


class IllegalTransition(DueflowError):
    """A lifecycle was asked to move where it cannot go from where it is (a bug in
    the caller, never a passing condition): ``machine``, ``state``, ``to``."""

    def __init__(self, machine: str, state: str, to: str, allowed: Iterable[str]) -> None:
        options = ", ".join(sorted(allowed)) or "nothing"
        super().__init__(f"{machine}: cannot go from {state} by {to}; from {state}: {options}")
        self.machine = machine
        self.state = state
        self.to = to
