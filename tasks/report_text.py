"""Sections of a radiology report: shared by the report converters and the report grader.

Reports mark their parts with upper-case headers followed by a colon at the start of a line
(``FINDINGS:``, ``IMPRESSION:``, ``INDICATION:`` ...), as MIMIC-CXR and CheXpert Plus reports do and
as AutoMedBench's report scorer parses them. ``FINDINGS AND IMPRESSION`` and ``CONCLUSION`` are
impression aliases; ``FINDING`` is a findings alias.

Also the validity rules of a submitted report. Both live in ``tasks`` (not ``scorer``) because the
converters, which may import only ``schemas``, need the same rules: to stage findings-only
references, and to leave out references that a perfect agent could not legally hand in.
"""

from __future__ import annotations

import re

import msgspec

from schemas.task_spec import ReportSpec

_HEADER = re.compile(r"(?:^|\n)[ \t]*([A-Z][A-Z /(),-]{1,40}?)[ \t]*:[ \t]*")
SECTION_ALIASES = {
    "finding": "findings",
    "findings": "findings",
    "reference findings": "findings",
    "findings and impression": "impression",
    "findings/impression": "impression",
    "impression": "impression",
    "conclusion": "impression",
}


def split_sections(text: str) -> dict[str, str]:
    """Upper-case ``HEADER:`` sections of a report, lower-case names (first non-empty one wins)."""
    sections: dict[str, str] = {}
    matches = list(_HEADER.finditer(text))
    for k, m in enumerate(matches):
        raw = m.group(1).strip().lower()
        name = SECTION_ALIASES.get(raw, raw)
        end = matches[k + 1].start() if k + 1 < len(matches) else len(text)
        body = text[m.end() : end].strip()
        if body and name not in sections:
            sections[name] = body
    return sections


class Validity(msgspec.Struct, frozen=True, kw_only=True):
    """The benchmark's output-format rules for one report file (pinned per task in spec.toml)."""

    min_chars: int = 40
    max_chars: int = 8000
    min_letters: int = 20
    printable_ascii: bool = True


_PRINTABLE = frozenset(chr(c) for c in range(32, 127)) | {"\n", "\t", "\r", "\x0b", "\x0c"}


def validity_errors(text: str, rules: Validity) -> list[str]:
    """Every rule the text breaks, as short reasons (empty when valid)."""
    errors = []
    if len(text) < rules.min_chars:
        errors.append(f"too short ({len(text)} chars < {rules.min_chars})")
    if len(text) > rules.max_chars:
        errors.append(f"too long ({len(text)} chars > {rules.max_chars})")
    letters = sum(1 for ch in text if ch.isalpha())
    if letters < rules.min_letters:
        errors.append(f"too few letters ({letters} < {rules.min_letters})")
    if not text.strip():
        errors.append("empty after stripping whitespace")
    if rules.printable_ascii:
        bad = next((ch for ch in text if ch not in _PRINTABLE), None)
        if bad is not None:
            errors.append(f"non-printable or non-ASCII character {bad!r}")
    return errors


def rules_of(report: ReportSpec) -> Validity:
    """The validity rules pinned in a task's ``[report]`` table."""
    return Validity(**{rule: getattr(report, rule) for rule in Validity.__struct_fields__})


def submittable(reference: str, report: ReportSpec) -> bool:
    """Whether a reference text would itself pass the task's validity rules. Converters leave out
    studies whose reference fails them: no submission could score 1.0 on such a case."""
    return not validity_errors(reference, rules_of(report))
