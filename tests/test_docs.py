"""Docs that cannot drift: generated parts match their sources, links resolve, and the docs and the
code describe the product as it is, not how it came about (that is what `git log` is for)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench import figures
from scripts import docs

ROOT = Path(__file__).resolve().parents[1]
SOURCE_DIRS = ["schemas", "recorder", "replay", "scorer", "tasks", "agents", "images", "sweeps", "amb"]
SOURCE_DIRS += ["bench", "scripts", "tests", ".ci"]
SOURCE_SUFFIXES = {".py", ".js", ".cjs", ".sh", ".css", ".html", ".toml", ".md"}
GOLDEN = ROOT / "tests" / "data"
"""Recorded spools and fixtures: data, not text anyone reads as a description of the product."""


def _ours(path: Path) -> bool:
    parts = path.relative_to(ROOT).parts
    return not any(p.startswith(".venv") or p in ("build", "node_modules", "__pycache__") for p in parts)


def prose_files() -> list[Path]:
    """README.md and docs/."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def source_files() -> list[Path]:
    """Every file of the project's own text: code, scripts, recipes, build files, CI."""
    found = [ROOT / "justfile", ROOT / "just", ROOT / "pyproject.toml"]
    for top in SOURCE_DIRS:
        for path in sorted((ROOT / top).rglob("*")):
            if not path.is_file() or not _ours(path) or path.is_relative_to(GOLDEN):
                continue
            if path.suffix in SOURCE_SUFFIXES or top == ".ci" or path.name == "Dockerfile":
                found.append(path)
    return found


# --- generated parts --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(docs.BLOCKS))
def test_readme_generated_blocks_are_what_just_docs_writes(name):
    block = docs.current(docs.README.read_text(), name)
    assert block == docs.BLOCKS[name](), f"README's {name} block is stale: run `./just docs`"


def test_cli_doc_is_every_commands_help():
    # In a fresh interpreter: the commands' help is what a user sees, not what a test in this
    # worker process may have left in click's shared command objects.
    fresh = subprocess.run(
        [sys.executable, "-c", "import sys; from scripts import docs; sys.stdout.write(docs.cli_doc())"],
        cwd=docs.CLI_DOC.parent.parent,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert docs.CLI_DOC.read_text() == fresh, "docs/cli.md is stale: run `./just docs`"


def test_viewer_api_block_is_the_route_table():
    assert docs.VIEWER_DOC.read_text() == docs.viewer_doc(), (
        "docs/viewer.md's api block is stale: run `./just docs`"
    )


def table_cells(block: str) -> list[str]:
    """The cells of a markdown table's rows (a ``\\|`` inside a cell is part of the cell)."""
    rows = [line for line in block.splitlines() if line.startswith("| ") and not line.startswith("|---")]
    return [cell.strip() for row in rows for cell in re.split(r"(?<!\\)\|", row.strip())[1:-1]]


def test_performance_table_cells_fit():
    cells = table_cells(docs.current(docs.README.read_text(), "figures"))
    assert len(cells) > 6 * 20, "the performance table should hold every bench's rows"
    long = [c for c in cells if len(c) > figures.MAX_CELL]
    assert not long, f"cells over {figures.MAX_CELL} characters (shorten them in the bench):\n" + "\n".join(
        long
    )


def test_table_cells_split_as_rendered():
    row = "| a `x\\|y` | b |"
    assert table_cells(row) == ["a `x\\|y`", "b"]


def test_every_bench_writes_its_figures():
    """Each bench run as a script takes --json and writes rows (bench/figures.py), so that the
    next run replaces the figures in the README."""
    not_a_bench = {
        "figures.py": "the rows' format and writer",
        "measure.py": "what several benches measure the same way",
        "grader_enh_det.py": "the SSIM and mAP parts of bench/grader.py (--only ssim, --only map)",
        "grader_report.py": "the report-score part of bench/grader.py (--only report)",
        "storage_where.py": "a breakdown of one store",
    }
    silent = [
        p.name
        for p in sorted((ROOT / "bench").glob("*.py"))
        if p.name not in not_a_bench and "figures.add_argument(" not in p.read_text()
    ]
    assert not silent, f"benches that do not write their figures: {silent}"


def test_results_files_are_rows_of_known_benches():
    for path in figures.RESULTS.glob("*.json"):
        rows = figures.read(path)
        assert rows, f"{path.name}: no rows"
        assert (ROOT / "bench" / f"{path.stem}.py").is_file(), (
            f"{path.name}: no bench/{path.stem}.py writes it"
        )
        ids = [r.id for r in rows]
        assert len(ids) == len(set(ids)), f"{path.name}: ids repeat: {ids}"


def test_figures_merge_replaces_rows_by_id_and_keeps_the_rest():
    def row(id: str, figure: str) -> figures.Figure:
        return figures.Figure(id=id, measure="m", figure=figure, load="1.0 on 2 cores", command="c")

    merged = figures.merge([row("a", "1"), row("b", "2")], [row("b", "3"), row("c", "4")])
    assert [(r.id, r.figure) for r in merged] == [("a", "1"), ("b", "3"), ("c", "4")]


def test_a_bench_command_shows_paths_as_placeholders():
    import argparse

    parser = argparse.ArgumentParser(prog="storage.py")
    parser.add_argument("--keep", metavar="DIR")
    parser.add_argument("--rounds", metavar="N")
    figures.add_argument(parser, "storage")
    argv = ["--keep", "/scratch/stores", "--rounds", "5", "--json=/scratch/x.json", "--against=../prev"]
    assert (
        figures.command_line(parser, argv) == "./just bench storage --keep DIR --rounds 5 --against=../prev"
    )


# --- links ------------------------------------------------------------------------------------------


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {slug(h) for h in re.findall(r"^#{1,6} (.+)$", path.read_text(), re.M)}


def test_docs_files_and_anchors_named_anywhere_exist():
    missing = []
    linking = [p for p in prose_files() + source_files() if p.suffix in (".md", ".py", ".js")]
    for path in linking + sorted(figures.RESULTS.glob("*.json")):
        text = path.read_text(errors="replace")
        for ref, anchor in re.findall(r"\bdocs/([\w.-]+\.md)(?:#([\w-]+))?", text):
            target = ROOT / "docs" / ref
            if not target.is_file():
                missing.append(f"{path.relative_to(ROOT)} names docs/{ref}")
            elif anchor and anchor not in anchors(target):
                missing.append(f"{path.relative_to(ROOT)} links docs/{ref}#{anchor}: no such heading")
    for path in prose_files():  # relative links between docs: (storage.md#x) inside docs/
        for ref, anchor in re.findall(r"\]\(([\w.-]+\.md)?#([\w-]+)\)", path.read_text()):
            target = path.parent / ref if ref else path
            if target.is_file() and anchor not in anchors(target):
                missing.append(f"{path.relative_to(ROOT)} links {ref}#{anchor}: no such heading")
    assert not missing, "\n".join(missing)


# --- no development history -------------------------------------------------------------------------

HISTORY = re.compile(
    r"\bsessions? #?\d|\b(?:this|earlier|previous|later) sessions?\b|\bsittings?\b"
    r"|\bissue(?:'s)?\b|\bissues #?\d|\bbuild before\b|\bmain before\b|\bCI once\b|\bon CI:",
    re.IGNORECASE,
)
"""Development history: numbered or recalled sittings, issue numbers, past CI runs, "the build
before". A design choice keeps its reason ("X, because Y"), not the story of how it was reached."""


def test_no_development_history_in_docs_or_sources():
    this = Path(__file__).resolve()
    hits = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()[:120]}"
        for path in prose_files() + source_files()
        if path.resolve() != this  # the pattern itself
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if HISTORY.search(line)
    ]
    assert not hits, "development history belongs in commit messages:\n" + "\n".join(hits)


@pytest.mark.parametrize(
    "line",
    [
        "Measured in session 12",
        "as in earlier sessions",
        "in one sitting",
        "issue 22 asks",
        "the issue's target",
    ]
    + ["issues 15-22 added", "beside the build before it", "main before this change", "It failed on CI once"]
    + ["on CI: 40 s"],
)
def test_history_pattern_finds(line):
    assert HISTORY.search(line)


@pytest.mark.parametrize(
    "line",
    ["a session of its own", "the test session's temp dir", "the proxy issues a request", "sits on the path"],
)
def test_history_pattern_leaves_the_product_alone(line):
    assert not HISTORY.search(line)
