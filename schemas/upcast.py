"""Upcasters: pure ``dict -> dict`` steps that bring an old payload to its kind's current version.

``UPCASTERS[(kind, n)]`` turns version ``n`` into ``n + 1``. ``upcast`` applies the steps in order.
Each step is tested against a golden log written by the old version (``tests/data/golden``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Upcaster = Callable[[dict[str, Any]], dict[str, Any]]


def note_v1_v2(old: dict[str, Any]) -> dict[str, Any]:
    """note v1 ``{"message"}`` → v2 ``{"text", "data"}``."""
    new = {k: v for k, v in old.items() if k != "message"}
    new["text"] = old.get("message", "")
    new.setdefault("data", {})
    return new


UPCASTERS: dict[tuple[str, int], Upcaster] = {
    ("note", 1): note_v1_v2,
}


def upcast(kind: str, version: int, target: int, payload: dict[str, Any]) -> dict[str, Any]:
    """Apply every step from ``version`` to ``target``; KeyError names a missing step."""
    while version < target:
        step = UPCASTERS.get((kind, version))
        if step is None:
            raise KeyError(f"no upcaster for {kind} v{version} -> v{version + 1}")
        payload = step(payload)
        version += 1
    return payload
