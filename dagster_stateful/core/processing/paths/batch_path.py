"""Which batch processor a worker runs: the per-message one, or the columnar one when its app allows it.

Owns `choose_path`. The columnar path (`vectorized`) stands on NumPy and Arrow, which take about
50 MiB and a quarter of a second to import: they load when an app declares a columnar aggregation
(`StreamingDataFrame`) and are imported here only when a worker takes that path, so a worker of any
other app (and the processes that restore for it) never loads them.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from dagster_stateful.core.config import AppConfig
from dagster_stateful.core.processing.dsl.dataframe import StreamingDataFrame
from dagster_stateful.core.processing.paths.batch import BatchProcessor
from dagster_stateful.core.state.serialization import BytesSerde, JsonSerde, StrSerde

if TYPE_CHECKING:
    from dagster_stateful.core.processing.paths.vectorized import VectorizedBatchProcessor

log = logging.getLogger(__name__)

__all__ = ["can_vectorize", "choose_path"]


def choose_path(
    config: AppConfig, dataframe: StreamingDataFrame, per_message: BatchProcessor, consume_batch: int
) -> tuple[BatchProcessor | VectorizedBatchProcessor, int]:
    """The worker's batch processor and how many messages it consumes at a time: the columnar path
    when the app allows it (see `vectorized`), else `per_message` itself."""
    aggregation = dataframe.vectorized
    if aggregation is None or not can_vectorize(config):
        return per_message, consume_batch
    from dagster_stateful.core.processing.paths.columns import warm_up
    from dagster_stateful.core.processing.paths.vectorized import VECTORIZED_CONSUME_BATCH, VectorizedBatchProcessor

    log.info(
        "Worker of %r folds its %s%s aggregation a batch at a time, in columns",
        config.name,
        "" if aggregation.windows is None else f"{aggregation.windows.kind} window ",
        aggregation.aggregator.name,
    )
    warm_up()
    return VectorizedBatchProcessor(config, aggregation, per_message), VECTORIZED_CONSUME_BATCH


def can_vectorize(config: AppConfig) -> bool:
    """Whether the app's serdes let the columnar path decode its messages: JSON values, and keys
    that are bytes or UTF-8 text."""
    return type(config.value_serde) is JsonSerde and type(config.key_serde) in (BytesSerde, StrSerde)
