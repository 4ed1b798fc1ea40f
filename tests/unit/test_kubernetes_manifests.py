"""The Kubernetes manifests: rendered, then checked offline against schemas and rules.

deploy/kubernetes/example/ is what ``dueflow deploy kubernetes`` renders from
deploy/kubernetes/example.toml and the example app (``make k8s-example``);
the committed files must equal a fresh render. Every built-in object is
validated, strictly (unknown fields refused), against the Kubernetes JSON
schemas the kubernetes-validate wheel ships, for the oldest and newest
Kubernetes it knows of that KEDA 2.x runs on; the KEDA ScaledObject and
TriggerAuthentication and the Prometheus operator's PodMonitor and
ServiceMonitor against the schemas in deploy/kubernetes/schemas/. Then the
rules a deployment must keep: a queue's maximum worker replicas never above
its partitions, a grace period that outlasts the longest job, 2+ emitters
under a disruption budget, credentials only from Secrets.
"""

from __future__ import annotations

import json
import math
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from dueflow.apps.cli.deploy_cmd import longest_job_s
from dueflow.apps.ops.kubernetes import (
    KubernetesPlan,
    max_workers,
    render,
    worker_shutdown,
)
from dueflow.apps.ops.manifest_yaml import dump, dump_documents
from dueflow.config import Settings, load_settings, settings_from_dict
from dueflow.errors import ConfigError
from dueflow.kafka.topics import names

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "kubernetes"
EXAMPLE = K8S / "example"
EXAMPLE_TOML = K8S / "example.toml"
SCHEMAS = K8S / "schemas"
APP_DIR = ROOT / "deploy" / "example_app"
IMAGE = "registry.example.com/acme/dueflow-example:0.2.0"
# KEDA 2.x supports Kubernetes from 1.30 on; the newest the wheel knows of.
KUBERNETES_VERSIONS = ("1.30.0", kubernetes_validate.latest_version())
CRD_SCHEMAS = {
    ("keda.sh/v1alpha1", "ScaledObject"): "keda.sh_v1alpha1_scaledobject.json",
    ("keda.sh/v1alpha1", "TriggerAuthentication"): "keda.sh_v1alpha1_triggerauthentication.json",
    ("monitoring.coreos.com/v1", "PodMonitor"): "monitoring.coreos.com_v1_podmonitor.json",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "monitoring.coreos.com_v1_servicemonitor.json",
}
# The Kafka scaler's metadata keys (KEDA 2.x docs); a typo is otherwise ignored.
KAFKA_SCALER_KEYS = {
    "bootstrapServers",
    "consumerGroup",
    "topic",
    "lagThreshold",
    "activationLagThreshold",
    "offsetResetPolicy",
    "allowIdleConsumers",
    "excludePersistentLag",
    "scaleToZeroOnInvalidOffset",
    "limitToPartitionsWithLag",
    "ensureEvenDistributionOfPartitions",
    "partitionLimitation",
    "version",
    "sasl",
    "tls",
    "unsafeSsl",
}


@pytest.fixture(scope="module")
def example_app() -> Iterator[list[str]]:
    sys.path.insert(0, str(APP_DIR))
    try:
        yield ["example_tasks"]
    finally:
        sys.path.remove(str(APP_DIR))
        sys.modules.pop("example_tasks", None)


def example_settings() -> Settings:
    return load_settings(config_file=EXAMPLE_TOML, env={})


def example_render(app: list[str]) -> dict[str, list[dict[str, Any]]]:
    settings = example_settings()
    plan = KubernetesPlan(
        image=IMAGE,
        app=tuple(app),
        config_text=EXAMPLE_TOML.read_text(),
        longest_job_s=longest_job_s(settings, app),
    )
    return render(settings, plan)


def committed() -> dict[str, list[dict[str, Any]]]:
    return {
        p.name: [d for d in yaml.safe_load_all(p.read_text()) if d is not None]
        for p in sorted(EXAMPLE.glob("*.yaml"))
    }


def all_docs() -> list[dict[str, Any]]:
    return [d for docs in committed().values() for d in docs]


def of_kind(kind: str) -> list[dict[str, Any]]:
    return [d for d in all_docs() if d["kind"] == kind]


def test_the_committed_example_is_what_the_renderer_writes(example_app: list[str]) -> None:
    fresh = example_render(example_app)
    assert committed() == fresh, "deploy/kubernetes/example/ is stale: run `make k8s-example`"
    for name, docs in fresh.items():  # byte for byte, after the header line
        text = (EXAMPLE / name).read_text().split("\n", 1)[1]
        assert text == dump_documents(docs), name


def test_the_kustomization_lists_every_file() -> None:
    (kustomization,) = committed()["kustomization.yaml"]
    files = {p.name for p in EXAMPLE.glob("*.yaml")} - {"kustomization.yaml"}
    assert sorted(kustomization["resources"]) == sorted(files)
    assert kustomization["namespace"] == "dueflow"


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_built_in_objects_match_the_kubernetes_schemas_strictly(version: str) -> None:
    checked = 0
    for doc in all_docs():
        if (doc["apiVersion"], doc["kind"]) in CRD_SCHEMAS or doc["kind"] == "Kustomization":
            continue
        kubernetes_validate.validate(doc, version, strict=True)
        checked += 1
    assert checked >= 8


def test_custom_resources_match_the_crd_schemas() -> None:
    seen = set()
    for doc in all_docs():
        key = (doc["apiVersion"], doc["kind"])
        if key not in CRD_SCHEMAS:
            continue
        schema = json.loads((SCHEMAS / CRD_SCHEMAS[key]).read_text())
        jsonschema.Draft202012Validator.check_schema(schema)
        jsonschema.Draft202012Validator(schema).validate(doc)
        seen.add(key)
    assert seen == set(CRD_SCHEMAS)


def test_the_crd_schemas_refuse_what_the_api_would_not_take() -> None:
    schema = json.loads((SCHEMAS / CRD_SCHEMAS[("keda.sh/v1alpha1", "ScaledObject")]).read_text())
    (scaled, *_) = of_kind("ScaledObject")
    validator = jsonschema.Draft202012Validator(schema)
    typo = json.loads(json.dumps(scaled))
    typo["spec"]["maxReplicas"] = typo["spec"].pop("maxReplicaCount")
    assert not validator.is_valid(typo)
    no_trigger = json.loads(json.dumps(scaled))
    no_trigger["spec"]["triggers"] = []
    assert not validator.is_valid(no_trigger)
    text_count = json.loads(json.dumps(scaled))
    text_count["spec"]["maxReplicaCount"] = "3"
    assert not validator.is_valid(text_count)


def _settings_in_config_map() -> Settings:
    (config_map,) = of_kind("ConfigMap")
    return settings_from_dict(tomllib.loads(config_map["data"]["dueflow.toml"])).validate()


def test_a_queue_never_gets_more_workers_than_partitions() -> None:
    settings = _settings_in_config_map()
    n = names(settings)
    scaled = {d["spec"]["scaleTargetRef"]["name"]: d for d in of_kind("ScaledObject")}
    assert len(scaled) == len(settings.queues)
    for queue in settings.queues:
        so = scaled[f"dueflow-worker-{queue.name}"]
        spec = so["spec"]
        assert 1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"] <= queue.partitions
        (trigger,) = spec["triggers"]
        assert trigger["type"] == "kafka"
        meta = trigger["metadata"]
        assert set(meta) <= KAFKA_SCALER_KEYS
        assert meta["consumerGroup"] == n.worker_group(queue.name)
        assert meta["topic"] == n.exec(queue.name)
        assert meta["bootstrapServers"] == settings.bootstrap
        assert meta["allowIdleConsumers"] == "false"
        assert trigger["authenticationRef"] == {"name": "dueflow-kafka"}  # SASL_SSL example


@given(partitions=st.integers(1, 512), wanted=st.one_of(st.none(), st.integers(1, 2048)))
def test_max_workers_is_capped_by_partitions(partitions: int, wanted: int | None) -> None:
    top = max_workers(partitions, wanted)
    assert 1 <= top <= partitions
    if wanted is not None and wanted <= partitions:
        assert top == wanted


def test_asking_for_more_workers_than_partitions_is_capped_in_the_render() -> None:
    settings = load_settings(env={}, overrides={"queues": "tiny:2,wide:40"})
    plan = KubernetesPlan(image="x:1", app=("m",), config_text="", max_workers=16)
    files = render(settings, plan)
    tops = {
        d["spec"]["scaleTargetRef"]["name"]: d["spec"]["maxReplicaCount"]
        for docs in files.values()
        for d in docs
        if d["kind"] == "ScaledObject"
    }
    assert tops == {"dueflow-worker-tiny": 2, "dueflow-worker-wide": 16}


def _env(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container["env"]}


def test_worker_grace_outlasts_the_longest_job_and_the_commit(example_app: list[str]) -> None:
    settings = _settings_in_config_map()
    longest = longest_job_s(settings, example_app)
    assert longest == {"default": 5.0, "billing": 30.0, "reports": 600.0}
    workers = [
        d for d in of_kind("Deployment") if d["metadata"]["name"].startswith("dueflow-worker-")
    ]
    assert len(workers) == 3
    ws = settings.worker
    for deployment in workers:
        queue = deployment["metadata"]["labels"]["dueflow.io/queue"]
        pod = deployment["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        assert container["args"] == ["worker", "--app", "example_tasks", "--queues", queue]
        drain = float(_env(container)["DUEFLOW_WORKER_SHUTDOWN_GRACE_S"]["value"])
        assert drain >= longest[queue]  # every running job may finish
        assert drain >= ws.shutdown_grace_s
        commit_s = max(5.0, ws.transaction_timeout_ms / 1000) + 7.0
        assert pod["terminationGracePeriodSeconds"] >= drain + commit_s + ws.hook_timeout_s
        assert "replicas" not in deployment["spec"]  # KEDA owns it
        rolling = deployment["spec"]["strategy"]["rollingUpdate"]
        assert rolling == {"maxSurge": 1, "maxUnavailable": 0}  # new one first
    reports = next(d for d in workers if d["metadata"]["name"] == "dueflow-worker-reports")
    assert reports["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == math.ceil(
        600 + 17 + 60 + 5
    )


@given(longest=st.floats(0, 86_400), grace=st.floats(0, 3_600))
def test_worker_shutdown_rule(longest: float, grace: float) -> None:
    settings = load_settings(env={}, overrides={"worker": {"shutdown_grace_s": grace}})
    got = worker_shutdown(settings, longest)
    assert got.drain_s >= longest
    assert got.drain_s >= grace
    assert got.grace_s > got.drain_s + settings.worker.hook_timeout_s


def test_emitters_two_or_more_under_a_disruption_budget() -> None:
    (emitter,) = [d for d in of_kind("Deployment") if d["metadata"]["name"] == "dueflow-emitter"]
    assert emitter["spec"]["replicas"] >= 2
    (pdb,) = of_kind("PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1
    pod_labels = emitter["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    (container,) = emitter["spec"]["template"]["spec"]["containers"]
    assert container["args"] == ["emitter"]
    with pytest.raises(ConfigError, match="emitters"):
        render(
            example_settings(), KubernetesPlan(image="x", app=("m",), config_text="", emitters=1)
        )


def test_probes_and_monitors_point_at_the_listener() -> None:
    for deployment in of_kind("Deployment"):
        pod = deployment["spec"]["template"]
        (container,) = pod["spec"]["containers"]
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert ports["metrics"] == 9464
        assert container["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "metrics"}
        assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
        assert container["startupProbe"]["httpGet"]["path"] == "/readyz"
        assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
    (service,) = of_kind("Service")
    (status,) = [d for d in of_kind("Deployment") if d["metadata"]["name"] == "dueflow-status-view"]
    status_labels = status["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= status_labels.items()
    (monitor,) = of_kind("ServiceMonitor")
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert {e["port"] for e in monitor["spec"]["endpoints"]} <= {
        p["name"] for p in service["spec"]["ports"]
    }
    (pods,) = of_kind("PodMonitor")
    (expr,) = pods["spec"]["selector"]["matchExpressions"]
    assert sorted(expr["values"]) == ["emitter", "worker"]


def test_credentials_come_only_from_secrets() -> None:
    for deployment in of_kind("Deployment"):
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        for name, entry in _env(container).items():
            if any(word in name for word in ("PASSWORD", "USERNAME", "TOKEN")):
                assert "value" not in entry, name
                assert entry["valueFrom"]["secretKeyRef"]["name"] in (
                    "dueflow-kafka",
                    "dueflow-status",
                )
    (config_map,) = of_kind("ConfigMap")
    assert "password" not in config_map["data"]["dueflow.toml"].lower()
    (auth,) = of_kind("TriggerAuthentication")
    assert {r["parameter"] for r in auth["spec"]["secretTargetRef"]} == {
        "sasl",
        "username",
        "password",
        "tls",
    }


def test_a_settings_file_with_a_password_is_refused() -> None:
    settings = load_settings(
        env={}, overrides={"kafka": {"security.protocol": "SASL_SSL", "sasl.password": "s3cret"}}
    )
    plan = KubernetesPlan(image="x", app=("m",), config_text="")
    with pytest.raises(ConfigError, match=r"kafka\.sasl\.password") as err:
        render(settings, plan)
    assert "s3cret" not in str(err.value)


_TEXT = st.text(st.characters(blacklist_categories=("Cs", "Cc")), max_size=40)


@given(
    st.recursive(
        st.one_of(st.none(), st.booleans(), st.integers(), _TEXT, _TEXT.map(lambda t: t + "\nx\n")),
        lambda inner: st.one_of(
            st.lists(inner, max_size=3), st.dictionaries(_TEXT, inner, max_size=3)
        ),
        max_leaves=12,
    )
)
def test_the_yaml_writer_reads_back_the_same(value: Any) -> None:
    doc = {"value": value}
    assert yaml.safe_load(dump(doc)) == doc


def test_the_command_writes_the_example(
    example_app: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from dueflow.apps.cli.main import main

    out = tmp_path / "k8s"
    argv = ["deploy", "kubernetes", "--config", str(EXAMPLE_TOML), "--app", example_app[0]]
    argv += ["--image", IMAGE]
    assert main([*argv, "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in EXAMPLE.iterdir())
    for path in out.iterdir():
        assert path.read_text() == (EXAMPLE / path.name).read_text(), path.name
    capsys.readouterr()
    assert main(argv) == 0  # to stdout: every document, one stream
    docs = [d for d in yaml.safe_load_all(capsys.readouterr().out) if d]
    assert len(docs) == len(all_docs())
