"""Loading :class:`~dueflow.config.Settings`: defaults, an optional TOML file, the
``DUEFLOW_*`` environment, then overrides (CLI flags), merged and coerced to the
settings' types; every value that does not fit is a :class:`~dueflow.errors.ConfigError`
naming the setting."""

from __future__ import annotations

import dataclasses
import tomllib
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from dueflow.byte_size import parse_byte_size
from dueflow.config.sections import QueueSpec
from dueflow.config.settings import Settings
from dueflow.errors import ConfigError
from dueflow.rules.wheel import DEFAULT_LEVELS, WheelLevel

_ENV_PREFIX = "DUEFLOW_"
_SECTIONS = ("wheel", "emitter", "worker", "observability", "producer")
_SECRET_SETTINGS = frozenset(
    {
        "observability.status_token",
        "observability.status_viewer_token",
        "producer.schema_registry_password",
    }
)


def load_settings(
    *,
    config_file: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Settings:
    """Merge defaults, TOML file, environment and overrides into valid :class:`Settings`.

    ``overrides`` uses the same nested shape as the TOML file; ``None`` values are
    ignored so CLI flags that were not given do not override anything.
    """
    env = {} if env is None else env
    data: dict[str, Any] = {}
    path = config_file or env.get(_ENV_PREFIX + "CONFIG")
    if path:
        data = _merge(data, _read_toml(Path(path)))
    data = _merge(data, _from_env(env))
    if overrides:
        data = _merge(data, _drop_none(overrides))
    return settings_from_dict(data).validate()


def settings_from_dict(data: Mapping[str, Any]) -> Settings:
    """Build :class:`Settings` from a nested mapping (TOML shape), coercing types."""
    data = dict(data)
    if "queues" in data:
        data["queues"] = _queues(data["queues"])
    if "routes" in data:
        data["routes"] = _routes(data["routes"])
    if "wheel" in data:
        wheel = dict(data["wheel"])
        if "levels" in wheel:
            wheel["levels"] = _levels(wheel["levels"])
        if "shard" in wheel:  # a property of each emitter's session, not a setting
            raise ConfigError(
                "wheel.shard", wheel["shard"], "no value: set wheel.shards (how many) instead"
            )
        data["wheel"] = wheel
    if "worker" in data:
        data["worker"] = _worker_sizes(data["worker"])
    built = _build(Settings, data, "")
    assert isinstance(built, Settings)
    return built


def _worker_sizes(worker: Any) -> Any:
    """``worker.max_memory`` and ``max_memory_hard`` in bytes, from ``512MiB`` or an int."""
    if not isinstance(worker, Mapping):
        return worker  # _build names the problem
    out = dict(worker)
    for name in ("max_memory", "max_memory_hard"):
        value = out.get(name)
        if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none")):
            continue
        try:
            out[name] = parse_byte_size(value)
        except ValueError as exc:
            raise ConfigError(f"worker.{name}", value, str(exc)) from exc
    return out


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError as exc:
        raise ConfigError("config", str(path), "the path of an existing TOML file") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("config", str(path), f"valid TOML ({exc})") from exc


def _from_env(env: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    top = (
        {f.name for f in dataclasses.fields(Settings)}
        - set(_SECTIONS)
        - {
            "kafka",
            "queues",
            "routes",
        }
    )
    for key, value in env.items():
        if not key.startswith(_ENV_PREFIX) or key == _ENV_PREFIX + "CONFIG":
            continue
        name = key[len(_ENV_PREFIX) :].lower()
        if name == "queues":
            out["queues"] = _queues_from_text(value)
        elif name == "routes":
            out["routes"] = value
        elif name.startswith("kafka_"):
            out.setdefault("kafka", {})[name[len("kafka_") :].replace("_", ".")] = value
        elif name in top:
            out[name] = value
        else:
            for section in _SECTIONS:
                if name.startswith(section + "_"):
                    out.setdefault(section, {})[name[len(section) + 1 :]] = value
                    break
    return out


def _queues_from_text(text: str) -> list[dict[str, Any]]:
    queues: list[dict[str, Any]] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, partitions = part.partition(":")
        entry: dict[str, Any] = {"name": name.strip()}
        if partitions:
            entry["partitions"] = partitions.strip()
        queues.append(entry)
    return queues


def _queues(value: Any) -> tuple[QueueSpec, ...]:
    if isinstance(value, str):
        value = _queues_from_text(value)
    if not isinstance(value, list | tuple):
        raise ConfigError("queues", value, "a list of queues or 'name[:partitions],...'")
    out = []
    for i, item in enumerate(value):
        if isinstance(item, QueueSpec):
            out.append(item)
        elif isinstance(item, str):
            out.append(QueueSpec(item))
        elif isinstance(item, Mapping):
            q = _build(QueueSpec, item, f"queues[{i}].")
            assert isinstance(q, QueueSpec)
            out.append(q)
        else:
            raise ConfigError(f"queues[{i}]", item, "a table with at least `name`")
    return tuple(out)


def _routes(value: Any) -> tuple[tuple[str, str], ...]:
    """The route table from a TOML table, ``PATTERN=QUEUE,...`` text, or pairs."""
    accepted = "a table of task name or glob = queue, or 'PATTERN=QUEUE,...'"
    if isinstance(value, str):
        pairs = []
        for part in filter(None, (p.strip() for p in value.split(","))):
            pattern, sep, queue = part.rpartition("=")
            if not sep or not pattern.strip():
                raise ConfigError("routes", part, accepted)
            pairs.append((pattern.strip(), queue.strip()))
        return tuple(pairs)
    if isinstance(value, Mapping):
        items = list(value.items())
    elif isinstance(value, list | tuple):
        items = list(value)
    else:
        raise ConfigError("routes", value, accepted)
    out = []
    for item in items:
        if not (isinstance(item, list | tuple) and len(item) == 2):
            raise ConfigError("routes", item, accepted)
        pattern, queue = item
        if not isinstance(pattern, str) or not isinstance(queue, str):
            raise ConfigError(f"routes[{pattern}]", queue, "a queue name (a string)")
        out.append((pattern.strip(), queue.strip()))
    return tuple(out)


def _levels(value: Any) -> tuple[WheelLevel, ...]:
    if isinstance(value, str):
        # "64x1000,64x60000": slots x width_ms
        try:
            pairs = [tuple(int(x) for x in part.split("x")) for part in value.split(",")]
        except ValueError as exc:
            raise ConfigError("wheel.levels", value, "'SLOTSxWIDTH_MS,...'") from exc
        value = [list(p) for p in pairs]
    out = []
    for i, item in enumerate(value):
        if isinstance(item, WheelLevel):
            out.append(item)
        elif isinstance(item, Mapping):
            lv = _build(WheelLevel, item, f"wheel.levels[{i}].")
            assert isinstance(lv, WheelLevel)
            out.append(lv)
        elif isinstance(item, list | tuple) and len(item) == 2:
            out.append(WheelLevel(int(item[0]), int(item[1])))
        else:
            raise ConfigError(f"wheel.levels[{i}]", item, "[slots, width_ms]")
    return tuple(out) or DEFAULT_LEVELS


def _build(cls: type, data: Mapping[str, Any], path: str) -> object:
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key not in names:
            raise ConfigError(f"{path}{key}", value, f"one of the known settings {sorted(names)}")
        kwargs[key] = _coerce(hints[key], value, f"{path}{key}")
    try:
        return cls(**kwargs)
    except TypeError as exc:  # pragma: no cover - a required field is missing
        raise ConfigError(path.rstrip(".") or "settings", dict(data), str(exc)) from exc


def _coerce(tp: Any, value: Any, name: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        empty = value is None or (isinstance(value, str) and value.lower() in ("", "none"))
        if empty and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(inner[0], value, name)
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if isinstance(value, tp):
            return value
        if not isinstance(value, Mapping):
            raise ConfigError(name, value, "a table of settings")
        return _build(tp, value, name + ".")
    if origin is Literal:
        if value not in args:
            raise ConfigError(name, value, " or ".join(repr(a) for a in args))
        return value
    if origin is tuple:
        items = (
            [v.strip() for v in value.split(",") if v.strip()] if isinstance(value, str) else value
        )
        if isinstance(value, tuple) and all(isinstance(v, QueueSpec | WheelLevel) for v in value):
            return value
        return tuple(_coerce(args[0], v, f"{name}[{i}]") for i, v in enumerate(items))
    if origin in (Mapping, dict) or tp is Mapping:
        if not isinstance(value, Mapping):
            # `kafka` holds passwords: name it, never show what was given.
            raise ConfigError(name, value, "a table of key = value strings", secret=True)
        return {str(k): str(v) for k, v in value.items()}
    if tp is bool:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off"):
            return False
        raise ConfigError(name, value, "true or false")
    if tp is int:
        if isinstance(value, bool):
            raise ConfigError(name, value, "an integer")
        try:
            return int(str(value).strip()) if not isinstance(value, int) else value
        except ValueError as exc:
            raise ConfigError(name, value, "an integer") from exc
    if tp is float:
        try:
            return float(value)
        except (TypeError, ValueError) as exc:
            raise ConfigError(name, value, "a number") from exc
    if tp is str:
        if not isinstance(value, str | int | float):
            raise ConfigError(name, value, "a string", secret=name in _SECRET_SETTINGS)
        return str(value)
    return value


def _merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merge(dict(out[key]), value)
        else:
            out[key] = value
    return out


def _drop_none(data: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, Mapping):
            inner = _drop_none(value)
            if inner:
                out[key] = inner
        elif value is not None:
            out[key] = value
    return out
