"""Schedule jobs and steer them (cancel, reschedule, update) with the SDK of one release.

Run as a script by that release's interpreter (``python tests/upgrade/steer.py
--plan PLAN --out OUT --sdk NAME``), so a release's own SDK decides how a
cancel or a move is written: the records of the release before (idempotency
``cancelled``, a second timer and a reschedule record) on a queue that was not
finalized, a command to the partition's owner on one that was. Only what the
SDK of every release has is used, and ``wait=`` (a command's verdict) only when
the plan asks for it.

``PLAN`` is a JSON list of operations, done in order; each writes one JSON line
per job to ``OUT`` (flushed at once) once the SDK returned:

- ``{"op": "schedule", "group": G, "n": N, "delay_ms": D, "kind": K}``: N jobs
  of kind K due D ms out (10 ms apart), payload tag ``original``:
  ``{"type": "job", "group", "job_id", "due_ms", "kind", "sdk", "at_ms"}``;
- ``{"op": "cancel", "group": G, "wait": S?}``;
- ``{"op": "reschedule", "group": G, "due_ms": T, "wait": S?}``, or ``"in_ms": D``
  instead of ``due_ms``: due D ms after the operation starts;
- ``{"op": "update", "group": G, "tag": TAG, "wait": S?}``: the payload
  becomes ``{"kind": "ok", "work_ms": 20, "tag": TAG}``:
  every job of group G (scheduled by this run or an earlier one into ``OUT``):
  ``{"type": OP, "job_id", "at_ms", "sdk", "result": {...}}`` (the SDK's answer;
  ``at_ms``: when it returned, after the broker acknowledged what it wrote), or
  ``"error"`` instead of ``"result"`` when the SDK refused.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import UTC, datetime
from typing import IO, Any

TASK = "upgrade-job"
QUEUE = "jobs"


def _emit(out: IO[str], doc: dict[str, Any]) -> None:
    out.write(json.dumps(doc) + "\n")
    out.flush()


def _answer(result: Any) -> dict[str, Any]:
    if hasattr(result, "_asdict"):
        plain = (int, float, str, bool, type(None))
        return {k: v if isinstance(v, plain) else repr(v) for k, v in result._asdict().items()}
    return {"repr": repr(result)}


def _steer(s: Any, op: dict[str, Any], job_id: str, started_ms: int) -> Any:
    extra = {"wait": op["wait"]} if "wait" in op else {}
    if op["op"] == "cancel":
        return s.cancel(job_id, queue=QUEUE, **extra)
    if op["op"] == "reschedule":
        due_ms = op["due_ms"] if "due_ms" in op else started_ms + op["in_ms"]
        run_at = datetime.fromtimestamp(due_ms / 1000, UTC)
        return s.reschedule(job_id, run_at=run_at, queue=QUEUE, **extra)
    if op["op"] == "update":
        payload = {"kind": "ok", "work_ms": 20, "tag": op["tag"]}
        return s.update(job_id, payload=payload, queue=QUEUE, **extra)
    raise ValueError(f"op: got {op['op']!r}; accepted: schedule, cancel, reschedule, update")


def _group(path: str, name: str) -> list[str]:
    with open(path) as fh:
        docs = [json.loads(line) for line in fh if line.endswith("}\n")]
    return [d["job_id"] for d in docs if d["type"] == "job" and d["group"] == name]


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--plan", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--sdk", required=True, help="the release's name, written with each line")
    args = p.parse_args(argv)

    from dueflow.config import load_settings
    from dueflow.errors import DueflowError
    from dueflow.producers import Scheduler

    with open(args.plan) as fh:
        plan = json.load(fh)
    settings = load_settings(env=os.environ)
    with open(args.out, "a") as out, Scheduler(settings) as s:
        for op in plan:
            if op["op"] == "schedule":
                for n in range(op["n"]):
                    job = s.schedule(
                        TASK,
                        {"kind": op["kind"], "work_ms": 20, "tag": "original"},
                        queue=QUEUE,
                        delay=(op["delay_ms"] + 10 * n) / 1000,
                    )
                    _emit(
                        out,
                        {
                            "type": "job",
                            "group": op["group"],
                            "job_id": job.job_id,
                            "due_ms": job.due_ms,
                            "kind": op["kind"],
                            "sdk": args.sdk,
                            "at_ms": time.time_ns() // 1_000_000,
                        },
                    )
                continue
            started_ms = time.time_ns() // 1_000_000
            for job_id in _group(args.out, op["group"]):
                doc: dict[str, Any] = {"type": op["op"], "job_id": job_id, "sdk": args.sdk}
                try:
                    doc["result"] = _answer(_steer(s, op, job_id, started_ms))
                except DueflowError as exc:
                    doc["error"] = str(exc)
                doc["at_ms"] = time.time_ns() // 1_000_000
                _emit(out, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
