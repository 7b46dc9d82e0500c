"""The example deployment, a dg project: four stateful apps on one topic of orders, in RocksDB state stores.

`./scripts/run-example` serves it in the Dagster UI (`dg dev`; the location is
`dagster-stateful-example`, as in `workspace.yaml`). `apps` holds the apps, `definitions` loads the
`defs` folder (dg's layout, configured under `[tool.dg]` in pyproject.toml), and the folder holds:
- `order_apps/defs.yaml`, a `StatefulAppComponent` naming the four apps: everything
  `build_stateful_definitions` makes for them (topic and state assets with checks, the provision /
  worker / restore / clear-state jobs, worker schedules and the lag and rebalance sensors), all
  switched on so a newcomer sees data move;
- `generate_orders.py`, a job (scheduled every minute) that writes each customer's tier to the
  compacted `customers` topic, then random orders to the `orders` topic, timestamped over the last
  minute, some of them twice (as a retrying producer would).

Kafka is the cluster named by KAFKA_BOOTSTRAP_SERVERS (on a secured one, with KAFKA_SECURITY_PROTOCOL,
KAFKA_SASL_MECHANISM, KAFKA_SASL_USERNAME, KAFKA_SASL_PASSWORD and KAFKA_SSL_CA_LOCATION, see
docs/security.md); state lives in DAGSTER_STATEFUL_STATE_DIR and
snapshots (built daily by Spark, or from the UI) in DAGSTER_STATEFUL_SNAPSHOT_ROOT.
"""
