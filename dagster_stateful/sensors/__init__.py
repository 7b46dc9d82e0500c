"""Sensors of a stateful app: consumer lag, rebalances and snapshot age (built by factories)."""

from dagster_stateful.sensors.lag import lag_sensor
from dagster_stateful.sensors.rebalance import rebalance_sensor
from dagster_stateful.sensors.snapshot import snapshot_sensor

__all__ = ["lag_sensor", "rebalance_sensor", "snapshot_sensor"]
