"""How a finished restore is logged, for people and for log handlers that keep structured fields.

Owns `log_restored` and `RESTORE_REPORT_FIELD`: the log record of each restore's end or suspension
carries its `RestoreReport` as the attribute `restore_report`.
"""

from __future__ import annotations

import logging

from dagster_stateful.core.monitoring.report import RestoreReport

log = logging.getLogger(__name__)

RESTORE_REPORT_FIELD = "restore_report"


def log_restored(
    report: RestoreReport, changelog_topic: str, how: str, gap_at: int | None = None, level: int = logging.INFO
) -> None:
    """Log a finished restore at `level`, with its report attached (`RESTORE_REPORT_FIELD`), and warn
    when it applied records of uncommitted messages (`gap_at`: where compaction left the first gap, if known)."""
    log.log(
        level,
        "Restored store %r partition %d (%s) from %s offsets %d..%d: %d records applied (%d of uncommitted "
        "messages), %d skipped, %.2f s",
        report.store,
        report.partition,
        how,
        changelog_topic,
        report.start_offset,
        report.end_offset,
        report.records_applied,
        report.records_uncommitted_applied,
        report.records_skipped,
        report.seconds,
        extra={RESTORE_REPORT_FIELD: report},
    )
    if report.records_uncommitted_applied:
        where = f"in {changelog_topic}" if gap_at is None else f"from offset {gap_at} of {changelog_topic} on"
        log.warning(
            "Store %r partition %d: applied %d changelog records of uncommitted messages whose committed record "
            "compaction may have removed (%s); the messages they came from will be processed again, so those keys "
            "may count them twice (at-least-once)",
            report.store,
            report.partition,
            report.records_uncommitted_applied,
            where,
        )
