"""What `group_by` declares, without a broker: the repartition topic it names, the topics the app
then reads, provisions and needs ACLs for, and the declarations it refuses with what to do."""

from __future__ import annotations

import pytest

from dagster_stateful.core import App, Count, Sum
from dagster_stateful.core.kafka.provisioning import TopicRole
from dagster_stateful.core.kafka.security.acl_model import AclRequirement, Operation, ResourceType
from dagster_stateful.core.kafka.security.acls import required_acls
from dagster_stateful.core.kafka.security.authorization import consuming, producing
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
