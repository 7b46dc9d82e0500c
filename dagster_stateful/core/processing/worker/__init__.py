"""The bounded worker: the consume-process-commit loop and what happens around it.

`loop` (the loop), `rebalance` (partitions assigned, revoked or lost), `store_opening` (an
assigned partition's stores opened and their restores chosen), `starting_offsets` (where a
partition starts), `progress` (lag and transaction markers) and `client_settings` (the
worker's own Kafka clients).
"""
