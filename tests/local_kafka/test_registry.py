"""The development Schema Registry (Apicurio, built from Maven Central) as a user of Confluent's
would reach it: confluent-kafka's client and serializers against its Confluent-compatible API. An
Avro record round-trips with its schema id in the wire format, a newer compatible writer's record
is read with the older reader schema, JSON Schema round-trips too, and the schemas outlive a
restart of the registry on the same data directory."""

from __future__ import annotations

import json

from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from dagster_stateful.local_kafka.registry import LocalRegistry

ORDER_V1 = {"type": "record", "name": "Order", "fields": [{"name": "id", "type": "int"}]}
ORDER_V2 = {
    "type": "record",
    "name": "Order",
    "fields": [{"name": "id", "type": "int"}, {"name": "amount", "type": "int", "default": 0}],
}


def test_records_round_trip_through_the_registry_and_its_schemas_outlive_a_restart(tmp_path):
    orders = SerializationContext("orders", MessageField.VALUE)
    with LocalRegistry(tmp_path / "registry") as registry:
        client = SchemaRegistryClient({"url": registry.url})
        first = AvroSerializer(client, json.dumps(ORDER_V1))({"id": 1}, orders)
        assert first[0] == 0, "the wire format's magic byte"
        schema_id = int.from_bytes(first[1:5], "big")
        assert AvroDeserializer(client)(first, orders) == {"id": 1}

        newer = AvroSerializer(client, json.dumps(ORDER_V2))({"id": 2, "amount": 5}, orders)
        assert int.from_bytes(newer[1:5], "big") != schema_id
        assert AvroDeserializer(client, json.dumps(ORDER_V1))(newer, orders) == {"id": 2}, (
            "read with the reader's schema"
        )

        events = SerializationContext("events", MessageField.VALUE)
        event_schema = json.dumps({"type": "object", "properties": {"kind": {"type": "string"}}})
        encoded = JSONSerializer(event_schema, client)({"kind": "paid"}, events)
        assert JSONDeserializer(event_schema, schema_registry_client=client)(encoded, events) == {"kind": "paid"}
        assert sorted(client.get_subjects()) == ["events-value", "orders-value"]

    with LocalRegistry(tmp_path / "registry") as restarted:
        client = SchemaRegistryClient({"url": restarted.url})
        assert sorted(client.get_subjects()) == ["events-value", "orders-value"]
        assert AvroDeserializer(client)(first, orders) == {"id": 1}, "the schema id still resolves"
        assert list(client.get_versions("orders-value")) == [1, 2]
