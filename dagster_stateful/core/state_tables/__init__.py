"""State as a table: a snapshot decoded as rows, rows encoded back into state, bootstraps and
migrations.

`table` (a snapshot's decoded table), `encoding` (a table as stored rows), `writes` (changelog
writes and snapshot publication for a table), `bootstrap` (a store written from a table, with the
group's offsets) and `migration` (state transformed between snapshots).
"""
