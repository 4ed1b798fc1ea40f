"""``dueflow status``, ``dueflow job ID`` and ``dueflow status-view``.

``status`` and ``job`` ask the status view over HTTP when it runs (``--url``,
default ``observability.status_url`` or ``http://<status_bind>:<status_port>``);
where it does not answer they read Kafka directly: ``status`` shows the
cluster view (lag, DLQ depth, pending timers, active emitter, DLQ tail),
``job`` scans the job's outcomes partition (bounded by ``--scan-limit``) and
says when the answer may be incomplete. ``job`` asks the view as
``Scheduler.status`` does (:class:`~dueflow.producers.view_client.ViewClient`:
the view's token when configured, and a view of another cluster or topic
prefix does not count as an answer).
``job ID --result [--wait 30]`` prints the job's result (its handler's return
value) as JSON once it has succeeded: exit 0; 1 when it has not ended within
``--wait`` seconds (default: no wait) or is not found; 4 when it ended without
a result (dead, cancelled, expired, skipped, or its value was not kept).
What they print: :mod:`dueflow.apps.cli.status_render`.
"""

from __future__ import annotations

import argparse
import json
import ssl
import urllib.error
import urllib.request
from typing import TYPE_CHECKING, Any

from dueflow.apps.cli.common import (
    add_global_options,
    add_listener_options,
    check_cluster,
    configure_logging,
    fail,
    print_json,
    print_text,
    settings_from_args,
)
from dueflow.apps.cli.status_render import (
    UNKNOWN,
    UNKNOWN_JOB,
    overdue,
    render_job,
    render_status,
    status_from_cluster,
    status_from_overview,
    waiting_note,
)
from dueflow.config import Settings
from dueflow.control_chars import escape_text
from dueflow.errors import InvalidInput, JobOutcomeError, ResultTimeout
from dueflow.kafka.clients import cluster_id_of, make_admin
from dueflow.kafka.cluster_view import compute_view
from dueflow.kafka.outcome_scan import scan_for_job
from dueflow.kafka.queue_reader import with_registered_queues
from dueflow.observability import logs
from dueflow.observability.health import Health
from dueflow.observability.metrics import Metrics, serve
from dueflow.rules.job_status import JobStatus
from dueflow.streams.status.cluster_reader import ClusterReader
from dueflow.streams.status.tls import server_context
from dueflow.wall_clock import wall_ms

if TYPE_CHECKING:
    from dueflow.producers.view_client import ViewClient

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
        "--wait",
        type=float,
        metavar="SECONDS",
        help="wait up to SECONDS (at most 60) for the job to end before answering "
        "(status view only)",
    )
    job.add_argument(
        "--scan-limit",
        type=int,
        default=200_000,
        help="Kafka-direct: read at most this many newest records of the job's "
        "outcomes partition (default 200000)",
    )
    job.add_argument(
        "--result",
        action="store_true",
        help="print the job's result (its handler's return value) as JSON: exit 0; 1 not "
        "ended within --wait SECONDS (no limit of 60 here; default: answer at once) or not "
        "found; 4 ended without one (dead, cancelled, expired, skipped, or not kept)",
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
    add_listener_options(view)
    view.add_argument("--port", type=int, help="HTTP port (observability.status_port; 0: any)")
    view.add_argument("--bind", help="HTTP address (observability.status_bind, 127.0.0.1)")
    view.add_argument(
        "--tls-cert",
        metavar="PEM",
        help="serve HTTPS only with this certificate file (observability.status_tls_cert; "
        "with --tls-key)",
    )
    view.add_argument(
        "--tls-key",
        metavar="PEM",
        help="the certificate's unencrypted private key file (observability.status_tls_key)",
    )
    view.add_argument("--data-dir", help="faust data dir (observability.status_data_dir)")
    view.add_argument("--app-id", help="faust app id and consumer group (<prefix>.status)")
    view.set_defaults(func=_status_view)


def _view_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", help="status view URL (default from settings)")
    p.add_argument("--kafka", action="store_true", help="read Kafka directly even if the view runs")
    p.add_argument("--json", action="store_true", help="machine-readable output")


# ------------------------------------------------------------------------ HTTP


def _get(url: str, context: ssl.SSLContext | None = None) -> tuple[int, Any] | None:
    """``(status, json)`` from the status view; ``None`` when it does not answer."""
    try:
        with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_S, context=context) as resp:
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


def _view_context(args: argparse.Namespace, settings: Settings) -> ssl.SSLContext | None:
    """The TLS context for the view of ``settings`` (its own certificate when these
    are its settings: ``ViewClient``); None for ``--url`` (the system's CAs)."""
    # imported here: dueflow.producers loads the whole SDK (about half a second)
    from dueflow.producers.view_client import pinned_view_context

    return None if args.url else pinned_view_context(settings.observability)


# ---------------------------------------------------------------------- status


def _answer_logging(args: argparse.Namespace, settings: Settings) -> None:
    """``status`` and ``job`` answer on stdout; their log says only what went wrong
    (warnings and errors, on stderr) unless ``--log-level`` asks for more."""
    obs = settings.observability
    level = args.log_level or max(obs.log_level.upper(), "WARNING", key=_LEVELS.index)
    logs.configure(obs.log_format, level)


_LEVELS = ["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]


def _status(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    _answer_logging(args, settings)
    doc: dict[str, Any] | None = None
    if not args.kafka:
        got = _get(_base_url(args, settings) + "/api/overview", _view_context(args, settings))
        if got is not None and got[0] == 200:
            doc = status_from_overview(got[1])
    if doc is None:
        doc = _status_from_kafka(settings)
    if args.json:
        print_json(doc)
    else:
        print_text(render_status(doc))
    return 0


def _status_from_kafka(settings: Settings) -> dict[str, Any]:
    settings = with_registered_queues(settings)  # registered queues too
    with ClusterReader(settings) as reader:
        view = compute_view(reader.read(), settings)
    return status_from_cluster(view.to_json(), counts=None, source="kafka")


# ------------------------------------------------------------------------- job


def _job(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    _answer_logging(args, settings)
    if args.wait is not None and not (args.wait >= 0 and (args.result or args.wait <= 60)):
        raise InvalidInput("--wait", args.wait, "seconds from 0 to 60 (with --result: >= 0)")
    if args.result:
        return _job_result(args, settings)
    view_error: str | None = None
    if not args.kafka:
        answered, view_error = _job_from_view(args, settings)
        if answered is not None:
            return answered
    return _job_from_kafka(args, settings, view_error)


def _view_client(args: argparse.Namespace, settings: Settings) -> ViewClient:
    """A client of the status view that ``job`` asks (as ``Scheduler.status`` does)."""
    # imported here: dueflow.producers loads the whole SDK (about half a second)
    from dueflow.producers.view_client import ViewClient

    return ViewClient(
        _base_url(args, settings),
        # --url names the view to ask: its answer counts whatever it reads
        topic_prefix=None if args.url else settings.topic_prefix,
        token=settings.observability.status_token,
        timeout_s=HTTP_TIMEOUT_S,
        cluster_id=lambda: cluster_id_of(make_admin(settings), timeout_s=5.0),
        ssl_context=_view_context(args, settings),
    )


def _job_from_view(args: argparse.Namespace, settings: Settings) -> tuple[int | None, str | None]:
    """``job ID`` as the status view answers it: (exit code, None) once printed, else
    (None, why the view did not answer, when that is worth saying)."""
    # imported here: dueflow.producers loads the whole SDK (about half a second)
    from dueflow.producers.view_client import ViewUnavailable

    job_id = args.job_id
    client = _view_client(args, settings)
    try:
        body = client.job(job_id, wait_ms=int((args.wait or 0) * 1000))
    except ViewUnavailable as exc:
        # Said when a view was named or set up, or answered wrongly; nothing
        # listening at the default address is the usual case without one.
        named = args.url or settings.observability.status_url
        return None, (str(exc) if named or not exc.absent else None)
    finally:
        client.close()
    doc: dict[str, Any] = {"job_id": job_id, "found": body is not None}
    doc["source"] = "status-view"
    now_ms = wall_ms()
    note = None
    if body is not None:
        doc["job"] = body
        if overdue(body, now_ms=now_ms):
            note = waiting_note(
                body,
                now_ms=now_ms,
                emitter_active=_view_emitter(
                    _base_url(args, settings) + "/jobs/", _view_context(args, settings)
                ),
            )
            doc["note"] = note
    else:
        doc["state"] = "unknown"
        doc["error"] = UNKNOWN_JOB
    if args.json:
        print_json(doc)
    elif body is not None:
        print_text(render_job(body, now_ms=now_ms))
        if note:
            print_text(f"note: {note}")
    else:
        print_text(f"job {escape_text(job_id)}: {UNKNOWN} ({UNKNOWN_JOB})")
    return (0 if body is not None else 1), None


def _job_from_kafka(args: argparse.Namespace, settings: Settings, view_error: str | None) -> int:
    """``job ID`` from a bounded scan of the job's outcomes partition."""
    job_id = args.job_id
    scan = scan_for_job(settings, job_id, max_records=args.scan_limit)
    doc = {**scan.to_json(), "source": "kafka", "complete": scan.skipped_older == 0}
    if view_error is not None:
        doc["status_view_error"] = view_error
    now_ms = wall_ms()
    note = None
    if scan.view is not None and overdue(scan.view, now_ms=now_ms):
        note = waiting_note(scan.view, now_ms=now_ms, emitter_active=_kafka_emitter(settings))
        doc["note"] = note
    if args.json:
        print_json(doc)
        return 0 if scan.view is not None else 1
    if view_error is not None:
        print_text(f"the status view did not answer ({view_error}): reading Kafka directly")
    where = (
        f"scanned {scan.scanned} records of {scan.topic}[{scan.partition}] "
        f"(offsets {scan.first_offset}..{scan.end_offset})"
    )
    if scan.skipped_older:
        where += (
            f"; {scan.skipped_older} older records not read (--scan-limit): "
            "the answer may be incomplete"
        )
    if scan.view is None:
        print_text(f"job {escape_text(job_id)}: {UNKNOWN}; {where}")
    else:
        print_text(render_job(scan.view, now_ms=now_ms))
        print_text(where)
        if note:
            print_text(f"note: {note}")
    return 0 if scan.view is not None else 1


def _job_result(args: argparse.Namespace, settings: Settings) -> int:
    """``job ID --result``: the job's result as JSON, once it has ended: the status
    view's long poll (``until=final``), else the bounded scan."""
    # imported here: dueflow.producers loads the whole SDK (about half a second)
    from dueflow.producers.lookup import OutcomeLookup
    from dueflow.producers.result_wait import wait_for_result
    from dueflow.producers.view_client import WAIT_MAX_MS, ViewUnavailable

    job_id = args.job_id
    wait_s = args.wait or 0.0
    scan = OutcomeLookup(settings, scan_limit=args.scan_limit)
    client = None if args.kafka else _view_client(args, settings)

    def lookup(budget: float) -> JobStatus | None:
        nonlocal client
        if client is not None:
            wait_ms = 0 if wait_s == 0 else int(min(budget * 1000, WAIT_MAX_MS))
            try:
                body = client.job(job_id, wait_ms=wait_ms, until="final")
            except ViewUnavailable:
                client.close()
                client = None  # the scan from here on
            else:
                return None if body is None else JobStatus.from_view(body, source="status-view")
        return scan.status(job_id, timeout_s=budget)

    try:
        value = wait_for_result(job_id, lookup, wait_s)
    except ResultTimeout as exc:
        return fail(str(exc), 1)
    except JobOutcomeError as exc:  # dead, cancelled, not run, not kept
        return fail(str(exc), 4)
    finally:
        if client is not None:
            client.close()
    print_json(value)
    return 0


def _view_emitter(job_url: str, context: ssl.SSLContext | None = None) -> bool | None:
    """Whether the status view sees an active emitter (None: it does not say)."""
    got = _get(job_url.rsplit("/jobs/", 1)[0] + "/api/overview", context)
    if got is None or got[0] != 200:
        return None
    cluster = got[1].get("cluster") or {}
    if "active_emitter" not in cluster:
        return None
    return cluster["active_emitter"] is not None


def _kafka_emitter(settings: Settings) -> bool | None:
    with ClusterReader(settings) as reader:
        return reader.emitter_active()


# ----------------------------------------------------------------- status-view


def _status_view(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    from dataclasses import replace

    # imported here: the status view (faust, about 800 ms) and its console's tools (the
    # SDK) load for this command only
    from dueflow.apps.ops.console_actions import ConsoleTools
    from dueflow.streams.status.app import StatusView

    if args.tls_cert or args.tls_key:
        tls = {"status_tls_cert": args.tls_cert, "status_tls_key": args.tls_key}
        given = {k: v for k, v in tls.items() if v}
        settings = replace(
            settings, observability=replace(settings.observability, **given)
        ).validate()
    obs = settings.observability
    server_context(obs)  # the TLS files load, before anything connects or listens

    metrics = Metrics()
    health = Health(liveness_timeout_s=obs.liveness_timeout_s)
    if obs.metrics_port is not None:
        # First: the probes answer (live, not ready) while the cluster is waited for.
        serve(metrics, obs.metrics_port, addr=obs.metrics_bind, health=health)
    check_cluster(settings)  # faust's client retries forever: ask first
    configure_logging(settings)

    if args.bind:
        settings = replace(settings, observability=replace(obs, status_bind=args.bind))
    # The queues registered by now are shown too (one created later: after a restart).
    settings = with_registered_queues(settings)
    view = StatusView(
        settings,
        metrics=metrics,
        health=health,
        port=args.port,
        data_dir=args.data_dir,
        app_id=args.app_id,
        tools=ConsoleTools(),
    )
    view.run(loglevel="info" if obs.log_level.upper() == "DEBUG" else "warning")
    return 0  # pragma: no cover - run() exits the process
