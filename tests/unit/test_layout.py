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
import functools
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
OTHER_PYTHON = ("tests", "benchmarks", "demo", "tools")
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


@functools.cache
def package_imports() -> tuple[Imported, ...]:
    return tuple(imp for module, path in package_files() for imp in imports_of(module, path))


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


# The components, each a source root of the one namespace (consumers/, producers/,
# streams/, broker/), stand side by side on the core; the applications (apps, testing,
# the facade) stand on them. A component imports the core only: an import of another
# component, or of an application, is one of these, each with why.
# (The status view's redrive and console act through the operator tools the
# application running it hands it: streams/dueflow/streams/status/operator_tools.py.)
COMPONENT_IMPORTS = {
    # The status view sets a bad outcome record aside with the workers' quarantine writer.
    ("dueflow.streams.status.app", "dueflow.consumers.quarantine"),
    ("dueflow.streams.status.outcome_fold", "dueflow.consumers.quarantine"),
    # The SDK routes a task to the queue its ``@task`` declares, read from the app it is
    # given (``Scheduler(app=...)``): imported only then.
    ("dueflow.producers.scheduler_base", "dueflow.consumers.registry"),
}
APPLICATIONS = ("apps", "testing", "facade")
MODULES = {module for module, _path in package_files()}


def _imported_module(imp: Imported) -> str:
    """The module an import names (``from m import name``: m, unless m.name is a module)."""
    parts = imp.target.split(".")
    for n in range(len(parts), 1, -1):
        name = ".".join(parts[:n])
        if name in MODULES:
            return name
    return imp.target


def component_imports() -> set[tuple[str, str]]:
    """(importer, imported module) of every import between components, or of an
    application by a component, anywhere in a file (functions and type checks too)."""
    found = set()
    for imp in package_imports():
        source, target = layer_of(imp.source), layer_of(imp.target)
        if source in COMPONENTS and target != source and target in (*COMPONENTS, *APPLICATIONS):
            found.add((imp.source, _imported_module(imp)))
    return found


def test_a_component_imports_no_other_component_but_the_named_ones() -> None:
    unnamed = component_imports() - COMPONENT_IMPORTS
    wrong = [
        _where(imp) for imp in package_imports() if (imp.source, _imported_module(imp)) in unnamed
    ]
    assert wrong == []


def test_the_component_allow_list_names_only_imports_that_exist() -> None:
    assert COMPONENT_IMPORTS - component_imports() == set()


# Modules that import each other, counting the imports made only for type checks:
# the checks of Settings.validate take the Settings they check, and the unique-key
# admission works on its command applier's batch (each split out for size).
IMPORT_CYCLES = [
    {"dueflow.config.settings", "dueflow.config.validation"},
    {"dueflow.consumers.commands", "dueflow.consumers.unique"},
]


def module_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports anywhere (functions and TYPE_CHECKING
    blocks too), but its own packages (a package's __init__ runs first anyway)."""
    graph: dict[str, set[str]] = {module: set() for module in MODULES}
    for imp in package_imports():
        target = _imported_module(imp)
        if target in MODULES and not f"{imp.source}.".startswith(f"{target}."):
            graph[imp.source].add(target)
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The sets of modules that reach each other (strongly connected, more than one)."""
    reach: dict[str, set[str]] = {}
    for start in graph:
        seen: set[str] = set()
        stack = list(graph[start])
        while stack:
            module = stack.pop()
            if module not in seen:
                seen.add(module)
                stack.extend(graph[module] - seen)
        reach[start] = seen
    cycles: list[set[str]] = []
    for module in sorted(graph):
        if module in reach[module] and not any(module in cycle for cycle in cycles):
            cycles.append({other for other in reach[module] if module in reach[other]})
    return cycles


def test_modules_import_each_other_in_no_circle_but_the_named_ones() -> None:
    # A circle held together by function-local or TYPE_CHECKING imports is a design
    # that needs a Protocol or a move, not an import placed where it happens to work.
    assert import_cycles(module_graph()) == IMPORT_CYCLES


def test_the_circle_check_sees_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert import_cycles(graph) == [{"a", "b", "c"}]


def function_local_imports(path: Path) -> Iterator[tuple[ast.stmt, bool]]:
    """Each import of a dueflow module inside a function of ``path``, and whether a
    comment says why: on its own lines, or on the line above its run of imports."""
    lines = path.read_text().splitlines()
    tree = ast.parse("\n".join(lines), filename=str(path))
    seen: set[int] = set()
    for function in ast.walk(tree):
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(function):
            for field in ("body", "orelse", "finalbody"):
                block = getattr(node, field, None)
                if not isinstance(block, list):
                    continue
                first: ast.stmt | None = None
                end = 0
                for stmt in block:
                    if not isinstance(stmt, ast.Import | ast.ImportFrom):
                        first = None
                        continue
                    if first is None or stmt.lineno > end + 1:  # a run: no line between
                        first = stmt
                    end = stmt.end_lineno or stmt.lineno
                    modules = (
                        [alias.name for alias in stmt.names]
                        if isinstance(stmt, ast.Import)
                        else [stmt.module or ""]
                    )
                    if stmt.lineno in seen or not any(m.startswith("dueflow") for m in modules):
                        continue
                    seen.add(stmt.lineno)
                    own = lines[stmt.lineno - 1 : stmt.end_lineno]
                    above = lines[first.lineno - 2].strip() if first.lineno > 1 else ""
                    yield stmt, any("#" in line for line in own) or above.startswith("#")


def test_a_function_local_import_of_dueflow_says_why() -> None:
    # An import belongs at the top of its module. One inside a function is for a real
    # import-time cost (a command's own runtime, an optional exporter) and says so.
    silent = [
        f"{path.relative_to(ROOT)}:{stmt.lineno} {ast.unparse(stmt)}"
        for _module, path in package_files()
        for stmt, says_why in function_local_imports(path)
        if not says_why
    ]
    assert silent == []


def test_the_local_import_check_reads_comments(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text(
        "def f():\n"
        "    # imported here: costly\n"
        "    from dueflow import a\n"
        "    from dueflow import b\n"
        "    x = 1\n"
        "    import os\n"
        "\n"
        "    # costly too\n"
        "    from dueflow import e\n"
        "    from dueflow import c\n"
        "    from dueflow import d  # costly\n"
        "    y = 2\n"
        "    from dueflow import f\n"
    )
    found = [(ast.unparse(stmt), why) for stmt, why in function_local_imports(source)]
    assert found == [
        ("from dueflow import a", True),
        ("from dueflow import b", True),
        ("from dueflow import e", True),
        ("from dueflow import c", True),
        ("from dueflow import d", True),
        ("from dueflow import f", False),
    ]


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
