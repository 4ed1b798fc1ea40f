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


class DuplicateJob(DueflowError):
    """A job scheduled with ``unique_key=`` and ``on_duplicate="refuse"`` while the key
    is held by another job (``first_job_id``): nothing was scheduled."""

    def __init__(self, unique_key: str, first_job_id: str, job_id: str) -> None:
        super().__init__(
            f"unique key {unique_key!r} is held by job {first_job_id!r}: "
            f"job {job_id!r} was not scheduled (on_duplicate='refuse')"
        )
        self.unique_key = unique_key
        self.first_job_id = first_job_id
        self.job_id = job_id


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


class SchemaRegistryError(DueflowError):
    """The schema registry (``producer.schema_registry_url``) could not register
    job.avsc: not reached, not in time, or it said no (``status``, None when it did
    not answer). Retriable unless it answered with a 4xx (auth, incompatible)."""

    def __init__(
        self,
        url: str,
        reason: str,
        *,
        status: int | None = None,
        cause: BaseException | None = None,
    ) -> None:
        super().__init__(
            f"schema registry at {url} (producer.schema_registry_url): {reason}", cause=cause
        )
        self.url = url
        self.status = status
        self.retriable = status is None or status >= 500


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


class FieldOutOfRange(UndecodableRecord):
    """A header or field read from the wire decodes but holds a value outside its
    accepted range (docs/wire-format.md#accepted-ranges): ``field``, ``value``
    (as read, shortened) and ``accepted`` name it. A kind of
    :class:`UndecodableRecord`: whoever sets an undecodable record aside sets
    this one aside too."""

    def __init__(self, field: str, value: object, accepted: str) -> None:
        shown = value[:60] if isinstance(value, str | bytes) else value
        if isinstance(shown, int) and shown.bit_length() > 100:
            shown = f"an integer of {shown.bit_length()} bits"  # keep messages short
        super().__init__(f"{field}: {shown!r} is out of range; accepted: {accepted}")
        self.field = field
        self.value = value
        self.accepted = accepted


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


class JobOutcomeError(DueflowError):
    """``Scheduler.result`` could not return a result: the job ended otherwise, or
    did not end in time. ``job_id``; ``state``: the job's state as last seen."""

    def __init__(self, job_id: str, state: str, message: str) -> None:
        super().__init__(message)
        self.job_id = job_id
        self.state = state


class JobFailed(JobOutcomeError):
    """The job is dead (its attempts failed, or it failed permanently): ``error_type``,
    ``error`` (the last failure) and ``attempts``; ``dueflow dlq show`` has the rest."""

    def __init__(
        self, job_id: str, *, error_type: str | None, error: str | None, attempts: int
    ) -> None:
        what = ": ".join(part for part in (error_type, error) if part) or "no error recorded"
        super().__init__(
            job_id, "dead", f"job {job_id!r} is dead after {attempts} attempt(s): {what}"
        )
        self.error_type = error_type
        self.error = error
        self.attempts = attempts


class JobCancelled(JobOutcomeError):
    """The job was cancelled: it has no result."""

    def __init__(self, job_id: str) -> None:
        super().__init__(job_id, "cancelled", f"job {job_id!r} was cancelled: it has no result")


class JobNotRun(JobOutcomeError):
    """The job ended without running: ``expired`` (not started by its deadline) or
    ``skipped`` (a cron occurrence its schedule's overlap policy skipped)."""

    def __init__(self, job_id: str, state: str) -> None:
        why = {
            "expired": "it was not started by its deadline",
            "skipped": "its schedule's overlap policy skipped it",
        }.get(state, "it ended without running")
        super().__init__(job_id, state, f"job {job_id!r} did not run ({state}): {why}")


class ResultNotKept(JobOutcomeError):
    """The job succeeded, but its handler's return value was not kept (not JSON, or
    over ``worker.result_max_bytes``): ``error`` says why."""

    def __init__(self, job_id: str, error: str) -> None:
        super().__init__(job_id, "succeeded", f"job {job_id!r} succeeded; its result: {error}")
        self.error = error


class ResultTimeout(JobOutcomeError):
    """The job did not finish within the time given (``state``: where it is; ``unknown``:
    no outcome of it was found). Asking again may help."""

    retriable = True

    def __init__(self, job_id: str, state: str, timeout_s: float, *, hint: str = "") -> None:
        where = "no outcome of it was found" if state == "unknown" else f"it is {state}"
        super().__init__(
            job_id,
            state,
            f"job {job_id!r} did not finish within {timeout_s:g} s ({where}){hint}",
        )
        self.timeout_s = timeout_s
