"""The schema registry option of the scheduling clients: the id of job.avsc (I/O).

With ``producer.schema_registry_url`` set, the clients write job values in the
Confluent wire format (:mod:`dueflow.records.framing`) with the id the registry
gives ``schemas/dueflow/schemas/job.avsc`` under the subject
``<prefix>.timers-value``, as the clients of ``clients/`` do. Registering is
``POST /subjects/{subject}/versions`` with the schema text; a registry that has
the schema answers with its existing id, so registering again is harmless.

The id is asked for once per process and registry, subject and schema
(:class:`JobSchemaIds`), at the first schedule that needs it rather than at
start: a client that only cancels or reads status never calls the registry. A
registry that does not answer within ``producer.schema_registry_timeout_s``
fails that schedule with a :class:`~dueflow.errors.SchemaRegistryError` naming
its URL; the next schedule asks again.
"""

from __future__ import annotations

import base64
import json
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from importlib import resources
from urllib.parse import quote

from dueflow.config import Settings
from dueflow.errors import SchemaRegistryError
from dueflow.records.framing import MAX_SCHEMA_ID

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"


def job_schema_text() -> str:
    """job.avsc as the clients of ``clients/`` register it: the file's text."""
    return (resources.files("dueflow.schemas") / "job.avsc").read_text()


def subject_of(settings: Settings) -> str:
    """The subject job.avsc is registered under: ``<prefix>.timers-value``."""
    return f"{settings.topic_prefix}.timers-value"


def register_schema(
    url: str,
    subject: str,
    schema: str,
    *,
    timeout_s: float,
    user: str | None = None,
    password: str | None = None,
) -> int:
    """The id the registry at ``url`` gives ``schema`` under ``subject`` (registering it
    when new). Raises :class:`SchemaRegistryError` naming ``url``."""
    request = urllib.request.Request(
        f"{url.rstrip('/')}/subjects/{quote(subject, safe='')}/versions",
        data=json.dumps({"schema": schema}).encode(),
        method="POST",
        headers={"Content-Type": CONTENT_TYPE, "Accept": CONTENT_TYPE},
    )
    if user is not None:
        token = base64.b64encode(f"{user}:{password or ''}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            body = response.read()
    except urllib.error.HTTPError as exc:
        detail = exc.read()[:300].decode("utf-8", "replace")
        raise SchemaRegistryError(
            url,
            f"registering job.avsc under {subject!r} answered HTTP {exc.code}: {detail}",
            status=exc.code,
            cause=exc,
        ) from exc
    except (OSError, urllib.error.URLError) as exc:  # refused, not resolved, timed out
        reason = getattr(exc, "reason", exc)
        raise SchemaRegistryError(
            url,
            f"not reached within {timeout_s:g} s ({reason})",
            cause=exc,
        ) from exc
    try:
        schema_id = json.loads(body)["id"]
    except (ValueError, KeyError, TypeError) as exc:
        raise SchemaRegistryError(
            url, f"answer without a schema id: {body[:300]!r}", status=200, cause=exc
        ) from exc
    if type(schema_id) is not int or not 0 <= schema_id <= MAX_SCHEMA_ID:
        raise SchemaRegistryError(
            url, f"schema id: got {schema_id!r}; accepted: 0 to {MAX_SCHEMA_ID}", status=200
        )
    return schema_id


class JobSchemaIds:
    """Ids of job.avsc by (registry URL, subject, schema text), asked for once each."""

    def __init__(self) -> None:
        self._ids: dict[tuple[str, str, str], int] = {}
        self._lock = threading.Lock()

    def get(self, settings: Settings) -> int:
        """The id of job.avsc at ``settings``' registry (asked for the first time only)."""
        producer = settings.producer
        url = producer.schema_registry_url
        if url is None:
            raise ValueError("producer.schema_registry_url is not set")
        schema = job_schema_text()
        key = (url, subject_of(settings), schema)
        found = self._ids.get(key)
        if found is not None:
            return found
        with self._lock:  # one request at a time: concurrent first schedules ask once
            found = self._ids.get(key)
            if found is None:
                found = register_schema(
                    url,
                    key[1],
                    schema,
                    timeout_s=producer.schema_registry_timeout_s,
                    user=producer.schema_registry_user,
                    password=producer.schema_registry_password,
                )
                self._ids[key] = found
            return found


# Shared by every client of the process: the id is registered once per process.
PROCESS_SCHEMA_IDS = JobSchemaIds()


def registry_ids(
    settings: Settings, ids: JobSchemaIds = PROCESS_SCHEMA_IDS
) -> Callable[[], int] | None:
    """What gives a client's planner the id of job.avsc: None without the option."""
    if settings.producer.schema_registry_url is None:
        return None
    return lambda: ids.get(settings)
