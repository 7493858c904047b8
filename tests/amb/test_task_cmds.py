"""`amb task ...` run as a user runs it (the installed console script)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import nibabel as nib
import numpy as np

AMB = str(Path(sys.executable).parent / "amb")


def test_list_json_covers_every_track(amb):
    rows = json.loads(amb("task", "list", "--json").stdout)
    assert len(rows) == 24
    assert {r["track"] for r in rows} == {"segmentation", "enhancement", "vqa", "report", "detection"}
    kidney = next(r for r in rows if r["id"] == "kidney-seg")
    assert kidney == {
        "id": "kidney-seg",
        "track": "segmentation",
        "name": "Kidney Tumor",
        "modality": "CT",
        "cases": 20,
        "metric": "macro_dice",
        "time_limit_s": 3600,
        "converter": "kits19",
    }


def test_show_spec_and_brief(amb):
    spec = json.loads(amb("task", "show", "feta-seg", "--json").stdout)
    assert spec["submission"]["label_ids"] == [1, 2, 3, 4, 5, 6, 7]
    text = amb("task", "show", "feta-seg").stdout
    assert "agents_outputs/{case}/dseg.nii.gz" in text and "macro_dice" in text
    assert amb("task", "show", "feta-seg", "--tier", "lite").stdout.startswith("# Fetal Brain Tissues")


def test_synth_then_prepare_errors_are_one_line(tmp_path, amb):
    out = tmp_path / "twin"
    first = amb("task", "synth", "pancreas-seg", "--out", str(out), "--cases", "2", "--seed", "7")
    assert "wrote 2 synthetic pancreas-seg cases (seed 7)" in first.stdout
    img = nib.nifti1.load(str(out / "public" / "PanTS_00000001" / "ct.nii.gz"))
    assert np.asanyarray(img.dataobj).dtype == np.int16
    again = amb("task", "synth", "pancreas-seg", "--out", str(out), check=False)
    assert again.returncode == 2 and again.stderr.count("\n") == 1 and "already exists" in again.stderr
    assert amb("task", "synth", "pancreas-seg", "--out", str(out), "--force").returncode == 0

    unknown = amb("task", "show", "../tasks/kidney-seg", check=False)  # an id, never a path
    assert unknown.returncode == 3
    assert unknown.stderr.startswith("amb: error: unknown task '../tasks/kidney-seg'")
    for args, needle in [
        (("task", "show", "no-such-task"), "unknown task 'no-such-task'"),
        (
            (
                "task",
                "prepare",
                "kidney-seg",
                "--source",
                str(tmp_path / "missing"),
                "--out",
                str(tmp_path / "o"),
            ),
            "not a directory",
        ),
        (
            ("task", "prepare", "kidney-seg", "--source", str(out), "--out", str(tmp_path / "o")),
            "no case_XXXXX/segmentation.nii.gz",
        ),
    ]:
        proc = amb(*args, check=False)
        assert proc.returncode != 0 and proc.stderr.startswith("amb: error: ") and needle in proc.stderr
        assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
