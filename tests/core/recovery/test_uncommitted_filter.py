"""The at-least-once rule for changelog records of uncommitted messages, as pure logic."""

from __future__ import annotations

from dagster_stateful.core.recovery.uncommitted import UncommittedFilter, encode_processed_offset


def classify(
    filter_: UncommittedFilter, records: list[tuple[bytes, bytes | None, int, int]]
) -> dict[bytes, bytes | None]:
    """Apply (key, value, processed offset, changelog offset) records in order; returns what is restored."""
    restored: dict[bytes, bytes | None] = {}
    for key, value, processed, offset in records:
        if filter_.is_uncommitted(encode_processed_offset(processed)):
            if not filter_.admit_uncommitted(key, offset):
                continue
        else:
            filter_.admit_committed(key, value)
        restored[key] = value
    return restored


def test_an_uncommitted_record_after_the_keys_committed_one_is_skipped():
    filter_ = UncommittedFilter(committed_offset=100, restored=None)
    restored = classify(filter_, [(b"k", b"committed", 99, 0), (b"k", b"uncommitted", 100, 1)])

    assert restored == {b"k": b"committed"}
    assert filter_.skipped == 1 and filter_.first_uncommitted == 1 and filter_.resume_offset(2) == 1


def test_an_uncommitted_record_whose_committed_one_was_compacted_away_is_applied():
    filter_ = UncommittedFilter(committed_offset=100, restored=None)
    restored = classify(filter_, [(b"other", b"x", 10, 5), (b"k", b"uncommitted", 150, 9), (b"k", b"newer", 160, 10)])

    assert restored == {b"other": b"x", b"k": b"newer"}, "never lose a key: apply (at-least-once may double)"
    assert filter_.applied_uncommitted == 1 and filter_.skipped == 0 and filter_.resume_offset(11) == 9


def test_a_full_restore_asks_the_store_whether_a_committed_record_was_restored():
    in_store = {b"k"}
    filter_ = UncommittedFilter(committed_offset=100, restored=in_store.__contains__)
    restored = classify(filter_, [(b"k", b"uncommitted", 120, 7), (b"j", b"uncommitted", 120, 8)])

    assert restored == {b"j": b"uncommitted"}
    assert filter_.skipped == 1 and filter_.applied_uncommitted == 1


def test_a_committed_delete_counts_as_the_keys_committed_state_in_a_full_restore():
    filter_ = UncommittedFilter(committed_offset=100, restored=lambda key: False)
    restored = classify(filter_, [(b"k", None, 50, 3), (b"k", b"uncommitted", 120, 7)])

    assert restored == {b"k": None}


def test_with_nothing_committed_every_record_is_skipped():
    filter_ = UncommittedFilter(committed_offset=None, restored=None)
    restored = classify(filter_, [(b"k", b"v", 0, 0), (b"j", b"w", 5, 1)])

    assert restored == {} and filter_.skipped == 2 and filter_.resume_offset(2) == 0


def test_records_without_the_header_count_as_committed():
    filter_ = UncommittedFilter(committed_offset=100, restored=None)

    assert not filter_.is_uncommitted(None)
    assert filter_.resume_offset(40) == 40
