"""The Dagster Component over `build_stateful_definitions`: stateful apps declared in a `defs.yaml`.

Owns `StatefulAppComponent`, its YAML schema and its scaffolder. A `defs.yaml` names one or more
`App` objects by `module:attribute` (a module starting with `.` is relative to the YAML's folder)
and gives the builder's options and the resources' settings; values that vary by deployment come
from the environment, non-secret ones through Dagster's `{{ env.NAME }}` templates, secrets only as
`{env: NAME}` references, which become `EnvVar`s (read when a run starts, never shown in the UI).
The component is thin: `build_defs` calls `build_stateful_definitions`, which stays the API for
Python users. `dg scaffold defs dagster_stateful.StatefulAppComponent <name>` writes a `defs.yaml`
and an app module with one stateful step (`StatefulAppScaffolder`).
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Sequence
from types import ModuleType
from typing import Annotated, Any, overload

from dagster import Component, ComponentLoadContext, Definitions, EnvVar, Model, Resolvable, Resolver
from dagster.components import ResolutionContext, Scaffolder, ScaffoldRequest, scaffold_component, scaffold_with
from dagster.components.core.context import RESOLUTION_CONTEXT_STASH_KEY, ComponentDeclLoadContext
from pydantic import ConfigDict, Field, field_validator

from dagster_stateful.builder import build_stateful_definitions
from dagster_stateful.core.app import App
from dagster_stateful.errors import ConfigurationError
from dagster_stateful.resources import KafkaResource, StatefulSparkResource, StateStoreResource

__all__ = [
    "ChecksSettings",
    "EnvVarRef",
    "KafkaSettings",
    "SnapshotSettings",
    "SparkSettings",
    "StateStoreSettings",
    "StatefulAppComponent",
    "StatefulAppScaffolder",
    "load_app",
]


def _doc(description: str) -> Resolver:
    """A field's description in the YAML schema (`dg list components`, the UI's docs, editors).

    Dagster 1.13 drops a pydantic `Field(description=...)` from the schema when the field has a
    default; a default `Resolver` carries it through."""
    return Resolver.default(description=description)


class EnvVarRef(Model):
    """`{env: NAME}`: the value of the environment variable NAME, as Dagster's `EnvVar`."""

    env: str = Field(description="Name of the environment variable that holds the value.")

    def value(self) -> EnvVar:
        return EnvVar(self.env)


@overload
def _env_or_text(value: str | EnvVarRef) -> str: ...
@overload
def _env_or_text(value: str | EnvVarRef | None) -> str | None: ...
def _env_or_text(value: str | EnvVarRef | None) -> str | None:
    """A setting as a resource takes it: an `{env: NAME}` reference becomes `EnvVar(NAME)`."""
    return value.value() if isinstance(value, EnvVarRef) else value


def _given(value: str | EnvVarRef | None) -> bool:
    """Whether a setting has a value (an `{env: NAME}` one: whether NAME is set and not empty)."""
    return bool(os.environ.get(value.env) if isinstance(value, EnvVarRef) else value)


def _secret_reference(value: Any) -> Any:
    """A secret's setting, refused unless it is an `{env: NAME}` reference (or unset)."""
    if isinstance(value, str):
        raise ConfigurationError(
            "kafka.sasl_password is a secret and is given as text (a `{{ env.NAME }}` template is text too: "
            "its value would be written into the resource config the UI shows); keep it in an environment "
            "variable and write `sasl_password: {env: KAFKA_PASSWORD}` (with the variable's name)"
        )
    return value


class KafkaSettings(Resolvable, Model):
    """The `kafka` resource (`KafkaResource`): how the code location reaches the cluster."""

    bootstrap_servers: Annotated[
        str | EnvVarRef,
        _doc("Comma-separated host:port list, or `{env: NAME}` (e.g. `{env: KAFKA_BOOTSTRAP_SERVERS}`)."),
    ]
    security_protocol: Annotated[str | EnvVarRef, _doc("PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL.")] = "PLAINTEXT"
    sasl_mechanism: Annotated[str | EnvVarRef | None, _doc("e.g. PLAIN, SCRAM-SHA-512 (SASL only).")] = None
    sasl_username: Annotated[str | EnvVarRef | None, _doc("SASL user name, e.g. `{env: KAFKA_USER}`.")] = None
    sasl_password: Annotated[
        EnvVarRef | None,
        Resolver(
            lambda context, value: _secret_reference(value),
            model_field_type=EnvVarRef | None,
            inject_before_resolve=False,  # a template's value never reaches the model, nor its errors
            description="SASL password: only as `{env: NAME}`, never as text in the YAML.",
        ),
    ] = None
    ssl_ca_location: Annotated[
        str | EnvVarRef | None, _doc("PEM file of the CA certificates that signed the brokers' (TLS).")
    ] = None
    admin_timeout_seconds: Annotated[
        float, _doc("How long Kafka reads and topic changes retry transient errors before a run fails.")
    ] = 30.0
    client_config: Annotated[dict[str, str], _doc("Further librdkafka settings (no secrets: the UI shows them).")] = (
        Field(default_factory=dict)
    )

    def _password(self) -> str | None:
        """The password's `EnvVar`; none when its variable is unset and no SASL mechanism is chosen, so
        one YAML serves a cluster with SASL and one without (with a mechanism, Dagster reports it missing)."""
        password = _env_or_text(self.sasl_password)
        if password is None or os.environ.get(password) is not None or _given(self.sasl_mechanism):
            return password
        return None

    @field_validator("sasl_password", mode="before")
    @classmethod
    def _secret_from_environment(cls, value: Any) -> Any:
        return _secret_reference(value)

    def resource(self) -> KafkaResource:
        return KafkaResource(
            bootstrap_servers=_env_or_text(self.bootstrap_servers),
            security_protocol=_env_or_text(self.security_protocol),
            sasl_mechanism=_env_or_text(self.sasl_mechanism),
            sasl_username=_env_or_text(self.sasl_username),
            sasl_password=self._password(),
            ssl_ca_location=_env_or_text(self.ssl_ca_location),
            admin_timeout_seconds=self.admin_timeout_seconds,
            client_config=dict(self.client_config),
        )


class StateStoreSettings(Resolvable, Model):
    """The `state_store` resource (`StateStoreResource`): where this machine keeps state and snapshots."""

    state_dir: Annotated[
        str | EnvVarRef,
        _doc(
            "Directory of the RocksDB state, e.g. `\"{{ env('DAGSTER_STATEFUL_STATE_DIR', '/var/lib/stateful') }}\"`."
        ),
    ]
    snapshot_root: Annotated[
        str | EnvVarRef | None, _doc("Path or URI (file://, s3a://, ...) of the stores' snapshots; unset: none.")
    ] = None

    def resource(self) -> StateStoreResource:
        return StateStoreResource(
            state_dir=_env_or_text(self.state_dir), snapshot_root=_env_or_text(self.snapshot_root)
        )


class SparkSettings(Resolvable, Model):
    """The `spark` resource (`StatefulSparkResource`): how snapshots and Spark restores reach Spark."""

    spark_config: Annotated[
        dict[str, str], _doc("Spark settings, e.g. `spark.master: spark://host:7077` (default: local[*]).")
    ] = Field(default_factory=dict)

    def resource(self) -> StatefulSparkResource:
        return StatefulSparkResource(spark_config={"spark.master": "local[*]", **self.spark_config})


class ChecksSettings(Resolvable, Model):
    """When the asset checks run, and how far a store may trail its changelog."""

    check_cron: Annotated[
        str | None, _doc("When a sensor evaluates the checks (null: only when launched by hand).")
    ] = "*/10 * * * *"
    max_changelog_lag: Annotated[int, _doc("Changelog records a store may be behind before its check fails.")] = 100_000


class SnapshotSettings(Resolvable, Model):
    """When Spark snapshots the stores, and how old the newest snapshot may be."""

    compaction_cron: Annotated[str, _doc("When the daily compaction job snapshots every store.")] = "0 3 * * *"
    max_snapshot_age_hours: Annotated[float, _doc("Age of the newest snapshot at which its check fails.")] = 48.0


def load_app(reference: str, context: ResolutionContext | None = None) -> App:
    """The `App` named by `module:attribute`; a module starting with `.` is relative to the folder
    of the `defs.yaml` being loaded. Raises `ConfigurationError` saying what is wrong and what to do."""
    module_name, _, attribute = reference.partition(":")
    if not module_name or not attribute:
        raise ConfigurationError(
            f"app reference {reference!r} is not `module:attribute`: write e.g. `my_project.apps:order_totals`, or "
            "`.apps:order_totals` for a module in this defs.yaml's folder"
        )
    module = _import(_absolute_module(module_name, reference, context), reference)
    if not hasattr(module, attribute):
        apps = sorted(name for name, value in vars(module).items() if isinstance(value, App))
        raise ConfigurationError(
            f"app reference {reference!r}: module {module.__name__!r} ({module.__file__}) has no attribute "
            f"{attribute!r}; its App objects are {apps or 'none'}. Name one of them, or define "
            f"`{attribute} = App(...)` in that module"
        )
    value = getattr(module, attribute)
    if not isinstance(value, App):
        raise ConfigurationError(
            f"app reference {reference!r} is a {type(value).__name__}, not a dagster_stateful App: name the "
            f"module attribute that holds the App (`{attribute} = App(name=..., source=...)`)"
        )
    return value


def _import(module_name: str, reference: str) -> ModuleType:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name is None or not module_name.startswith(error.name):
            raise  # the module exists; something it imports is missing
        raise ConfigurationError(
            f"app reference {reference!r}: module {module_name!r} is not found ({error}); fix the module's name, "
            "or make it importable by the code location (install its package, or run from the project's root)"
        ) from error


def _absolute_module(module_name: str, reference: str, context: ResolutionContext | None) -> str:
    if not module_name.startswith("."):
        return module_name
    load_context = context.stash.get(RESOLUTION_CONTEXT_STASH_KEY) if context is not None else None
    if not isinstance(load_context, ComponentDeclLoadContext):
        raise ConfigurationError(
            f"app reference {reference!r} is relative (starts with '.') but is not loaded from a defs.yaml: "
            "write the module's full name"
        )
    return load_context.defs_relative_module_name(load_context.path) + module_name


def _resolve_apps(context: ResolutionContext, value: str | Sequence[str]) -> list[App]:
    references = [value] if isinstance(value, str) else list(context.resolve_value(value))
    if not references:
        raise ConfigurationError("`app:` names no App: give one `module:attribute` or a list of them")
    return [load_app(str(reference), context.at_path(index)) for index, reference in enumerate(references)]


class StatefulAppScaffolder(Scaffolder):
    """`dg scaffold defs dagster_stateful.StatefulAppComponent <name>`: a `defs.yaml` and `apps.py`
    holding one app with one stateful step, ready for `dg check defs`."""

    def scaffold(self, request: ScaffoldRequest) -> None:
        attribute, app_name = _scaffold_names(request.target_path.name)
        (request.target_path / "apps.py").write_text(_APP_MODULE.format(attribute=attribute, app_name=app_name))
        if request.scaffold_format == "yaml":
            yaml = _DEFS_YAML.format(type_name=request.type_name, attribute=attribute)
            (request.target_path / "defs.yaml").write_text(yaml)
        else:
            scaffold_component(request)


def _scaffold_names(folder: str) -> tuple[str, str]:
    """The Python attribute and the app name (its consumer group) a scaffolded folder gets."""
    attribute = re.sub(r"\W+", "_", folder).strip("_").lower() or "app"
    if attribute[0].isdigit():
        attribute = f"app_{attribute}"
    return attribute, attribute.replace("_", "-")


_APP_MODULE = '''\
"""The stateful app of this component, with one stateful step: it counts the messages of each key
on the topic `{app_name}-input` and sends the counts to `{app_name}-counts`.

`defs.yaml` names `{attribute}` below; write your steps here (see dagster_stateful's docs/apps.md,
"An app, end to end").
"""

from dagster_stateful.core import App, State


def count_per_key(message: dict, state: State) -> dict:
    """A stateful step: `state` holds this message key's values only."""
    count = state.get("count", 0) + 1
    state.set("count", count)
    return {{"count": count, "last": message}}


{attribute} = App(
    name="{app_name}",
    source="{app_name}-input",
    stores=["counts"],
    output="{app_name}-counts",
)
{attribute}.to_topic({attribute}.dataframe().apply(count_per_key, stateful=True, store="counts"))
'''

_DEFS_YAML = """\
type: {type_name}

attributes:
  # The App(s) this component runs: `module:attribute`, or a list of them ('.' = this folder).
  app: .apps:{attribute}
  # The source topic's partition count (or a map topic -> count); a check verifies it.
  source_partitions: 1
  kafka:
    # Secrets only as `{{env: NAME}}` (Dagster's EnvVar, read when a run starts, never shown in the UI).
    bootstrap_servers: {{env: KAFKA_BOOTSTRAP_SERVERS}}
    # security_protocol: SASL_SSL
    # sasl_mechanism: SCRAM-SHA-512
    # sasl_username: {{env: KAFKA_USER}}
    # sasl_password: {{env: KAFKA_PASSWORD}}
  state_store:
    state_dir: "{{{{ env('DAGSTER_STATEFUL_STATE_DIR', '.dagster-stateful/state') }}}}"
    # snapshot_root: s3a://bucket/snapshots
  worker_every_minutes: 5
  automation_running: false
  lag_threshold: 1000
  # pool_size: 1
  # standby_replicas: 1
  # checks: {{check_cron: "*/10 * * * *", max_changelog_lag: 100000}}
  # snapshots: {{compaction_cron: "0 3 * * *", max_snapshot_age_hours: 48}}
"""


@scaffold_with(StatefulAppScaffolder)
class StatefulAppComponent(Component, Resolvable, Model):
    """Stateful Kafka apps (RocksDB state, compacted changelogs) as Dagster assets, checks, jobs,
    schedules and sensors: everything `build_stateful_definitions` makes for them.

    `app` names the `App` objects (`module:attribute`); the other attributes are the builder's
    options and the resources' settings. Secrets only as `{env: NAME}`.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")

    apps: Annotated[
        Sequence[App],
        Resolver(
            _resolve_apps,
            model_field_name="app",
            model_field_type=str | list[str],
            description="The App object(s) to run, as `module:attribute` (e.g. `my_project.apps:order_totals`) "
            "or a list of them; a module starting with `.` is relative to this defs.yaml's folder.",
        ),
    ]
    source_partitions: Annotated[
        int | dict[str, int],
        _doc("The source topic's partition count, or the count per source topic (a check verifies it)."),
    ]
    kafka: Annotated[KafkaSettings, _doc("The `kafka` resource: how to reach the cluster.")]
    state_store: Annotated[StateStoreSettings, _doc("The `state_store` resource: where state and snapshots live.")]
    spark: Annotated[SparkSettings | None, _doc("The `spark` resource (unset: local[*]).")] = None
    worker_every_minutes: Annotated[
        int | None, _doc("Run a bounded worker of each app on this schedule (null: no schedule).")
    ] = 5
    automation_running: Annotated[
        bool, _doc("Start the schedules and sensors switched on (otherwise a user turns them on in the UI).")
    ] = False
    lag_threshold: Annotated[int, _doc("Total lag at which the lag sensor requests a worker run.")] = 1000
    restore_threshold: Annotated[
        int, _doc("Changelog records behind at which the rebalance sensor requests a restore.")
    ] = 1000
    pool_size: Annotated[int, _doc("Workers per worker run: a pool on one machine, in parallel processes.")] = 1
    standby_replicas: Annotated[
        int | None,
        _doc("Standby copies each app's workers keep of other hosts' partitions (null: the app's own setting)."),
    ] = None
    checks: Annotated[ChecksSettings, _doc("The asset checks' schedule and limit.")] = Field(
        default_factory=ChecksSettings
    )
    snapshots: Annotated[SnapshotSettings, _doc("The snapshots' schedule and maximum age.")] = Field(
        default_factory=SnapshotSettings
    )

    def build_defs(self, context: ComponentLoadContext) -> Definitions:
        return build_stateful_definitions(self.apps, **self.builder_options())

    def builder_options(self) -> dict[str, Any]:
        """The keyword arguments of `build_stateful_definitions` (besides the apps) this component stands for."""
        return {
            "source_partitions": self.source_partitions,
            "kafka": self.kafka.resource(),
            "state_store": self.state_store.resource(),
            "spark": self.spark.resource() if self.spark is not None else None,
            "worker_every_minutes": self.worker_every_minutes,
            "automation_running": self.automation_running,
            "lag_threshold": self.lag_threshold,
            "restore_threshold": self.restore_threshold,
            "pool_size": self.pool_size,
            "standby_replicas": self.standby_replicas,
            "check_cron": self.checks.check_cron,
            "max_changelog_lag": self.checks.max_changelog_lag,
            "compaction_cron": self.snapshots.compaction_cron,
            "max_snapshot_age_hours": self.snapshots.max_snapshot_age_hours,
        }
