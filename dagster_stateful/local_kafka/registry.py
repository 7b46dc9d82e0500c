"""A real Schema Registry for development and tests: Apicurio Registry, built from Maven Central.

Owns `LocalRegistry` and the registry's build. Confluent's Schema Registry is not on Maven Central;
Apicurio Registry is, and it speaks the Confluent API under `/apis/ccompat/v7`, so confluent-kafka's
`SchemaRegistryClient` talks to it as to Confluent's (`LocalRegistry.url`). Its application jar
does not start from a plain classpath: `registry_app` builds it once into a runnable Quarkus app
(`quarkus-maven-plugin` `build`, Apicurio 2.4.2 on Quarkus 2.16.4, the two artifacts Maven Central
does not serve left out or pinned) and caches it per user beside the broker's jars, published
atomically under a lock as `maven.bundle_jars` does. Apicurio's POMs name repositories besides
Maven Central: the build runs with a settings file whose only mirror is Maven Central
(`$DAGSTER_STATEFUL_MAVEN_MIRROR` to use another). A registry keeps its schemas in an H2 database
in its data directory, so they outlive a restart; it listens on 127.0.0.1 only.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType

from dagster_stateful.errors import LocalKafkaError, RegistryStartError
from dagster_stateful.local_processes import find_java, free_port, launch
from dagster_stateful.maven import cache_root, locked

log = logging.getLogger(__name__)

APICURIO_VERSION = "2.4.2.Final"
QUARKUS_VERSION = "2.16.4.Final"
MIRROR_ENV = "DAGSTER_STATEFUL_MAVEN_MIRROR"
MAVEN_CENTRAL = "https://repo.maven.apache.org/maven2"
COMPATIBLE_API = "/apis/ccompat/v7"
HOST = "127.0.0.1"
_COMPLETE_MARKER = ".complete"
_RUNNER = "registry-runner.jar"

_POM = f"""<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>dagster-stateful.cache</groupId>
  <artifactId>registry</artifactId>
  <version>1</version>
  <properties><maven.compiler.release>17</maven.compiler.release></properties>
  <dependencyManagement>
    <dependencies>
      <dependency>
        <groupId>io.quarkus</groupId><artifactId>quarkus-bom</artifactId><version>{QUARKUS_VERSION}</version>
        <type>pom</type><scope>import</scope>
      </dependency>
      <dependency>
        <!-- the build-time half of the version Apicurio names is not on Maven Central -->
        <groupId>io.apicurio</groupId><artifactId>apicurio-common-app-components-config-index</artifactId>
        <version>0.1.10.Final</version>
      </dependency>
    </dependencies>
  </dependencyManagement>
  <dependencies>
    <dependency>
      <groupId>io.apicurio</groupId><artifactId>apicurio-registry-app</artifactId><version>{APICURIO_VERSION}</version>
      <exclusions>
        <!-- not on Maven Central -->
        <exclusion><groupId>com.github.everit-org.json-schema</groupId><artifactId>org.everit.json.schema</artifactId></exclusion>
      </exclusions>
    </dependency>
  </dependencies>
  <build>
    <finalName>registry</finalName>
    <plugins>
      <plugin>
        <groupId>io.quarkus</groupId><artifactId>quarkus-maven-plugin</artifactId><version>{QUARKUS_VERSION}</version>
        <executions><execution><goals><goal>build</goal></goals></execution></executions>
      </plugin>
    </plugins>
  </build>
</project>
"""

_BUILD_PROPERTIES = """# Two of Apicurio's jars carry no class index: Quarkus must index them to build the app.
quarkus.index-dependency.registry-app.group-id=io.apicurio
quarkus.index-dependency.registry-app.artifact-id=apicurio-registry-app
quarkus.index-dependency.common-config.group-id=io.apicurio
quarkus.index-dependency.common-config.artifact-id=apicurio-common-app-components-config
"""


def registry_app(cache: Path | None = None) -> Path:
    """The runnable registry's jar (its libraries beside it), built once into the per-user cache."""
    home = (cache or cache_root()) / f"apicurio-registry-{APICURIO_VERSION}"
    app = home / "app"
    if not (app / _COMPLETE_MARKER).exists():
        with locked(home):
            if not (app / _COMPLETE_MARKER).exists():
                _build(app)
    return app / _RUNNER


def _build(app: Path) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise LocalKafkaError(
            f"Maven (`mvn`) was not found on PATH; it is needed once to build Apicurio Registry {APICURIO_VERSION} "
            f"from Maven Central into {app}. Install Maven (e.g. `apt-get install maven`)."
        )
    mirror = os.environ.get(MIRROR_ENV, MAVEN_CENTRAL)
    log.info("Building Apicurio Registry %s from %s into %s (once; about 200 MB)", APICURIO_VERSION, mirror, app)
    with tempfile.TemporaryDirectory(prefix="registry-", dir=app.parent) as work:
        project = Path(work)
        (project / "pom.xml").write_text(_POM)
        (project / "src" / "main" / "resources").mkdir(parents=True)
        (project / "src" / "main" / "resources" / "application.properties").write_text(_BUILD_PROPERTIES)
        settings = project / "settings.xml"
        settings.write_text(
            f"<settings><mirrors><mirror><id>only</id><mirrorOf>*</mirrorOf><url>{mirror}</url></mirror></mirrors>"
            "</settings>"
        )
        command = [mvn, "-B", "-q", "-s", str(settings), "-f", str(project / "pom.xml"), "package", "-DskipTests"]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        target = project / "target"
        runner = target / "registry-runner.jar"
        if result.returncode != 0 or not runner.exists():
            tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-25:])
            raise LocalKafkaError(
                f"Maven could not build Apicurio Registry {APICURIO_VERSION} (exit {result.returncode}); check that "
                f"{mirror} is reachable (${MIRROR_ENV} names another mirror).\n{tail}"
            )
        staged = project / "app"
        staged.mkdir()
        runner.rename(staged / _RUNNER)
        (target / "lib").rename(staged / "lib")
        (staged / _COMPLETE_MARKER).write_text(f"apicurio-registry-app {APICURIO_VERSION}\n")
        if app.exists():
            shutil.rmtree(app)
        staged.rename(app)
    log.info("Built Apicurio Registry %s in %s", APICURIO_VERSION, app)


class LocalRegistry:
    """One Apicurio Registry process on 127.0.0.1, its schemas kept in `data_dir`."""

    def __init__(self, data_dir: Path, port: int | None = None, heap: str = "256m") -> None:
        self.data_dir = Path(data_dir)
        self.port = port or free_port()
        self.heap = heap
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """What confluent-kafka's `SchemaRegistryClient` takes as `url`."""
        return f"http://{HOST}:{self.port}{COMPATIBLE_API}"

    @property
    def log_file(self) -> Path:
        return self.data_dir / "registry.log"

    def start(self, timeout: float = 120.0) -> LocalRegistry:
        """Build the registry if needed, start it, and wait until it answers (or raise `RegistryStartError`)."""
        runner = registry_app()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        command = [
            find_java(),
            f"-Xmx{self.heap}",
            f"-Dquarkus.http.host={HOST}",
            f"-Dquarkus.http.port={self.port}",
            "-jar",
            str(runner),
        ]
        environment = {**os.environ, "REGISTRY_DATASOURCE_URL": f"jdbc:h2:file:{self.data_dir / 'schemas'}"}
        self._process = launch(command, self.log_file, cwd=self.data_dir, env=environment)
        self._wait_until_ready(timeout)
        log.info("Schema Registry (Apicurio %s) answers at %s", APICURIO_VERSION, self.url)
        return self

    def _wait_until_ready(self, timeout: float) -> None:
        assert self._process is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                self._fail(f"the registry process exited with code {self._process.returncode}")
            if _answers(f"{self.url}/subjects"):
                return
            time.sleep(0.2)
        self._fail(f"the registry did not answer at {self.url} within {timeout:.0f} s")

    def _fail(self, reason: str) -> None:
        self.stop()
        lines = self.log_file.read_text(errors="replace").splitlines()[-30:] if self.log_file.exists() else []
        raise RegistryStartError(f"{reason}. Last lines of {self.log_file}:\n" + "\n".join(lines))

    def stop(self, timeout: float = 20.0) -> None:
        """Stop the registry (SIGTERM, then SIGKILL after `timeout`)."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout)

    def __enter__(self) -> LocalRegistry:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2.0) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False
