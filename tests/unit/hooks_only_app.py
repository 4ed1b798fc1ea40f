"""An app module with hooks and no task (``--app mypkg.tasks,mypkg.hooks``)."""

from __future__ import annotations

from dueflow.consumers import WorkerInfo, on_startup


@on_startup
def ready(worker: WorkerInfo) -> None:
    pass
