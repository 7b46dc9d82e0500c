"""What runs a stateful app's jobs without a person: its schedules and its sensors (built by factories).

Holds the schedules (a bounded worker every few minutes, the daily compaction: `schedules`), the
sensors (consumer lag, rebalances, snapshot age, and the one that evaluates the asset checks on
their cron: `lag_sensor`, `rebalance_sensor`, `snapshot_sensor`, `checks_sensor`), and what they
share: what a worker schedule or sensor launches and how it sees a worker run in progress
(`worker_target`), and sensor cursors (`cursor`). The builder registers them.
"""

from dagster_stateful.automation.checks_sensor import checks_sensor
from dagster_stateful.automation.lag_sensor import lag_sensor
from dagster_stateful.automation.rebalance_sensor import rebalance_sensor
from dagster_stateful.automation.schedules import compaction_schedule, worker_schedule
from dagster_stateful.automation.snapshot_sensor import snapshot_sensor

__all__ = [
    "checks_sensor",
    "compaction_schedule",
    "lag_sensor",
    "rebalance_sensor",
    "snapshot_sensor",
    "worker_schedule",
]
