"""A store's state, to compare before and after a command: every file's digest, every run's events."""

from __future__ import annotations

import hashlib
from pathlib import Path

from click.testing import CliRunner, Result

from amb.main import cli
from replay.store import Store


def amb(*args: str) -> Result:
    """The real command, in this process (no judge configured)."""
    return CliRunner().invoke(cli, list(args), env={"AMB_JUDGE_BASE_URL": "", "AMB_JUDGE_MODEL": ""})


def files(root: Path) -> dict[str, str]:
    """Every file under ``root`` by its relative path, with the sha256 of its bytes."""
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def event_hashes(store: Path) -> dict[str, list[str]]:
    """Every run's event hashes, in (source, seq) order."""
    with Store.open(store, read_only=True) as st:
        rows = st.con.execute("SELECT run_id, hash FROM events ORDER BY run_id, source, seq").fetchall()
    out: dict[str, list[str]] = {}
    for run, h in rows:
        out.setdefault(run, []).append(h)
    return out
