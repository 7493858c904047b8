"""Fail-closed parsing of an LLM judge reply into a verdict (Inspect's judge hygiene).

The LAST JSON object in the reply that has a ``value`` counts, so chain-of-thought or an injected
object earlier in the text cannot win; anything docs/scoring.md (Judges) does not accept is
*unscored* with a named reason, never a guess.
"""

from __future__ import annotations

import json
from typing import Any

from scorer.judge.base import snap

_decoder = json.JSONDecoder()


def json_objects(text: str) -> list[dict[str, Any]]:
    """Every top-level JSON object embedded in ``text``, in order; none at all when the text holds
    JSON nested deeper than the decoder reads (fail closed: such a reply is no verdict, and reading
    on from each bracket inside it would take time quadratic in its length)."""
    out = []
    i = text.find("{")
    while i != -1:
        try:
            obj, end = _decoder.raw_decode(text, i)
        except RecursionError:
            return []
        except ValueError:
            i = text.find("{", i + 1)
            continue
        if isinstance(obj, dict):
            out.append(obj)
        i = text.find("{", end)
    return out


def parse_verdict(
    text: str, item_id: str, offered: list[float], allowed_ids: set[str]
) -> tuple[float | None, str, list[str], str | None]:
    """(value, reason, cited ids, unscored_reason)."""
    if not text or not text.strip():
        return None, "the judge replied with nothing", [], "empty_reply"
    candidates = [o for o in json_objects(text) if "value" in o]
    if not candidates:
        return None, "no JSON object with a value in the reply", [], "parse_failure"
    obj = candidates[-1]
    asked = obj.get("item", item_id)
    if asked != item_id:
        return None, f"the reply judged item {asked!r}, not {item_id!r}", [], "wrong_item"
    value = snap(obj.get("value"), offered)
    if value is None:
        why = f"value {obj.get('value')!r} is not one of the offered values {offered}"
        return None, why, [], "value_out_of_range"
    reason = obj.get("reason")
    return value, reason if isinstance(reason, str) else "", cited_ids(obj.get("evidence"), allowed_ids), None


def cited_ids(cited: Any, allowed_ids: set[str]) -> list[str]:
    """The event ids a reply cites (``proxy:12`` or ``[proxy:12]``) that the evidence shows, sorted."""
    if not isinstance(cited, list):
        return []
    return sorted({c.strip("[]") for c in cited if isinstance(c, str) and c.strip("[]") in allowed_ids})


CODES = ("E1", "E2", "E3", "E4", "E5")


def parse_codes(text: str, allowed_ids: set[str]) -> tuple[list[dict[str, Any]] | None, str | None]:
    """(codes, unscored_reason). The last object with a ``codes`` list counts; each code must be one of
    E1–E5 and cite at least one event id of the evidence, or it is dropped (a code needs evidence)."""
    if not text or not text.strip():
        return None, "empty_reply"
    candidates = [o for o in json_objects(text) if isinstance(o.get("codes"), list)]
    if not candidates:
        return None, "parse_failure"
    out: dict[str, dict[str, Any]] = {}
    for entry in candidates[-1]["codes"]:
        if not isinstance(entry, dict) or entry.get("code") not in CODES:
            continue
        ids = cited_ids(entry.get("evidence"), allowed_ids)
        if not ids:
            continue
        reason = entry.get("reason")
        out[entry["code"]] = {
            "code": entry["code"],
            "events": ids,
            "reason": reason if isinstance(reason, str) else "",
        }
    return [out[c] for c in sorted(out)], None
