"""What RocksDB's files and failures say, read without opening a database.

Owns whether a directory holds a database, and whether a failure RocksDB reported means damaged
files (a corruption status, or a CURRENT file naming a manifest that is gone) or a machine short
of files, memory or disk, which moving the store aside would not mend.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["holds_database", "is_corruption", "is_corruption_status", "is_shortage"]

CORRUPTION_STATUS = "Corruption:"
SHORTAGES = ("Too many open files", "No space left on device", "Cannot allocate memory")
"""What RocksDB's status says when the machine, not the data, is at fault."""


def holds_database(path: Path) -> bool:
    """Whether `path` holds a RocksDB database (an empty partition directory does not)."""
    return (path / "CURRENT").is_file()


def is_corruption_status(error: Exception) -> bool:
    return CORRUPTION_STATUS in str(error)


def is_shortage(error: Exception) -> bool:
    return any(shortage in str(error) for shortage in SHORTAGES)


def is_corruption(path: Path, error: Exception) -> bool:
    """Whether a failure to open the database at `path` means its files are damaged (not merely
    unreadable right now, as with too many open files or a full disk)."""
    return is_corruption_status(error) or _current_names_missing_manifest(path)


def _current_names_missing_manifest(path: Path) -> bool:
    try:
        manifest = (path / "CURRENT").read_text().strip()
    except (OSError, UnicodeDecodeError):
        return False  # no CURRENT is a new database; an unreadable one is not evidence of damage
    return bool(manifest) and not (path / manifest).is_file()
