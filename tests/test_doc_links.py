"""Every link into the docs resolves: the file exists, and an anchor names one of its headings.

Checked: relative Markdown links in README.md and docs/*.md, and every ``docs/<file>.md`` or
``docs/<file>.md#anchor`` written in src/, tests/ and bench/ (docstrings, comments, messages,
bundled TOML). Anchors are GitHub's: the heading in lowercase, punctuation dropped except '-' and
'_', spaces turned into '-', and a repeated heading numbered -1, -2, ...
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

MD_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
# "docs" and "/" kept apart so this file's own text holds no reference of the form it checks.
CODE_REF = re.compile("docs" + r"/([A-Za-z0-9_.-]+\.md)(?:#([A-Za-z0-9_-]+))?")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^ {0,3}(```|~~~)")


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _outside_fences(text: str) -> list[str]:
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


@cache
def anchors(path: Path) -> frozenset[str]:
    """Every anchor the headings of a Markdown file produce."""
    seen: dict[str, int] = {}
    out = set()
    for line in _outside_fences(path.read_text(encoding="utf-8")):
        match = HEADING.match(line)
        if not match:
            continue
        base = anchor(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.add(base if count == 0 else f"{base}-{count}")
    return frozenset(out)


def broken(target: Path, fragment: str | None) -> str | None:
    """Why a link to ``target`` (and ``#fragment``) does not resolve, or None."""
    name = target.relative_to(ROOT) if target.is_relative_to(ROOT) else target
    if not target.exists():
        return f"{name} does not exist"
    if fragment and target.suffix == ".md" and fragment not in anchors(target):
        return f"{name} has no heading with anchor #{fragment}"
    return None


def markdown_problems(path: Path) -> list[str]:
    """Broken relative links of one Markdown file."""
    out = []
    for line in _outside_fences(path.read_text(encoding="utf-8")):
        for url in MD_LINK.findall(re.sub(r"`[^`]*`", "", line)):
            if re.match(r"^[a-z][a-z0-9+.-]*:", url, re.IGNORECASE):  # http:, https:, mailto:
                continue
            file, _, fragment = url.partition("#")
            target = (path.parent / file).resolve() if file else path
            if why := broken(target, fragment or None):
                out.append(f"{path.relative_to(ROOT)}: [..]({url}): {why}")
    return out


def code_problems(path: Path) -> list[str]:
    """Broken docs references in one source, test or bench file."""
    out = []
    for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        for file, fragment in CODE_REF.findall(line):
            if why := broken(DOCS / file, fragment or None):
                out.append(f"{path.relative_to(ROOT)}:{number}: {why}")
    return out


def markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


def code_files() -> list[Path]:
    out = []
    for folder in ("src", "tests", "bench"):
        for path in sorted((ROOT / folder).rglob("*")):
            if path.is_file() and path.suffix in {".py", ".toml", ".md", ".txt", ".jsonl"}:
                out.append(path)
    return out


@pytest.mark.parametrize("heading, expected", [
    ("The model behind the numbers", "the-model-behind-the-numbers"),
    ("Step-time model", "step-time-model"),
    ("What the tests check", "what-the-tests-check"),
    ("Acceptance decay (`fits.py`, `decay.py`, `intervals.py`, `aggregate.py`)",
     "acceptance-decay-fitspy-decaypy-intervalspy-aggregatepy"),
    ("Where the figures differ: k = 0, B >= 2?", "where-the-figures-differ-k--0-b--2"),
    ("study_settings and [the link](x.md)", "study_settings-and-the-link"),
])  # fmt: skip
def test_anchor_follows_github(heading, expected):
    assert anchor(heading) == expected


def test_repeated_headings_are_numbered(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Notes\n\n## Notes\n\n```\n# not a heading\n```\n", encoding="utf-8")
    assert anchors(page) == {"notes", "notes-1"}


def test_a_broken_link_is_caught(tmp_path, monkeypatch):
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    monkeypatch.setattr(f"{__name__}.DOCS", tmp_path / "docs")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A page\n\n## Real section\n", encoding="utf-8")
    d = "docs" + "/"  # kept apart, so this file holds no reference to a page that does not exist
    page = tmp_path / "README.md"
    page.write_text(
        f"[ok]({d}a.md#real-section) [ok]({d}a.md) [ok](https://example.org/x.md#y)\n"
        f"[bad]({d}a.md#no-such-section) [bad]({d}missing.md) `[in code]({d}missing.md)`\n",
        encoding="utf-8",
    )
    problems = markdown_problems(page)
    assert len(problems) == 2
    assert "#no-such-section" in problems[0] and "missing.md does not exist" in problems[1]
    source = tmp_path / "mod.py"
    source.write_text(f"# see {d}a.md#real-section, {d}a.md#gone and {d}nope.md\n", encoding="utf-8")
    problems = code_problems(source)
    assert len(problems) == 2
    assert "#gone" in problems[0] and "nope.md does not exist" in problems[1]


def test_markdown_links_resolve():
    problems = [p for path in markdown_files() for p in markdown_problems(path)]
    assert not problems, "\n".join(problems)


def test_docs_references_in_code_resolve():
    problems = [p for path in code_files() for p in code_problems(path)]
    assert not problems, "\n".join(problems)
