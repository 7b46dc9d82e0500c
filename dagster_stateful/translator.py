"""How the Dagster objects made for a stateful app are named and grouped, and how to choose your own.

Owns `StatefulTranslator`, in the pattern of dagster-dbt's `DagsterDbtTranslator` and
dagster-sling's: `build_stateful_definitions(..., translator=...)` asks it for every asset key and
group, so a subclass can put the assets where a deployment wants them. By default topics are
`kafka/topics/<topic>`, stores `state/<app>/<store>_store` and snapshots
`snapshots/<app>/<store>_snapshot` (so a store and its snapshot tell apart at a glance in the asset
graph, which shows the last part of a key), all in one group per app.
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
        """A Kafka topic's asset (the source topic and the changelogs)."""
        return AssetKey(["kafka", "topics", topic])

    def get_source_key(self, app: App) -> AssetKey:
        return self.get_topic_key(app.source)

    def get_changelog_key(self, app: App, store: str) -> AssetKey:
        return self.get_topic_key(app.changelog_topic(store))

    def get_store_key(self, app: App, store: str) -> AssetKey:
        return AssetKey(["state", app.name, f"{store}_store"])

    def get_snapshot_key(self, app: App, store: str) -> AssetKey:
        return AssetKey(["snapshots", app.name, f"{store}_snapshot"])

    def get_group_name(self, app: App) -> str:
        return python_name(app)


DEFAULT_TRANSLATOR = StatefulTranslator()
