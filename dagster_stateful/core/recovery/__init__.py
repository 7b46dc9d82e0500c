"""Recovery: bringing store partitions up to date from the changelog or from snapshots.

`changelog` (replaying a changelog into a store partition, step by step, and the processed-offset
header the commit path writes), `uncommitted` (the at-least-once rule for records of uncommitted
messages), `snapshots` (the Parquet + manifest snapshot format), `snapshot_load` (a snapshot or
Spark-written SST files ingested into a store), `planner` (which path is fastest, and why),
`restore` (restoring chosen partitions outside a worker) and `verification` (digests).
"""
