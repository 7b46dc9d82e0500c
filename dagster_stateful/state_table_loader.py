"""How an asset takes a store's snapshot as an input: the snapshot assets' IO manager.

Owns `state_table_io_manager`: with it, `@asset(ins={"totals": AssetIn(snapshot_key)})` receives
the latest snapshot of that store as a table (`state_table.read_state_table`; a partitioned table's
snapshot asset, `table_snapshot_key`: `state_table.read_table_state`), in the engine the
input's annotation names (a pandas or Spark DataFrame; Arrow otherwise). The snapshot assets carry
it themselves, under the app's key `state_table_io_manager_key(app)`, so no caller supplies it.
Storing an output is nothing to it: a snapshot asset writes its own files.
"""

from __future__ import annotations

from typing import Any

from dagster import InputContext, IOManager, IOManagerDefinition, OutputContext, io_manager

from dagster_stateful.core.app import App
from dagster_stateful.errors import ConfigurationError
from dagster_stateful.naming import job_name
from dagster_stateful.state_table import Engine, read_state_table, read_table_state

__all__ = [
    "APP_METADATA",
    "STORE_METADATA",
    "TABLE_METADATA",
    "state_table_io_manager",
    "state_table_io_manager_key",
]

APP_METADATA = "dagster_stateful/app"
STORE_METADATA = "dagster_stateful/store"
TABLE_METADATA = "dagster_stateful/table"
"""Definition metadata of a snapshot asset: which app's store (or partitioned table) it snapshots."""


def state_table_io_manager_key(app: App) -> str:
    """The resource key of the IO manager of `app`'s snapshot assets."""
    return job_name(app, "state_tables")


class StateTableLoader(IOManager):
    """Loads a snapshot asset of one app as its store's latest decoded table."""

    def __init__(self, app: App, snapshot_root: str | None) -> None:
        self._app = app
        self._snapshot_root = snapshot_root

    def handle_output(self, context: OutputContext, obj: Any) -> None:
        """Nothing to store: a snapshot asset writes its snapshot itself."""

    def load_input(self, context: InputContext) -> Any:
        upstream = context.upstream_output
        metadata = upstream.definition_metadata if upstream is not None else {}
        name, store, table = metadata.get(APP_METADATA), metadata.get(STORE_METADATA), metadata.get(TABLE_METADATA)
        app = self._app
        if name != app.name or (store is None and table is None):
            raise ConfigurationError(
                f"input {context.name!r} comes from {context.asset_key.to_user_string()}, which is not a snapshot "
                f"asset of app {app.name!r}; only those load through {state_table_io_manager_key(app)!r}"
            )
        engine = engine_for(context.dagster_type.typing_type)
        what = f"store {store!r}" if table is None else f"table {table!r}"
        context.log.info(f"Reading the latest snapshot of {what} of app {app.name!r} as a {engine} table")
        if table is not None:
            return read_table_state(app, str(table), engine=engine, snapshot_root=self._snapshot_root)
        return read_state_table(app, str(store), engine=engine, snapshot_root=self._snapshot_root)


def engine_for(annotation: Any) -> Engine:
    """The engine an input's type annotation asks for (Arrow unless it names pandas or Spark)."""
    module = getattr(annotation, "__module__", "") or ""
    if module.startswith("pandas"):
        return "pandas"
    if module.startswith("pyspark"):
        return "spark"
    return "arrow"


def state_table_io_manager(app: App) -> IOManagerDefinition:
    @io_manager(
        required_resource_keys={"state_store"},
        description="Loads a store's snapshot asset as its latest decoded table (Arrow, pandas or Spark, as the "
        "input is annotated).",
    )
    def stateful_state_tables(init_context) -> StateTableLoader:
        return StateTableLoader(app, init_context.resources.state_store.snapshot_root)

    return stateful_state_tables
