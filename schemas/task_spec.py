"""The typed task spec: what a task gives the agent, what it must hand back, and how it is scored.

One ``tasks/<task-id>/spec.toml`` per task is decoded into ``TaskSpec``. Specs are configuration, not
stored history, so every Struct here rejects unknown fields: a typo in a spec file is an error at
load time (``tasks.registry.load_spec``), never a silently ignored key.

Adding a field: give it a default and put it last in its Struct (other helpers' specs must still
load). Track-specific settings go in a typed sub-struct (``seg`` for segmentation); tracks that have
none yet may use the free-form ``params`` table until they get one.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

import msgspec

from schemas.errors import AmbError, NotFound

Track = Literal["segmentation", "enhancement", "vqa", "report", "detection"]
Tier = Literal["lite", "standard"]
TIERS: tuple[str, ...] = get_args(Tier)


class TaskError(AmbError):
    """A task id, spec file, data directory or converter source is wrong."""


class UnknownTask(TaskError, NotFound):
    """No task of that id (exit code 3, as every thing a command names that is not there)."""


class _Config(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Base of every spec Struct: immutable, keyword-only, unknown fields rejected."""


class Layout(_Config, frozen=True, kw_only=True):
    """Where a task's per-case files sit under ``public/`` or ``private/``."""

    case_dir: str = "{case}"
    """Folder of one case, relative to the side's root (``{case}`` is the case id)."""
    files: list[str] = []
    """Per-case files inside ``case_dir`` (e.g. ``["ct.nii.gz"]``)."""
    shared: list[str] = []
    """Files directly under the side's root, shared by all cases (manifests, case lists)."""


class SubmissionSpec(_Config, frozen=True, kw_only=True):
    """The exact contract for what the agent writes into its workspace."""

    root: str = "agents_outputs"
    """Folder under the workspace that holds the outputs (``agent_outputs`` for report tasks)."""
    files: list[str]
    """Required per-case outputs relative to ``root``, e.g. ``["{case}/organ.nii.gz"]``."""
    optional: list[str] = []
    """Files the agent may also write (relative to ``root``); never required, never scored."""
    format: Literal["nifti", "npy", "json", "text"]
    """File format of the required outputs."""
    dtype: str = ""
    """Required dtype or dtype family (``integer``, ``float32``, ...); empty when not applicable."""
    shape: str = ""
    """``like_input`` (same shape as the case's input) or a fixed shape such as ``720x512``."""
    label_ids: list[int] = []
    """Segmentation: label ids allowed in an output besides 0 (binary masks: ``[1]``)."""
    classes: list[str] = []
    """Detection / multiple choice: the allowed class names or option labels."""


class Metric(_Config, frozen=True, kw_only=True):
    """The task metric and its pinned parameters (echoed into every grade result)."""

    name: str
    """``macro_dice``, ``ssim``, ``vqa_accuracy``, ``report_score``, ``map50``, ..."""
    params: dict[str, Any] = {}
    """Pinned parameters (thresholds, IoU, data range source, ...)."""


class SegTarget(_Config, frozen=True, kw_only=True):
    """A binary segmentation target: one mask file per case on both sides."""

    name: str
    """``organ`` or ``lesion`` (the name is also the output file stem)."""
    file: str
    """File name inside the case folder, e.g. ``organ.nii.gz`` (same name in submission and private)."""
    kind: Literal["organ", "lesion"]
    """Organ Dice averages over all cases; lesion Dice only over cases with a non-empty reference."""
    alias: list[str] = []
    """Other accepted submission file names, tried in order after ``file`` (the public code's lookup)."""


class SegLabel(_Config, frozen=True, kw_only=True):
    """One foreground label of a multiclass label map."""

    id: int
    name: str


class SegSpec(_Config, frozen=True, kw_only=True):
    """Segmentation-specific settings: binary organ+lesion masks or one multiclass label map."""

    mode: Literal["binary", "multiclass"]
    targets: list[SegTarget] = []
    """``binary`` mode: the targets (organ, lesion)."""
    label_file: str = ""
    """``multiclass`` mode: the label-map file name in the case folder (e.g. ``dseg.nii.gz``)."""
    labels: list[SegLabel] = []
    """``multiclass`` mode: the foreground labels that are scored (macro over these)."""
    threshold: float = 0.5
    """Binary masks are binarised with ``value > threshold``."""
    input_file: str = ""
    """The public input whose shape every output must match (e.g. ``ct.nii.gz``)."""
    synth_shape: list[int] = msgspec.field(default_factory=lambda: [48, 48, 32])
    """Default synthetic-twin volume shape (x, y, z); small so tests stay fast."""
    synth_spacing: list[float] = msgspec.field(default_factory=lambda: [1.0, 1.0, 2.5])
    """Synthetic-twin voxel spacing in mm (x, y, z)."""
    synth_recipe: Literal["organ_lesion", "fetal_brain", "airway", "organ_atlas"] = "organ_lesion"
    """Which phantom the synthetic twin draws (``tasks.synth.segmentation``)."""
    synth_organs: int = 1
    """``organ_lesion``: how many organ bodies (2 for the paired kidneys)."""


class EnhSpec(_Config, frozen=True):
    """Enhancement settings (LDCT denoising, MRI super-resolution): 2-D float32 slices in ``.npy``."""

    kind: Literal["denoise", "super_resolution"]
    input_file: str = "input.npy"
    """Public per-case input slice."""
    output_file: str = "enhanced.npy"
    """Submitted per-case output, under ``submission.root/{case}/``."""
    reference_file: str = "reference.npy"
    """Private per-case reference slice (the output must have its shape)."""
    ranges_file: str = "ground_truth.csv"
    """Private CSV with ``patient_id,data_range``: SSIM/PSNR's data range per case; a case without a
    row uses the reference's max - min. Never the dtype's range."""
    scale: int = 1
    """Output size / input size per axis (2 for ×2 super-resolution)."""
    value_range: list[float] = msgspec.field(default_factory=lambda: [0.0, 1.0])
    """Nominal intensity range of the slices (HU for CT), for the briefs and the synthetic twin."""
    synth_shape: list[int] = msgspec.field(default_factory=lambda: [128, 128])
    """Synthetic twin's reference (output) shape, rows × columns; small so tests stay fast."""


class DetSpec(_Config, frozen=True):
    """Detection settings: one image per case, boxes as JSON in original pixel coordinates."""

    image_file: str = "image.png"
    """Public per-case image."""
    output_file: str = "prediction.json"
    """Submitted per-case ``{"boxes": [{"class", "score", "x1", "y1", "x2", "y2"}]}``."""
    reference_file: str = "boxes.json"
    """Private per-case reference boxes (same schema, plus ``width`` and ``height`` of the image)."""
    wildcard: str = "abnormality"
    """A class name that matches every class (the public code's rule; a grade option can turn it off)."""
    style: Literal["smear", "chest_xray", "wrist_xray", "dental_xray"] = "chest_xray"
    """Appearance of the synthetic twin's images."""
    synth_shape: list[int] = msgspec.field(default_factory=lambda: [192, 256])
    """Synthetic twin's image size, rows × columns."""
    synth_boxes: list[int] = msgspec.field(default_factory=lambda: [1, 6])
    """Synthetic twin: minimum and maximum boxes per image."""


class VqaSpec(_Config, frozen=True):
    """VQA settings: one folder per question; the agent writes one ``answer.json`` per question."""

    answer_mode: Literal["open_ended", "multiple_choice"]
    """``open_ended`` (free text; yes/no golds scored strictly) or ``multiple_choice`` (A-E labels)."""
    question_file: str = "question.json"
    """Public per-case question (``question_id, dataset, question, image_paths, ...``, ``options`` for MC)."""
    answer_file: str = "answer.json"
    """Submitted per case under ``submission.root/{case}/``; the private reference has the same name."""
    style: Literal["radiology", "pathology", "mixed", "video"] = "radiology"
    """Appearance of the synthetic twin's images."""
    frames: list[int] = msgspec.field(default_factory=lambda: [1, 1])
    """Synthetic twin: minimum and maximum images per question (2-5 for multi-frame)."""
    synth_shape: list[int] = msgspec.field(default_factory=lambda: [128, 128])
    """Synthetic twin's image size, rows x columns."""


class ReportSpec(_Config, frozen=True):
    """Report-generation settings: one study (images + manifest) per case, one ``report.txt`` back."""

    output_file: str = "report.txt"
    """Submitted per case under ``submission.root/{case}/``; the private reference has the same name."""
    manifest_file: str = "manifest.json"
    """Public per-case manifest listing the study's images."""
    images_dir: str = "images"
    """Public per-case image folder."""
    section: Literal["findings", "full"] = "findings"
    """``findings``: score only the FINDINGS section when a report has one; ``full``: the whole text."""
    min_chars: int = 40
    max_chars: int = 8000
    min_letters: int = 20
    printable_ascii: bool = True
    """Validity rules of a submitted report (an invalid report scores 0 with its reason)."""
    style: Literal["chest_xray", "pathology"] = "chest_xray"
    """Appearance and vocabulary of the synthetic twin."""
    views: list[int] = msgspec.field(default_factory=lambda: [1, 1])
    """Synthetic twin: minimum and maximum images per study."""
    with_impression: bool = False
    """Synthetic twin: reference reports carry an IMPRESSION section after the FINDINGS."""
    synth_shape: list[int] = msgspec.field(default_factory=lambda: [128, 128])
    """Synthetic twin's image size, rows x columns."""


class TaskSpec(_Config, frozen=True, kw_only=True):
    """One benchmark task (both tiers share it; the tier only changes the brief)."""

    id: str
    """Task id, e.g. ``kidney-seg`` (the benchmark's id without the ``-task`` suffix)."""
    track: Track
    name: str
    """Human name as in the paper's task table."""
    dataset: str
    """Source dataset and release."""
    citation: str
    """Citation of the source dataset."""
    modality: str
    """``CT``, ``MRI``, ``X-ray``, ``pathology``, ``microscopy``, ``dental X-ray``, ``video``, ..."""
    time_limit_s: int
    """Wall-time cap of a run (hidden from the agent in segmentation)."""
    cases: int
    """Case count of the benchmark's held-out set (default case count of a synthetic twin is smaller)."""
    case_id_format: str = "case_{i:05d}"
    """Python format of the synthetic twin's case ids (``i`` counts from 0, ``n`` from 1)."""
    public: Layout
    """What the agent gets under ``/data/public``."""
    private: Layout
    """What the grader reads (never mounted into the agent's container)."""
    submission: SubmissionSpec
    metric: Metric
    forbidden_paths: list[str] = msgspec.field(default_factory=lambda: ["/data/private", "/eval", "/results"])
    """Paths the agent must never touch (a touch is a sandbox violation)."""
    converter: str = ""
    """Module name under ``tasks/convert/`` that prepares this task from the real dataset; empty if none."""
    seg: SegSpec | None = None
    """Segmentation settings (required when ``track = "segmentation"``)."""
    params: dict[str, Any] = {}
    """Track-specific settings for tracks without a typed sub-struct yet."""
    enh: EnhSpec | None = None
    """Enhancement settings (required when ``track = "enhancement"``)."""
    det: DetSpec | None = None
    """Detection settings (required when ``track = "detection"``)."""
    vqa: VqaSpec | None = None
    """VQA settings (required when ``track = "vqa"``)."""
    report: ReportSpec | None = None
    """Report-generation settings (required when ``track = "report"``)."""

    def case_id(self, i: int) -> str:
        """The synthetic twin's id of case number ``i``."""
        return self.case_id_format.format(i=i, n=i + 1)


def decode_spec(data: dict[str, Any], *, source: str = "spec") -> TaskSpec:
    """Build a ``TaskSpec`` from a parsed TOML table; any mismatch is one ``TaskError`` line."""
    try:
        spec = msgspec.convert(data, TaskSpec)
    except msgspec.ValidationError as e:
        raise TaskError(f"{source}: {e}") from e
    table = {"segmentation": "seg", "enhancement": "enh", "detection": "det"}.get(spec.track, spec.track)
    if getattr(spec, table) is None:
        raise TaskError(f"{source}: {spec.track} task without a [{table}] table")
    return spec
