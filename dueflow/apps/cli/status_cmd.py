"""``dueflow status``, ``dueflow job ID`` and ``dueflow status-view``.

``status`` and ``job`` ask the status view over HTTP when it runs (``--url``,
default ``observability.status_url`` or ``http://<status_bind>:<status_port>``);
where it does not answer they read Kafka directly: ``status`` shows the
cluster view (lag, DLQ depth, pending timers, active emitter, DLQ tail),
``job`` scans the job's outcomes partition (bounded by ``--scan-limit``).
"""

from __future__ import annotations

import argparse
import json
import urllib.error
import urllib.parse
import urllib.request
from datetime import UTC, datetime
from typing import Any

from dueflow.apps.cli.common import (
    add_global_options,
    check_cluster,
    configure_logging,
    format_table,
    print_json,
    settings_from_args,
)
from dueflow.config import Settings
from dueflow.kafka.queue_reader import with_registered_queues
from dueflow.rules.job_status import PENDING_STATES
from dueflow.wall_clock import wall_ms

HTTP_TIMEOUT_S = 3.0


def register(sub: Any) -> None:
    st = sub.add_parser("status", help="queues, lag, DLQ depth, pending timers, active emitter")
    add_global_options(st)
    _view_options(st)
    st.set_defaults(func=_status)

    job = sub.add_parser("job", help="where is job ID: state, attempts, times, last error")
    add_global_options(job)
    job.add_argument("job_id", metavar="ID", help="the job id")
    _view_options(job)
    job.add_argument(
        "--scan-limit",
        type=int,
        default=200_000,
        help="Kafka-direct: read at most this many newest records of the job's "
        "outcomes partition (default 200000)",
    )
    job.set_defaults(func=_job)

    view = sub.add_parser(
        "status-view",
        help="run the status view (faust app + HTTP + page)",
        description="Run the status view. State-changing calls (the redrive button) need "
        "its token: observability.status_token (DUEFLOW_OBSERVABILITY_STATUS_TOKEN), or one "
        "made at start and printed once in the page URL. Binding beyond loopback needs a "
        "configured token.",
    )
    add_global_options(view, service=True)
    view.add_argument("--port", type=int, help="HTTP port (observability.status_port; 0: any)")
    view.add_argument("--bind", help="HTTP address (observability.status_bind, 127.0.0.1)")
    view.add_argument("--data-dir", help="faust data dir (observability.status_data_dir)")
    view.add_argument("--app-id", help="faust app id and consumer group (<prefix>.status)")
    view.set_defaults(func=_status_view)


def _view_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", help="status view URL (default from settings)")
    p.add_argument("--kafka", action="store_true", help="read Kafka directly even if the view runs")
    p.add_argument("--json", action="store_true", help="machine-readable output")


# ------------------------------------------------------------------------ HTTP


def _get(url: str) -> tuple[int, Any] | None:
    """``(status, json)`` from the status view; ``None`` when it does not answer."""
    try:
        with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_S) as resp:
            return int(resp.status), json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        try:
            return int(exc.code), json.loads(exc.read())
        except ValueError:
            return int(exc.code), {"error": str(exc)}
    except (urllib.error.URLError, OSError, ValueError):
        return None


def _base_url(args: argparse.Namespace, settings: Settings) -> str:
    return str(args.url or settings.observability.status_base_url).rstrip("/")


# ---------------------------------------------------------------------- status


def _status(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    configure_logging(settings)
    doc: dict[str, Any] | None = None
    if not args.kafka:
        got = _get(_base_url(args, settings) + "/api/overview")
        if got is not None and got[0] == 200:
            doc = status_from_overview(got[1])
    if doc is None:
        doc = _status_from_kafka(settings)
    if args.json:
        print_json(doc)
    else:
        print(render_status(doc))
    return 0


def _status_from_kafka(settings: Settings) -> dict[str, Any]:
    from dueflow.kafka.cluster_view import compute_view
    from dueflow.streams.status.cluster_reader import ClusterReader

    settings = with_registered_queues(settings)  # registered queues too
    with ClusterReader(settings) as reader:
        view = compute_view(reader.read(), settings)
    return status_from_cluster(view.to_json(), counts=None, source="kafka")


def status_from_overview(overview: dict[str, Any]) -> dict[str, Any]:
    counts = {q: v.get("counts", {}) for q, v in overview.get("queues", {}).items()}
    cluster = overview.get("cluster") or {}
    doc = status_from_cluster(cluster, counts=counts, source="status-view")
    doc["recent_failures"] = overview.get("recent_failures", [])
    return doc


def status_from_cluster(
    cluster: dict[str, Any], *, counts: dict[str, dict[str, int]] | None, source: str
) -> dict[str, Any]:
    """One document for both sources (the shape of ``status --json``)."""
    queues: dict[str, Any] = {}
    names = set(cluster.get("lag_by_queue", {})) | set(counts or {})
    for q in sorted(names):
        queues[q] = {
            "counts": None if counts is None else counts.get(q, {}),
            "lag": cluster.get("lag_by_queue", {}).get(q),
            "dlq_depth": cluster.get("dlq_depth", {}).get(q),
            "paused": cluster.get("paused", {}).get(q),
        }
    return {
        "source": source,
        "queues": queues,
        "timers_pending": cluster.get("timers_pending", {}),
        "active_emitter": cluster.get("active_emitter"),
        "emitter_members": cluster.get("emitter_members"),
        "emitter_shards": cluster.get("emitter_shards", {}),
        "dlq_tail": cluster.get("failures", []),
        "recent_failures": [],
        "errors": cluster.get("errors", []),
    }


def render_status(doc: dict[str, Any]) -> str:
    """The human form of ``status``."""
    lines = [f"source: {doc['source']}"]
    states = ["scheduled", "fired", "started", "retrying", "succeeded", "dead", "cancelled"]
    rows = []
    for q, info in doc["queues"].items():
        counts = info["counts"]
        cells = ["-" if counts is None else counts.get(s, 0) for s in states]
        paused = info.get("paused")
        state = f"paused by {paused.get('by') or '?'}" if paused else "running"
        rows.append([q, *cells, _dash(info["lag"]), _dash(info["dlq_depth"]), state])
    lines += ["", format_table(["queue", *states, "lag", "dlq", "workers"], rows)]
    if doc["source"] == "kafka":
        lines.append("(counts by state need the status view: `dueflow status-view`)")
    timers = doc["timers_pending"]
    if timers:
        lines += ["", "pending timers: " + ", ".join(f"{k}={v}" for k, v in timers.items())]
    holder = doc["active_emitter"]
    if holder:
        lines.append(
            f"active emitter: {holder['client_id']} {holder['host']} "
            f"({doc['emitter_members']} member(s) in the group)"
        )
    else:
        lines.append("active emitter: NONE")
    shards = doc.get("emitter_shards") or {}
    if len(shards) > 1:
        lines.append(
            "emitter shards: "
            + ", ".join(
                f"{k}={v or 'NONE'}" for k, v in sorted(shards.items(), key=lambda kv: int(kv[0]))
            )
        )
    if doc["dlq_tail"]:
        lines += ["", "newest dead letters:"]
        lines.append(
            format_table(
                ["queue", "job", "task", "reason", "error", "attempts", "dead at"],
                [
                    [
                        f["queue"],
                        f["job_id"],
                        f["task"],
                        f["reason"],
                        _short(f"{f['error_type']}: {f['error_message']}"),
                        f["attempts"],
                        _when(f["dead_ms"]),
                    ]
                    for f in doc["dlq_tail"][:10]
                ],
            )
        )
    for err in doc["errors"]:
        lines.append(f"warning: {err}")
    return "\n".join(lines)


# ------------------------------------------------------------------------- job


def _job(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    configure_logging(settings)
    job_id = args.job_id
    if not args.kafka:
        url = _base_url(args, settings) + "/jobs/" + urllib.parse.quote(job_id, safe="")
        got = _get(url)
        if got is not None and got[0] in (200, 404):
            status, body = got
            found = status == 200
            doc = {"job_id": job_id, "found": found, "source": "status-view"}
            if found:
                doc["job"] = body
            else:
                doc.update(state="unknown", error=body.get("error"))
            if args.json:
                print_json(doc)
            elif found:
                print(render_job(body, now_ms=wall_ms()))
            else:
                print(f"job {job_id}: {UNKNOWN} ({body.get('error')})")
            return 0 if found else 1
    from dueflow.streams.status.outcome_scan import scan_for_job

    scan = scan_for_job(settings, job_id, max_records=args.scan_limit)
    doc = {**scan.to_json(), "source": "kafka"}
    if args.json:
        print_json(doc)
    else:
        where = (
            f"scanned {scan.scanned} records of {scan.topic}[{scan.partition}] "
            f"(offsets {scan.first_offset}..{scan.end_offset})"
        )
        if scan.skipped_older:
            where += f"; {scan.skipped_older} older records not read (--scan-limit)"
        if scan.view is None:
            print(f"job {job_id}: {UNKNOWN}; {where}")
        else:
            print(render_job(scan.view, now_ms=wall_ms()))
            print(where)
    return 0 if scan.view is not None else 1


# No outcome of the job: a client writes `scheduled` for every job it schedules
# unless scheduled_outcomes=False, so a job without one is most likely not there.
UNKNOWN = (
    "unknown: no outcome found (no such job; or scheduled by a client with "
    "scheduled_outcomes=False and not run yet)"
)


def render_job(view: dict[str, Any], *, now_ms: int | None = None) -> str:
    """The human form of ``job`` (``now_ms``: say how far the due time is)."""
    err = view.get("last_error")
    state = str(view["state"])
    due_ms = view.get("due_ms")
    due = _when(due_ms)
    if state in PENDING_STATES:
        state += " (pending: not started)"
        if due_ms is not None and now_ms is not None:
            ahead = int(due_ms) - now_ms
            due += f" (in {_span(ahead)})" if ahead >= 0 else f" ({_span(-ahead)} ago)"
    history = view.get("history") or []
    last = "-"
    if history and len(history[-1]) >= 3:
        what, attempt, at = history[-1][:3]
        last = f"{what} (attempt {attempt}) at {_when(at)}"
    rows = [
        ("job", view["job_id"]),
        ("queue / task", f"{view['queue']} / {view['task']}"),
        ("state", state),
        ("attempts", view["attempts"]),
        ("due", due),
        ("last outcome", last),
        ("first seen", _when(view.get("first_seen_ms"))),
        ("fired", _when(view.get("fired_ms"))),
        ("started", _when(view.get("started_ms"))),
        ("finished", _when(view.get("finished_ms"))),
        ("last update", _when(view.get("updated_ms"))),
        ("duration", "-" if view.get("duration_ms") is None else f"{view['duration_ms']:.1f} ms"),
        ("last error", "-" if not err else f"{err.get('type')}: {err.get('message')}"),
        ("trace id", view.get("trace_id") or "-"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)


# ----------------------------------------------------------------- status-view


def _status_view(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    check_cluster(settings)  # faust's client retries forever: ask first
    obs = settings.observability
    configure_logging(settings)
    from dueflow.observability.metrics import Metrics
    from dueflow.streams.status.app import StatusView

    if args.bind:
        from dataclasses import replace

        settings = replace(settings, observability=replace(obs, status_bind=args.bind))
    # The queues registered by now are shown too (one created later: after a restart).
    settings = with_registered_queues(settings)
    view = StatusView(
        settings,
        metrics=Metrics(),
        port=args.port,
        data_dir=args.data_dir,
        app_id=args.app_id,
    )
    view.run(loglevel="info" if obs.log_level.upper() == "DEBUG" else "warning")
    return 0  # pragma: no cover - run() exits the process


# --------------------------------------------------------------------- helpers


def _when(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def _span(ms: int) -> str:
    """``1d 2h``, ``3m 5s``, ``800ms``: the two largest units of a duration."""
    if ms < 1000:
        return f"{ms}ms"
    parts: list[str] = []
    rest = ms // 1000
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1)):
        if rest >= size or parts:
            parts.append(f"{rest // size}{unit}")
            rest %= size
    return " ".join(p for p in parts[:2])


def _dash(v: object) -> object:
    return "-" if v is None else v


def _short(text: str, n: int = 60) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"
