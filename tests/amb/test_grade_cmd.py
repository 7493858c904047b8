"""`amb grade`: a pure command of files, run as a user runs it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from schemas.errors import UsageError
from tasks import synth
from tasks.registry import load_spec

AMB = str(Path(sys.executable).parent / "amb")


def grade_kidney(kidney: Path) -> list[str]:
    """``amb grade kidney-seg`` on the module's submission and references."""
    return [
        "grade",
        "kidney-seg",
        "--submission",
        str(kidney / "ws"),
        "--reference",
        str(kidney / "data" / "private"),
    ]


@pytest.fixture(scope="module")
def kidney(tmp_path_factory):
    root = tmp_path_factory.mktemp("grade")
    spec = load_spec("kidney-seg")
    synth.synth(spec, root / "data", cases=3, seed=0)
    synth.perfect_submission(spec, root / "data", root / "ws")
    # Break one case: a truncated gzip stream.
    lesion = root / "ws" / "agents_outputs" / "case_00001" / "lesion.nii.gz"
    lesion.write_bytes(lesion.read_bytes()[:40])
    return root


def test_json_output(kidney, amb):
    out = amb(
        *grade_kidney(kidney),
        "--json",
    )
    data = json.loads(out.stdout)
    assert {"task", "metric", "score", "cases", "params", "checks", "degraded", "profile"} <= set(data)
    assert data["task"] == "kidney-seg" and data["metric"] == "macro_dice" and data["profile"] == "default"
    bad = next(c for c in data["cases"] if c["case"] == "case_00001")
    assert bad["score"] == 0.0 and bad["status"] == "invalid"
    assert bad["reason"].startswith("agents_outputs/case_00001/lesion.nii.gz: ")
    assert 0.0 < data["score"] < 1.0
    assert data["checks"]["n_invalid"] == 1 and data["params"]["seg_formula"] == "organ_lesion_50_50"


def test_profile_switches_the_gate(kidney, tmp_path, amb):
    profile = tmp_path / "strict.toml"
    profile.write_text(
        'extends = "paper-2026-06"\n[profile]\nname = "strict"\n[metrics]\ncompleteness = "all_or_nothing"\n'
    )
    out = amb(
        *grade_kidney(kidney),
        "--profile",
        str(profile),
    )
    assert "macro_dice = 0.0000" in out.stdout and "gate all_or_nothing, profile strict" in out.stdout
    assert "case_00001" in out.stdout and "invalid" in out.stdout


def test_a_profile_file_is_read_as_amb_score_reads_it(kidney, tmp_path, amb):
    # One loader for every command: a file that extends a built-in profile grades as that profile
    # does (its [metrics] and [tracks.*.metrics] followed through `extends`).
    import shutil

    # One case not submitted at all: code-2026-04's segmentation gate zeroes the TASK, the defaults do not.
    partial = tmp_path / "partial"
    shutil.copytree(kidney, partial)
    shutil.rmtree(partial / "ws" / "agents_outputs" / "case_00002")
    child = tmp_path / "child.toml"
    child.write_text('extends = "code-2026-04"\n\n[profile]\nname = "child"\n')
    by_name = json.loads(amb(*grade_kidney(partial), "--json", "--profile", "code-2026-04").stdout)
    by_file = json.loads(amb(*grade_kidney(partial), "--json", "--profile", str(child)).stdout)
    default = json.loads(amb(*grade_kidney(partial), "--json").stdout)
    assert by_name["score"] == 0.0 and default["score"] > 0.0
    assert by_file["score"] == by_name["score"] and by_file["params"] == by_name["params"]
    assert by_file["profile"] == "child"


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("", "missing required field `profile`"),
        ('extends = "code-2026-04"\nunknown_key = 1\n', "unknown field `unknown_key`"),
        ('extends = "code-2026-04"\n[metrics]\nseg_formula = "70_30"\n', "seg_formula"),
        ('extends = "code-2026-04"\n[metrics]\ntypo = "x"\n', "unknown field `typo`"),
        ('extends = "no-such-parent"\n', "no such file and no built-in profile"),
        ('extends = "code-2026-04"\n[weights]\nS1 = 0.9\n', "stage weights must sum to 1"),
        ("[metrics\n", "cannot read"),
    ],
)
def test_a_bad_profile_file_is_refused(kidney, tmp_path, amb, text, needle):
    bad = tmp_path / "bad.toml"
    bad.write_text(text)
    proc = amb(*grade_kidney(kidney), "--profile", str(bad), check=False)
    assert proc.returncode == 2 and proc.stdout == "", proc
    assert proc.stderr.startswith("amb: error: ") and needle in proc.stderr and proc.stderr.count("\n") == 1
    # amb score reads it with the same loader, so it refuses it with the same words.
    from scorer.profile import load

    with pytest.raises(UsageError, match=re.escape(needle)):
        load(str(bad))


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (("--profile", "no-such-profile"), "no built-in profile"),
        (("--reference", "/nonexistent-ref"), "not a directory"),
    ],
)
def test_errors_are_one_line(kidney, extra, needle, amb):
    args = grade_kidney(kidney)
    for i in range(0, len(extra), 2):
        j = args.index(extra[i]) if extra[i] in args else None
        if j is None:
            args += [extra[i], extra[i + 1]]
        else:
            args[j + 1] = extra[i + 1]
    proc = amb(*args, check=False)
    assert proc.returncode != 0 and proc.stderr.startswith("amb: error: ") and needle in proc.stderr
    assert proc.stderr.count("\n") == 1


def test_grader_image_entry_point_runs_without_amb(kidney, tmp_path, amb):
    # The grader image holds only schemas/, scorer/ and tasks/: run the module entry point from a
    # copy of those three packages with `amb` made unimportable, as in the image.
    import shutil

    root = Path(__file__).parents[2]
    src = tmp_path / "src"
    for package in ("schemas", "scorer", "tasks"):
        shutil.copytree(root / package, src / package, ignore=shutil.ignore_patterns("__pycache__"))
    code = (
        "import runpy, sys; sys.modules['amb'] = None; sys.path.insert(0, sys.argv.pop(1)); "
        "sys.argv[0] = 'scorer.grader'; runpy.run_module('scorer.grader', run_name='__main__')"
    )
    args = [
        *grade_kidney(kidney)[1:],
        "--json",
    ]
    proc = subprocess.run(
        [sys.executable, "-c", code, str(src), *args], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    via_amb = json.loads(amb("grade", *args).stdout)
    assert data == via_amb
    bad = subprocess.run(
        [sys.executable, "-c", code, str(src), "no-such-task", "--submission", ".", "--reference", "."],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (
        bad.returncode == 3
        and bad.stderr.startswith("amb: error: unknown task")
        and bad.stderr.count("\n") == 1
    )
