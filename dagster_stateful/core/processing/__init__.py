"""Processing: the steps, and the bounded worker that runs them against Kafka.

`dataframe` (the steps: apply, update, filter, aggregate, windows), `aggregations` (the
aggregators), `windows` (window definitions and their results), `batch` (the hot path), `worker`
(the consume-process-commit loop), `lifecycle` (run limits and the stop signal), `rebalance` (what
happens when partitions are assigned, revoked or lost), `restoring` (partitions restored between
polls), `progress` (lag and transaction markers), `commit` (the commit order that makes a crash
lose nothing), `transactions` (Kafka transactions, for exactly-once) and `bad_input` (the error
policy).
"""
