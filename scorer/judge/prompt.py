"""The LLM judge's prompt, versioned (``judge.prompt_version`` in the profile names this text).

One call judges one rubric item, so a one-item rubric change re-asks exactly that item for each run
(every other call's input, and so its cache key, is unchanged). The evidence is fenced between
markers that ``scorer.evidence.neutralise`` keeps out of model-written text.
"""

from __future__ import annotations

import base64
from typing import Any

from scorer.evidence import Evidence
from scorer.profile import RubricItem

PROMPTS = {
    "amb-judge-item-v1": (
        "You are an expert medical-AI evaluator grading one autonomous agent run of a medical imaging "
        "benchmark. You judge exactly ONE rubric item from the evidence (a deterministic summary of "
        "the recorded run; metric values in it are facts). Judge only what the evidence shows. "
        "Do not score inference (S4) or submission (S5).\n"
        "Reply with one JSON object and nothing else:\n"
        '{"item": "<item id>", "value": <one of the offered values>, '
        '"evidence": ["<event id in square brackets in the evidence, e.g. proxy:12>", ...], '
        '"reason": "<one sentence>"}\n'
        "Use only an offered value; intermediate values are not allowed."
    ),
}

TIER_NOTES = {
    "lite": (
        "Tier LITE: the method was prescribed; judge understanding of the given model, not breadth of search."
    ),
    "standard": (
        "Tier STANDARD: the agent had to choose among candidate families; judge the comparison and the "
        "choice."
    ),
}

EVIDENCE_PLACEHOLDER = "{{evidence:%s}}"
"""Stored requests carry this instead of the evidence text (stored once per run as a blob)."""


def system_text(version: str) -> str:
    try:
        return PROMPTS[version]
    except KeyError:
        raise KeyError(f"unknown judge prompt version {version!r} (known: {', '.join(PROMPTS)})") from None


def _fmt(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else repr(float(v))


def user_text(item: RubricItem, tier: str | None, evidence_text: str) -> str:
    offered = ", ".join(_fmt(v) for v in item.values)
    return (
        f"Rubric item {item.id} (stage {item.stage}): {item.text}\n"
        f"Offered values: [{offered}]\n"
        f"{TIER_NOTES.get(tier or '', 'Tier: unknown.')}\n"
        f"<<<EVIDENCE\n{evidence_text}EVIDENCE>>>\n"
        f'Answer for item "{item.id}" only, as one JSON object.'
    )


def messages(
    item: RubricItem,
    tier: str | None,
    evidence: Evidence,
    version: str,
    *,
    images: bool,
    placeholder: bool = False,
) -> list[dict[str, Any]]:
    """The chat messages of one item's call. ``placeholder`` swaps the evidence for its digest."""
    ev_text = (EVIDENCE_PLACEHOLDER % evidence.sha256) if placeholder else evidence.text
    user: Any = user_text(item, tier, ev_text)
    if images and evidence.images and item.rule == "plot_is_diagram":
        parts: list[dict[str, Any]] = [{"type": "text", "text": user}]
        for img in evidence.images:
            url = (
                f"blob:{img.path}"
                if placeholder
                else f"data:{img.media_type};base64,{base64.b64encode(img.data).decode()}"
            )
            parts.append({"type": "image_url", "image_url": {"url": url}})
        user = parts
    return [{"role": "system", "content": system_text(version)}, {"role": "user", "content": user}]


CODES_PROMPT = (
    "You are an expert medical-AI evaluator diagnosing one autonomous agent run of a medical imaging "
    "benchmark. Assign the error codes that apply (zero or more; they are diagnostic and do not change "
    "scores). Codes (cause-based, multi-label):\n"
    "E1 understanding: wrong problem, or an approach incompatible with the objective, modality, metric "
    "or artifact.\n"
    "E2 data/model setup: cannot access, prepare, load or configure data, models, APIs, dependencies "
    "or runtime.\n"
    "E3 verification/recovery: invalid intermediate or final outputs appear but are not detected, "
    "validated, debugged or recovered.\n"
    "E4 implementation/execution: a plausible pipeline whose code, commands or processing fail.\n"
    "E5 deliverable/submission: final artifacts missing, incomplete, malformed, misnamed, misplaced or "
    "schema-incompatible.\n"
    "A clean successful run has no code. Every code must cite at least one event id shown in square "
    "brackets in the evidence.\n"
    'Reply with one JSON object and nothing else: {"codes": [{"code": "E3", "evidence": ["proxy:12"], '
    '"reason": "<one sentence>"}]}'
)


def codes_messages(evidence: Evidence, *, placeholder: bool = False) -> list[dict[str, Any]]:
    ev_text = (EVIDENCE_PLACEHOLDER % evidence.sha256) if placeholder else evidence.text
    user = f"Error codes for this run.\n<<<EVIDENCE\n{ev_text}EVIDENCE>>>\nAnswer with the codes object only."
    return [{"role": "system", "content": CODES_PROMPT}, {"role": "user", "content": user}]
