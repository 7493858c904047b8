"""Synthetic twins for the VQA track, in the layout the converters write (``tasks.convert._vqa``).

Questions are generated from the facts the image was drawn with (which organ holds a lesion, how
many lesions, which modality, which tissue, where the structure moves), so every gold answer is
visible in its image. Open-ended twins cycle through yes/no, open and counting questions so one
small twin exercises every matching rule (strict yes/no, normalised exact match, number words).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from schemas.task_spec import TaskError, TaskSpec
from tasks.case_files import write_json
from tasks.convert._vqa import Question, write_questions
from tasks.synth import fresh_sides, medimg

LABELS = ("A", "B", "C", "D", "E")
NUMBER_WORDS = {1: "one", 2: "two", 3: "three"}
_BODY = {"abdomen": "abdomen", "chest": "chest", "head": "brain"}


def _radiology(rng: np.random.Generator, shape, i: int) -> tuple[list[np.ndarray], dict[str, Any]]:
    scenario = int(rng.integers(0, 4))
    if scenario == 0:
        region, modality = "abdomen", "ct"
        lesion = rng.choice(np.array(["liver", "kidney", None], dtype=object))
        n = int(rng.integers(1, 4)) if lesion else 0
        img = medimg.ct_slice(rng, shape, region, lesion, max(n, 1))
        organ = lesion
    elif scenario == 1:
        region, modality = "chest", "ct"
        lesion = rng.choice(np.array(["lung", None], dtype=object))
        n = int(rng.integers(1, 3)) if lesion else 0
        img = medimg.ct_slice(rng, shape, region, lesion, max(n, 1))
        organ = lesion
    elif scenario == 2:
        region, modality = "head", "mri"
        has = bool(rng.integers(0, 2))
        n = 1 if has else 0
        img = medimg.mri_slice(rng, shape, has)
        organ = "brain" if has else None
    else:
        region, modality = "chest", "x-ray"
        effusion = str(rng.choice(["left", "right", ""]))
        img = medimg.chest_xray(rng, shape, {"effusion": effusion} if effusion else {})
        if i % 3 == 0:
            return [img], _q(
                f"Is there a pleural effusion on the {effusion or 'left'} side?",
                "yes" if effusion else "no",
                "yes/no",
                "chest",
                "abnormality",
            )
        if i % 3 == 1:
            return [img], _q(
                "What imaging modality was used to take this image?", "x-ray", "open", "chest", "modality"
            )
        return [img], _q("Which part of the body is shown in this image?", "chest", "open", "chest", "organ")
    body = _BODY[region]
    kind = i % 3
    if kind == 0:
        target = organ or {"abdomen": "liver", "chest": "lung", "head": "brain"}[region]
        return [img], _q(
            f"Is there a lesion in the {target}?", "yes" if organ else "no", "yes/no", body, "abnormality"
        )
    if kind == 1:
        if organ:
            return [img], _q("Which organ contains the abnormality?", str(organ), "open", body, "organ")
        return [img], _q(
            "What imaging modality was used to take this image?", modality, "open", body, "modality"
        )
    if organ:
        # Gold as a digit half the time and as a word the other half: both normalise to the digit.
        gold = str(n) if rng.integers(0, 2) else NUMBER_WORDS[n]
        return [img], _q(f"How many lesions are seen in the {organ}?", gold, "open", body, "counting")
    return [img], _q("Which part of the body is shown in this image?", body, "open", body, "organ")


def _pathology(rng: np.random.Generator, shape, i: int) -> tuple[list[np.ndarray], dict[str, Any]]:
    tissue = str(rng.choice(["normal", "adenocarcinoma", "inflammation", "fibrosis"]))
    necrosis = bool(rng.integers(0, 2)) and tissue == "adenocarcinoma"
    img = medimg.he_patch(rng, shape, tissue, necrosis)
    kind = i % 3
    if kind == 0:
        answer = "yes" if necrosis else "no"
        return [img], _q("Is there necrosis in this tissue?", answer, "yes/no", "colon", "abnormality")
    if kind == 1:
        names = {
            "normal": "normal colonic mucosa",
            "adenocarcinoma": "adenocarcinoma",
            "inflammation": "chronic inflammation",
            "fibrosis": "fibrosis",
        }
        return [img], _q("What process is shown in this image?", names[tissue], "open", "colon", "diagnosis")
    asked = str(rng.choice(["adenocarcinoma", "fibrosis"]))
    answer = "yes" if asked == tissue else "no"
    return [img], _q(f"Does this image show {asked}?", answer, "yes/no", "colon", "diagnosis")


def _multiple_choice(rng: np.random.Generator, shape, i: int) -> tuple[list[np.ndarray], dict[str, Any]]:
    scenario = int(rng.integers(0, 3))
    age = int(rng.integers(25, 85))
    sex = str(rng.choice(["man", "woman"]))
    if scenario == 0:
        choices = [
            "Left pleural effusion",
            "Right pneumothorax",
            "Cardiomegaly",
            "Right lower lobe consolidation",
            "No acute abnormality",
        ]
        facts = [
            {"effusion": "left"},
            {"pneumothorax": "right"},
            {"cardiomegaly": "yes"},
            {"consolidation": "right"},
            {},
        ]
        k = int(rng.integers(0, 5))
        img = medimg.chest_xray(rng, shape, facts[k])
        stem = (
            f"A {age}-year-old {sex} presents with shortness of breath. "
            "Which finding best explains the radiograph?"
        )
        body, task = "chest", "diagnosis"
    elif scenario == 1:
        choices = [
            "Hepatic lesions",
            "Renal lesion",
            "Pulmonary nodule",
            "Intracranial lesion",
            "No focal lesion",
        ]
        k = int(rng.integers(0, 5))
        region, lesion = [
            ("abdomen", "liver"),
            ("abdomen", "kidney"),
            ("chest", "lung"),
            ("head", "brain"),
            ("abdomen", None),
        ][k]
        if region == "head":
            img = medimg.mri_slice(rng, shape, True)
        else:
            img = medimg.ct_slice(rng, shape, region, lesion, 2)
        stem = (
            f"A {age}-year-old {sex} undergoes cross-sectional imaging for weight loss. "
            "What does the image show?"
        )
        body, task = _BODY[region], "diagnosis"
    else:
        choices = [
            "Normal colonic mucosa",
            "Invasive adenocarcinoma",
            "Chronic inflammation",
            "Fibrosis",
            "Necrosis only",
        ]
        k = int(rng.integers(0, 4))
        tissue = ["normal", "adenocarcinoma", "inflammation", "fibrosis"][k]
        img = medimg.he_patch(rng, shape, tissue)
        stem = f"A colon biopsy from a {age}-year-old {sex} is shown. What is the most likely diagnosis?"
        body, task = "colon", "diagnosis"
    return [img], _mc(rng, stem, choices, k, body, task)


def _video(
    rng: np.random.Generator, shape, i: int, frames: tuple[int, int]
) -> tuple[list[np.ndarray], dict[str, Any]]:
    n = int(rng.integers(frames[0], frames[1] + 1))
    choices = [
        "It moves to the left",
        "It moves to the right",
        "It moves upward",
        "It moves downward",
        "It does not move",
    ]
    k = int(rng.integers(0, 5))
    imgs = medimg.video_frames(rng, shape, n, ["left", "right", "up", "down", "none"][k])
    stem = (
        f"These {n} frames are taken in order from one ultrasound clip. "
        "How does the hypoechoic structure move across the frames?"
    )
    return imgs, _mc(rng, stem, choices, k, "abdomen", "temporal reasoning")


def _q(question: str, answer: str, answer_type: str, body: str, task: str) -> dict[str, Any]:
    return {
        "question": question,
        "answer_text": answer,
        "answer_label": "",
        "answer_type": answer_type,
        "body_system": body,
        "medical_task": task,
        "question_type": "binary" if answer_type == "yes/no" else "open",
    }


def _mc(
    rng: np.random.Generator, stem: str, choices: list[str], correct: int, body: str, task: str
) -> dict[str, Any]:
    order = rng.permutation(len(choices))
    options = {LABELS[j]: choices[int(o)] for j, o in enumerate(order)}
    label = LABELS[int(np.where(order == correct)[0][0])]
    return {
        "question": stem,
        "answer_text": options[label],
        "answer_label": label,
        "answer_type": "multiple_choice",
        "options": options,
        "body_system": body,
        "medical_task": task,
        "question_type": "multiple_choice",
    }


def _case(spec: TaskSpec, seed: int, i: int) -> tuple[list[np.ndarray], dict[str, Any]]:
    assert spec.vqa is not None
    rng = medimg.case_rng(spec, seed, i)
    shape = tuple(spec.vqa.synth_shape)
    if spec.vqa.style == "video":
        return _video(rng, shape, i, (spec.vqa.frames[0], spec.vqa.frames[-1]))
    if spec.vqa.answer_mode == "multiple_choice":
        return _multiple_choice(rng, shape, i)
    if spec.vqa.style == "pathology":
        return _pathology(rng, shape, i)
    return _radiology(rng, shape, i)


def synth(spec: TaskSpec, out: Path, cases: int, seed: int) -> None:
    """Write ``cases`` questions of ``spec``'s task into ``out/public`` and ``out/private``, as the
    converters write a real dataset's."""
    if spec.vqa is None:
        raise TaskError(f"task {spec.id}: not a VQA task")
    fresh_sides(out)
    dataset = spec.dataset.split(" (")[0].split(",")[0]
    questions = []
    for i in range(cases):
        images, q = _case(spec, seed, i)
        jpegs = [(".jpg", medimg.jpeg_bytes(img)) for img in images]
        questions.append(Question(qid=spec.case_id(i), images=jpegs, dataset=dataset, **q))
    write_questions(spec, questions, out, out)


def perfect_submission(spec: TaskSpec, data: Path, workspace: Path) -> None:
    """One ``answer.json`` per question with the gold answer, as ``submit_answer`` would write it."""
    assert spec.vqa is not None
    root = workspace / spec.submission.root
    for path in sorted((data / "private").glob(f"*/{spec.vqa.answer_file}")):
        gold = json.loads(path.read_text(encoding="utf-8"))
        qid = gold["question_id"]
        text = gold["answer_text"]
        write_json(
            root / qid / spec.vqa.answer_file,
            {
                "question_id": qid,
                "predicted_label": gold.get("answer_label", ""),
                "predicted_answer": text,
                "raw_model_output": f"The answer is {text}.",
                "model_name": "reference-oracle",
                "runtime_s": 0.0,
            },
            ensure_ascii=False,
        )
