"""The local broker's cluster id never reads as a command-line option."""

from __future__ import annotations

import uuid

from dagster_stateful.local_kafka import broker


def test_a_cluster_id_starting_with_a_dash_is_drawn_again(monkeypatch):
    dashed = uuid.UUID(bytes=b"\xf8" + bytes(15))  # base64url of 0xF8... starts with "-"
    plain = uuid.UUID(bytes=bytes(range(16)))
    draws = iter([dashed, plain])
    monkeypatch.setattr(broker.uuid, "uuid4", lambda: next(draws))

    cluster_id = broker.new_cluster_id()

    assert not cluster_id.startswith("-") and len(cluster_id) == 22
    assert cluster_id == "AAECAwQFBgcICQoLDA0ODw"
