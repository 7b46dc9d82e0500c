"""Sensors of a stateful app: consumer lag, rebalances and snapshot age (built by factories)."""

from dagster_stateful.automation.lag_sensor import lag_sensor
from dagster_stateful.automation.rebalance_sensor import rebalance_sensor
from dagster_stateful.automation.snapshot_sensor import snapshot_sensor

__all__ = ["lag_sensor", "rebalance_sensor", "snapshot_sensor"]
