"""PathVQA → pathvqa, from the Hugging Face parquet release.

Source layout (the dataset ``flaviagiammarino/path-vqa`` as downloaded): ``data/test-*.parquet``
(also ``train-*`` and ``validation-*``), rows with ``image`` (a struct of ``bytes`` and ``path``, the
Hugging Face image feature), ``question`` and ``answer``.

The original release stores its questions as Python pickles, which cannot be loaded safely from a
downloaded file; the parquet copy carries the same test questions as plain columns, so it is the
one converted (its ``test`` files only).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from schemas.task_spec import TaskError, TaskSpec
from tasks.convert._vqa import Question, write_questions

_MAGIC = {b"\xff\xd8\xff": ".jpg", b"\x89PNG": ".png", b"GIF8": ".gif", b"BM": ".bmp"}


def _suffix(data: bytes) -> str:
    return next((s for magic, s in _MAGIC.items() if data.startswith(magic)), ".jpg")


def prepare(spec: TaskSpec, source: Path, out: Path, progress: Callable[[str], None] | None = None) -> None:
    import pyarrow.parquet as pq

    files = sorted(p for p in source.rglob("*.parquet") if p.name.startswith("test"))
    if not files:
        raise TaskError(
            f"{source}: no test-*.parquet found (the Hugging Face PathVQA download's data/ folder)"
        )
    questions: list[Question] = []
    for path in files:
        try:
            table = pq.read_table(path)
        except Exception as e:  # pyarrow raises several types for a damaged file; all mean "unreadable"
            raise TaskError(f"{path}: not a readable parquet file: {e}") from e
        missing = {"image", "question", "answer"} - set(table.column_names)
        if missing:
            raise TaskError(f"{path}: missing columns {sorted(missing)}")
        for row in table.select(["image", "question", "answer"]).to_pylist():
            image = row["image"]
            data = image.get("bytes") if isinstance(image, dict) else None
            if not data:
                raise TaskError(f"{path}: row {len(questions)} has no image bytes")
            questions.append(
                Question(
                    qid=f"pathvqa_{len(questions):05d}",
                    question=str(row["question"]).strip(),
                    images=[(_suffix(data), data)],
                    answer_text=str(row["answer"]).strip(),
                    dataset="PathVQA",
                    question_type="binary" if str(row["answer"]).strip().lower() in ("yes", "no") else "open",
                )
            )
    write_questions(spec, questions, out, source, progress)
