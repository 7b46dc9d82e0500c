"""The YAML schema of `StatefulAppComponent`: its settings' models, and how its `app:` references load.

Owns the models of the resources' settings (`KafkaSettings`, `StateStoreSettings`,
`SparkSettings`) and of the builder's grouped options (`ChecksSettings`, `SnapshotSettings`),
`EnvVarRef` (`{env: NAME}`, which becomes Dagster's `EnvVar`: a secret is accepted only so, never
as text, since a `{{ env.NAME }}` template's value would show in the UI), `schema_doc` (a field's
description in the schema) and `load_app`, which turns `module:attribute` (a module starting with
`.` is relative to the `defs.yaml`'s folder) into the `App` it names, or says what is wrong.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Sequence
from types import ModuleType
from typing import Annotated, Any, overload

from dagster import EnvVar, Model, Resolvable, Resolver
from dagster.components import ResolutionContext
from dagster.components.core.context import RESOLUTION_CONTEXT_STASH_KEY, ComponentDeclLoadContext
from pydantic import Field, field_validator

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
    "load_app",
    "resolve_apps",
    "schema_doc",
]


def schema_doc(description: str) -> Resolver:
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
        schema_doc("Comma-separated host:port list, or `{env: NAME}` (e.g. `{env: KAFKA_BOOTSTRAP_SERVERS}`)."),
    ]
    security_protocol: Annotated[str | EnvVarRef, schema_doc("PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL.")] = (
        "PLAINTEXT"
    )
    sasl_mechanism: Annotated[str | EnvVarRef | None, schema_doc("e.g. PLAIN, SCRAM-SHA-512 (SASL only).")] = None
    sasl_username: Annotated[str | EnvVarRef | None, schema_doc("SASL user name, e.g. `{env: KAFKA_USER}`.")] = None
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
        str | EnvVarRef | None, schema_doc("PEM file of the CA certificates that signed the brokers' (TLS).")
    ] = None
    admin_timeout_seconds: Annotated[
        float, schema_doc("How long Kafka reads and topic changes retry transient errors before a run fails.")
    ] = 30.0
    client_config: Annotated[
        dict[str, str], schema_doc("Further librdkafka settings (no secrets: the UI shows them).")
    ] = Field(default_factory=dict)

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
        schema_doc(
            "Directory of the RocksDB state, e.g. `\"{{ env('DAGSTER_STATEFUL_STATE_DIR', '/var/lib/stateful') }}\"`."
        ),
    ]
    snapshot_root: Annotated[
        str | EnvVarRef | None, schema_doc("Path or URI (file://, s3a://, ...) of the stores' snapshots; unset: none.")
    ] = None

    def resource(self) -> StateStoreResource:
        return StateStoreResource(
            state_dir=_env_or_text(self.state_dir), snapshot_root=_env_or_text(self.snapshot_root)
        )


class SparkSettings(Resolvable, Model):
    """The `spark` resource (`StatefulSparkResource`): how snapshots and Spark restores reach Spark."""

    spark_config: Annotated[
        dict[str, str], schema_doc("Spark settings, e.g. `spark.master: spark://host:7077` (default: local[*]).")
    ] = Field(default_factory=dict)

    def resource(self) -> StatefulSparkResource:
        return StatefulSparkResource(spark_config={"spark.master": "local[*]", **self.spark_config})


class ChecksSettings(Resolvable, Model):
    """When the asset checks run, and how far a store may trail its changelog."""

    check_cron: Annotated[
        str | None, schema_doc("When a sensor evaluates the checks (null: only when launched by hand).")
    ] = "*/10 * * * *"
    max_changelog_lag: Annotated[int, schema_doc("Changelog records a store may be behind before its check fails.")] = (
        100_000
    )


class SnapshotSettings(Resolvable, Model):
    """When Spark snapshots the stores, and how old the newest snapshot may be."""

    compaction_cron: Annotated[str, schema_doc("When the daily compaction job snapshots every store.")] = "0 3 * * *"
    max_snapshot_age_hours: Annotated[float, schema_doc("Age of the newest snapshot at which its check fails.")] = 48.0


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


def resolve_apps(context: ResolutionContext, value: str | Sequence[str]) -> list[App]:
    """The `app:` attribute's resolver: one `module:attribute` or a list of them, each loaded by `load_app`."""
    references = [value] if isinstance(value, str) else list(context.resolve_value(value))
    if not references:
        raise ConfigurationError("`app:` names no App: give one `module:attribute` or a list of them")
    return [load_app(str(reference), context.at_path(index)) for index, reference in enumerate(references)]
