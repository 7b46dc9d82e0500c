"""The core's shape: layering, no import cycles, the façade as the only module that knows the App.

Reads the source with `ast` (imports anywhere in a module count, lazy ones included), so it checks
what the code says, not what happens to be imported at run time.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import dagster_stateful

PACKAGE_ROOT = Path(dagster_stateful.__file__).parent
CORE = PACKAGE_ROOT / "core"
FACADE = "dagster_stateful.core.app"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def core_modules() -> dict[str, set[str]]:
    """Each core module -> the dagster_stateful modules it imports."""
    return {
        module_name(path): {m for m in imported_modules(path) if m.startswith("dagster_stateful")}
        for path in CORE.rglob("*.py")
    }


def test_the_core_never_imports_dagster_or_pyspark():
    offenders = {
        module_name(path): sorted(
            m for m in imported_modules(path) if m.split(".")[0] in ("dagster", "pyspark", "dagster_pyspark")
        )
        for path in CORE.rglob("*.py")
    }
    assert not {m: found for m, found in offenders.items() if found}


def test_only_the_facade_imports_the_app():
    importers = sorted(m for m, imports in core_modules().items() if FACADE in imports)
    assert importers == ["dagster_stateful.core"], importers


def test_the_core_import_graph_has_no_cycle():
    graph = {m: {i for i in imports if i.startswith("dagster_stateful.core")} for m, imports in core_modules().items()}
    visiting: list[str] = []
    done: set[str] = set()

    def visit(module: str) -> None:
        if module in done:
            return
        assert module not in visiting, "import cycle: " + " -> ".join([*visiting[visiting.index(module) :], module])
        visiting.append(module)
        for dependency in graph.get(module, ()):
            if dependency != "dagster_stateful.core":  # the package's public re-exports
                visit(dependency)
        visiting.pop()
        done.add(module)

    for module in graph:
        if module != "dagster_stateful.core":
            visit(module)


CORE_LAYERS = (
    ("gc_pause", "state"),
    ("config",),
    ("kafka",),
    ("monitoring",),
    ("recovery",),
    ("state_tables",),
    ("processing",),
    ("queries",),
    ("app",),
)
"""The core's packages from the bottom up: a module imports from its own layer or those below."""
PROCESSING_LAYERS = (("lifecycle",), ("dsl",), ("commit",), ("restores",), ("paths",), ("standbys",), ("worker",))
"""The same inside `core.processing`."""


def layer_of(module: str, package: str, layers: tuple[tuple[str, ...], ...]) -> int | None:
    if not module.startswith(package + "."):
        return None
    part = module[len(package) + 1 :].split(".")[0]
    return next((index for index, layer in enumerate(layers) if part in layer), None)


def upward_imports(package: str, layers: tuple[tuple[str, ...], ...]) -> list[str]:
    found = []
    for module, imports in core_modules().items():
        own = layer_of(module, package, layers)
        for imported in imports:
            theirs = layer_of(imported, package, layers)
            if own is not None and theirs is not None and theirs > own:
                found.append(f"{module} -> {imported}")
    return sorted(found)


def test_every_core_package_has_its_layer():
    packages = {
        p.name.removesuffix(".py") for p in CORE.iterdir() if p.name != "__init__.py" and p.name != "__pycache__"
    }
    assert packages == {part for layer in CORE_LAYERS for part in layer}
    processing = {p.name.removesuffix(".py") for p in (CORE / "processing").iterdir()}
    assert processing - {"__init__", "__pycache__"} == {part for layer in PROCESSING_LAYERS for part in layer}


def test_no_import_runs_up_the_layers():
    assert upward_imports("dagster_stateful.core", CORE_LAYERS) == []
    assert upward_imports("dagster_stateful.core.processing", PROCESSING_LAYERS) == []


def test_rocksdict_and_confluent_kafka_stay_in_their_adapters():
    """RocksDB is touched only by the rocksdb adapter; the Kafka client library only under core/kafka,
    the worker's processing path and the recovery replay (which handle its messages)."""
    rocksdb_users = sorted(module_name(p) for p in CORE.rglob("*.py") if "rocksdict" in imported_modules(p))
    assert rocksdb_users == ["dagster_stateful.core.state.rocksdb"], rocksdb_users
    kafka_users = {
        module_name(p)
        for p in CORE.rglob("*.py")
        if any(m.split(".")[0] == "confluent_kafka" for m in imported_modules(p))
    }
    allowed_packages = (
        "dagster_stateful.core.kafka",
        "dagster_stateful.core.processing",
        "dagster_stateful.core.recovery",
        "dagster_stateful.core.state_tables",
    )
    assert all(m.startswith(allowed_packages) for m in kafka_users), sorted(kafka_users)
    assert not any(m.startswith("dagster_stateful.core.state.") for m in kafka_users)


def test_every_module_says_what_it_owns():
    missing = sorted(
        module_name(p) for p in PACKAGE_ROOT.rglob("*.py") if not ast.get_docstring(ast.parse(p.read_text()))
    )
    assert not missing, f"modules without a docstring: {missing}"


def assert_passes_in_a_fresh_interpreter(code: str) -> None:
    """Run `code` in a new Python process (nothing imported yet) and fail with its error if it fails."""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]


def test_modules_stay_small():
    too_long = {module_name(p): n for p in PACKAGE_ROOT.rglob("*.py") if (n := len(p.read_text().splitlines())) > 450}
    assert not too_long, f"split these modules (over 450 lines): {too_long}"


def test_the_engine_api_loads_without_dagster_or_pyspark():
    check = (
        "import sys, dagster_stateful.core as core; "
        "assert core.App and core.State and core.RestoreListener and core.StatefulError; "
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('dagster', 'pyspark')); "
        "assert not loaded, loaded"
    )
    assert_passes_in_a_fresh_interpreter(check)


def test_a_worker_loads_numpy_and_arrow_only_for_a_columnar_aggregation():
    """A worker of any other app (and a restore child) never pays their 50 MiB and quarter second."""
    check = (
        "import sys\n"
        "from dagster_stateful.core import App, Sum\n"
        "import dagster_stateful.core.processing.worker.loop, dagster_stateful.core.recovery.parallel_replay\n"
        "app = App(name='a', source='orders', stores=['totals'], kafka='127.0.0.1:9')\n"
        "app.dataframe().update(lambda value, state: None, stateful=True)\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('numpy', 'pyarrow'))\n"
        "assert not loaded, loaded[:5]\n"
        "columnar = App(name='b', source='orders', stores=['totals'], kafka='127.0.0.1:9')\n"
        "columnar.dataframe().aggregate(Sum('amount'))\n"
        "assert 'numpy' in sys.modules and 'pyarrow' in sys.modules\n"
    )
    assert_passes_in_a_fresh_interpreter(check)


def test_the_dagster_api_is_exported_from_the_package():
    import dagster_stateful
    from dagster_stateful.builder import build_stateful_definitions
    from dagster_stateful.component import StatefulAppComponent
    from dagster_stateful.pipes import SparkPipesResource
    from dagster_stateful.resources import KafkaResource, StatefulSparkResource, StateStoreResource
    from dagster_stateful.translator import StatefulTranslator

    assert dagster_stateful.SparkPipesResource is SparkPipesResource
    assert dagster_stateful.build_stateful_definitions is build_stateful_definitions
    assert dagster_stateful.StatefulTranslator is StatefulTranslator
    assert dagster_stateful.KafkaResource is KafkaResource
    assert dagster_stateful.StateStoreResource is StateStoreResource
    assert dagster_stateful.StatefulSparkResource is StatefulSparkResource
    assert dagster_stateful.StatefulAppComponent is StatefulAppComponent
    assert sorted(dagster_stateful.__all__) == sorted(
        [
            "build_stateful_definitions",
            "StatefulAppComponent",
            "KafkaResource",
            "SparkPipesResource",
            "StateStoreResource",
            "StatefulSparkResource",
            "StatefulTranslator",
        ]
    )
