"""The documentation points only at what the repository holds: every relative link of the
README and docs/ resolves to a file (and a heading, for ``#anchor`` links), and every
``*.md`` file named in the text exists. Every page of docs/ is reachable: docs/index.md
links to each, and the README links to the index. (The code in the pages is checked by
test_doc_snippets.py.)"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
DOCS = ROOT / "docs"
INDEX = DOCS / "index.md"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
MENTION = re.compile(r"(?<![\w/.-])((?:docs/)?[A-Za-z_-]+\.md)\b")


def anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings."""
    found = set()
    for line in page.read_text().splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            slug = re.sub(r"[^\w\- ]", "", title).replace(" ", "-")
            found.add(slug)
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_resolves(page):
    broken = []
    for target in LINK.findall(page.read_text()):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists() or (anchor and file.suffix == ".md" and anchor not in anchors(file)):
            broken.append(target)
    assert broken == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_markdown_file_the_text_names_exists(page):
    missing = {name for name in MENTION.findall(page.read_text())
               if not (ROOT / name).exists() and not (ROOT / "docs" / name).exists()}
    assert missing == set()


def linked_files(page: Path) -> set[Path]:
    """The files ``page`` links to by relative links (anchors dropped)."""
    targets = (t.partition("#")[0] for t in LINK.findall(page.read_text()))
    return {(page.parent / t).resolve() for t in targets
            if t and not t.startswith(("http://", "https://", "mailto:"))}


def test_the_index_links_every_page_of_the_docs():
    unlisted = sorted(p.name for p in DOCS.glob("*.md")
                      if p != INDEX and p.resolve() not in linked_files(INDEX))
    assert unlisted == [], "add a line for each to docs/index.md"


def test_the_readme_links_the_index():
    assert INDEX.resolve() in linked_files(ROOT / "README.md")


def test_every_doc_page_the_code_points_to_exists():
    """Error messages, ``--help`` texts and docstrings send users to docs/ pages: each one
    they name must be there (a page renamed or merged leaves no dangling pointer)."""
    named = {(path.relative_to(ROOT), page) for path in (ROOT / "src").rglob("*.py")
             for page in re.findall(r"docs/([\w-]+\.md)", path.read_text())}
    assert sorted((str(p), page) for p, page in named if not (DOCS / page).exists()) == []
