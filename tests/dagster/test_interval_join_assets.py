"""An interval join in Dagster: the joined stream's topic is an asset of its own, read by the app,
upstream of the join's store beside the app's source; so is a foreign-key join's global table (no broker
needed to build the graph)."""

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


def test_a_foreign_key_joins_table_is_an_asset_upstream_of_the_joins_store(tmp_path):
    app = App(name="customer-orders", source="orders", output="joined", stores=["rows"], state_dir=tmp_path)
    app.to_topic(app.dataframe().table_join(app.global_table("customers"), on="customer", how="left"))
    kafka = KafkaResource(bootstrap_servers="127.0.0.1:9")
    defs = build_stateful_definitions(app, 3, kafka, StateStoreResource(state_dir=str(tmp_path)))
    customers = StatefulTranslator().get_topic_key("customers")

    graph = defs.resolve_asset_graph()
    assert set(graph.get(store_key(app, "rows")).parent_keys) == {changelog_key(app, "rows"), customers}
    topic = defs.resolve_assets_def(customers).specs_by_key[customers]
    assert "as a global table by `customer-orders`" in (topic.description or "")
