"""Synthetic twins for the report-generation track, in the layout the converters write
(``tasks.case_files.write_report_case``).

Chest X-ray reports are assembled from the findings the image was drawn with (effusion side and size,
heart size, pneumothorax, consolidation, edema, tubes, nodules) in the phrasing radiologists use,
normal statements filling in the rest, so the clinical parts of the report score (CheXpert labels,
RadGraph entities) have something real to agree or disagree on. Pathology captions name the tissue,
the process and its grade, matching the H&E patch.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from schemas.task_spec import TaskError, TaskSpec
from tasks.case_files import write_report_case
from tasks.synth import copy_references, fresh_sides, medimg


def _cxr_findings(rng: np.random.Generator) -> dict[str, str]:
    facts: dict[str, str] = {}
    if rng.random() < 0.45:
        facts["effusion"] = str(rng.choice(["left", "right", "bilateral"]))
        facts["effusion_size"] = str(rng.choice(["small", "moderate"]))
    if rng.random() < 0.35:
        facts["cardiomegaly"] = str(rng.choice(["mildly", "moderately"]))
    if rng.random() < 0.15:
        facts["pneumothorax"] = str(rng.choice(["left", "right"]))
    if rng.random() < 0.3:
        facts["consolidation"] = str(rng.choice(["left", "right"]))
    if rng.random() < 0.2:
        facts["edema"] = "mild"
    if rng.random() < 0.2:
        facts["tube"] = "endotracheal"
    if rng.random() < 0.15:
        facts["nodule"] = "yes"
    return facts


_NORMAL_HEART = (
    "The heart size is normal.",
    "Heart size is within normal limits.",
    "The cardiomediastinal silhouette is normal.",
)
_NORMAL_BONES = (
    "The osseous structures are unremarkable.",
    "No acute osseous abnormality.",
    "Visualized bones are intact.",
)


def _cxr_text(rng: np.random.Generator, f: dict[str, str]) -> tuple[str, str]:
    """(FINDINGS paragraph, IMPRESSION) for the drawn findings."""
    s: list[str] = []
    imp: list[str] = []
    if "tube" in f:
        s.append("An endotracheal tube terminates approximately 4 cm above the carina.")
        imp.append("Endotracheal tube in standard position.")
    if "cardiomegaly" in f:
        s.append(f"The cardiac silhouette is {f['cardiomegaly']} enlarged.")
        imp.append("Cardiomegaly.")
    else:
        s.append(str(rng.choice(_NORMAL_HEART)))
    if "edema" in f:
        s.append("There is mild pulmonary vascular congestion with perihilar edema.")
        imp.append("Mild pulmonary edema.")
    if "consolidation" in f:
        lobe = "left lower lobe" if f["consolidation"] == "left" else "right lower lobe"
        s.append(f"There is patchy consolidation in the {lobe}, concerning for pneumonia.")
        imp.append(f"{lobe.capitalize()} consolidation, possibly pneumonia.")
    if "nodule" in f:
        s.append("A 9 mm nodule is noted in the upper lung zone.")
        imp.append("Pulmonary nodule; follow-up CT is recommended.")
    if "effusion" in f:
        bilateral = f["effusion"] == "bilateral"
        side = "bilateral pleural effusions" if bilateral else f"{f['effusion']} pleural effusion"
        s.append(f"{'There are' if bilateral else 'There is a'} {f['effusion_size']} {side}.")
        imp.append(f"{f['effusion_size'].capitalize()} {side}.")
    if "pneumothorax" in f:
        s.append(f"A small {f['pneumothorax']} apical pneumothorax is present.")
        imp.append(f"Small {f['pneumothorax']} pneumothorax.")
    absent = (
        ("consolidation", "focal consolidation"),
        ("effusion", "pleural effusion"),
        ("pneumothorax", "pneumothorax"),
    )
    negatives = [name for fact, name in absent if fact not in f]
    if negatives:
        listed = negatives[0] if len(negatives) == 1 else ", ".join(negatives[:-1]) + " or " + negatives[-1]
        s.append(f"There is no {listed}.")
    s.append(str(rng.choice(_NORMAL_BONES)))
    if not imp:
        imp.append("No acute cardiopulmonary process.")
    return " ".join(s), " ".join(imp)


_TISSUES = {
    "normal": [
        "Normal colonic mucosa with regular crypts and no dysplasia.",
        "Benign colonic mucosa with preserved crypt architecture.",
    ],
    "adenocarcinoma": [
        "Moderately differentiated adenocarcinoma with irregular glands infiltrating the stroma.",
        "Invasive adenocarcinoma with crowded glands and enlarged pleomorphic nuclei.",
    ],
    "inflammation": [
        "Chronic inflammation with a dense lymphoplasmacytic infiltrate in the lamina propria.",
        "Mucosa with marked chronic inflammation and no malignancy.",
    ],
    "fibrosis": [
        "Dense fibrosis with streaming collagen bundles and scattered spindle cells.",
        "Fibrotic stroma with few cells and no epithelial lesion.",
    ],
}


def _case(spec: TaskSpec, seed: int, i: int) -> tuple[list[np.ndarray], str]:
    assert spec.report is not None
    rng = medimg.case_rng(spec, seed, i)
    shape = (int(spec.report.synth_shape[0]), int(spec.report.synth_shape[1]))
    if spec.report.style == "pathology":
        tissue = str(rng.choice(list(_TISSUES)))
        necrosis = tissue == "adenocarcinoma" and bool(rng.integers(0, 2))
        caption = str(rng.choice(_TISSUES[tissue]))
        if necrosis:
            caption = caption[:-1] + ", with focal necrosis."
        return [medimg.he_patch(rng, shape, tissue, necrosis)], caption
    facts = _cxr_findings(rng)
    lo, hi = spec.report.views[0], spec.report.views[-1]
    n_views = int(rng.integers(lo, hi + 1))
    images = [medimg.chest_xray(rng, shape, facts, lateral=(k == 1)) for k in range(n_views)]
    findings, impression = _cxr_text(rng, facts)
    if spec.report.with_impression:
        return images, f"FINDINGS: {findings}\n\nIMPRESSION: {impression}"
    return images, findings


def synth(spec: TaskSpec, out: Path, cases: int, seed: int) -> None:
    """Write ``cases`` studies of ``spec``'s task into ``out/public`` and ``out/private``."""
    if spec.report is None:
        raise TaskError(f"task {spec.id}: not a report-generation task")
    fresh_sides(out)
    findings_only = spec.report.section == "findings" and not spec.report.with_impression
    mode = "findings_only" if findings_only else "full_report"
    for i in range(cases):
        case = spec.case_id(i)
        images, text = _case(spec, seed, i)
        write_report_case(out, spec, case, [medimg.jpeg_bytes(img) for img in images], text, mode)


def perfect_submission(spec: TaskSpec, data: Path, workspace: Path) -> None:
    """Copy every reference report to ``<workspace>/agent_outputs/<case>/report.txt``."""
    assert spec.report is not None
    copy_references(spec, data, workspace, spec.report.output_file)
