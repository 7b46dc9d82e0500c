"""Recovery: bringing store partitions up to date from the changelog or from snapshots.

`changelog` (replaying a changelog into a store partition, and the processed-offset header the
commit path writes), `snapshots` (the Parquet + manifest snapshot format), `snapshot_load` (a
snapshot or Spark-written SST files ingested into a store), `planner` (which path is fastest, and
why), `restore` (restoring chosen partitions outside a worker) and `verification` (digests).
"""
