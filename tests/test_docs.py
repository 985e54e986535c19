"""The documentation: README.md and the pages of docs/ link to files and headings that exist, and
README links every docs page (the README is short; the reference lives in docs/)."""

from __future__ import annotations

import re
from pathlib import Path

from conftest import REPO

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")  # [text](target)
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)  # https:, mailto:, ...


def markdown_files() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def prose(text: str) -> str:
    """The text outside fenced code blocks and inline code spans, where a link is a link."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def anchors(text: str) -> set[str]:
    """The #anchors GitHub gives a page's headings: the heading's text (code spans and links as their
    text) lowercased, every character but letters, digits, '_', '-' and spaces dropped, spaces as
    '-'; a repeated slug gets -1, -2, ..."""
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.sub(r"^```.*?^```", "", text, flags=re.S | re.M), re.M):
        heading = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "")
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        out.add(slug if count == 0 else f"{slug}-{count}")
    return out


def broken_links(page: Path) -> list[str]:
    """'target: why' for each relative link of a Markdown page that does not resolve."""
    broken = []
    for target in LINK.findall(prose(page.read_text(encoding="utf-8"))):
        if EXTERNAL.match(target):
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target}: no file {linked}")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked.read_text(encoding="utf-8")):
            broken.append(f"{target}: no heading with anchor #{anchor} in {linked.name}")
    return broken


def test_every_relative_link_resolves_to_a_file_and_heading():
    broken = {page.relative_to(REPO).as_posix(): broken_links(page) for page in markdown_files()}
    assert not {page: links for page, links in broken.items() if links}


def test_readme_links_every_docs_page():
    pages = sorted((REPO / "docs").glob("*.md"))
    assert pages, "docs/ holds the reference pages"
    linked = {(REPO / target.partition("#")[0]).resolve()
              for target in LINK.findall(prose((REPO / "README.md").read_text(encoding="utf-8")))
              if not EXTERNAL.match(target)}
    assert [p.name for p in pages if p.resolve() not in linked] == []


def test_the_check_finds_a_missing_file_and_a_missing_heading(tmp_path):
    """The link check itself: a link to no file and an anchor no heading has are reported, a link in
    code is not a link, and headings' anchors follow GitHub's rules."""
    (tmp_path / "b.md").write_text("# B's `--init-from`: a test\n## Twice\n## Twice\n```\n# not a heading\n```\n",
                                   encoding="utf-8")
    page = tmp_path / "a.md"
    page.write_text("[ok](b.md#bs---init-from-a-test) [ok](b.md#twice-1) [gone](c.md) [bad](b.md#twice-2)\n"
                    "`[code](nowhere.md)` [bad](b.md#not-a-heading) [web](https://example.org/x.md)\n",
                    encoding="utf-8")
    assert [link.split(":")[0] for link in broken_links(page)] == ["c.md", "b.md#twice-2", "b.md#not-a-heading"]
