"""docs/layout.md names every module of the package, in its package's list, and no module that is gone."""

from __future__ import annotations

import re
from pathlib import Path

import dagster_stateful

PACKAGE_ROOT = Path(dagster_stateful.__file__).parent
LAYOUT = PACKAGE_ROOT.parent / "docs" / "layout.md"
HEADING = re.compile(r"^### `(?P<package>[\w/]+)/`$")
ENTRY = re.compile(r"^- `(?P<module>\w+\.py)`: \S")


def listed_modules() -> dict[str, set[str]]:
    """Package path -> the modules its list in the layout names."""
    listed: dict[str, set[str]] = {}
    package = None
    for line in LAYOUT.read_text().splitlines():
        if heading := HEADING.match(line):
            package = heading["package"]
            listed.setdefault(package, set())
        elif (entry := ENTRY.match(line)) and package is not None:
            listed[package].add(entry["module"])
    return listed


def actual_modules() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in PACKAGE_ROOT.rglob("*.py"):
        package = path.parent.relative_to(PACKAGE_ROOT.parent).as_posix()
        modules = found.setdefault(package, set())
        if path.name != "__init__.py":
            modules.add(path.name)
    return found


def test_the_layout_lists_every_package_and_module_and_nothing_else():
    listed, actual = listed_modules(), actual_modules()
    assert sorted(set(actual) - set(listed)) == [], "packages missing from docs/layout.md"
    assert sorted(set(listed) - set(actual)) == [], "packages in docs/layout.md that do not exist"
    missing = {
        package: sorted(actual[package] - listed[package]) for package in actual if actual[package] - listed[package]
    }
    gone = {
        package: sorted(listed[package] - actual[package]) for package in actual if listed[package] - actual[package]
    }
    assert missing == {}, "modules missing from docs/layout.md"
    assert gone == {}, "modules in docs/layout.md that do not exist"
