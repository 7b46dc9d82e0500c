"""The example deployment: the code location `dagster dev` opens (workspace.yaml points here).

It connects to the cluster named by KAFKA_BOOTSTRAP_SERVERS (the README's run command starts a
local broker and sets it). For now it shows the cluster itself; the stateful example app joins it
as the engine lands.
"""

from dagster import Definitions, EnvVar, MaterializeResult, asset

from dagster_stateful.resources import KafkaResource


@asset(description="The Kafka cluster this code location talks to: its brokers and topics.")
def kafka_cluster(kafka: KafkaResource) -> MaterializeResult:
    metadata = kafka.admin_client().list_topics(timeout=15)
    topics = sorted(name for name in metadata.topics if not name.startswith("__"))
    return MaterializeResult(metadata={
        "cluster_id": metadata.cluster_id,
        "brokers": len(metadata.brokers),
        "topic_count": len(topics),
        "topics": ", ".join(topics) or "(none)",
    })


defs = Definitions(
    assets=[kafka_cluster],
    resources={"kafka": KafkaResource(bootstrap_servers=EnvVar("KAFKA_BOOTSTRAP_SERVERS"))},
)
