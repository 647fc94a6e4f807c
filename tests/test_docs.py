"""The README as a front door and the docs/ pages: short, and every relative link lands on a file and heading."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lowercased, punctuation dropped, spaces to hyphens."""
    return {re.sub(r"[^a-z0-9 _-]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
            for line in page.read_text().splitlines() if line.startswith("#")}


def test_every_relative_link_lands_on_a_file_and_heading() -> None:
    checked = 0
    for page in PAGES:
        for target in LINK.findall(page.read_text()):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            assert dest.exists(), f"{page.name}: {target}: no such file"
            if anchor:
                assert anchor in _anchors(dest), f"{page.name}: {target}: no such heading"
            checked += 1
    assert checked >= 15


def test_the_readme_is_a_front_door_and_links_every_docs_page() -> None:
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) < 120
    assert "make demo" in text and "make test" in text and "docker compose up" in text
    for page in PAGES[1:]:
        assert f"(docs/{page.name})" in text, f"the README does not link docs/{page.name}"


def test_the_layout_names_every_package_and_top_level_folder() -> None:
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout: which folders are the project's is git's answer")
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    folders = {f.split("/", 1)[0] for f in files if "/" in f}
    packages = {f.split("/")[1] for f in files if re.fullmatch(r"specwatch/[a-z_0-9]+/__init__\.py", f)}
    layout = (REPO / "docs" / "layout.md").read_text().split("## Folders", 1)[1].split("\n## ", 1)[0]
    for name in sorted(f"{f}/" for f in folders) + sorted(f"specwatch/{p}/" for p in packages):
        assert f"`{name}`" in layout, f"docs/layout.md's Folders has no line for {name}"
