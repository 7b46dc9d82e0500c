"""The Quix Streams venv of the side-by-side benchmark: built once per requirements, then reused.

Owns the venv's place and life cycle. Quix Streams 3.28 needs confluent-kafka <2.13 while the
project pins 2.16.1, so Quix runs in a venv of its own, built from `quix/requirements.txt` at
`<cache_root()>/bench/quix-venv-<hash>`, where `<hash>` covers the requirements file and the
Python version (a new interpreter or new pins get a new venv; old ones are left in place).
`quix_python()` returns that venv's python, building the venv first if it is not complete.

A venv is complete once its marker file exists; the marker is written last, after pip and an
import check succeeded. A failed build is deleted (SystemExit with the tail of the failing
command's output); an interrupted one (a directory without a marker) is deleted and redone by the
next call. A build holds a file lock, so concurrent callers wait for one build instead of racing.
The venv is built in place rather than in a temporary directory that is then renamed, because a
venv is not relocatable (pip writes its absolute path into the scripts it installs).

Runs under the project's venv python and uses the standard library only (plus `cache_root`).
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from dagster_stateful.maven import cache_root

log = logging.getLogger(__name__)

REQUIREMENTS = Path(__file__).resolve().parent / "quix" / "requirements.txt"
COMPLETE_MARKER = ".quix-bench-complete"
OUTPUT_TAIL_LINES = 40


def quix_python() -> Path:
    """The python of the Quix venv for the current requirements, built first if it is not complete."""
    venv = venv_dir()
    if not (venv / COMPLETE_MARKER).exists():
        with _locked(venv.parent / ".quix-venv.lock"):
            if not (venv / COMPLETE_MARKER).exists():
                _build(venv)
    return _python_of(venv)


def venv_dir() -> Path:
    """Where the venv for the current requirements file and Python version lives (built or not)."""
    return cache_root() / "bench" / f"quix-venv-{requirements_hash()}"


def requirements_hash() -> str:
    """A short hash of requirements.txt and the Python version (major.minor) that builds the venv."""
    digest = hashlib.sha256(REQUIREMENTS.read_bytes())
    digest.update(f"python{sys.version_info.major}.{sys.version_info.minor}".encode())
    return digest.hexdigest()[:16]


def _python_of(venv: Path) -> Path:
    return venv / "bin" / "python"


@contextmanager
def _locked(lock_file: Path) -> Iterator[None]:
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_file, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _build(venv: Path) -> None:
    if venv.exists():
        log.warning("Deleting the incomplete Quix venv %s (an interrupted build) to build it again", venv)
        shutil.rmtree(venv)
    log.info("Building the Quix Streams venv %s from %s (once; later runs reuse it)", venv, REQUIREMENTS)
    try:
        _create_and_install(venv)
    except BaseException:
        shutil.rmtree(venv, ignore_errors=True)
        raise


def _create_and_install(venv: Path) -> None:
    # -I: isolated mode, so neither the current directory (which may hold this very module) nor
    # PYTHON* variables can shadow the standard library's venv module.
    _run([sys.executable, "-I", "-m", "venv", str(venv)], "creating the venv")
    python = str(_python_of(venv))
    _run(
        [
            python,
            "-m",
            "pip",
            "install",
            "--disable-pip-version-check",
            "--no-input",
            "--requirement",
            str(REQUIREMENTS),
        ],
        f"pip install --requirement {REQUIREMENTS}",
    )
    output = _run(
        [python, "-W", "ignore", "-c", "import quixstreams; print(quixstreams.__version__)"], "importing quixstreams"
    )
    (venv / COMPLETE_MARKER).write_text(REQUIREMENTS.read_text())
    log.info("Quix Streams %s is ready in %s", output.strip().splitlines()[-1], venv)


def _run(command: Sequence[str], what: str) -> str:
    """Run `command` and return its output; on failure stop with the tail of that output."""
    result = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
    if result.returncode != 0:
        tail = "\n".join(result.stdout.splitlines()[-OUTPUT_TAIL_LINES:])
        raise SystemExit(
            f"Building the Quix Streams venv failed while {what} (exit code {result.returncode}).\n"
            f"Command: {' '.join(command)}\n"
            f"Last lines of its output:\n{tail}"
        )
    return result.stdout


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    print(quix_python())
