"""pytest fixtures for testing ``@task`` handlers in memory (opt in, no entry point).

Enable it in your top-level ``conftest.py``::

    pytest_plugins = ["dueflow.testing.pytest_plugin"]

(or ``pytest -p dueflow.testing.pytest_plugin``). Fixtures:

- ``dueflow_pipeline``: an :class:`~dueflow.testing.InMemoryPipeline` on a fake
  clock, with the tasks of ``dueflow_tasks`` and the settings of
  ``dueflow_settings``; closed after the test.
- ``dueflow_eager``: the same with ``eager=True`` (every ``schedule`` runs its job
  and retries before it returns).
- ``dueflow_tasks``: ``[]``; override it to give the pipeline your handlers (or
  module names), or call ``dueflow_pipeline.register(...)`` in the test.
- ``dueflow_settings``: ``None`` (the queues the tasks name); override it for your
  queues, retry tiers and worker defaults.

Nothing is imported until a fixture is used, and no plugin is installed for
projects that do not ask: dueflow is a runtime dependency, its test helpers
should not reach into every test suite of an environment it is installed in.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from dueflow.config import Settings
    from dueflow.testing import InMemoryPipeline


@pytest.fixture
def dueflow_tasks() -> list[Any]:
    """The handlers (``@task`` functions or module names) the pipelines get."""
    return []


@pytest.fixture
def dueflow_settings() -> Settings | None:
    """The pipelines' settings (``None``: the queues the tasks name, defaults)."""
    return None


@pytest.fixture
def dueflow_pipeline(
    dueflow_tasks: list[Any], dueflow_settings: Settings | None
) -> Iterator[InMemoryPipeline]:
    """dueflow in memory on a fake clock: ``.scheduler``, ``.clock``, ``advance``,
    ``run_due``, ``run_until_idle``, and what ran (``runs``, ``job``, ...)."""
    # imported here: the in-memory pipeline (over a second) loads only when it is used
    from dueflow.testing import InMemoryPipeline

    with InMemoryPipeline(dueflow_tasks, settings=dueflow_settings) as pipeline:
        yield pipeline


@pytest.fixture
def dueflow_eager(
    dueflow_tasks: list[Any], dueflow_settings: Settings | None
) -> Iterator[InMemoryPipeline]:
    """Like ``dueflow_pipeline``, eager: ``schedule`` runs the job (and its retries)
    before it returns, whatever the due times."""
    from dueflow.testing import InMemoryPipeline  # as in dueflow_pipeline

    with InMemoryPipeline(dueflow_tasks, settings=dueflow_settings, eager=True) as pipeline:
        yield pipeline
