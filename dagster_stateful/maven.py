"""Jars from Maven Central, fetched once into a per-user cache.

Owns the cache layout and the Maven invocation: a bundle (a named set of Maven coordinates) is
resolved by `mvn dependency:copy-dependencies` in a throw-away `pom` project and copied into
`<cache>/<bundle>/lib/`. A bundle is published atomically (built in a temporary directory, then
renamed) and guarded by a file lock, so concurrent callers and interrupted fetches never leave a
half-filled `lib/` behind. Each bundle is its own Maven project because Maven picks one version of
an artifact per project (the broker and Spark's connector want different `kafka-clients`).
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from dagster_stateful.errors import LocalKafkaError

log = logging.getLogger(__name__)

CACHE_ENV = "DAGSTER_STATEFUL_CACHE"
_COMPLETE_MARKER = ".complete"


@dataclass(frozen=True)
class JarBundle:
    """A named set of Maven artifacts that is copied, with its runtime dependencies, into one directory."""

    name: str
    artifacts: Sequence[str]
    """`groupId:artifactId:version` coordinates."""
    include_artifact_ids: Sequence[str] = field(default_factory=tuple)
    """When given, only these artifacts (of the resolved closure) are copied."""
    exclude_group_ids: Sequence[str] = field(default_factory=tuple)


def cache_root() -> Path:
    """The per-user jar cache: `$DAGSTER_STATEFUL_CACHE`, else `$XDG_CACHE_HOME/dagster-stateful`."""
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "dagster-stateful"


def bundle_jars(bundle: JarBundle, cache: Path | None = None) -> list[Path]:
    """Return the bundle's jar paths, fetching them from Maven Central first if they are not cached."""
    lib = (cache or cache_root()) / bundle.name / "lib"
    if not (lib / _COMPLETE_MARKER).exists():
        with locked(lib.parent):
            if not (lib / _COMPLETE_MARKER).exists():
                _fetch(bundle, lib)
    jars = sorted(lib.glob("*.jar"))
    if not jars:
        raise LocalKafkaError(
            f"the jar cache {lib} is marked complete but holds no jars; delete {lib.parent} and retry"
        )
    return jars


@contextmanager
def locked(directory: Path) -> Iterator[None]:
    """Hold `directory`'s lock file (made with the directory if needed) for the block: one builder at a time."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _fetch(bundle: JarBundle, lib: Path) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise LocalKafkaError(
            "Maven (`mvn`) was not found on PATH; it is needed once to fetch "
            f"{', '.join(bundle.artifacts)} from Maven Central into {lib}. "
            "Install Maven (e.g. `apt-get install maven`) or copy the jars there by hand "
            f"and create {lib / _COMPLETE_MARKER}."
        )
    log.info("Fetching %s from Maven Central into %s (once; later runs use the cache)", bundle.name, lib)
    with tempfile.TemporaryDirectory(prefix=f"{bundle.name}-", dir=lib.parent) as work:
        project = Path(work)
        (project / "pom.xml").write_text(_pom(bundle))
        staged = project / "lib"
        command = [
            mvn,
            "-B",
            "-q",
            "-f",
            str(project / "pom.xml"),
            "dependency:copy-dependencies",
            "-DincludeScope=runtime",
            f"-DoutputDirectory={staged}",
        ]
        if bundle.include_artifact_ids:
            command.append("-DincludeArtifactIds=" + ",".join(bundle.include_artifact_ids))
        if bundle.exclude_group_ids:
            command.append("-DexcludeGroupIds=" + ",".join(bundle.exclude_group_ids))
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0 or not any(staged.glob("*.jar")):
            tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-25:])
            raise LocalKafkaError(
                f"Maven could not fetch {', '.join(bundle.artifacts)} (exit {result.returncode}). "
                f"Check that Maven Central (or your settings.xml mirror) is reachable.\n{tail}"
            )
        (staged / _COMPLETE_MARKER).write_text("\n".join(bundle.artifacts) + "\n")
        if lib.exists():
            shutil.rmtree(lib)
        staged.rename(lib)
    log.info("Cached %d jars for %s in %s", len(list(lib.glob("*.jar"))), bundle.name, lib)


def _pom(bundle: JarBundle) -> str:
    dependencies = "\n".join(_dependency_xml(coordinate) for coordinate in bundle.artifacts)
    return f"""<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>dagster-stateful.cache</groupId>
  <artifactId>{bundle.name}</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
{dependencies}
  </dependencies>
</project>
"""


def _dependency_xml(coordinate: str) -> str:
    parts = coordinate.split(":")
    if len(parts) != 3:
        raise ValueError(f"expected groupId:artifactId:version, got {coordinate!r}")
    group, artifact, version = parts
    return (
        f"    <dependency><groupId>{group}</groupId><artifactId>{artifact}</artifactId>"
        f"<version>{version}</version></dependency>"
    )
