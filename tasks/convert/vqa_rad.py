"""VQA-RAD → vqa-rad.

Source layout (the OSF release, https://osf.io/89kps/): one JSON file, ``VQA_RAD Dataset Public.json``
(any ``*.json`` holding the question list is accepted), a list of records with at least ``qid``,
``image_name``, ``question``, ``answer``, ``answer_type`` (``CLOSED``/``OPEN``) and ``phrase_type``
(``freeform``, ``para``, ``test_freeform``, ``test_para``); and ``VQA_RAD Image Folder/`` with the
images named by ``image_name`` (``synpic54610.jpg``).

Only the test questions (``phrase_type`` starting with ``test``) are converted, as the benchmark
scores held-out questions; a release without that field converts every question. A gold answer
that normalises to yes/no is scored strictly (``yes/no``); every other answer, including closed
"left or right" questions, is ``open``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from schemas.task_spec import TaskError, TaskSpec
from tasks.convert._vqa import closed_or_open, write_questions

REQUIRED = ("qid", "image_name", "question", "answer")


def _load_questions(source: Path) -> list[dict[str, Any]]:
    for path in sorted(source.rglob("*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError):
            continue
        if (
            isinstance(data, list)
            and data
            and all(isinstance(r, dict) for r in data)
            and all(k in data[0] for k in REQUIRED)
        ):
            return data
    raise TaskError(
        f"{source}: no VQA-RAD question list found (expected 'VQA_RAD Dataset Public.json', "
        f"a JSON list of records with {', '.join(REQUIRED)})"
    )


def prepare(spec: TaskSpec, source: Path, out: Path, progress: Callable[[str], None] | None = None) -> None:
    records = _load_questions(source)
    if any("phrase_type" in r for r in records):
        records = [r for r in records if str(r.get("phrase_type", "")).startswith("test")]
        if not records:
            raise TaskError(f"{source}: the question list has no test questions (phrase_type test_*)")
    images = {
        p.name: p for p in source.rglob("*") if p.suffix.lower() in (".jpg", ".jpeg", ".png") and p.is_file()
    }
    questions = []
    for r in records:
        image = images.get(str(r["image_name"]))
        if image is None:
            raise TaskError(f"{source}: image {r['image_name']!r} of question {r['qid']} not found")
        questions.append(
            closed_or_open(r, f"vqarad_{r['qid']}", image, "VQA-RAD", "question_type", "image_organ")
        )
    write_questions(spec, questions, out, source, progress)
