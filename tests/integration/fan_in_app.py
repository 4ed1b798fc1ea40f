"""The handlers of the fan-in failover test (run by ``dueflow worker`` subprocesses):
members in two queues, and the group's callback, which writes what it received to the
SQLite ledger named by ``FAN_IN_LEDGER``. No test imports here: a worker process loads
this module."""

from __future__ import annotations

import json
import os
import sqlite3
import time
from pathlib import Path
from typing import Any

from dueflow.consumers import TaskContext, task
from dueflow.errors import PermanentJobError

PHOTOS = "photos"
DOCS = "docs"


def ledger(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(path, timeout=30, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("CREATE TABLE IF NOT EXISTS callbacks (job TEXT, states TEXT, at REAL, pid INTEGER)")
    return db


def _member(payload: Any) -> None:
    time.sleep(payload.get("sleep_ms", 0) / 1000)  # a kill -9 lands inside some runs
    if payload.get("fail"):
        raise PermanentJobError("this member fails for good")


@task("photo", queue=PHOTOS)
def photo(payload: Any, ctx: TaskContext) -> None:
    _member(payload)


@task("doc", queue=DOCS)
def doc(payload: Any, ctx: TaskContext) -> None:
    _member(payload)


@task("album-done", queue=PHOTOS)
def album_done(payload: Any, ctx: TaskContext) -> None:
    group = ctx.group
    assert group is not None
    with ledger(Path(os.environ["FAN_IN_LEDGER"])) as db:
        db.execute(
            "INSERT INTO callbacks VALUES (?, ?, ?, ?)",
            (ctx.job_id, json.dumps(group.states()), time.time(), os.getpid()),
        )
