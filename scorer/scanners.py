"""Scanners: checks a team writes over stored runs, each identified by the hash of what it is.

Four kinds, one contract (given a run, give its findings): a Python ``@scanner`` function, a SQL
query over the store's views, an LLM prompt over the run's evidence, and the built-in ``audit``
(docs/scanning.md). A scanner's id is the sha256 of the canonical JSON of its kind, name and
content, so editing a scanner makes a new version whose results stand beside the old.
"""

from __future__ import annotations

import importlib.util
import inspect
import math
import re
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from schemas.codec import canonical_digest
from schemas.errors import BadInput, NotFound, quoted
from schemas.finding import Finding
from schemas.ostext import is_utf8
from schemas.userfile import read_text
from scorer.audit import Violation
from scorer.profile import AuditRules
from scorer.trajectory import Trajectory

DEFAULT_TIMEOUT_S = 60.0
"""How long a Python scanner may take over one run."""
SQL_TIMEOUT_S = 600.0
"""How long a SQL scanner's query may take (it covers every run of the scan at once)."""
MAX_FINDINGS = 10_000
"""The most findings one scanner may give for one run."""
MAX_TEXT_CHARS = 100_000
"""The longest text a finding's value or explanation may be."""
MAX_EVENTS = 10_000
"""The most events one finding may cite."""


class Malformed(Exception):
    """A scanner returned something that is not findings (recorded as that run's error)."""


class Scanner(msgspec.Struct, kw_only=True):
    name: str
    kind: str
    """``python``, ``sql``, ``llm`` or ``builtin``."""
    content: dict[str, Any]
    """What the id is the hash of."""
    fn: Callable[..., Any] | None = None
    kinds: list[str] | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    path: str | None = None
    """The file a Python scanner was loaded from (its worker process imports it again)."""

    @property
    def id(self) -> str:
        return canonical_digest({"kind": self.kind, "name": self.name, "content": self.content})

    @property
    def short_id(self) -> str:
        return self.id.removeprefix("sha256:")[:12]


_registered: list[Scanner] = []


def scanner(
    fn: Callable[[Trajectory], Any] | None = None,
    *,
    name: str | None = None,
    kinds: list[str] | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> Any:
    """Register a Python scanner: ``@scanner`` or ``@scanner(name=..., kinds=[...], timeout=...)``.

    The function takes a ``Trajectory`` and returns None, a ``Finding`` or a list of them."""
    ok = isinstance(timeout, int | float) and not isinstance(timeout, bool) and 0 < timeout < math.inf
    if not ok:
        raise ValueError(f"@scanner(timeout={timeout!r}): give a number of seconds above 0")
    if kinds is not None and (
        not isinstance(kinds, list | tuple) or not all(isinstance(k, str) for k in kinds)
    ):
        raise ValueError(f"@scanner(kinds={kinds!r}): give a list of event kinds")

    def register(f: Callable[[Trajectory], Any]) -> Callable[[Trajectory], Any]:
        options = {"function": f.__name__, "kinds": sorted(kinds) if kinds else None, "timeout": timeout}
        source = Path(inspect.getfile(f)).read_text(encoding="utf-8")
        s = Scanner(
            name=name or f.__name__,
            kind="python",
            content={"source": source, **options},
            fn=f,
            kinds=list(kinds) if kinds else None,
            timeout_s=timeout,
        )
        _registered.append(s)
        return f

    return register(fn) if fn is not None else register


def findings(result: Any, event_ids: set[str] | None) -> list[Finding]:
    """A scanner's return value as findings; ``Malformed`` when it is anything else, or when a
    finding cites an event the run does not have (``event_ids``; None: not checked here)."""
    if result is None:
        return []
    items = [result] if isinstance(result, Finding) else result
    if not isinstance(items, list | tuple) or not all(isinstance(f, Finding) for f in items):
        raise Malformed(f"returned {type(result).__name__}, not None, a Finding or a list of Findings")
    if len(items) > MAX_FINDINGS:
        raise Malformed(f"returned {len(items)} findings for one run (at most {MAX_FINDINGS})")
    for f in items:
        _check_finding(f)
        missing = [e for e in f.events if event_ids is not None and e not in event_ids]
        if missing:
            raise Malformed(f"a finding cites {missing[0]!r}, which is not an event of this run")
    return list(items)


def _check_finding(f: Finding) -> None:
    """``Malformed`` unless the finding holds what the store keeps as it is: a finite number, text
    and events of bounded size."""
    if not isinstance(f.value, bool | int | float | str | type(None)):
        raise Malformed(f"a finding's value is {type(f.value).__name__}, not bool, number, text or None")
    if isinstance(f.value, float) and not math.isfinite(f.value):
        raise Malformed(f"a finding's value is {f.value}, not a finite number")
    if not isinstance(f.explanation, str):
        raise Malformed("a finding's explanation is not text")
    for what, text in (("value", f.value), ("explanation", f.explanation)):
        if isinstance(text, str) and len(text) > MAX_TEXT_CHARS:
            raise Malformed(f"a finding's {what} is {len(text)} characters long (at most {MAX_TEXT_CHARS})")
    if not isinstance(f.events, list) or not all(isinstance(e, str) for e in f.events):
        raise Malformed("a finding's events are not a list of 'source:seq' ids")
    if len(f.events) > MAX_EVENTS:
        raise Malformed(f"a finding cites {len(f.events)} events (at most {MAX_EVENTS})")
    texts = [("value", f.value), ("explanation", f.explanation)] + [("events", e) for e in f.events]
    for what, text in texts:
        if isinstance(text, str) and not is_utf8(text):
            raise Malformed(f"a finding's {what} holds a lone surrogate, which is no UTF-8 text")


def _python(path: Path, only: str | None) -> list[Scanner]:
    module_name = "amb_scanner_" + canonical_digest(str(path.resolve())).removeprefix("sha256:")[:16]
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise BadInput(f"{quoted(str(path))}: not a Python file that can be imported")
    module = importlib.util.module_from_spec(spec)
    del _registered[:]
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as e:  # a file that calls sys.exit() at import is no scanner file
        raise BadInput(f"scanner file {quoted(str(path))} fails to import: {type(e).__name__}: {e}") from e
    found = [s for s in _registered if only is None or s.name == only]
    del _registered[:]
    for s in found:
        s.path = str(path.resolve())
    if not found:
        what = f"no scanner named {only!r}" if only else "no @scanner function"
        raise BadInput(f"{quoted(str(path))} has {what} (decorate one with amb.scan.scanner)")
    return found


TIMEOUT_LINE = re.compile(r"^\s*--\s*timeout:\s*(\d+(?:\.\d+)?)\s*$", re.M)
"""A ``.sql`` scanner's own timeout: a comment line ``-- timeout: SECONDS`` (part of its query, so of
its id)."""


def _sql(path: Path) -> Scanner:
    query = read_text(path, "scanner").strip().rstrip(";")
    if not query:
        raise BadInput(
            f"{quoted(str(path))} is empty: write a query returning run_id, value, explanation, events"
        )
    timeout = TIMEOUT_LINE.search(query)
    if timeout and not float(timeout.group(1)) > 0:
        raise BadInput(
            f"{quoted(str(path))}: '-- timeout: {timeout.group(1)}': give a number of seconds above 0"
        )
    return Scanner(
        name=path.stem,
        kind="sql",
        content={"query": query},
        timeout_s=float(timeout.group(1)) if timeout else SQL_TIMEOUT_S,
    )


ANSWERS = ("boolean", "number", "text")


def _llm(path: Path, model: str | None) -> Scanner:
    try:
        spec = tomllib.loads(read_text(path, "scanner"))
    except tomllib.TOMLDecodeError as e:
        raise BadInput(f"{quoted(str(path))} is not TOML: {e}") from e
    prompt, answer = spec.get("prompt"), spec.get("answer", "boolean")
    labels_ok = isinstance(answer, list) and answer and all(isinstance(a, str) for a in answer)
    if not isinstance(prompt, str) or not prompt.strip() or not (answer in ANSWERS or labels_ok):
        raise BadInput(
            f'{quoted(str(path))}: an LLM scanner needs prompt = "..." and answer = one of '
            f"{', '.join(ANSWERS)} or a list of labels"
        )
    name = spec.get("name") or path.stem
    return Scanner(name=str(name), kind="llm", content={"prompt": prompt, "answer": answer, "model": model})


def audit_scanner(rules: AuditRules) -> Scanner:
    """The auditor's rules as a scanner: its version is the hash of the profile's ``[audit]``, so the
    rows ``amb score`` writes for it and those ``amb scan audit`` writes are one version's rows."""
    return Scanner(name="audit", kind="builtin", content={"rules": msgspec.to_builtins(rules)})


def audit_findings(violations: list[Violation]) -> list[Finding]:
    """A run's violations as the audit scanner's findings: the rule's name, its detail, its events."""
    return [Finding(value=v.rule, explanation=v.detail, events=list(v.events)) for v in violations]


def load(spec: str, *, model: str | None = None, audit_rules: AuditRules | None = None) -> list[Scanner]:
    """The scanners ``spec`` names: ``file.py`` (each one in it), ``file.py:name``, ``file.sql``,
    ``file.toml`` (an LLM scanner), or ``audit`` (the built-in rules; ``audit_rules`` from the profile)."""
    if spec == "audit":
        return [audit_scanner(audit_rules or AuditRules())]
    file, _, only = spec.partition(":") if spec.split(":", 1)[0].endswith(".py") else (spec, "", "")
    path = Path(file)
    if not path.is_file():
        raise NotFound(f"no scanner file {quoted(file)} (give a .py, .sql or .toml file, or 'audit')")
    suffix = path.suffix.lower()
    if suffix == ".py":
        return _python(path, only or None)
    if suffix == ".sql":
        return [_sql(path)]
    if suffix == ".toml":
        return [_llm(path, model)]
    raise BadInput(f"{quoted(file)}: a scanner is a .py, .sql or .toml file, or 'audit'")
