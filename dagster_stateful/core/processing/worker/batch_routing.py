"""Which path a worker's consumed records take, assembled once per run.

Owns `worker_path`: the task's records go per message (`BatchProcessor`) or in columns (`choose_path`),
through a versioned table join's grace first when the app has one (`join_grace.GracefulBatches`),
and a re-keying app's source records go to its re-keying instead (`rekeying.RoutedBatches`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from dagster_stateful.core.config import AppConfig
from dagster_stateful.core.kafka.clients import KafkaClients
from dagster_stateful.core.processing.dsl.dataframe import StreamingDataFrame
from dagster_stateful.core.processing.lifecycle import Deadline
from dagster_stateful.core.processing.paths.bad_input import BadInputHandler
from dagster_stateful.core.processing.paths.batch import BatchProcessor
from dagster_stateful.core.processing.paths.batch_path import choose_path
from dagster_stateful.core.processing.paths.rekeying import BatchPath, Rekeying, RoutedBatches
from dagster_stateful.core.processing.worker.join_grace import GracefulBatches
from dagster_stateful.core.processing.worker.tables import PartitionedTables


def worker_path(
    config: AppConfig,
    dataframe: StreamingDataFrame,
    per_message: Callable[[PartitionedTables | None], BatchProcessor],
    consume_batch: int,
    tables: PartitionedTables,
    rekeying: Rekeying | None,
) -> tuple[BatchPath, int]:
    """The path of every consumed record, and how many records to consume at a time.
    per_message: the per-message processor, given the tables its steps join with."""
    chosen, batch = choose_path(config, dataframe, per_message(tables or None), consume_batch)
    state_path: BatchPath = GracefulBatches(tables, chosen) if tables.grace_ms else chosen
    return (state_path if rekeying is None else RoutedBatches(rekeying, state_path)), batch


def partitioned_tables(
    dataframe: StreamingDataFrame,
    config: AppConfig,
    kafka: KafkaClients,
    app_dir: Path,
    bad_input: BadInputHandler,
    deadline: Deadline,
) -> tuple[PartitionedTables, PartitionedTables]:
    """The tables joined with the task's records, and those joined before `group_by` (with the source's)."""
    parts = (config, kafka, app_dir, bad_input, deadline)
    return (
        PartitionedTables(dataframe.table_joins.values(), *parts),
        PartitionedTables(dataframe.source_table_joins.values(), *parts, config.source),
    )
