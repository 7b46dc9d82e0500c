"""Processing: the steps an app declares and the bounded worker that runs them against Kafka.

`lifecycle` (run limits and the stop signal), `dsl/` (the steps), `paths/` (per message and in
columns), `commit/` (the commit path), `restores/` (restores while the worker runs),
`standbys/` (standby replicas) and `worker/` (the loop and rebalances).
"""
