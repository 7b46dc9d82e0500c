"""Sensors of a stateful app: consumer lag and rebalances (built by factories, JSON cursors)."""

from dagster_stateful.sensors.lag import lag_sensor
from dagster_stateful.sensors.rebalance import rebalance_sensor

__all__ = ["lag_sensor", "rebalance_sensor"]
