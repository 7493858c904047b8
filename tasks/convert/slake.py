"""SLAKE → slake (the English questions, SLAKE-EN).

Source layout (the SLAKE 1.0 release, ``Slake1.0/``): ``test.json`` (also ``train.json``,
``validate.json``), a list of records with ``qid``, ``img_name`` (``xmlab102/source.jpg``),
``question``, ``answer``, ``q_lang`` (``en``/``zh``), ``answer_type`` (``OPEN``/``CLOSED``),
``location``, ``modality``, ``content_type``; and ``imgs/xmlab<N>/source.jpg``.

Only ``test.json`` is read and only ``q_lang == "en"`` questions are kept.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from schemas.task_spec import TaskError, TaskSpec
from tasks.convert._vqa import closed_or_open, write_questions


def prepare(spec: TaskSpec, source: Path, out: Path, progress: Callable[[str], None] | None = None) -> None:
    tests = sorted(source.rglob("test.json"))
    if not tests:
        raise TaskError(f"{source}: no test.json found (is this the Slake1.0 folder?)")
    path = tests[0]
    try:
        records = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise TaskError(f"{path}: not a readable JSON question list: {e}") from e
    if not isinstance(records, list):
        raise TaskError(f"{path}: expected a JSON list of questions")
    questions = []
    for r in records:
        if not isinstance(r, dict) or r.get("q_lang", "en") != "en":
            continue
        missing = [k for k in ("qid", "img_name", "question", "answer") if k not in r]
        if missing:
            raise TaskError(f"{path}: question {r.get('qid', '?')} lacks {missing}")
        image = path.parent / "imgs" / str(r["img_name"])
        if not image.is_file():
            raise TaskError(f"{path}: image imgs/{r['img_name']} of question {r['qid']} not found")
        questions.append(
            closed_or_open(r, f"slake_{r['qid']}", image, "SLAKE-EN", "content_type", "location")
        )
    write_questions(spec, questions, out, source, progress)
