"""The Dagster Component over `build_stateful_definitions`: stateful apps declared in a `defs.yaml`.

Owns `StatefulAppComponent`. A `defs.yaml` names one or more `App` objects by `module:attribute`
(a module starting with `.` is relative to the YAML's folder) and gives the builder's options and
the resources' settings (their models and the loading of the apps: `component_models`); values
that vary by deployment come from the environment, non-secret ones through Dagster's
`{{ env.NAME }}` templates, secrets only as `{env: NAME}` references, which become `EnvVar`s (read
when a run starts, never shown in the UI). The component is thin: `build_defs` calls
`build_stateful_definitions`, which stays the API for Python users. `dg scaffold defs
dagster_stateful.StatefulAppComponent <name>` writes a `defs.yaml` and an app module with one
stateful step (`component_scaffolder`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

from dagster import Component, ComponentLoadContext, Definitions, Model, Resolvable, Resolver
from dagster.components import scaffold_with
from pydantic import ConfigDict, Field

from dagster_stateful.builder import build_stateful_definitions
from dagster_stateful.component_models import (
    ChecksSettings,
    KafkaSettings,
    SnapshotSettings,
    SparkSettings,
    StateStoreSettings,
    resolve_apps,
    schema_doc,
)
from dagster_stateful.component_scaffolder import StatefulAppScaffolder
from dagster_stateful.core.app import App

__all__ = ["StatefulAppComponent"]


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
            resolve_apps,
            model_field_name="app",
            model_field_type=str | list[str],
            description="The App object(s) to run, as `module:attribute` (e.g. `my_project.apps:order_totals`) "
            "or a list of them; a module starting with `.` is relative to this defs.yaml's folder.",
        ),
    ]
    source_partitions: Annotated[
        int | dict[str, int],
        schema_doc("The source topic's partition count, or the count per source topic (a check verifies it)."),
    ]
    kafka: Annotated[KafkaSettings, schema_doc("The `kafka` resource: how to reach the cluster.")]
    state_store: Annotated[
        StateStoreSettings, schema_doc("The `state_store` resource: where state and snapshots live.")
    ]
    spark: Annotated[SparkSettings | None, schema_doc("The `spark` resource (unset: local[*]).")] = None
    worker_every_minutes: Annotated[
        int | None, schema_doc("Run a bounded worker of each app on this schedule (null: no schedule).")
    ] = 5
    automation_running: Annotated[
        bool, schema_doc("Start the schedules and sensors switched on (otherwise a user turns them on in the UI).")
    ] = False
    lag_threshold: Annotated[int, schema_doc("Total lag at which the lag sensor requests a worker run.")] = 1000
    restore_threshold: Annotated[
        int, schema_doc("Changelog records behind at which the rebalance sensor requests a restore.")
    ] = 1000
    pool_size: Annotated[int, schema_doc("Workers per worker run: a pool on one machine, in parallel processes.")] = 1
    standby_replicas: Annotated[
        int | None,
        schema_doc("Standby copies each app's workers keep of other hosts' partitions (null: the app's own setting)."),
    ] = None
    checks: Annotated[ChecksSettings, schema_doc("The asset checks' schedule and limit.")] = Field(
        default_factory=ChecksSettings
    )
    snapshots: Annotated[SnapshotSettings, schema_doc("The snapshots' schedule and maximum age.")] = Field(
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
