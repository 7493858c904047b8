"""The grader reads only regular files that live inside the submission folder.

A hostile submission tries to score what it did not produce: a symbolic link to the reference (or
to a perfect answer kept outside), a link in a parent folder, a hard link, a FIFO that would hang an
open, a device. Each such case is ``invalid`` with its reason, on every track, and an honest case
beside them still scores.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest

from scorer.grader import grade
from scorer.grader.options import GradeOptions
from scorer.grader.submitted import Rejected, open_submitted
from tasks import synth
from tasks.registry import load_spec

ATTACKS = ["symlink", "parent-symlink", "hardlink", "fifo", "device"]
REASONS = {
    "symlink": "a symbolic link",
    "parent-symlink": "is a symbolic link: the grader does not follow links",
    "hardlink": "a hard link (2 names for one file)",
    "fifo": "not a regular file (a FIFO)",
    "device": "not a regular file (a character device)",
}


def _case_files(work: Path, root: str, case: str) -> list[Path]:
    return sorted(p for p in (work / root / case).rglob("*") if p.is_file())


def _attack(kind: str, target: Path, outside: Path, case_dir: Path) -> None:
    """Replace the perfect output ``target`` by ``kind``; the perfect bytes move to ``outside``."""
    keep = outside / f"{case_dir.name}-{target.name}"
    shutil.move(target, keep)
    if kind == "symlink":
        target.symlink_to(keep)
    elif kind == "parent-symlink":
        shutil.move(keep, target)
        moved = outside / f"dir-{case_dir.name}"
        shutil.move(case_dir, moved)
        case_dir.symlink_to(moved, target_is_directory=True)
    elif kind == "hardlink":
        os.link(keep, target)
    elif kind == "fifo":
        os.mkfifo(target)
    elif kind == "device":
        os.mknod(target, stat.S_IFCHR | 0o644, os.makedev(1, 3))  # /dev/null's numbers


# The report track reads its files through the same ``read_submitted_text`` as VQA (its hostile
# files are in test_grader_report.py); grading it here would start the METEOR JVM for one more minute.
@pytest.mark.parametrize(
    "task_id", ["kidney-seg", "pancreas-oar-seg", "bccd-det", "ldct-denoising", "vqa-rad"]
)
def test_every_linked_or_special_file_is_invalid_and_the_honest_case_scores(tmp_path, task_id):
    spec = load_spec(task_id)
    data, work, outside = tmp_path / "data", tmp_path / "work", tmp_path / "outside"
    outside.mkdir()
    synth.synth(spec, data, cases=len(ATTACKS) + 1, seed=1)
    synth.perfect_submission(spec, data, work)
    root = spec.submission.root
    cases = sorted(p.name for p in (work / root).iterdir() if p.is_dir())
    assert len(cases) == len(ATTACKS) + 1
    for kind, case in zip(ATTACKS, cases, strict=False):
        _attack(kind, _case_files(work, root, case)[0], outside, work / root / case)

    result = grade(spec, work, data / "private", GradeOptions())
    by_case = {c.case: c for c in result.cases}
    for kind, case in zip(ATTACKS, cases, strict=False):
        c = by_case[case]
        assert c.status == "invalid" and c.score == 0.0, (kind, c)
        assert REASONS[kind] in (c.reason or ""), (kind, c.reason)
        assert case in (c.reason or ""), c.reason
    honest = by_case[cases[-1]]
    assert honest.status == "scored" and honest.score == pytest.approx(1.0), honest
    assert result.checks["n_invalid"] == len(ATTACKS)


def test_a_symlink_to_the_reference_itself_scores_nothing(tmp_path):
    """A symlink organ.nii.gz -> the private reference must not score 1.0."""
    spec = load_spec("kidney-seg")
    data, work = tmp_path / "data", tmp_path / "work"
    synth.synth(spec, data, cases=2, seed=2)
    synth.perfect_submission(spec, data, work)
    case = sorted((data / "private").iterdir())[0].name
    for name in ("organ.nii.gz", "lesion.nii.gz"):
        out = work / spec.submission.root / case / name
        out.unlink()
        out.symlink_to(data / "private" / case / name)
    result = grade(spec, work, data / "private", GradeOptions())
    first = {c.case: c for c in result.cases}[case]
    assert first.status == "invalid" and first.score == 0.0
    why = "a symbolic link: the grader reads only regular files inside the submission"
    assert first.reason == f"agents_outputs/{case}/organ.nii.gz: {why}"
    assert result.score < 1.0


def test_open_submitted_refuses_escapes_and_reads_regular_files(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "f.txt").write_bytes(b"ok")
    with open_submitted(tmp_path, "a/b/f.txt") as f:
        assert f.read() == b"ok"
    with open_submitted(tmp_path, "./a/b/f.txt") as f:
        assert f.read() == b"ok"
    for bad in ("../x", "/etc/passwd", "a/../../x", ""):
        with pytest.raises(ValueError):
            open_submitted(tmp_path, bad)
    with pytest.raises(Rejected) as e:
        open_submitted(tmp_path, "a/nope/f.txt")
    assert e.value.kind == "missing"
    (tmp_path / "a" / "file").write_text("a file where a folder should be")
    with pytest.raises(Rejected) as e:
        open_submitted(tmp_path, "a/file/f.txt")
    assert e.value.kind == "missing"
    (tmp_path / "link").symlink_to(tmp_path / "a")
    with pytest.raises(Rejected, match="link/ is a symbolic link"):
        open_submitted(tmp_path, "link/b/f.txt")
    # A dangling link is refused as a link, not reported missing.
    (tmp_path / "a" / "b" / "dangling").symlink_to(tmp_path / "nowhere")
    with pytest.raises(Rejected, match="a symbolic link") as e:
        open_submitted(tmp_path, "a/b/dangling")
    assert e.value.kind == "invalid"
