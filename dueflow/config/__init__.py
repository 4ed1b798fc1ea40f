"""One settings object for every dueflow process.

Sources, later ones win: defaults, an optional TOML file (``--config`` or
``DUEFLOW_CONFIG``), environment variables (``DUEFLOW_*``), then CLI flags
(passed in as ``overrides``). Every validation error names the setting, the
value and what is accepted.

Environment variables:

- ``DUEFLOW_BOOTSTRAP``, ``DUEFLOW_TOPIC_PREFIX``, ``DUEFLOW_REPLICATION_FACTOR``,
  ``DUEFLOW_MIN_INSYNC_REPLICAS``, ... : top-level settings by upper-case name.
- ``DUEFLOW_QUEUES=billing:12,default``: queue names with optional partition count
  (static queues: a bootstrap beside the queue registry, see docs/queues.md).
- ``DUEFLOW_ROUTES=report=reports,billing.*=billing``: the route table (task name or
  glob -> queue), ``[routes]`` in the TOML file.
- ``DUEFLOW_APP=myapp.tasks``: modules whose ``@task`` declarations route jobs.
- ``DUEFLOW_<SECTION>_<FIELD>`` for the sections ``wheel``, ``emitter``, ``worker``,
  ``observability`` and ``producer`` (e.g. ``DUEFLOW_EMITTER_SESSION_TIMEOUT_MS=3000``).
- ``DUEFLOW_KAFKA_<KEY>``: passed to librdkafka with ``_`` turned into ``.``
  (e.g. ``DUEFLOW_KAFKA_SECURITY_PROTOCOL=SASL_SSL``): security settings.

Modules: :mod:`.sections` (the sections' dataclasses), :mod:`.settings`
(:class:`Settings`), :mod:`.validation` (its checks), :mod:`.loading` (the
sources merged and coerced).
"""

from __future__ import annotations

from dueflow.config.loading import load_settings, settings_from_dict
from dueflow.config.sections import (
    EMITTER_MAX_PRODUCERS,
    EmitterSettings,
    ObservabilitySettings,
    ProducerSettings,
    QueueSpec,
    WorkerSettings,
)
from dueflow.config.settings import Settings
from dueflow.config.validation import (
    RESULT_MAX_BYTES_LIMIT,
    STATUS_TOKEN_MIN,
    validate_queue,
)

__all__ = [
    "EMITTER_MAX_PRODUCERS",
    "RESULT_MAX_BYTES_LIMIT",
    "STATUS_TOKEN_MIN",
    "EmitterSettings",
    "ObservabilitySettings",
    "ProducerSettings",
    "QueueSpec",
    "Settings",
    "WorkerSettings",
    "load_settings",
    "settings_from_dict",
    "validate_queue",
]
