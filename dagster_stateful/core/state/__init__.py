"""Local state: where it lives, how it is stored, and what a step sees of it.

`directory` (the on-disk layout, locks, listing, wiping, corrupt copies; it builds every store
partition), `partition` (one RocksDB per store and Kafka partition, with its offsets), `rocksdb`
(the only module that touches rocksdict; SST files), `stores` (what an app declares per store),
`transaction` (a partition's uncommitted work between commits), `cache` (the record cache), the
views a step gets: `kv` (`State`), `ttl` (expiring key-value state), `live` and `windows` (the
state of keyed and windowed aggregations); `serialization`, `keys` (message-key scoping), `locks`
and `checkpoint` (the `.checkpoint` file other processes read).
"""
