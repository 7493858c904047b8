"""Upcasters: pure ``dict -> dict`` steps that bring an old payload to its kind's current version.

``UPCASTERS[(kind, n)]`` turns version ``n`` into ``n + 1``. ``upcast`` applies the steps in order.
Each step is tested against a golden log written by the old version (``tests/data/golden``).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from schemas.ostext import os_text

Upcaster = Callable[[dict[str, Any]], dict[str, Any]]


def note_v1_v2(old: dict[str, Any]) -> dict[str, Any]:
    """note v1 ``{"message"}`` → v2 ``{"text", "data"}``."""
    return {"data": {}, **{k: v for k, v in old.items() if k != "message"}, "text": old.get("message", "")}


def os_text_v1_v2(fields: tuple[str, ...], old: dict[str, Any]) -> dict[str, Any]:
    """v1 → v2 of a kind that holds OS strings: v1 held them as plain text (every v1 string is valid
    UTF-8, so the name's bytes are its text); v2 holds the recorded text of ``schemas.ostext``,
    which differs only where the name has a backslash. ``fields`` are the payload's OS-string
    fields: a string, a list of strings, or ``files[].path`` (each file's path)."""
    new = dict(old)
    for name in fields:
        if name == "files[].path":
            new["files"] = [
                {**f, "path": _v1(f["path"])} if isinstance(f, dict) and isinstance(f.get("path"), str) else f
                for f in old.get("files") or []
            ]
            continue
        value = old.get(name)
        if isinstance(value, str):
            new[name] = _v1(value)
        elif isinstance(value, list):
            new[name] = [_v1(v) if isinstance(v, str) else v for v in value]
    return new


def _v1(text: str) -> str:
    """A v1 OS string's recorded text (a lone surrogate, which no v1 writer could store, raises)."""
    return os_text(text.encode("utf-8"))


OS_FIELDS: dict[str, tuple[str, ...]] = {
    "file.written": ("path",),
    "file.deleted": ("path",),
    "file.renamed": ("src", "dst"),
    "file.accessed": ("path",),
    "process.exited": ("argv", "cwd"),
    "run.started": ("command", "workspace"),
    "submission.sealed": ("root", "files[].path", "skipped"),
}
"""Kinds whose payload holds OS strings (file names, argv, cwd), with those fields."""

UPCASTERS: dict[tuple[str, int], Upcaster] = {
    ("note", 1): note_v1_v2,
    **{(kind, 1): partial(os_text_v1_v2, fields) for kind, fields in OS_FIELDS.items()},
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
