"""What the baseline policy knows of a run when it picks its next step, and what a step returns."""

from __future__ import annotations

import json
import posixpath
import re
from dataclasses import dataclass, field
from typing import Any

from schemas.task_spec import TaskSpec

CASE_LINE = re.compile(r"^CASE (\S+)\s*$", re.M)


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict


@dataclass(frozen=True)
class Decision:
    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)


@dataclass
class Step:
    """An earlier step, as the conversation shows it: its name, exit code and output."""

    name: str
    exit_code: int | None
    output: str


def json_line(output: str, tag: str) -> dict | None:
    for line in reversed(output.splitlines()):
        if line.startswith(tag + " "):
            try:
                return json.loads(line[len(tag) + 1 :])
            except ValueError:
                return None
    return None


class Context:
    """What the policy knows when it picks a step: the task, its data folder, the tier, the flaw
    and the steps so far; and what follows from them (the cases, the method, the outputs' names, the
    kit's configuration)."""

    def __init__(self, spec: TaskSpec, data: str, tier: str, flaw: str | None, steps: list[Step]):
        self.spec, self.data, self.tier, self.flaw, self.steps = spec, data, tier, flaw, steps
        self.track = spec.track

    # facts from earlier results
    @property
    def cases(self) -> list[str]:
        for s in self.steps:
            if s.name == "explore":
                return CASE_LINE.findall(s.output)
        return []

    @property
    def pilot_case(self) -> str:
        cases = self.cases
        return cases[0] if cases else "UNKNOWN"

    def call(self, content: str, args: dict) -> Decision:
        """A turn that runs ``args`` (``execute_code``) after saying ``content``."""
        return Decision(content, [ToolCall("execute_code", args)])

    # what the method is, in words (for the plan) and as configuration (for the kit)
    def method(self) -> tuple[str, list[str]]:
        t = self.track
        if t == "segmentation":
            assert self.spec.seg is not None
            what = (
                "intensity thresholding of enhancing soft tissue, connected components (largest "
                "regions kept), "
                "region growing, and darker sub-regions inside the organ as the lesion"
                if self.spec.seg.mode == "binary"
                else "Otsu foreground thresholding and intensity quantile bins mapped to the tissue labels"
            )
            return what, [
                "classical thresholding + connected components (chosen: no weights to download)",
                "nnU-Net family checkpoint (needs weights and a GPU)",
                "MONAI bundle / VISTA3D (needs weights and a GPU)",
            ]
        if t == "enhancement":
            assert self.spec.enh is not None
            what = (
                "a 3x3 binomial smoothing filter"
                if self.spec.enh.kind == "denoise"
                else f"bilinear upsampling by x{self.spec.enh.scale}"
            )
            return what, [
                f"classical filter: {what} (chosen)",
                "DRUNet / deep denoiser (needs weights)",
                "Swin2SR transformer (needs weights)",
            ]
        if t == "vqa":
            return (
                "an answer prior per question type (the most frequent answer: 'no' for yes/no questions, "
                "a normal or first option for multiple choice)"
            ), [
                "answer prior per question type (chosen: no model available offline)",
                "LLaVA-Med v1.5 (needs weights)",
                "general VLM (needs weights)",
            ]
        if t == "report":
            return "a normal-study findings template filled from the manifest", [
                "findings template from the manifest (chosen)",
                "CheXagent (needs weights)",
                "BLIP captioning (needs weights)",
            ]
        return "a blob detector (background threshold, connected components, one box per blob)", [
            "blob detector on the thresholded image (chosen)",
            "YOLOv8 fine-tuned (needs weights)",
            "Faster R-CNN (needs weights)",
        ]

    def outputs(self) -> list[str]:
        files = list(self.spec.submission.files)
        if self.flaw == "wrong-filename":
            files = [posixpath.join(posixpath.dirname(f), "pred_" + posixpath.basename(f)) for f in files]
        return files

    def config(self) -> dict:
        s = self.spec
        cfg: dict[str, Any] = {
            "task": s.id,
            "track": s.track,
            "data": self.data,
            "root": s.submission.root,
            "outputs": self.outputs(),
        }
        if s.track == "segmentation":
            assert s.seg is not None
            cfg.update(mode=s.seg.mode, input_file=s.seg.input_file or s.public.files[0])
            if s.seg.mode == "binary":
                # CT has a fixed scale (Hounsfield units): enhancing soft tissue; other modalities are
                # thresholded relative to the image itself.
                cfg.update(window=[85.0, 300.0] if "CT" in s.modality.split() else None)
                cfg.update(
                    kinds=[t.kind for t in s.seg.targets],
                    label_ids=[1],
                    keep=2 if re.search(r"\bkidneys\b|two kidney", self.brief_hint(), re.I) else 1,
                )
            else:
                cfg.update(label_ids=[lab.id for lab in s.seg.labels])
        elif s.track == "enhancement":
            assert s.enh is not None
            cfg.update(kind=s.enh.kind, scale=s.enh.scale, input_file=s.enh.input_file, passes=1)
        elif s.track == "vqa":
            assert s.vqa is not None
            cfg.update(question_file=s.vqa.question_file)
        elif s.track == "report":
            assert s.report is not None
            cfg.update(
                manifest_file=s.report.manifest_file,
                style=s.report.style,
                section=s.report.section,
                min_chars=s.report.min_chars,
            )
        else:
            assert s.det is not None
            cfg.update(input_file=s.det.image_file, classes=list(s.submission.classes) or [s.det.wildcard])
        return cfg

    def brief_hint(self) -> str:
        from tasks.registry import brief

        try:
            return brief(self.spec.id, self.tier)
        except Exception:
            return ""
