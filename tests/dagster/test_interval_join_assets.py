"""An interval join in Dagster: the joined stream's topic is an asset of its own, read by the app,
upstream of the join's store beside the app's source (no broker needed to build the graph)."""

from __future__ import annotations

from dagster_stateful.builder import build_stateful_definitions
from dagster_stateful.core import App
from dagster_stateful.naming import changelog_key, source_key, store_key
from dagster_stateful.resources import KafkaResource, StateStoreResource
from dagster_stateful.translator import StatefulTranslator


def test_the_joined_streams_topic_is_an_asset_upstream_of_the_joins_store(tmp_path):
    app = App(name="paid", source="orders", output="paid-orders", stores=["joined"], state_dir=tmp_path)
    app.to_topic(app.dataframe().join_interval(app.stream("payments"), within=60_000, how="left"))
    kafka = KafkaResource(bootstrap_servers="127.0.0.1:9")
    defs = build_stateful_definitions(app, 3, kafka, StateStoreResource(state_dir=str(tmp_path)))
    payments = StatefulTranslator().get_topic_key("payments")

    graph = defs.resolve_asset_graph()
    store = store_key(app, "joined")
    assert set(graph.get(store).parent_keys) == {changelog_key(app, "joined"), payments}
    assert source_key(app) in set(graph.get(changelog_key(app, "joined")).parent_keys)
    topic = defs.resolve_assets_def(payments).specs_by_key[payments]
    assert "as a joined stream by `paid`" in (topic.description or "")
    assert app.config.joined_streams == {"payments": "payments"}
