"""The at-least-once rule for changelog records of uncommitted messages, as pure logic."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import pytest

from dagster_stateful.core.recovery.uncommitted import UncommittedFilter, encode_processed_offset
from dagster_stateful.core.state.keys import STREAM_TIME_KEY


def classify(
    filter_: UncommittedFilter, records: Sequence[tuple[bytes, bytes | None, int, int]]
) -> dict[bytes, bytes | None]:
    """Apply (key, value, processed offset, changelog offset) records in order; returns what is restored."""
    restored: dict[bytes, bytes | None] = {}
    for key, value, processed, offset in records:
        filter_.note_batch(offset, offset, 1, partial(list, [offset]))
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


def test_with_no_offset_missing_every_uncommitted_record_is_skipped_exactly():
    """Nothing was compacted in the range read: every committed record was applied, so each key's
    committed value is known, including keys with no committed record in the range (the store's)."""
    filter_ = UncommittedFilter(committed_offset=100, restored=None, start=40)
    restored = classify(filter_, [(b"k", b"committed", 99, 40), (b"j", b"uncommitted", 100, 41)])

    assert restored == {b"k": b"committed"}
    assert filter_.skipped == 1 and filter_.applied_uncommitted == 0 and filter_.gap_at is None


def test_only_records_after_a_missing_offset_may_be_applied():
    filter_ = UncommittedFilter(committed_offset=100, restored=None, start=40)
    records = [(b"a", b"a-uncommitted", 100, 40), (b"b", b"b-uncommitted", 101, 45), (b"a", b"a-newer", 102, 46)]
    restored = classify(filter_, records)

    assert filter_.gap_at == 45
    assert restored == {b"b": b"b-uncommitted"}, "a's committed state was known before the gap, b's is not after it"
    assert filter_.applied_uncommitted == 1 and filter_.skipped == 2


def test_a_store_at_the_committed_offset_skips_every_uncommitted_record_whatever_compaction_removed():
    filter_ = UncommittedFilter(committed_offset=100, restored=None, start=40, at_committed=True)
    restored = classify(filter_, [(b"a", b"uncommitted", 100, 47), (b"b", b"uncommitted", 101, 52)])

    assert restored == {} and filter_.skipped == 2 and filter_.gap_at == 47


def test_stream_time_is_never_taken_from_an_uncommitted_record():
    filter_ = UncommittedFilter(committed_offset=100, restored=lambda key: False)
    restored = classify(filter_, [(STREAM_TIME_KEY, b"5000", 120, 9), (b"k", b"uncommitted", 120, 10)])

    assert filter_.gap_at == 9, "a full restore's range starts at 0"
    assert restored == {b"k": b"uncommitted"}, "the key is applied (its committed record may be gone), stream time not"


def test_a_batch_is_checked_whole_when_contiguous_and_offset_by_offset_when_not():
    filter_ = UncommittedFilter(committed_offset=100, restored=None, start=10)
    filter_.note_batch(10, 19, 10, lambda: pytest.fail("a contiguous batch needs no scan"))
    assert filter_.gap_at is None

    filter_.note_batch(20, 30, 10, lambda: [20, 21, 22, 24, 25, 26, 27, 28, 29, 30])
    assert filter_.gap_at == 24
