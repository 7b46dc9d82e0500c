"""`StatefulAppComponent`: a defs.yaml builds what `build_stateful_definitions` builds with the same
options, `dg scaffold defs` writes a skeleton that `dg check defs` accepts and that processes messages
on the real broker, and a YAML naming a missing app, or a secret as text, fails saying what, where and
what to do."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from dagster import DagsterInstance, Definitions, EnvVar, load_from_defs_folder
from dagster.components.testing import DefsFolderSandbox, create_defs_folder_sandbox
from support.kafka_helpers import create_topic, produce, read_messages

import dagster_stateful.component
from dagster_stateful import KafkaResource, StatefulAppComponent, StatefulSparkResource, StateStoreResource
from dagster_stateful.builder import build_stateful_definitions

APPS_MODULE = """
from dagster_stateful.core import App, State


def add_to_total(order: dict, state: State) -> dict:
    state.set("total", state.get("total", 0) + order["amount"])
    return order


totals = App(name="totals", source="orders", stores=["totals"], output="totals-out")
totals.to_topic(totals.dataframe().apply(add_to_total, stateful=True))
counts = App(name="counts", source="orders", stores=["counts"], output="counts-out")
counts.to_topic(counts.dataframe().apply(add_to_total, stateful=True))
"""

EVERY_OPTION = """
type: dagster_stateful.StatefulAppComponent
attributes:
  app: [{project}.apps:totals, {project}.apps:counts]
  source_partitions: {{orders: 3}}
  kafka:
    bootstrap_servers: {{env: TEST_KAFKA_BOOTSTRAP}}
    security_protocol: SASL_SSL
    sasl_mechanism: SCRAM-SHA-512
    sasl_username: {{env: TEST_KAFKA_USER}}
    sasl_password: {{env: TEST_KAFKA_PASSWORD}}
    ssl_ca_location: {{env: TEST_KAFKA_CA}}
    admin_timeout_seconds: 5
    client_config: {{ssl.ca.location: /etc/kafka/ca.pem}}
  state_store:
    state_dir: "{{{{ env('TEST_STATE_DIR', '/nowhere') }}}}"
    snapshot_root: file:///snapshots
  spark: {{spark_config: {{spark.master: "local[2]"}}}}
  worker_every_minutes: 2
  automation_running: true
  lag_threshold: 7
  restore_threshold: 9
  pool_size: 2
  standby_replicas: 1
  checks: {{check_cron: "*/5 * * * *", max_changelog_lag: 11}}
  snapshots: {{compaction_cron: "0 4 * * *", max_snapshot_age_hours: 12}}
"""

REQUIRED_ONLY = """
type: dagster_stateful.StatefulAppComponent
attributes:
  app: {project}.apps:totals
  source_partitions: 3
  kafka: {{bootstrap_servers: "127.0.0.1:9092"}}
  state_store: {{state_dir: /var/lib/stateful}}
"""


@pytest.fixture
def sandbox() -> Iterator[DefsFolderSandbox]:
    """A temporary dg project (`src/<project>/defs`) with two apps in `src/<project>/apps.py`."""
    with create_defs_folder_sandbox() as sandbox:
        (sandbox.defs_folder_path.parent / "apps.py").write_text(APPS_MODULE)
        yield sandbox


def write_defs(sandbox: DefsFolderSandbox, yaml: str, name: str = "stateful") -> Path:
    """`<defs>/<name>/defs.yaml` with `yaml`, whose `{project}` is the sandbox's package."""
    folder = sandbox.defs_folder_path / name
    folder.mkdir()
    (folder / "defs.yaml").write_text(yaml.format(project=sandbox.project_name))
    return folder


def expected_resources(state_dir: str) -> dict[str, Any]:
    """The resources EVERY_OPTION stands for."""
    return {
        "kafka": KafkaResource(
            bootstrap_servers=EnvVar("TEST_KAFKA_BOOTSTRAP"),
            security_protocol="SASL_SSL",
            sasl_mechanism="SCRAM-SHA-512",
            sasl_username=EnvVar("TEST_KAFKA_USER"),
            sasl_password=EnvVar("TEST_KAFKA_PASSWORD"),
            ssl_ca_location=EnvVar("TEST_KAFKA_CA"),
            admin_timeout_seconds=5.0,
            client_config={"ssl.ca.location": "/etc/kafka/ca.pem"},
        ),
        "state_store": StateStoreResource(state_dir=state_dir, snapshot_root="file:///snapshots"),
        "spark": StatefulSparkResource(spark_config={"spark.master": "local[2]"}),
    }


def settings(resource: Any) -> dict[str, tuple[str, str]]:
    """A resource's fields with their types: an `EnvVar` and the text of its name differ here."""
    return {name: (type(value).__name__, repr(value)) for name, value in resource}


def outline(defs: Definitions) -> dict[str, Any]:
    """What a user sees of definitions: assets and groups, checks, jobs and their ops, schedules,
    sensors (with default statuses) and the resources' settings."""
    repository = defs.get_repository_def()
    graph = repository.asset_graph
    return {
        "assets": sorted((key.to_user_string(), graph.get(key).group_name) for key in graph.get_all_asset_keys()),
        "checks": sorted(key.to_user_string() for key in graph.asset_check_keys),
        "jobs": sorted((job.name, tuple(sorted(job.graph.node_names()))) for job in repository.get_all_jobs()),
        "schedules": sorted((s.name, s.cron_schedule, s.default_status.value) for s in repository.schedule_defs),
        "sensors": sorted((s.name, s.default_status.value) for s in repository.sensor_defs),
        "resources": {key: settings(value) for key, value in (defs.resources or {}).items()},
    }


def test_component_from_yaml_builds_what_the_builder_builds_with_the_same_options(sandbox, monkeypatch, tmp_path):
    monkeypatch.setenv("TEST_STATE_DIR", str(tmp_path / "state"))
    folder = write_defs(sandbox, EVERY_OPTION)

    with sandbox.load_component_and_build_defs(defs_path=folder) as (component, from_yaml):
        apps = sys.modules[f"{sandbox.project_name}.apps"]
        from_python = build_stateful_definitions(
            [apps.totals, apps.counts],
            source_partitions={"orders": 3},
            worker_every_minutes=2,
            automation_running=True,
            lag_threshold=7,
            restore_threshold=9,
            pool_size=2,
            standby_replicas=1,
            check_cron="*/5 * * * *",
            max_changelog_lag=11,
            compaction_cron="0 4 * * *",
            max_snapshot_age_hours=12.0,
            **expected_resources(str(tmp_path / "state")),
        )

    assert isinstance(component, StatefulAppComponent)
    assert component.apps == [apps.totals, apps.counts]
    assert outline(from_yaml) == outline(from_python)
    assert outline(from_yaml)["resources"]["kafka"]["sasl_password"] == ("EnvVar", "'TEST_KAFKA_PASSWORD'")


def test_component_hands_every_option_to_the_builder_and_defaults_to_its_defaults(sandbox, monkeypatch, tmp_path):
    """The options the lag and rebalance sensors and the checks close over do not show in the
    definitions: the builder's arguments are compared instead."""
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(
        dagster_stateful.component, "build_stateful_definitions", lambda apps, **options: calls.append(options)
    )
    monkeypatch.setenv("TEST_STATE_DIR", str(tmp_path / "state"))
    every_folder = write_defs(sandbox, EVERY_OPTION)
    required_folder = write_defs(sandbox, REQUIRED_ONLY, name="required")
    with sandbox.build_component_tree() as tree:
        for folder in (every_folder, required_folder):
            tree.load_component(folder, StatefulAppComponent).build_defs(tree.load_context)

    given, defaulted = calls
    expected = {
        "source_partitions": {"orders": 3},
        "worker_every_minutes": 2,
        "automation_running": True,
        "lag_threshold": 7,
        "restore_threshold": 9,
        "pool_size": 2,
        "standby_replicas": 1,
        "check_cron": "*/5 * * * *",
        "max_changelog_lag": 11,
        "compaction_cron": "0 4 * * *",
        "max_snapshot_age_hours": 12.0,
    }
    assert {key: value for key, value in given.items() if key in expected} == expected
    for name, resource in expected_resources(str(tmp_path / "state")).items():
        assert settings(given[name]) == settings(resource), name
    builder_defaults = {
        name: parameter.default
        for name, parameter in _builder_parameters().items()
        if parameter.default is not parameter.empty and name != "translator"
    }
    assert set(given) == set(builder_defaults) | {"source_partitions", "kafka", "state_store"}
    assert {key: defaulted[key] for key in builder_defaults} == builder_defaults


def _builder_parameters() -> dict[str, inspect.Parameter]:
    return dict(inspect.signature(build_stateful_definitions).parameters)


def test_yaml_naming_a_missing_app_fails_saying_what_where_and_what_to_do(sandbox):
    yaml = REQUIRED_ONLY.replace("apps:totals", "apps:total")
    folder = write_defs(sandbox, yaml)

    with pytest.raises(Exception) as raised, sandbox.load_component_and_build_defs(defs_path=folder):
        pass

    message = _messages(raised.value)
    assert f"module '{sandbox.project_name}.apps'" in message and "has no attribute 'total'" in message
    assert f"{folder / 'defs.yaml'}:4" in message, "where: the file and line of `app:`"
    assert "its App objects are ['counts', 'totals']" in message, "what to do: the names that exist"
    assert "define `total = App(...)`" in message


def test_yaml_giving_the_kafka_password_as_text_is_refused(sandbox, monkeypatch):
    monkeypatch.setenv("KAFKA_PASSWORD", "hunter2")
    yaml = REQUIRED_ONLY.replace(
        'kafka: {{bootstrap_servers: "127.0.0.1:9092"}}',
        'kafka: {{bootstrap_servers: "127.0.0.1:9092", sasl_password: "{{{{ env.KAFKA_PASSWORD }}}}"}}',
    )
    folder = write_defs(sandbox, yaml)

    with pytest.raises(Exception) as raised, sandbox.load_component_and_build_defs(defs_path=folder):
        pass

    message = _messages(raised.value)
    assert "kafka.sasl_password is a secret" in message
    assert "write `sasl_password: {env: KAFKA_PASSWORD}`" in message
    assert "hunter2" not in message


ENV_DRIVEN_SECURITY = """
type: dagster_stateful.StatefulAppComponent
attributes:
  app: {project}.apps:totals
  source_partitions: 3
  kafka:
    bootstrap_servers: "127.0.0.1:9092"
    security_protocol: "{{{{ env('TEST_KAFKA_PROTOCOL', 'PLAINTEXT') }}}}"
    sasl_mechanism: "{{{{ env('TEST_KAFKA_MECHANISM', '') }}}}"
    sasl_password: {{env: TEST_KAFKA_SECRET}}
  state_store: {{state_dir: /nowhere}}
"""


@pytest.mark.parametrize("secured", [False, True])
def test_one_yaml_serves_a_cluster_with_sasl_and_one_without_through_environment_variables(
    sandbox, monkeypatch, secured
):
    if secured:
        monkeypatch.setenv("TEST_KAFKA_PROTOCOL", "SASL_SSL")
        monkeypatch.setenv("TEST_KAFKA_MECHANISM", "SCRAM-SHA-512")
        monkeypatch.setenv("TEST_KAFKA_SECRET", "hunter2")
    folder = write_defs(sandbox, ENV_DRIVEN_SECURITY)

    with sandbox.load_component_and_build_defs(defs_path=folder) as (component, _):
        resource = component.kafka.resource()
        settings = resource.client_settings()

    if secured:
        assert settings["security.protocol"] == "SASL_SSL" and settings["sasl.mechanism"] == "SCRAM-SHA-512"
        assert isinstance(resource.sasl_password, EnvVar) and resource.sasl_password.env_var_name == "TEST_KAFKA_SECRET"
    else:
        assert settings == {"bootstrap.servers": "127.0.0.1:9092", "security.protocol": "PLAINTEXT"}
        assert resource.sasl_password is None, "an unset password variable without SASL is no setting"


def _messages(error: BaseException) -> str:
    """The messages of an error and of the errors it was raised from."""
    parts = []
    current: BaseException | None = error
    while current is not None:
        parts.append(str(current))
        current = current.__cause__ or current.__context__
    return "\n".join(parts)


def dg(project: Path, *arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dagster_dg_cli.cli", *arguments],
        cwd=project,
        env={key: value for key, value in os.environ.items() if key != "VIRTUAL_ENV"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def new_dg_project(root: Path, package: str) -> Path:
    """A dg project as `create-dagster project` lays it out (src layout, `defs` folder), without its venv."""
    (root / "pyproject.toml").write_text(
        textwrap.dedent(f"""
            [project]
            name = "{package}"
            version = "0.0.1"

            [tool.dg]
            directory_type = "project"

            [tool.dg.project]
            root_module = "{package}"

            [tool.dg.cli]
            suppress_warnings = ["project_and_activated_venv_mismatch"]
        """)
    )
    package_dir = root / "src" / package
    (package_dir / "defs").mkdir(parents=True)
    (package_dir / "__init__.py").write_text("")
    (package_dir / "defs" / "__init__.py").write_text("")
    (package_dir / "definitions.py").write_text(
        textwrap.dedent("""
            from pathlib import Path

            import dagster as dg


            @dg.definitions
            def defs():
                return dg.load_from_defs_folder(path_within_project=Path(__file__).parent)
        """)
    )
    return package_dir


def test_dg_scaffold_defs_writes_a_skeleton_that_dg_checks_and_that_counts_messages(
    kafka_bootstrap, monkeypatch, tmp_path
):
    package = f"scaffolded_{uuid.uuid4().hex[:8]}"
    name = f"counts_{uuid.uuid4().hex[:8]}"  # the app's name, so its topics, are this test's own
    package_dir = new_dg_project(tmp_path, package)

    scaffolded = dg(tmp_path, "scaffold", "defs", "dagster_stateful.StatefulAppComponent", name)

    assert scaffolded.returncode == 0, scaffolded.stdout + scaffolded.stderr
    folder = package_dir / "defs" / name
    assert sorted(path.name for path in folder.iterdir()) == ["apps.py", "defs.yaml"]
    assert "type: dagster_stateful.StatefulAppComponent" in (folder / "defs.yaml").read_text()
    checked = dg(tmp_path, "check", "defs")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "All definitions loaded successfully" in checked.stdout

    app_name = name.replace("_", "-")
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", kafka_bootstrap)
    monkeypatch.setenv("DAGSTER_STATEFUL_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    create_topic(kafka_bootstrap, f"{app_name}-input", 1)
    produce(kafka_bootstrap, f"{app_name}-input", [(b"k", orjson.dumps({"n": n})) for n in range(3)])
    defs = load_from_defs_folder(path_within_project=tmp_path)
    instance = DagsterInstance.ephemeral()
    job = name  # the app's Dagster names use underscores
    assert defs.resolve_job_def(f"{job}__provision").execute_in_process(instance=instance).success
    worker = defs.resolve_job_def(f"{job}__worker").execute_in_process(
        instance=instance, run_config={"ops": {f"{job}__run_worker_op": {"config": {"max_seconds": 60}}}}
    )

    assert worker.success
    outputs = read_messages(kafka_bootstrap, f"{app_name}-counts")
    assert [orjson.loads(message.value())["count"] for message in outputs] == [1, 2, 3]
