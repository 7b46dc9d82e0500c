"""The README and the pages under docs/ hang together: every relative link in them points at a file
of the repository (and, with a `#fragment`, at a heading of that page), every page has a title and
is listed in docs/README.md, and the README's set-up section holds exactly the two commands it
promises, `./scripts/run-example` and `./scripts/test`, as its only shell blocks."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
SETUP_COMMANDS = ["./scripts/run-example", "./scripts/test"]
SHELL_LANGUAGES = {"bash", "sh", "shell", "console"}

FENCE = re.compile(r"^\s*(```|~~~)\s*([\w+-]*)")
INLINE_CODE = re.compile(r"`+[^`]*`+")
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # https:, mailto:, ...


def markdown_files() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def prose_lines(text: str, keep_inline_code: bool = False) -> list[str]:
    """The lines outside fenced code blocks, with inline code removed unless kept."""
    lines: list[str] = []
    fence = None
    for line in text.splitlines():
        opened = FENCE.match(line)
        if fence is None and opened:
            fence = opened.group(1)
        elif fence is not None and line.strip().startswith(fence):
            fence = None
        elif fence is None:
            lines.append(line if keep_inline_code else INLINE_CODE.sub("", line))
    return lines


def fenced_blocks(text: str) -> list[tuple[int, str, str]]:
    """(line number of the opening fence, language, content) of every fenced block."""
    blocks: list[tuple[int, str, str]] = []
    body: list[str] = []
    start, language, fence = 0, "", None
    for number, line in enumerate(text.splitlines(), 1):
        opened = FENCE.match(line)
        if fence is None and opened:
            start, fence, language, body = number, opened.group(1), opened.group(2).lower(), []
        elif fence is not None and line.strip().startswith(fence):
            blocks.append((start, language, "\n".join(body).strip()))
            fence = None
        elif fence is not None:
            body.append(line)
    return blocks


def anchors(page: Path) -> set[str]:
    """GitHub's anchors for the page's headings: lower case, punctuation dropped, spaces to hyphens,
    repeated headings numbered."""
    seen: dict[str, int] = {}
    result = set()
    for line in prose_lines(page.read_text(), keep_inline_code=True):
        heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not heading:
            continue
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.group(1))  # a link keeps its text
        slug = re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        result.add(slug if count == 0 else f"{slug}-{count}")
    return result


def test_relative_links_point_at_files_and_headings():
    broken = []
    for page in markdown_files():
        # Inline code is removed first: a link whose text is code keeps its target, `[a](b)` is no link.
        targets = {target for line in prose_lines(page.read_text()) for target in LINK.findall(line)}
        for target in sorted(targets):
            if EXTERNAL.match(target):
                continue
            path_part, _, fragment = target.partition("#")
            resolved = (page.parent / path_part).resolve() if path_part else page
            where = f"{page.relative_to(ROOT)}: ({target})"
            if not resolved.is_relative_to(ROOT):
                broken.append(f"{where} leaves the repository")
            elif not resolved.exists():
                broken.append(f"{where} names no file")
            elif fragment and resolved.suffix == ".md" and fragment not in anchors(resolved):
                broken.append(f"{where} names no heading of {resolved.relative_to(ROOT)}")
    assert not broken, "\n".join(broken)


def test_every_docs_page_has_a_title_and_is_in_the_index():
    index = (DOCS / "README.md").read_text()
    pages = sorted(DOCS.glob("*.md"))
    assert pages, "docs/ holds no page"
    for page in pages:
        assert page.read_text().startswith("# "), f"{page.relative_to(ROOT)} does not open with a title"
        if page.name != "README.md":
            assert f"]({page.name})" in index, f"docs/README.md does not link {page.name}"


def test_readme_has_exactly_the_two_setup_commands():
    text = README.read_text()
    lines = text.splitlines()
    setup_start = next(i for i, line in enumerate(lines, 1) if line.startswith("## Set-up"))
    setup_end = next(
        (i for i, line in enumerate(lines, 1) if i > setup_start and line.startswith("## ")), len(lines) + 1
    )
    shell_blocks = [(start, body) for start, language, body in fenced_blocks(text) if language in SHELL_LANGUAGES]

    assert [body for _, body in shell_blocks] == SETUP_COMMANDS
    assert all(setup_start < start < setup_end for start, _ in shell_blocks), "a set-up command is outside Set-up"
    for command in SETUP_COMMANDS:
        assert (ROOT / command).is_file(), f"{command} does not exist"
