"""The submission the grader reads is written under the exact bytes of each sealed name, and a name
that is no file under the grader's folder makes the TASK unscored with the reason."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from schemas.blobstore import BlobStore
from schemas.events import RunStarted, SealedFile, SubmissionSealed
from schemas.ostext import os_text
from scorer.taskgrade import grade_run, materialise
from scorer.trajectory import Trajectory, fold
from tasks.registry import load_spec
from tasks.synth import perfect_submission, synth
from tests.fakes.events import unsigned_events


def test_materialise_writes_each_file_under_the_bytes_of_its_name(tmp_path: Path) -> None:
    blobs = BlobStore(tmp_path / "blobs")
    names = [b"agents_outputs/x\xff.txt", b"agents_outputs/a\\b", b"\\xff"]
    files = []
    for i, raw in enumerate(names):
        ref = blobs.put(b"%d" % i)
        files.append(SealedFile(path=os_text(raw), size=1, sha256=ref.blob, content=ref))
    files.append(SealedFile(path="\\x41", size=0, sha256="sha256:0", content=blobs.put(b"")))
    sealed = SubmissionSealed(root="/workspace", files=files)
    traj = fold("r", unsigned_events("r", "recorder", [RunStarted(), sealed]), blobs.get)
    into = tmp_path / "into"
    assert materialise(traj, blobs.get, into) == ["\\x41: not the recorded text of a name"]
    got = {
        os.path.relpath(os.path.join(d, f), os.fsencode(into)): open(os.path.join(d, f), "rb").read()
        for d, _, fs in os.walk(os.fsencode(into))
        for f in fs
    }
    assert got == {raw: b"%d" % i for i, raw in enumerate(names)}  # (main: the recorded text as the name)


def sealed_run(blobs: BlobStore, files: dict[str, bytes], task: str | None = None) -> Trajectory:
    sealed = SubmissionSealed(
        root="/workspace",
        files=[
            SealedFile(path=name, size=len(data), sha256=blobs.put(data).blob, content=blobs.put(data))
            for name, data in files.items()
        ],
    )
    return fold("r", unsigned_events("r", "recorder", [RunStarted(task=task), sealed]), blobs.get)


def every_file(top: Path) -> set[str]:
    return {os.path.relpath(os.path.join(d, f), top) for d, _, fs in os.walk(top) for f in fs}


HOSTILE = {
    "absolute": ("/etc/amb-not-yours", "an absolute path"),
    "absolute-under-root": ("/workspace//{tmp}/outside.txt", "an absolute path"),
    "dotdot": ("agents_outputs/../../outside.txt", "path escapes the submission root"),
    "the-root-itself": ("/workspace/", "not a file's path (an empty or '.' part)"),
    "dot": (".", "not a file's path (an empty or '.' part)"),
    "nul": ("agents_outputs/a\x00b", "a name holding a NUL byte"),
    "long-part": ("agents_outputs/" + "x" * 300, "cannot be written (File name too long)"),
    "long-path": ("d/" * 3000 + "f", "cannot be written (File name too long)"),
}


@pytest.mark.parametrize("kind", list(HOSTILE))
def test_a_name_that_is_no_file_under_the_folder_is_refused_and_nothing_is_written_outside(tmp_path, kind):
    name, reason = HOSTILE[kind]
    name = name.replace("{tmp}", str(tmp_path).lstrip("/"))
    blobs = BlobStore(tmp_path / "blobs")
    traj = sealed_run(blobs, {name: b"hostile", "agents_outputs/ok.txt": b"fine"})
    (tmp_path / "into").mkdir()
    before = every_file(tmp_path)
    problems = materialise(traj, blobs.get, tmp_path / "into")
    assert len(problems) == 1 and problems[0].endswith(f": {reason}"), problems
    assert len(problems[0]) < 300 and "\x00" not in problems[0]  # the name shown clipped, one line
    assert every_file(tmp_path) - before == {"into/agents_outputs/ok.txt"}


def test_a_file_where_a_folder_goes_is_refused(tmp_path):
    blobs = BlobStore(tmp_path / "blobs")
    traj = sealed_run(blobs, {"agents_outputs/a": b"file", "agents_outputs/a/b": b"under a file"})
    assert materialise(traj, blobs.get, tmp_path) == ["agents_outputs/a/b: cannot be written (File exists)"]


def test_grade_run_with_an_impossible_name_is_unscored_with_the_reason(tmp_path):
    spec, refs = load_spec("bccd-det"), tmp_path / "refs"
    synth(spec, refs / spec.id, cases=1)
    perfect_submission(spec, refs / spec.id, tmp_path / "ws")
    files = {os.path.relpath(p, tmp_path / "ws"): p.read_bytes() for p in (tmp_path / "ws").rglob("*.json")}
    blobs = BlobStore(tmp_path / "blobs")
    honest, _ = grade_run(sealed_run(blobs, files, spec.id), blobs.get, references=refs, metrics={})
    assert honest["task_score"] == 1.0
    escaping = "/workspace/" + str(tmp_path / "escaped.json")  # the root, then an absolute path
    files[escaping] = b"{}"
    grade, _ = grade_run(sealed_run(blobs, files, spec.id), blobs.get, references=refs, metrics={})
    assert grade == {"task_score": None, "reason": f"submission not gradable: {escaping}: an absolute path"}
    assert not (tmp_path / "escaped.json").exists()
