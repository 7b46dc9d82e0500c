"""How an asset takes a store's snapshot as an input: the snapshot asset's IO manager.

Owns `state_table_io_manager`, the IO manager (resource key `STATE_TABLE_IO_MANAGER_KEY`) that
every snapshot asset names, so that `@asset(ins={"totals": AssetIn(snapshot_key)})` receives the
latest snapshot of that store as a table (`state_table.read_state_table`). The input's type
annotation picks the engine: a pandas DataFrame, a Spark DataFrame, or (unannotated, or
`pyarrow.Table`) an Arrow table. The snapshot asset writes its own files, so storing an output is
nothing to this IO manager.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dagster import InputContext, IOManager, IOManagerDefinition, OutputContext, io_manager

from dagster_stateful.core.app import App
from dagster_stateful.errors import ConfigurationError
from dagster_stateful.state_table import Engine, read_state_table

__all__ = ["APP_METADATA", "STATE_TABLE_IO_MANAGER_KEY", "STORE_METADATA", "state_table_io_manager"]

STATE_TABLE_IO_MANAGER_KEY = "stateful_state_tables"
APP_METADATA = "dagster_stateful/app"
STORE_METADATA = "dagster_stateful/store"
"""Definition metadata of a snapshot asset: which app's store it snapshots."""


class StateTableLoader(IOManager):
    """Loads a snapshot asset as its store's latest decoded table."""

    def __init__(self, apps: dict[str, App], snapshot_root: str | None) -> None:
        self._apps = apps
        self._snapshot_root = snapshot_root

    def handle_output(self, context: OutputContext, obj: Any) -> None:
        """Nothing to store: a snapshot asset writes its snapshot itself."""

    def load_input(self, context: InputContext) -> Any:
        upstream = context.upstream_output
        metadata = upstream.definition_metadata if upstream is not None else {}
        name, store = metadata.get(APP_METADATA), metadata.get(STORE_METADATA)
        app = self._apps.get(str(name))
        if app is None or store is None:
            raise ConfigurationError(
                f"input {context.name!r} comes from {context.asset_key.to_user_string()}, which is not the snapshot "
                f"asset of a stateful app of this code location (apps: {sorted(self._apps)}); only snapshot assets "
                f"load through the {STATE_TABLE_IO_MANAGER_KEY!r} IO manager"
            )
        engine = engine_for(context.dagster_type.typing_type)
        context.log.info(f"Reading the latest snapshot of store {store!r} of app {app.name!r} as a {engine} table")
        return read_state_table(app, str(store), engine=engine, snapshot_root=self._snapshot_root)


def engine_for(annotation: Any) -> Engine:
    """The engine an input's type annotation asks for (Arrow unless it names pandas or Spark)."""
    module = getattr(annotation, "__module__", "") or ""
    if module.startswith("pandas"):
        return "pandas"
    if module.startswith("pyspark"):
        return "spark"
    return "arrow"


def state_table_io_manager(apps: Sequence[App]) -> IOManagerDefinition:
    by_name = {app.name: app for app in apps}

    @io_manager(
        required_resource_keys={"state_store"},
        description="Loads a store's snapshot asset as its latest decoded table (Arrow, pandas or Spark, as the "
        "input is annotated).",
    )
    def stateful_state_tables(init_context) -> StateTableLoader:
        return StateTableLoader(by_name, init_context.resources.state_store.snapshot_root)

    return stateful_state_tables
