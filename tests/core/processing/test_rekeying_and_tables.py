"""What `group_by` and global tables declare, without a broker: the repartition topic, the topics the
app then reads, provisions and needs ACLs for, how a join merges a record with its table row, and
the declarations refused with what to do."""

from __future__ import annotations

import orjson
import pytest
from confluent_kafka import KafkaError, Message, TopicPartition

from dagster_stateful.core import App, Count, Sum
from dagster_stateful.core.kafka.clients import KafkaClients
from dagster_stateful.core.kafka.provisioning import TopicRole
from dagster_stateful.core.kafka.security.acl_model import AclRequirement, Operation, ResourceType
from dagster_stateful.core.kafka.security.acls import required_acls
from dagster_stateful.core.kafka.security.authorization import consuming, producing
from dagster_stateful.core.processing.dsl.steps import DROPPED, StepFailed
from dagster_stateful.core.processing.lifecycle import Deadline
from dagster_stateful.core.processing.paths.bad_input import BadInputHandler
from dagster_stateful.core.processing.paths.rekeying import Rekeying, RoutedBatches
from dagster_stateful.core.processing.worker.table_partition import TablePartition
from dagster_stateful.core.processing.worker.tables import MAX_WAITING, PartitionedTables, TaskTables
from dagster_stateful.errors import ConfigurationError


def orders_app(tmp_path, **settings) -> App:
    return App(name="regions", source="orders", stores=["totals"], state_dir=tmp_path, **settings)


def test_group_by_names_the_repartition_topic_that_owns_the_state(tmp_path):
    app = orders_app(tmp_path)
    before = app.config
    assert before.input_topics == ("orders",) and before.task_topic == "orders"

    app.to_topic(app.dataframe().group_by("region").aggregate(Sum("amount")), "region-totals")

    assert app.config.repartition_topic == "regions-region-repartition"
    assert app.config.input_topics == ("orders", "regions-region-repartition")
    assert app.config.task_topic == "regions-region-repartition"
    assert app.config.emits_output and app.config.output == "region-totals"


def test_the_repartition_topic_is_provisioned_purgeable_and_in_the_least_privilege_table(tmp_path):
    app = orders_app(tmp_path, on_error="dead-letter")
    app.dataframe().group_by(lambda order: order["region"], name="by-region", partitions=6).aggregate(Count())

    [spec] = [spec for spec in app.topic_specs() if spec.role is TopicRole.REPARTITION]
    assert (spec.name, spec.partitions) == ("regions-by-region-repartition", 6)
    assert spec.config["cleanup.policy"] == "delete" and spec.config["retention.ms"] == "-1"
    table = set(required_acls(app.config, app.topic_specs()))
    for operation in (Operation.READ, Operation.WRITE, Operation.DELETE):
        assert AclRequirement(ResourceType.TOPIC, spec.name, operation) in table
    assert {*consuming(app.config), *producing(app.config)} <= table


@pytest.mark.parametrize(
    ("declare", "says"),
    [
        (lambda frame: frame.apply(lambda v, state: v, stateful=True).group_by("region"), "Declare group_by before"),
        (lambda frame: frame.group_by("region").group_by("city"), "one group_by per app"),
        (lambda frame: frame.group_by(lambda order: order["region"]), "needs a name"),
        (lambda frame: frame.tumbling_window(1000).aggregate(Count()).final().group_by("region"), "windowed"),
        (lambda frame: frame.group_by("region", partitions=0), "positive partition count"),
        (lambda frame: frame.group_by("a region"), "group_by name"),
    ],
)
def test_declarations_group_by_cannot_keep_are_refused_saying_what_to_do(tmp_path, declare, says):
    app = orders_app(tmp_path)
    with pytest.raises(ConfigurationError, match=says):
        declare(app.dataframe())


def test_steps_before_group_by_are_its_own_and_stateful_steps_may_follow_it(tmp_path):
    app = orders_app(tmp_path)
    frame = app.dataframe().filter(lambda order: order["amount"] > 0).group_by("region")
    assert frame.steps == () and frame.grouping is not None and len(frame.grouping.before) == 1

    frame.apply(lambda order, state: order, stateful=True)

    assert frame.is_stateful and app.config.task_topic == "regions-region-repartition"


def test_a_global_table_is_read_whole_outside_the_group_and_needs_read_and_its_config(tmp_path):
    app = orders_app(tmp_path)
    customers = app.global_table("customers")
    app.dataframe().join(customers, on="customer").group_by("tier").aggregate(Sum("amount"))

    assert app.config.global_tables == {"customers": "customers"}
    assert app.config.input_topics == ("orders", "regions-tier-repartition"), "not part of the group's topics"
    [spec] = [spec for spec in app.topic_specs() if spec.role is TopicRole.GLOBAL_TABLE]
    assert spec.name == "customers" and not spec.managed
    table = set(required_acls(app.config, app.topic_specs()))
    for operation in (Operation.READ, Operation.DESCRIBE_CONFIGS):
        assert AclRequirement(ResourceType.TOPIC, "customers", operation) in table
    assert AclRequirement(ResourceType.TOPIC, "customers", Operation.WRITE) not in table
    assert {*consuming(app.config), *producing(app.config)} <= table


@pytest.mark.parametrize(
    ("declare", "says"),
    [
        (lambda app, table: app.dataframe().join("customers", on="customer"), "App.global_table"),
        (lambda app, table: app.dataframe().join(table, on="customer", how="outer"), "'inner' or 'left'"),
        (lambda app, table: app.dataframe().join(table, on="customer", on_merge="both"), "on_merge"),
        (lambda app, table: app.dataframe().join(table, on=""), "field name or a function"),
        (lambda app, table: app.global_table("customers"), "already has a global table"),
    ],
)
def test_joins_a_table_cannot_serve_are_refused_saying_what_to_do(tmp_path, declare, says):
    app = orders_app(tmp_path)
    table = app.global_table("customers")
    with pytest.raises(ConfigurationError, match=says):
        declare(app, table)


@pytest.mark.parametrize(
    ("how", "on_merge", "order", "expected"),
    [
        ("inner", "raise", {"customer": "c1", "amount": 3}, {"customer": "c1", "amount": 3, "tier": "gold"}),
        ("inner", "raise", {"customer": "c9", "amount": 3}, DROPPED),
        ("left", "raise", {"customer": "c9", "amount": 3}, {"customer": "c9", "amount": 3}),
        ("left", "keep-left", {"customer": "c1", "tier": "mine"}, {"customer": "c1", "tier": "mine"}),
        ("left", "keep-right", {"customer": "c1", "tier": "mine"}, {"customer": "c1", "tier": "gold"}),
        ("left", lambda order, row: (order["customer"], row["tier"]), {"customer": "c1"}, ("c1", "gold")),
    ],
)
def test_a_join_merges_the_record_with_the_tables_latest_row(tmp_path, how, on_merge, order, expected):
    app = orders_app(tmp_path)
    customers = app.global_table("customers")
    rows = {b"c1": orjson.dumps({"tier": "gold"})}
    customers.bind_reader(rows.get)
    frame = app.dataframe().join(customers, on="customer", how=how, on_merge=on_merge)

    assert frame.run(order, {}) == expected


@pytest.mark.parametrize(
    ("order", "says"),
    [({"amount": 3}, "no field 'customer'"), ({"customer": "c1", "tier": "x"}, r"both have fields \['tier'\]")],
)
def test_a_record_a_join_cannot_take_fails_its_step_for_the_error_policy(tmp_path, order, says):
    app = orders_app(tmp_path)
    customers = app.global_table("customers")
    customers.bind_reader({b"c1": orjson.dumps({"tier": "gold"})}.get)
    frame = app.dataframe().join(customers, on="customer")

    with pytest.raises(StepFailed, match=says):
        frame.run(order, {})


class StatePath:
    """The state's path, recording the runs it is given."""

    messages_in_columns = 0

    def __init__(self) -> None:
        self.runs: list[list[tuple[str | None, int | None, bool]]] = []

    def process(self, messages: list[Message], start: int, budget: int) -> tuple[int, int]:
        taken = messages[start : start + budget]
        self.runs.append([(m.topic(), m.offset(), m.error() is not None) for m in taken])
        return start + len(taken), len(taken)


def test_a_batch_of_both_topics_goes_each_run_to_its_path_and_the_source_is_sent_re_keyed(tmp_path):
    app = orders_app(tmp_path, on_error="skip")
    app.dataframe().filter(lambda order: order["amount"] > 0).group_by("region").aggregate(Count())
    grouping = app.dataframe().grouping
    assert grouping is not None
    sent: list[tuple[str, bytes | None, bytes | None, int]] = []
    counts: dict[int, int] = {}
    bad_input = BadInputHandler(app.config.on_error, lambda *record: None, app.dead_letter_topic)
    rekeying = Rekeying(app.config, grouping, bad_input, lambda t, k, v, h, p, ts: sent.append((t, k, v, ts)), counts)
    rekeying.take([TopicPartition("orders", 0, 10)], reset=None)
    state = StatePath()
    repartition = "regions-region-repartition"

    def order(offset: int, value: dict, topic: str = "orders") -> Message:
        return Message(
            topic=topic, partition=0, offset=offset, key=b"c1", value=orjson.dumps(value), timestamp=(1, offset)
        )

    batch = [
        order(10, {"region": "north", "amount": 3}),
        order(11, {"amount": 3}),  # no region: skipped by the error policy
        order(12, {"region": "south", "amount": 0}),  # filtered out before group_by
        order(0, {"region": "north", "amount": 3}, topic=repartition),
        Message(topic="orders", partition=0, offset=13, error=KafkaError(KafkaError._PARTITION_EOF)),
        order(13, {"region": "south", "amount": 5}),
    ]

    index, done = RoutedBatches(rekeying, state).process(batch, 0, 100)

    assert (index, done) == (6, 6)
    assert sent == [
        (repartition, b"north", batch[0].value(), 10),
        (repartition, b"south", batch[5].value(), 13),
    ]
    assert state.runs == [[(repartition, 0, False)], [("orders", 13, True)]]
    assert bad_input.skipped == 1 and counts == {0: 4}, "four source records passed (one by the error policy)"
    assert rekeying.offsets_to_commit() == [TopicPartition("orders", 0, 14)]


def test_records_joining_a_versioned_table_wait_out_their_grace_in_offset_order(tmp_path):
    """Stream time per partition is the newest timestamp read there; a record is released once it
    passes the record's timestamp plus the grace, after every record before it (offset order); a
    roll-back forgets what waits and where stream time was; too many waiting release the oldest."""
    app = App(name="graced", source="orders", stores=["totals"], state_dir=tmp_path)
    profiles = app.table("profiles", history=60_000)
    app.dataframe().join(profiles, grace=1_000)
    tables = PartitionedTables(
        app._dataframe.table_joins.values(),
        app.config,
        KafkaClients({"bootstrap.servers": "127.0.0.1:9"}),
        tmp_path,
        BadInputHandler(app.config.on_error, lambda *_: None, app.config.dead_letter_topic),
        Deadline(None),
    )
    task = TaskTables(tables, 0, [], stream_time=-1)
    tables.tasks[0] = task

    def record(offset: int, timestamp: int) -> Message:
        return Message(topic="orders", partition=0, offset=offset, key=b"c1", value=b"{}", timestamp=(1, timestamp))

    for offset, timestamp in enumerate([5_000, 4_000, 5_500, 5_900]):
        assert tables.hold(record(offset, timestamp))
    assert task.released == [] and tables.first_waiting(0) == 0
    tables.hold(record(4, 6_000))  # stream time 6000: 5000 and the 4000 after it have waited 1 s
    assert [m.offset() for m in task.released] == [0, 1]
    tables.hold(record(5, 7_000))
    assert [m.offset() for m in task.released] == [0, 1, 2, 3, 4]
    assert task.positions_to_commit()["join:stream-time"] == 7_000

    task.roll_back()
    assert task.released == [] and task.stream_time == -1 and tables.first_waiting(0) is None
    assert not tables.hold(Message(topic="orders", partition=9, offset=0, key=b"k", value=b"{}", timestamp=(1, 0)))

    for offset in range(MAX_WAITING + 1):
        tables.hold(record(offset, 10_000))
    assert len(task.waiting) == MAX_WAITING and tables.released_early == 1


def test_the_rows_a_join_reads_follow_the_tables_updates_roll_backs_and_commits(tmp_path):
    """Rows read ahead stay in memory across batches (within a budget), and a join always reads
    the table as the task sees it: what was applied since the commit first, the database's rows
    after a roll-back, the new rows once a commit wrote them."""
    app = orders_app(tmp_path)
    customers = app.table("customers")
    app.dataframe().join(customers, on_merge="keep-right")
    bad_input = BadInputHandler(app.config.on_error, lambda *_: None, app.dead_letter_topic)
    kafka = KafkaClients({"bootstrap.servers": "127.0.0.1:9"})
    tables = PartitionedTables(
        app._dataframe.table_joins.values(), app.config, kafka, tmp_path, bad_input, Deadline(None)
    )
    held = TablePartition(customers, 0, tmp_path / "tables" / "customers" / "0", tables._record)
    held.open(0)
    assert held.database is not None
    held.database.write([(f"c{k}".encode(), orjson.dumps({"tier": f"t{k}"})) for k in range(1, 5)], {})
    held.start_at(4, 0)
    task = TaskTables(tables, 0, [held], stream_time=-1)
    task.by_name[customers.name] = held
    tables.tasks[0] = task

    def tier(key: bytes, timestamp: int = 10) -> str | None:
        tables.before(0, key, timestamp)
        row = customers.row()
        return None if row is None else row["tier"]

    def order(offset: int, key: bytes) -> Message:
        return Message(topic="orders", partition=0, offset=offset, key=key, value=b"{}", timestamp=(1, 10))

    tables.prefetch([order(0, b"c1"), order(1, b"c2"), order(2, b"c9")], 0)
    assert held.rows == {b"c1": b'{"tier":"t1"}', b"c2": b'{"tier":"t2"}', b"c9": None}
    assert (tier(b"c1"), tier(b"c9"), tier(b"c3")) == ("t1", None, "t3"), "a row not read ahead is read alone"

    held.apply(b"c1", orjson.dumps({"tier": "gold"}), 4, 5)
    assert tier(b"c1") == "gold"
    held.roll_back()
    assert tier(b"c1") == "t1"
    held.apply(b"c1", orjson.dumps({"tier": "gold"}), 4, 5)
    held.commit()
    assert b"c1" not in held.rows and tier(b"c1") == "gold"

    held.pending.append(
        Message(topic="customers", partition=0, offset=5, key=b"c2", value=b'{"tier":"x"}', timestamp=(1, 20))
    )
    assert tables.point_at(0) is None, "a table record waits: each order applies what comes before it"
    assert tier(b"c2", 15) == "t2" and tier(b"c2", 20) == "x"
    assert tables.point_at(0) is not None

    held.prefetch([b"c4", b"c2"], 1)  # over its budget: only this batch's rows are kept
    assert set(held.rows) == {b"c2", b"c4"} and (tier(b"c4"), tier(b"c9")) == ("t4", None)
    held.close()
