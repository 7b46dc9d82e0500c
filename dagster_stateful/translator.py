"""How the Dagster objects made for a stateful app are named and grouped, and how to choose your own.

Owns `StatefulTranslator`, in the pattern of dagster-dbt's `DagsterDbtTranslator` and
dagster-sling's: `build_stateful_definitions(..., translator=...)` asks it for every asset key and
group, so a subclass can put the assets where a deployment wants them. By default a source topic
is `kafka/<topic>` in the group `kafka` (several apps may read it: it belongs to none of them), and
an app's own assets are `<app>/<store>_changelog`, `<app>/<store>_store` and
`<app>/<store>_snapshot` (and, when it re-keys, `<app>/<name>_repartition`; for a partitioned
table, `<app>/<table>_table` and `<app>/<table>_table_snapshot`) in one group per app:
short enough for the catalog's width, and told apart at a glance in the asset graph, which shows
the last part of a key.
"""

from __future__ import annotations

import re

from dagster import AssetKey

from dagster_stateful.core.app import App

__all__ = ["DEFAULT_TRANSLATOR", "StatefulTranslator", "python_name"]


def python_name(app: App) -> str:
    """The app's name as Dagster allows object names: letters, digits and underscores."""
    return re.sub(r"[^A-Za-z0-9_]", "_", app.name)


class StatefulTranslator:
    """Asset keys and groups of a stateful app's definitions; override any method."""

    def get_topic_key(self, topic: str) -> AssetKey:
        """A source topic's asset (every app reading the topic shares it)."""
        return AssetKey(["kafka", topic])

    def get_topic_group_name(self, topic: str) -> str:
        """The group of a source topic's asset."""
        return "kafka"

    def get_source_key(self, app: App) -> AssetKey:
        return self.get_topic_key(app.source)

    def get_repartition_key(self, app: App) -> AssetKey:
        """The repartition topic of an app that re-keys (`group_by`)."""
        repartition = app.config.repartition
        if repartition is None:
            raise ValueError(f"app {app.name!r} does not re-key its records: it has no repartition topic")
        return AssetKey([python_name(app), f"{repartition.name}_repartition"])

    def get_changelog_key(self, app: App, store: str) -> AssetKey:
        return AssetKey([python_name(app), f"{store}_changelog"])

    def get_store_key(self, app: App, store: str) -> AssetKey:
        return AssetKey([python_name(app), f"{store}_store"])

    def get_table_store_key(self, app: App, table: str) -> AssetKey:
        """A partitioned table's store (`App.table`), kept beside the stores of the app."""
        return AssetKey([python_name(app), f"{table}_table"])

    def get_snapshot_key(self, app: App, store: str) -> AssetKey:
        return AssetKey([python_name(app), f"{store}_snapshot"])

    def get_table_snapshot_key(self, app: App, table: str) -> AssetKey:
        """The snapshot of a partitioned table's store, beside the table's store asset."""
        return AssetKey([python_name(app), f"{table}_table_snapshot"])

    def get_group_name(self, app: App) -> str:
        return python_name(app)


DEFAULT_TRANSLATOR = StatefulTranslator()
