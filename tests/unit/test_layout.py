"""The source layout: one path per module, and the layers' import rules.

dueflow is one namespace from several source roots: the core in ``dueflow/``,
each component folder a root of its own (``consumers/dueflow/consumers/`` ...),
the published Avro schemas a data package (``schemas/dueflow/schemas/``). These
tests read the tree and every import statement (nothing is imported), so a
symlink, a bare ``import consumers``, a core module reaching into a component,
or a package missing from pyproject.toml fails here, named.
"""

from __future__ import annotations

import ast
import subprocess
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMPONENTS = ("consumers", "producers", "streams", "broker")
# source root -> the package folder it holds (the core's root is the repository)
SOURCE_ROOTS = {".": "dueflow", **{c: f"dueflow/{c}" for c in COMPONENTS}}
SCHEMAS = ROOT / "schemas" / "dueflow" / "schemas"
# Folders of Python that is not part of the package: imported by their own names.
OTHER_PYTHON = ("tests", "benchmarks", "demo")
# Top-level folders that must never be imported bare (``import consumers``).
BARE = (*COMPONENTS, "schemas")

# The core's layers, lowest first. A layer may import its own modules and the
# ones listed for it; the base (dueflow/*.py: config, errors, model, headers,
# ids ...) is importable by every layer.
ALLOWED = {
    "base": {"rules", "kafka"},  # config reads the wheel geometry and the librdkafka keys
    "rules": set(),
    "records": {"rules"},
    "observability": set(),
    "kafka": {"rules", "records", "observability"},
    "apps": {"rules", "records", "observability", "kafka", "testing", *COMPONENTS},
    "testing": {"rules", "records", "observability", "kafka", "apps", *COMPONENTS},
    "facade": {"rules", "apps", *COMPONENTS},
}
CORE_LAYERS = {"rules", "records", "observability", "kafka"}
# Imports that the pure rules may not make: they are functions of their arguments.
IO_LIBRARIES = ("confluent_kafka", "aiokafka", "faust", "aiohttp", "socket", "subprocess")


@dataclass(frozen=True)
class Imported:
    source: str  # the importing module
    path: Path
    line: int
    target: str  # the imported module (or module.name for ``from m import name``)


def _module_of(root: str, path: Path) -> str:
    rel = path.relative_to(ROOT / root).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def package_files() -> Iterator[tuple[str, Path]]:
    """(module, file) of every Python file of the package, from its source root."""
    for root, folder in SOURCE_ROOTS.items():
        base = ROOT / root / folder
        for path in sorted(base.rglob("*.py")):
            if root == "." and path.relative_to(base).parts[0] in COMPONENTS:
                continue
            yield _module_of(root, path), path
    for path in sorted(SCHEMAS.rglob("*.py")):
        yield _module_of("schemas", path), path


def python_files() -> Iterator[Path]:
    for _module, path in package_files():
        yield path
    for folder in OTHER_PYTHON:
        yield from sorted((ROOT / folder).rglob("*.py"))


def imports_of(source: str, path: Path) -> Iterator[Imported]:
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Imported(source, path, node.lineno, alias.name)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            if node.module != "dueflow":  # ``from dueflow import headers``: the module counts
                yield Imported(source, path, node.lineno, node.module)
            for alias in node.names:
                yield Imported(source, path, node.lineno, f"{node.module}.{alias.name}")


def layer_of(module: str) -> str | None:
    """The layer of a dueflow module: a core layer, a component, or None outside."""
    parts = module.split(".")
    if parts[0] != "dueflow":
        return None
    if len(parts) == 1 or parts[1] == "__main__":
        return "facade"  # dueflow/__init__.py (its lazy exports) and ``python -m dueflow``
    if parts[1] in ALLOWED or parts[1] in COMPONENTS or parts[1] == "schemas":
        return parts[1]
    return "base"


def _where(imp: Imported) -> str:
    return f"{imp.path.relative_to(ROOT)}:{imp.line} ({imp.source}) imports {imp.target}"


def package_imports() -> list[Imported]:
    return [imp for module, path in package_files() for imp in imports_of(module, path)]


def test_no_symlink_is_tracked() -> None:
    staged = subprocess.run(
        ["git", "ls-files", "-s"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    links = [line.split("\t", 1)[1] for line in staged.splitlines() if line.startswith("120000")]
    assert links == []


# What a portion's dueflow/__init__.py may hold: the pkgutil-style namespace
# declaration and nothing else (the package is dueflow/__init__.py; the wheel
# holds none of these files). Tools that read files rather than run them
# (pyright, IDEs) need it to see past the core's regular package.
PORTION = ["from pkgutil import extend_path", "__path__ = extend_path(__path__, __name__)"]


@pytest.mark.parametrize("component", [*COMPONENTS, "schemas"])
def test_a_component_folder_is_a_source_root_not_a_package(component: str) -> None:
    folder = ROOT / component
    assert not (folder / "__init__.py").exists(), "the folder itself is not importable"
    assert sorted(p.name for p in folder.iterdir() if p.suffix == ".py") == []
    portion = ast.parse((folder / "dueflow" / "__init__.py").read_text())
    assert [ast.unparse(node) for node in portion.body] == PORTION
    assert sorted(p.name for p in (folder / "dueflow").iterdir()) == ["__init__.py", component]
    assert (folder / "dueflow" / component / "__init__.py").is_file()


def test_the_core_s_init_declares_the_namespace_too() -> None:
    # Without it the components would be reachable only through an installed
    # finder: extend_path lets every dueflow/ folder on sys.path take part.
    init = ast.parse((ROOT / "dueflow" / "__init__.py").read_text())
    assert PORTION[1] in [ast.unparse(node) for node in init.body]


def test_every_module_has_one_path() -> None:
    seen: dict[str, Path] = {}
    for module, path in package_files():
        assert module not in seen, f"{module} is both {seen[module]} and {path}"
        seen[module] = path
    assert not (ROOT / "dueflow" / "demo").exists(), "the demo is an example, outside the package"


def test_the_packages_of_pyproject_are_the_tree_s() -> None:
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    on_disk = {module for module, path in package_files() if path.name == "__init__.py"}
    assert sorted(setup["packages"]) == sorted(on_disk)
    for package, folder in setup["package-dir"].items():
        assert (ROOT / folder / "__init__.py").is_file(), package
        assert Path(folder).parts[-1] == package.rsplit(".", 1)[-1]


def test_nothing_imports_a_component_folder_bare() -> None:
    bare = [
        _where(imp)
        for path in python_files()
        for imp in imports_of(str(path.relative_to(ROOT)), path)
        if imp.target.split(".")[0] in BARE
    ]
    assert bare == []


def test_the_schemas_package_is_data_that_nothing_imports() -> None:
    assert [p.name for p in SCHEMAS.rglob("*.py")] == ["__init__.py"]
    assert sorted(p.name for p in SCHEMAS.glob("*.avsc")), "the published schemas are here"
    imported = [
        _where(imp)
        for path in python_files()
        for imp in imports_of(str(path.relative_to(ROOT)), path)
        if imp.target == "dueflow.schemas" or imp.target.startswith("dueflow.schemas.")
    ]
    assert imported == []


def test_the_core_never_imports_a_component() -> None:
    wrong = [
        _where(imp)
        for imp in package_imports()
        if layer_of(imp.source) in CORE_LAYERS | {"base"} and layer_of(imp.target) in COMPONENTS
    ]
    assert wrong == []


def test_each_layer_imports_only_the_layers_below_it() -> None:
    wrong = []
    for imp in package_imports():
        source, target = layer_of(imp.source), layer_of(imp.target)
        if source not in ALLOWED or target in (None, "base", source):
            continue
        if target not in ALLOWED[source]:
            wrong.append(_where(imp))
    assert wrong == []


# The status view (streams/) offers the dead-letter redrive of the operator tools.
COMPONENT_USES_OF_APPS = {("dueflow.streams.status.app", "dueflow.apps.ops.redrive")}


def test_components_use_no_application_but_the_named_ones() -> None:
    wrong = [
        _where(imp)
        for imp in package_imports()
        if layer_of(imp.source) in COMPONENTS
        and layer_of(imp.target) in ("apps", "testing", "facade")
        and (imp.source, imp.target.rsplit(".", 1)[0]) not in COMPONENT_USES_OF_APPS
        and (imp.source, imp.target) not in COMPONENT_USES_OF_APPS
    ]
    assert wrong == []


def test_the_rules_do_no_io() -> None:
    wrong = [
        _where(imp)
        for imp in package_imports()
        if layer_of(imp.source) == "rules" and imp.target.split(".")[0] in IO_LIBRARIES
    ]
    assert wrong == []


def test_the_checks_see_every_layer() -> None:
    # The rules above are only as good as the modules they read: each layer is there.
    layers = {layer_of(module) for module, _path in package_files()}
    assert layers >= set(ALLOWED) - {"facade"} | set(COMPONENTS) | {"schemas", "facade"}
    assert len(package_imports()) > 1000
