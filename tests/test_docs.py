"""Docs that cannot drift: generated blocks match the code, and cross-references resolve."""

from __future__ import annotations

import re
from pathlib import Path

from scripts import docs

ROOT = Path(__file__).resolve().parents[1]
TEXT_FILES = [
    p
    for pattern in ("*.md", "docs/*.md", "**/*.py")
    for p in ROOT.glob(pattern)
    if not any(part.startswith(".venv") or part == "build" for part in p.relative_to(ROOT).parts)
]


def test_readme_views_block_is_what_amb_schema_prints():
    block = docs.current(docs.README.read_text())
    assert block == docs.generated(), "README's views block is stale: run `./just docs`"


def test_docs_files_named_anywhere_exist():
    missing = []
    for path in TEXT_FILES:
        for ref in re.findall(r"\bdocs/[\w.-]+\.md\b", path.read_text(errors="replace")):
            if not (ROOT / ref).is_file():
                missing.append(f"{path.relative_to(ROOT)} names {ref}")
    assert not missing, "\n".join(missing)


def test_design_sections_cited_exist():
    design = ROOT.parent / "shared" / "DESIGN.md"
    headings = set(re.findall(r"^## (\d+)\.", design.read_text(), re.M)) if design.is_file() else None
    cited = [
        (path.relative_to(ROOT), n)
        for path in TEXT_FILES
        for n in re.findall(r"DESIGN(?:\.md)? (?:section|§) ?(\d+)", path.read_text(errors="replace"))
    ]
    assert cited, "the architecture test cites DESIGN.md section 2; the pattern must find it"
    if headings is not None:  # shared/ sits beside the checkout here and on CI
        bad = [f"{p} cites DESIGN.md section {n}" for p, n in cited if n not in headings]
        assert not bad, "\n".join(bad)
