"""What a bounded worker run did: the report it returns.

Owns `RestoreReport` (one store partition's restore) and `WorkerReport` (messages processed and
offsets committed per partition, restores, rebalances, bad messages, lag left, why it stopped, the
stores' metrics and how long commits took), both plain data.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from dagster_stateful.core.state.latency import Latency
from dagster_stateful.core.state.metrics import ALL_STORES, StoreMetrics


class RestoreKind(StrEnum):
    """How a store partition's restore began."""

    FULL = "full"
    """No local state: the whole changelog was replayed."""
    PARTIAL = "partial"
    """Only the changelog tail after the local state's position was replayed."""
    SNAPSHOT = "snapshot"
    """A snapshot was loaded locally through SST files."""
    SPARK = "spark"
    """Spark wrote SST files from a snapshot, which were ingested."""
    STANDBY = "standby"
    """The store was this worker's standby replica: only the tail since its position was replayed."""


class StopReason(StrEnum):
    """Why a bounded worker run ended."""

    NOT_STOPPED = ""
    CAUGHT_UP = "caught_up"
    MAX_MESSAGES = "max_messages"
    MAX_SECONDS = "max_seconds"
    STOP_REQUESTED = "stop requested (SIGTERM)"
    NO_PARTITIONS = "no partitions assigned"


@dataclass
class RestoreReport:
    store: str
    partition: int
    kind: RestoreKind
    start_offset: int
    end_offset: int
    records_applied: int = 0
    records_skipped: int = 0
    """Records of uncommitted messages left out: the key's committed record was restored (they will be
    processed again)."""
    records_uncommitted_applied: int = 0
    """Records of uncommitted messages applied because the key's committed record was compacted away
    (at-least-once: their messages may count twice)."""
    seconds: float = 0.0
    completed: bool = True
    """False when the restore was suspended (revocation, shutdown); the next owner continues it."""
    records_below_committed_end: int = 0
    """Records taken without reading their header: below the changelog end that the group's last
    commit recorded as holding only records of committed messages (`processing.commit_metadata`)."""
    uncommitted_processed_up_to: int | None = None
    """The highest source offset among the records of uncommitted messages read (None: none read)."""
    bare_uncommitted_read: bool = False
    """Whether records of uncommitted messages without headers were read (their source offsets are not known)."""


@dataclass
class WorkerReport:
    app: str
    processing_guarantee: str = "at-least-once"
    """The guarantee this run gave: "at-least-once" or "exactly-once"."""
    stop_reason: StopReason = StopReason.NOT_STOPPED
    messages_processed: dict[int, int] = field(default_factory=dict)
    committed_offsets: dict[int, int] = field(default_factory=dict)
    restores: list[RestoreReport] = field(default_factory=list)
    rebalances: int = 0
    stores_recovered: int = 0
    """Store partitions found damaged while processing, moved aside and restored from their changelog."""
    partitions_lost: int = 0
    """Partitions the group took away without a revocation (this worker was evicted or cut off)."""
    skipped: int = 0
    dead_lettered: int = 0
    late: int = 0
    """Messages that arrived after every window they belong to had closed (dead-lettered ones included)."""
    timers_fired: int = 0
    """Timers whose `on_timer` function ran (again after a roll-back, where a firing is redone)."""
    stream_records_joined: int = 0
    """Records of an interval join's joined stream processed (again after a roll-back too)."""
    windows_closed_idle: int = 0
    """Windows (or sessions) closed because their partition was idle (`final(advance_when_idle=...)`)."""
    messages_in_columns: int = 0
    """Messages a columnar aggregation folded a batch at a time (the others went message by message)."""
    transactions_aborted: int = 0
    """Exactly-once: transactions Kafka aborted; each one's messages were processed again."""
    cache_bytes_peak: int = 0
    """The most bytes the record caches held, checked after each consumed batch (see `cache_max_bytes`)."""
    cache_commits: int = 0
    """Commits made early because uncommitted state changes filled the record cache (`cache_max_bytes`)."""
    lag: dict[int, int] = field(default_factory=dict)
    """Messages left per partition of the topic that owns the state (the source, or the repartition topic)."""
    rekeyed: dict[int, int] = field(default_factory=dict)
    """A re-keying app: source messages sent on to the repartition topic (or passed by the error
    policy), per source partition."""
    table_records_applied: int = 0
    """Records of the partitioned tables applied (again, after a roll-back) in this run."""
    upstream_lag: dict[int, int] = field(default_factory=dict)
    """A re-keying app: messages left per source partition."""
    seconds: float = 0.0
    store_metrics: dict[str, StoreMetrics] = field(default_factory=dict)
    """Per store, over the partitions this run committed (see `state.metrics.StoreMetrics`)."""
    partition_store_metrics: dict[tuple[str, int], StoreMetrics] = field(default_factory=dict)
    """The same per (store, partition)."""
    store_totals: StoreMetrics = field(default_factory=lambda: StoreMetrics(ALL_STORES))
    """The same over every store (percentiles over all their timed calls)."""
    commit_latency: Latency = field(default_factory=Latency)
    """How long this run's commits took, each from its start to its stores' writes."""
    standby_records: dict[int, int] = field(default_factory=dict)
    """Partition -> changelog records this run's standby replicas of it applied (`num_standby_replicas`)."""
    standby_holders: dict[int, list[str]] = field(default_factory=dict)
    """Partition -> the client ids of the members keeping its standbys, in failover order, as of the
    last stable membership the run read (`num_standby_replicas`)."""

    @property
    def total_processed(self) -> int:
        return sum(self.messages_processed.values())

    @property
    def total_lag(self) -> int:
        return sum(self.lag.values()) + sum(self.upstream_lag.values())

    @property
    def outcome(self) -> str:
        """How the run ended, in one line for the log."""
        return (
            f"{self.stop_reason}, {self.processing_guarantee}: {self.total_processed} messages, lag left "
            f"{self.total_lag}, {self.rebalances} rebalances, {self.timers_fired} timers fired, {self.seconds:.1f} s"
        )
