"""MedXpertQA (MM subset) → medxpertqa-mm.

Source layout (the Hugging Face dataset ``TsinghuaC3I/MedXpertQA`` as downloaded, the layout the
benchmark's own staging reads): ``MM/test.jsonl`` (and ``MM/dev.jsonl``), one JSON object a line with
``id`` (``MM-0``), ``question``, ``options`` (``{"A": ..., "E": ...}``), ``label`` (the correct letter),
``images`` (file names), ``medical_task``, ``body_system``, ``question_type``; and ``images.zip`` (or
an ``images/`` folder) holding the image files. Only ``test.jsonl`` is converted.
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Callable
from pathlib import Path

from schemas.task_spec import TaskError, TaskSpec
from tasks.convert._vqa import Question, write_questions

LABELS = ("A", "B", "C", "D", "E")


class _Images:
    """Image bytes by file name, from ``images.zip`` or from files anywhere under the source."""

    def __init__(self, source: Path) -> None:
        self.files = {
            p.name: p
            for p in source.rglob("*")
            if p.is_file() and p.suffix.lower() in (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp")
        }
        self.zip: zipfile.ZipFile | None = None
        self.members: dict[str, str] = {}
        archive = next(iter(sorted(source.rglob("images.zip"))), None)
        if archive is not None:
            try:
                self.zip = zipfile.ZipFile(archive)
            except zipfile.BadZipFile as e:
                raise TaskError(f"{archive}: not a readable zip file: {e}") from e
            self.members = {Path(i.filename).name: i.filename for i in self.zip.infolist() if not i.is_dir()}

    def get(self, name: str) -> bytes | None:
        base = Path(name).name
        if base in self.files:
            return self.files[base].read_bytes()
        if self.zip is not None and base in self.members:
            return self.zip.read(self.members[base])
        return None


def prepare(spec: TaskSpec, source: Path, out: Path, progress: Callable[[str], None] | None = None) -> None:
    path = next(iter(sorted(p for p in source.rglob("test.jsonl") if p.parent.name == "MM")), None)
    if path is None:
        raise TaskError(f"{source}: no MM/test.jsonl found (the MedXpertQA download's MM subset)")
    images = _Images(source)
    questions = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
        except ValueError as e:
            raise TaskError(f"{path}:{n}: bad JSON: {e}") from e
        options = r.get("options")
        label = str(r.get("label", "")).strip().upper()
        if not isinstance(options, dict) or label not in options or label not in LABELS:
            raise TaskError(f"{path}:{n}: needs options A-E and a label among them")
        blobs = []
        for name in r.get("images") or []:
            data = images.get(str(name))
            if data is None:
                raise TaskError(f"{path}:{n}: image {name!r} not found in images.zip or under {source}")
            blobs.append((Path(str(name)).suffix or ".jpg", data))
        if not blobs:
            raise TaskError(f"{path}:{n}: question {r.get('id')} has no image")
        opts = {str(k).strip().upper(): str(v).strip() for k, v in options.items()}
        questions.append(
            Question(
                qid=str(r["id"]),
                question=str(r["question"]).strip(),
                images=blobs,
                answer_text=opts[label],
                answer_label=label,
                options=opts,
                dataset="MedXpertQA-MM",
                medical_task=str(r.get("medical_task", "")),
                body_system=str(r.get("body_system", "")),
                question_type=str(r.get("question_type", "")) or "multiple_choice",
            )
        )
    write_questions(spec, questions, out, source, progress)
