"""Reading one key from the freshest copy of its partition that this machine holds (Kafka Streams'
interactive queries with stale stores enabled).

Owns `StateCopy`, `KeyRead` and `read_key`. The copies of a key's partition are found through the
group's description (`KeyLocation`): the active owner's and the standbys' state directories, known
from their client ids (`<app>@<host>:<state directory>`) when they run on this host, and this app's
own state directory (a stopped worker's copy, or one the rebalance sensor keeps warm), and those
of the group's other members on this host (a copy left by an earlier assignment). Each copy is
as fresh as its checkpointed changelog position: the answer comes from the copy the fewest
changelog records behind, the active one on a tie, so a read during the active copy's restore, or
after its owner is gone, is answered by a standby that says so and how far behind it is.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dagster_stateful.core.config import AppConfig
from dagster_stateful.core.kafka.clients import KafkaClients
from dagster_stateful.core.kafka.descriptions import GroupMember
from dagster_stateful.core.queries.key_location import KeyLocation, member_name
from dagster_stateful.core.state.decoding import StateEntry, WindowEntry
from dagster_stateful.core.state.directory import StateDirectory
from dagster_stateful.core.state.query import StoreReader
from dagster_stateful.core.state.rocksdb_files import holds_database
from dagster_stateful.errors import ConfigurationError

ACTIVE = "active"
STANDBY = "standby"
OLDER = "older"
"""A copy that no member keeps now: left by an earlier assignment in a member's state directory, or
in this app's own (a stopped worker's, or one the rebalance sensor keeps warm)."""
_ROLE_ORDER = {ACTIVE: 0, STANDBY: 1, OLDER: 2}

ReaderFactory = Callable[[StateDirectory, list[int]], StoreReader]
"""Opens a reader of the store's chosen partitions in a state directory."""


@dataclass(frozen=True)
class StateCopy:
    """One copy of a store partition on this machine."""

    role: str
    """`active`, `standby` or `older` (a copy no member keeps now)."""
    member: GroupMember | None
    root: Path
    changelog_offset: int | None
    """The changelog position the copy has applied up to (its checkpoint)."""
    behind: int
    """Changelog records the copy has not applied yet."""

    def describe(self) -> str:
        who = f" of {member_name(self.member)}" if self.member is not None else ""
        return f"the {self.role} copy{who} in {self.root} ({self.behind} changelog records behind)"


@dataclass(frozen=True)
class KeyRead:
    """What a key's state is, and which copy said so."""

    location: KeyLocation
    answered_by: StateCopy
    copies: tuple[StateCopy, ...]
    """Every copy of the partition this machine holds, freshest first."""
    entries: tuple[StateEntry | WindowEntry, ...]

    @property
    def from_standby(self) -> bool:
        return self.answered_by.role != ACTIVE

    def describe(self) -> str:
        return f"{self.location.describe()}; answered by {self.answered_by.describe()}"


def member_state_root(member: GroupMember, app_name: str) -> Path | None:
    """The state directory a member works on when it runs on this host (from its client id); None
    when it runs elsewhere or is no worker of this app."""
    return client_state_root(member.client_id, app_name)


def client_state_root(client_id: str, app_name: str) -> Path | None:
    """The state directory named by a worker's client id (`<app>@<host>:<state directory>`) when it is
    on this host; None otherwise."""
    prefix = f"{app_name}@"
    if not client_id.startswith(prefix):
        return None
    host, separator, root = client_id[len(prefix) :].partition(":")
    if not separator or host != socket.gethostname():
        return None
    return Path(root)


def copy_behind(config: AppConfig, root: Path, store: str, partition: int, changelog: tuple[int, int]) -> int | None:
    """Changelog records the copy of `store` `partition` under `root` has not applied (`changelog`: the
    partition's low and high watermarks); None when there is no copy there."""
    held, position = copy_position(config, root, store, partition)
    return _behind(position, changelog) if held else None


def copy_position(config: AppConfig, root: Path, store: str, partition: int) -> tuple[bool, int | None]:
    """Whether `root` holds a copy of `store` `partition`, and the changelog position it has applied
    (from its checkpoint; None before its first one)."""
    directory = StateDirectory(root, config)
    if not holds_database(directory.partition_path(store, partition)):
        return False, None
    checkpoint = directory.read_checkpoint(store, partition)
    return True, checkpoint.changelog_offset if checkpoint else None


def _behind(position: int | None, changelog: tuple[int, int]) -> int:
    low, high = changelog
    return max(high - (low if position is None else position), 0)


def read_key(
    config: AppConfig, kafka: KafkaClients, own_root: Path, location: KeyLocation, reader_of: ReaderFactory
) -> KeyRead:
    """`location.key`'s entries in `location.store`, from the freshest copy of its partition here."""
    copies = _copies(config, kafka, own_root, location)
    if not copies:
        raise ConfigurationError(
            f"no copy of store {location.store!r} partition {location.partition} is on this host "
            f"({socket.gethostname()}); {location.describe()}: read it where one of those members runs"
        )
    answering = copies[0]
    directory = StateDirectory(answering.root, config)
    with reader_of(directory, [location.partition]) as reader:
        found = reader.windows(location.key) if reader.is_window_store else reader.items(location.key)
        entries: tuple[StateEntry | WindowEntry, ...] = tuple(found)
    return KeyRead(location, answering, tuple(copies), entries)


def _copies(config: AppConfig, kafka: KafkaClients, own_root: Path, location: KeyLocation) -> list[StateCopy]:
    roles = [(ACTIVE, location.active)] if location.active is not None else []
    roles += [(STANDBY, member) for member in location.standbys]
    roles += [(OLDER, member) for member in location.members if member not in {m for _, m in roles}]
    candidates: list[tuple[str, GroupMember | None, Path | None]] = [
        (role, member, member_state_root(member, config.name)) for role, member in roles
    ]
    candidates.append((OLDER, None, own_root))
    topic = config.changelog_topic(location.store)
    marks = kafka.watermarks(topic, [location.partition])[location.partition]
    copies: dict[Path, StateCopy] = {}
    for role, member, root in candidates:
        if root is None or root.resolve() in copies:
            continue  # a member on another host, or a directory already seen
        held, position = copy_position(config, root, location.store, location.partition)
        if held:
            copies[root.resolve()] = StateCopy(role, member, root, position, _behind(position, marks))
    return sorted(copies.values(), key=lambda copy: (copy.behind, _ROLE_ORDER[copy.role]))


__all__ = [
    "ACTIVE",
    "OLDER",
    "STANDBY",
    "KeyRead",
    "ReaderFactory",
    "StateCopy",
    "client_state_root",
    "copy_behind",
    "copy_position",
    "member_state_root",
    "read_key",
]
