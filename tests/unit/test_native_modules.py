"""The worker's record decoder and encoder run compiled (mypyc, by setup.py) in an
install built with a C compiler, and the compiled build and the Python source
give the same bytes and the same fields."""

from __future__ import annotations

import importlib
import importlib.util
import os
from types import ModuleType
from typing import Any

from hypothesis import given, settings

from dueflow.model import Job
from dueflow.records import codec
from tests.support.avro_values import avro_jobs
from tests.support.native import module_name, native_sources


def _python_source(name: str) -> ModuleType:
    """The module ``dueflow.records.<name>`` run from its ``.py`` file, whatever is built."""
    (source,) = [s for s in native_sources() if s.stem == name]
    spec = importlib.util.spec_from_file_location(f"_python_{name}", source)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.__file__ is not None
    assert module.__file__.endswith(".py")
    return module


DECODER = importlib.import_module("dueflow.records.worker_decoder")
ENCODER = importlib.import_module("dueflow.records.worker_encoder")
PY_DECODER = _python_source("worker_decoder")
PY_ENCODER = _python_source("worker_encoder")


def test_every_listed_module_is_compiled_in_this_install() -> None:
    """Compiled, unless the install was built with ``DUEFLOW_PURE_PYTHON`` set."""
    want = ".py" if os.environ.get("DUEFLOW_PURE_PYTHON") else ".so"
    for source in native_sources():
        module = importlib.import_module(module_name(source))
        assert module.__file__ is not None
        assert module.__file__.endswith(want), (module.__name__, module.__file__)


@given(avro_jobs(max_payload=64))
@settings(max_examples=100)
def test_the_build_and_the_source_decode_a_job_alike(job: Job) -> None:
    data = codec.encode("job", job.to_record())
    assert DECODER.decode_job_fields(data) == PY_DECODER.decode_job_fields(data)
    assert DECODER.decode_job(data) == PY_DECODER.decode_job(data) == job


@given(avro_jobs(max_payload=64))
@settings(max_examples=100)
def test_the_build_and_the_source_encode_a_success_alike(job: Job) -> None:
    args: tuple[Any, ...] = (
        job.job_id,
        job.idempotency_key,
        job.queue,
        job.task,
        job.max_attempts,
        job.created_ms,
        job.due_ms,
        12.5,
        "worker-1",
        "0af7651916cd43dd8448eb211c80319c",
        job.schedule_id,
    )
    assert ENCODER.encode_success(*args) == PY_ENCODER.encode_success(*args)
