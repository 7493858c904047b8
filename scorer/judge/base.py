"""What every judge returns: one verdict per rubric item, or *unscored* with a reason (never 0).

A verdict's value is always one of the item's offered values; anything else (a parse failure, an
out-of-range value, a refusal, a timeout) is ``value=None`` with ``unscored_reason`` set, and the
stage that contains it is unscored too (profile ``stages.unscored_item_policy``).
"""

from __future__ import annotations

from typing import Protocol

import msgspec

from scorer.evidence import Evidence
from scorer.profile import RubricItem
from scorer.trajectory import Trajectory


class Verdict(msgspec.Struct, frozen=True, kw_only=True):
    item: str
    value: float | None
    reason: str = ""
    cited: list[str] = []
    """Event ids the verdict rests on (only ids present in the evidence view are kept)."""
    judge: str = ""
    """``offline:<rules version>``, ``llm:<model>``, ``auto_credit`` or ``requires:<item>``."""
    unscored_reason: str | None = None
    call_key: str | None = None
    """The judge call's cache key (LLM judge), so a verdict can be traced to its stored exchange."""
    cached: bool = False


class Judge(Protocol):
    label: str
    """What every output row says about who judged (``offline:...`` or ``llm:<model>``)."""

    def judge(
        self, traj: Trajectory, evidence: Evidence, items: list[RubricItem], *, track: str | None
    ) -> dict[str, Verdict]: ...


def snap(value: object, offered: list[float]) -> float | None:
    """``value`` if it is (numerically) one of ``offered``, else None. Booleans are not numbers here."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return next((float(v) for v in offered if abs(float(value) - v) <= 1e-9), None)
