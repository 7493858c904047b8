"""What every VQA converter writes: one question folder per question, the gold answer on the private
side, and ``ground_truth.csv``. The converters only map their dataset's records onto ``Question``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from schemas.task_spec import TaskError, TaskSpec
from tasks.case_files import write_csv, write_json

_YES_NO = {"yes", "no"}


class Question(msgspec.Struct, kw_only=True):
    qid: str
    question: str
    images: list[tuple[str, bytes]]
    """(file suffix such as ``.jpg``, image bytes) per image, in order."""
    answer_text: str
    answer_label: str = ""
    options: dict[str, str] | None = None
    dataset: str
    medical_task: str = ""
    body_system: str = ""
    question_type: str = ""
    answer_type: str = ""
    """``yes/no``, ``open`` or ``multiple_choice``; empty: told from the answer (``answer_type``)."""


def closed_or_open(
    record: dict[str, Any], qid: str, image: Path, dataset: str, task: str, body: str
) -> Question:
    """A SLAKE or VQA-RAD record (its ``task`` and ``body`` keys lower-cased): ``answer_type``
    ``CLOSED`` is a binary question, anything else an open one."""
    return Question(
        qid=qid,
        question=str(record["question"]).strip(),
        images=[(image.suffix, image.read_bytes())],
        answer_text=str(record["answer"]).strip(),
        dataset=dataset,
        medical_task=str(record.get(task, "")).lower(),
        body_system=str(record.get(body, "")).lower(),
        question_type="binary" if str(record.get("answer_type", "")).upper() == "CLOSED" else "open",
    )


def answer_type(q: Question) -> str:
    if q.answer_type:
        return q.answer_type
    if q.options is not None:
        return "multiple_choice"
    return "yes/no" if q.answer_text.strip().lower().rstrip(".") in _YES_NO else "open"


def write_questions(
    spec: TaskSpec,
    questions: list[Question],
    out: Path,
    source: Path,
    progress: Callable[[str], None] | None = None,
) -> None:
    """Write ``questions`` in the task layout (``progress`` gets each written id); a duplicate id or
    no question at all is an error."""
    assert spec.vqa is not None
    if not questions:
        raise TaskError(f"{source}: no question to convert")
    public, private = Path(out) / "public", Path(out) / "private"
    rows = []
    seen: set[str] = set()
    for q in questions:
        if q.qid in seen:
            raise TaskError(f"{source}: duplicate question id {q.qid!r}")
        seen.add(q.qid)
        paths = []
        for k, (suffix, data) in enumerate(q.images):
            rel = f"images/{q.qid}-{chr(ord('a') + k)}{suffix.lower()}"
            (public / q.qid / "images").mkdir(parents=True, exist_ok=True)
            (public / q.qid / rel).write_bytes(data)
            paths.append(rel)
        kind = answer_type(q)
        question: dict[str, Any] = {
            "question_id": q.qid,
            "dataset": q.dataset,
            "question": q.question,
            "image_paths": paths,
            "split": "test",
            "medical_task": q.medical_task,
            "body_system": q.body_system,
            "question_type": q.question_type or ("multiple_choice" if q.options is not None else "open"),
        }
        gold: dict[str, Any] = {
            "question_id": q.qid,
            "answer_label": q.answer_label,
            "answer_text": q.answer_text,
            "answer_type": kind,
        }
        rows.append({**gold, "question_type": question["question_type"]})
        if q.options is not None:
            question["options"] = q.options
            gold["options"] = q.options
        write_json(public / q.qid / spec.vqa.question_file, question, ensure_ascii=False)
        write_json(private / q.qid / spec.vqa.answer_file, gold, ensure_ascii=False)
        if progress is not None:
            progress(q.qid)
    write_csv(private / "ground_truth.csv", rows)
