"""Kubernetes manifests of one dueflow deployment, derived from its settings (pure).

``dueflow deploy kubernetes`` writes them as a kustomize base (one file per
component and a ``kustomization.yaml``), for ``kubectl apply -k`` and for
overlays of your own. What is derived rather than typed in:

- one worker Deployment per queue, each with a KEDA ``ScaledObject`` on the
  lag of the queue's consumer group on its exec topic, whose
  ``maxReplicaCount`` is at most the queue's partitions (a member beyond them
  would own nothing) -- :func:`max_workers`;
- the workers' drain time and ``terminationGracePeriodSeconds`` from the
  longest job timeout of the queue's tasks: the drain lets every running job
  finish (a job cut short runs again on the next owner), and the grace period
  adds the final commit, leaving the group and the shutdown hooks, so the
  kubelet's SIGKILL never comes first -- :func:`worker_shutdown`;
- the emitter's grace period from its transaction timeout.

Settings reach the pods as the TOML file given (a ConfigMap mounted at
``/etc/dueflow``); SASL credentials only from a Secret (``kafka_secret``:
keys ``username``, ``password``, and for KEDA's Kafka scaler ``sasl`` and
``tls``); the status view's token from another Secret (``status_secret``,
key ``token``). The TOML file may not hold a password: it is refused.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dueflow.config import Settings
from dueflow.errors import ConfigError
from dueflow.kafka.topics import names

CONFIG_DIR = "/etc/dueflow"
CONFIG_FILE = "dueflow.toml"
METRICS_PORT = 9464  # the image's DUEFLOW_OBSERVABILITY_METRICS_PORT
STATUS_PORT = 6066
UID = 10001  # the image's user
PART_OF = "dueflow"
# Seconds beyond the drain: the final commit may wait out its deadline, then the
# consumers leave and close; a little slack for the interpreter's exit.
EXIT_SLACK_S = 5


@dataclass(frozen=True, slots=True)
class KubernetesPlan:
    """What the settings do not say: the image, the app, names and sizes."""

    image: str
    app: tuple[str, ...]
    config_text: str  # the TOML settings file, embedded in the ConfigMap as is
    namespace: str = "dueflow"
    name: str = "dueflow"
    emitters: int = 2
    min_workers: int = 1
    max_workers: int | None = None  # per queue; None: the queue's partitions
    lag_threshold: int = 100  # KEDA: target lag per worker replica
    longest_job_s: Mapping[str, float] = field(default_factory=dict)  # queue -> seconds
    kafka_secret: str = "dueflow-kafka"
    status_secret: str = "dueflow-status"
    image_pull_policy: str = "IfNotPresent"


@dataclass(frozen=True, slots=True)
class WorkerShutdown:
    """How long a worker of a queue drains, and how long Kubernetes waits for it."""

    drain_s: float  # worker.shutdown_grace_s for this queue's pods
    grace_s: int  # terminationGracePeriodSeconds


def max_workers(partitions: int, wanted: int | None) -> int:
    """Worker replicas of a queue at most: ``wanted``, never above the partitions."""
    if wanted is None:
        return partitions
    return max(1, min(wanted, partitions))


def worker_shutdown(settings: Settings, longest_job_s: float) -> WorkerShutdown:
    """The drain covers the longest job; the grace period covers the drain, the final
    commit (its deadline: transaction timeout + 7 s, see the runtime), and the
    shutdown hooks (``worker.hook_timeout_s``)."""
    ws = settings.worker
    drain = max(ws.shutdown_grace_s, longest_job_s)
    commit_s = max(5.0, ws.transaction_timeout_ms / 1000) + 7.0
    grace = math.ceil(drain + commit_s + ws.hook_timeout_s + EXIT_SLACK_S)
    return WorkerShutdown(drain, grace)


def emitter_grace_s(settings: Settings) -> int:
    """The emitter commits its open transactions and leaves the group at SIGTERM."""
    return math.ceil(settings.emitter.transaction_timeout_ms / 1000 + 2 * EXIT_SLACK_S)


def uses_sasl(settings: Settings) -> bool:
    return "SASL" in str(settings.kafka.get("security.protocol", "")).upper()


def check_no_secrets(settings: Settings) -> None:
    """A settings file that goes into a ConfigMap must not carry credentials."""
    for key in settings.kafka:
        if "password" in key or key in ("sasl.username", "ssl.key.pem"):
            raise ConfigError(
                f"kafka.{key}",
                "(hidden)",
                "no credentials in the settings file of a deployment: they come from the "
                "Kafka Secret (keys username and password)",
                secret=True,
            )
    for name in ("status_token", "status_viewer_token"):
        if getattr(settings.observability, name) is not None:
            raise ConfigError(
                f"observability.{name}",
                "(hidden)",
                "unset in the settings file of a deployment: it comes from the status Secret "
                "(or the environment of the status view)",
                secret=True,
            )


def render(settings: Settings, plan: KubernetesPlan) -> dict[str, list[dict[str, Any]]]:
    """File name -> the manifests in it, ``kustomization.yaml`` included."""
    check_no_secrets(settings)
    if plan.emitters < 2:
        raise ConfigError("emitters", plan.emitters, "2 or more (one active, hot standbys)")
    files: dict[str, list[dict[str, Any]]] = {
        "serviceaccount.yaml": [_service_account(plan)],
        "configmap.yaml": [_config_map(plan)],
        "emitter.yaml": [_emitter(settings, plan), _emitter_pdb(plan)],
    }
    for queue in settings.queue_names:
        files[f"worker-{queue}.yaml"] = _worker(settings, plan, queue)
    files["status-view.yaml"] = [_status_view(settings, plan), _status_service(plan)]
    files["monitoring.yaml"] = [_pod_monitor(plan), _service_monitor(plan)]
    if uses_sasl(settings):
        files["keda-auth.yaml"] = [_trigger_auth(plan)]
    files["kustomization.yaml"] = [
        {
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "namespace": plan.namespace,
            "resources": [name for name in files if name != "kustomization.yaml"],
        }
    ]
    return files


# ---------------------------------------------------------------------- pieces


def _labels(plan: KubernetesPlan, component: str, **extra: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": plan.name,
        "app.kubernetes.io/part-of": PART_OF,
        "app.kubernetes.io/component": component,
        **extra,
    }


def _meta(plan: KubernetesPlan, name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"name": name, "namespace": plan.namespace, "labels": labels}


def _config_hash(plan: KubernetesPlan) -> str:
    """Pods roll when the settings change (the ConfigMap keeps its name)."""
    return hashlib.sha256(plan.config_text.encode()).hexdigest()[:16]


def _service_account(plan: KubernetesPlan) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _meta(plan, plan.name, _labels(plan, "serviceaccount")),
        "automountServiceAccountToken": False,
    }


def _config_map(plan: KubernetesPlan) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(plan, f"{plan.name}-settings", _labels(plan, "settings")),
        "data": {CONFIG_FILE: plan.config_text},
    }


def _kafka_env(settings: Settings, plan: KubernetesPlan) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [
        {"name": "DUEFLOW_CONFIG", "value": f"{CONFIG_DIR}/{CONFIG_FILE}"},
    ]
    if uses_sasl(settings):
        for var, key in (
            ("DUEFLOW_KAFKA_SASL_USERNAME", "username"),
            ("DUEFLOW_KAFKA_SASL_PASSWORD", "password"),
        ):
            env.append(
                {
                    "name": var,
                    "valueFrom": {"secretKeyRef": {"name": plan.kafka_secret, "key": key}},
                }
            )
    return env


def _probe(path: str, *, period: int, failures: int, timeout: int = 3) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": "metrics"},
        "periodSeconds": period,
        "timeoutSeconds": timeout,
        "failureThreshold": failures,
    }


def _container(
    settings: Settings,
    plan: KubernetesPlan,
    name: str,
    args: list[str],
    *,
    env: list[dict[str, Any]] | None = None,
    ports: list[dict[str, Any]] | None = None,
    resources: dict[str, Any],
) -> dict[str, Any]:
    # Liveness fails after liveness_timeout_s without a loop turn; the probe adds
    # its own failures on top. Start-up (topic checks, schedules, table recovery)
    # is judged by /readyz, for up to 10 minutes.
    return {
        "name": name,
        "image": plan.image,
        "imagePullPolicy": plan.image_pull_policy,
        "args": args,
        "env": _kafka_env(settings, plan) + (env or []),
        "ports": [
            {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"},
            *(ports or []),
        ],
        "startupProbe": _probe("/readyz", period=5, failures=120),
        "livenessProbe": _probe("/livez", period=10, failures=3),
        "readinessProbe": _probe("/readyz", period=5, failures=2),
        "resources": resources,
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [
            {"name": "settings", "mountPath": CONFIG_DIR, "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "home", "mountPath": "/home/dueflow"},
        ],
    }


def _pod_spec(
    plan: KubernetesPlan, container: dict[str, Any], grace_s: int, labels: dict[str, str]
) -> dict[str, Any]:
    return {
        "serviceAccountName": plan.name,
        "terminationGracePeriodSeconds": grace_s,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": UID,
            "runAsGroup": UID,
            "fsGroup": UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "affinity": {
            "podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 100,
                        "podAffinityTerm": {
                            "topologyKey": "kubernetes.io/hostname",
                            "labelSelector": {"matchLabels": labels},
                        },
                    }
                ]
            }
        },
        "containers": [container],
        "volumes": [
            {"name": "settings", "configMap": {"name": f"{plan.name}-settings"}},
            {"name": "tmp", "emptyDir": {}},
            {"name": "home", "emptyDir": {}},
        ],
    }


def _deployment(
    plan: KubernetesPlan,
    name: str,
    labels: dict[str, str],
    pod_spec: dict[str, Any],
    *,
    replicas: int | None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if replicas is not None:  # workers: KEDA owns the replica count
        spec["replicas"] = replicas
    spec.update(
        {
            "selector": {"matchLabels": labels},
            # A new pod starts, and is ready, before an old one is told to stop.
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
            },
            "template": {
                "metadata": {
                    "labels": labels,
                    "annotations": {"dueflow.io/settings-hash": _config_hash(plan)},
                },
                "spec": pod_spec,
            },
        }
    )
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(plan, name, labels),
        "spec": spec,
    }


def _emitter(settings: Settings, plan: KubernetesPlan) -> dict[str, Any]:
    labels = _labels(plan, "emitter")
    container = _container(
        settings,
        plan,
        "emitter",
        ["emitter"],
        resources={"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
    )
    pod = _pod_spec(plan, container, emitter_grace_s(settings), labels)
    return _deployment(plan, f"{plan.name}-emitter", labels, pod, replicas=plan.emitters)


def _emitter_pdb(plan: KubernetesPlan) -> dict[str, Any]:
    labels = _labels(plan, "emitter")
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _meta(plan, f"{plan.name}-emitter", labels),
        "spec": {"minAvailable": 1, "selector": {"matchLabels": labels}},
    }


def _worker(settings: Settings, plan: KubernetesPlan, queue: str) -> list[dict[str, Any]]:
    spec = settings.queue(queue)
    name = f"{plan.name}-worker-{queue}".lower().replace("_", "-")
    labels = _labels(plan, "worker", **{"dueflow.io/queue": queue})
    longest = plan.longest_job_s.get(queue, settings.worker.default_timeout_s)
    shutdown = worker_shutdown(settings, longest)
    app = ",".join(plan.app)
    container = _container(
        settings,
        plan,
        "worker",
        ["worker", "--app", app, "--queues", queue],
        env=[{"name": "DUEFLOW_WORKER_SHUTDOWN_GRACE_S", "value": f"{shutdown.drain_s:g}"}],
        resources={"requests": {"cpu": "500m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
    )
    pod = _pod_spec(plan, container, shutdown.grace_s, labels)
    deployment = _deployment(plan, name, labels, pod, replicas=None)
    n = names(settings)
    trigger: dict[str, Any] = {
        "type": "kafka",
        "name": "exec-lag",
        "metadata": {
            "bootstrapServers": settings.bootstrap,
            "consumerGroup": n.worker_group(queue),
            # The exec topic only: records in a retry tier wait for their time.
            "topic": n.exec(queue),
            "lagThreshold": str(plan.lag_threshold),
            "offsetResetPolicy": "earliest",
            "allowIdleConsumers": "false",
        },
    }
    if uses_sasl(settings):
        trigger["authenticationRef"] = {"name": f"{plan.name}-kafka"}
    top = max_workers(spec.partitions, plan.max_workers)
    scaled = {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": _meta(plan, name, labels),
        "spec": {
            "scaleTargetRef": {"name": name},
            "pollingInterval": 15,
            "cooldownPeriod": 300,
            "minReplicaCount": min(plan.min_workers, top),
            "maxReplicaCount": top,
            "advanced": {
                "horizontalPodAutoscalerConfig": {
                    "behavior": {
                        # Each change of members is a rebalance: add quickly, remove slowly.
                        "scaleDown": {
                            "stabilizationWindowSeconds": 300,
                            "policies": [{"type": "Pods", "value": 1, "periodSeconds": 120}],
                        }
                    }
                }
            },
            "triggers": [trigger],
        },
    }
    return [deployment, scaled]


def _status_view(settings: Settings, plan: KubernetesPlan) -> dict[str, Any]:
    labels = _labels(plan, "status-view")
    service = f"{plan.name}-status"
    hosts = ",".join(
        [
            service,
            f"{service}.{plan.namespace}",
            f"{service}.{plan.namespace}.svc",
            f"{service}.{plan.namespace}.svc.cluster.local",
        ]
    )
    container = _container(
        settings,
        plan,
        "status-view",
        ["status-view"],
        env=[
            {
                "name": "DUEFLOW_OBSERVABILITY_STATUS_TOKEN",
                "valueFrom": {"secretKeyRef": {"name": plan.status_secret, "key": "token"}},
            },
            {"name": "DUEFLOW_OBSERVABILITY_STATUS_ALLOWED_HOSTS", "value": hosts},
        ],
        ports=[{"name": "http", "containerPort": STATUS_PORT, "protocol": "TCP"}],
        resources={"requests": {"cpu": "250m", "memory": "512Mi"}, "limits": {"memory": "2Gi"}},
    )
    pod = _pod_spec(plan, container, 30, labels)
    return _deployment(plan, f"{plan.name}-status-view", labels, pod, replicas=1)


def _status_service(plan: KubernetesPlan) -> dict[str, Any]:
    labels = _labels(plan, "status-view")
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(plan, f"{plan.name}-status", labels),
        "spec": {
            "selector": labels,
            "ports": [
                {"name": "http", "port": STATUS_PORT, "targetPort": "http", "protocol": "TCP"},
                {"name": "metrics", "port": METRICS_PORT, "targetPort": "metrics"},
            ],
        },
    }


def _pod_monitor(plan: KubernetesPlan) -> dict[str, Any]:
    """Emitters and workers have no Service: Prometheus finds their pods."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": _meta(plan, f"{plan.name}-pods", _labels(plan, "monitoring")),
        "spec": {
            "selector": {
                "matchLabels": {"app.kubernetes.io/name": plan.name},
                "matchExpressions": [
                    {
                        "key": "app.kubernetes.io/component",
                        "operator": "In",
                        "values": ["emitter", "worker"],
                    }
                ],
            },
            "podMetricsEndpoints": [{"port": "metrics", "path": "/metrics", "interval": "15s"}],
        },
    }


def _service_monitor(plan: KubernetesPlan) -> dict[str, Any]:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": _meta(plan, f"{plan.name}-status", _labels(plan, "monitoring")),
        "spec": {
            "selector": {"matchLabels": _labels(plan, "status-view")},
            "endpoints": [{"port": "metrics", "path": "/metrics", "interval": "15s"}],
        },
    }


def _trigger_auth(plan: KubernetesPlan) -> dict[str, Any]:
    """KEDA's Kafka scaler logs in with the same Secret as the pods."""
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "TriggerAuthentication",
        "metadata": _meta(plan, f"{plan.name}-kafka", _labels(plan, "autoscaling")),
        "spec": {
            "secretTargetRef": [
                {"parameter": p, "name": plan.kafka_secret, "key": p}
                for p in ("sasl", "username", "password", "tls")
            ]
        },
    }
