"""``dueflow deploy kubernetes``: manifests of a deployment, from its settings file.

    dueflow deploy kubernetes --config dueflow.toml --app myapp.tasks \\
        --image registry.example.com/myapp:1.4.0 --out deploy/k8s

Writes a kustomize base (``kubectl apply -k deploy/k8s``): the emitters (a
Deployment of 2+ and a PodDisruptionBudget), one worker Deployment per queue
with a KEDA ScaledObject on its consumer lag (at most as many replicas as the
queue has partitions), the status view with a Service, a PodMonitor and a
ServiceMonitor, and the settings file as a ConfigMap. The worker's drain and
termination grace period follow the longest job timeout of the queue's tasks,
read from ``--app`` (docs/deployment.md). Nothing is sent to any cluster.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from dueflow.apps.ops.kubernetes import KubernetesPlan, render
from dueflow.apps.ops.manifest_yaml import dump_documents
from dueflow.config import Settings, load_settings
from dueflow.errors import InvalidInput
from dueflow.rules.routing import Router


def register(sub: Any) -> None:
    p = sub.add_parser(
        "deploy",
        help="write deployment manifests (Kubernetes) from the settings file",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    kinds = p.add_subparsers(dest="target", metavar="TARGET")
    kinds.required = True
    k = kinds.add_parser("kubernetes", help="a kustomize base: Deployments, KEDA, monitors")
    k.add_argument("--config", required=True, help="the TOML settings file the pods will use")
    k.add_argument(
        "--app",
        action="append",
        required=True,
        help="module(s) with the @task handlers (imported here for their queues and timeouts)",
    )
    k.add_argument("--image", required=True, help="the image with dueflow and the app")
    k.add_argument("--out", help="directory to write (default: print to stdout)")
    k.add_argument("--namespace", default="dueflow")
    k.add_argument("--name", default="dueflow", help="name prefix of every object")
    k.add_argument("--emitters", type=int, default=2, help="emitter replicas (2 or more)")
    k.add_argument("--min-workers", type=int, default=1, help="worker replicas per queue, least")
    k.add_argument(
        "--max-workers",
        type=int,
        help="worker replicas per queue, most (default and ceiling: the queue's partitions)",
    )
    k.add_argument("--lag-threshold", type=int, default=100, help="KEDA: lag per worker replica")
    k.set_defaults(func=_kubernetes)


def longest_job_s(settings: Settings, modules: list[str]) -> dict[str, float]:
    """The longest handler timeout per queue (a task without one: the worker default)."""
    # imported here: the worker's package (about 50 ms) is loaded by this command only
    from dueflow.consumers.registry import TaskRegistry

    registry = TaskRegistry.from_modules(modules)
    router = Router(settings.routes, registry.declared_queues)
    out: dict[str, float] = {}
    for t in registry:
        queue = router.queue_for(t.spec.name)
        timeout = t.spec.timeout_s or settings.worker.default_timeout_s
        out[queue] = max(out.get(queue, 0.0), timeout)
    return out


def _kubernetes(args: argparse.Namespace) -> int:
    path = Path(args.config)
    try:
        text = path.read_text()
    except OSError as exc:
        raise InvalidInput("--config", args.config, f"a readable TOML file ({exc})") from exc
    settings = load_settings(config_file=path, env={})
    modules = [m.strip() for item in args.app for m in item.split(",") if m.strip()]
    plan = KubernetesPlan(
        image=args.image,
        app=tuple(modules),
        config_text=text,
        namespace=args.namespace,
        name=args.name,
        emitters=args.emitters,
        min_workers=args.min_workers,
        max_workers=args.max_workers,
        lag_threshold=args.lag_threshold,
        longest_job_s=longest_job_s(settings, modules),
    )
    files = render(settings, plan)
    if args.out is None:
        print(dump_documents(doc for docs in files.values() for doc in docs), end="")
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, docs in files.items():
        (out / name).write_text(HEADER + dump_documents(docs))
    print(f"wrote {len(files)} files to {out}{os.sep}: kubectl apply -k {out}")
    return 0


HEADER = (
    "# Written by `dueflow deploy kubernetes` (docs/deployment.md); render again, do not edit.\n"
)
