"""Diff of two runs, step by step.

A *step* is one model call and the tool calls its reply asked for. Steps are aligned in two
passes: first on their keys (the tool names with their normalised arguments, so identical actions
line up wherever they sit), with difflib's SequenceMatcher (longest matching blocks); then, inside
each stretch the first pass could not match, on tool names alone (same tools, other arguments: a
*changed* step), and what is left is paired by order or reported as inserted or deleted. The first
row that is not an identical match is the first divergence.
"""

from __future__ import annotations

import difflib
import hashlib
import json
from dataclasses import dataclass
from typing import Any, Literal

import duckdb
import msgspec
from msgspec import UNSET, UnsetType

from replay.web.resource import BadRequest, decode_cursor, encode_cursor
from replay.web.runs import RunRow, Score
from schemas.codec import canonical_json
from schemas.display import clip
from schemas.untrusted_json import loads_untrusted

ARG_CAP = 2000
LINES_CAP = 80


@dataclass(frozen=True)
class Step:
    index: int
    key: str
    """Source and seq of the model call (``SOURCE:SEQ``)."""
    ts_ns: int
    ok: bool
    error: str | None
    tools: tuple[tuple[str, str], ...]
    """(name, normalised arguments) of each tool call, in the reply's order."""
    text: str
    tokens_in: int
    tokens_out: int
    latency_ms: float | None

    @property
    def names(self) -> str:
        return (
            ",".join(n for n, _ in self.tools) if self.tools else ("(failed)" if not self.ok else "(reply)")
        )

    @property
    def match_key(self) -> str:
        h = hashlib.sha256()
        h.update(self.names.encode())
        for _, args in self.tools:
            h.update(b"\0" + args.encode())
        return h.hexdigest()


def normalise_arguments(raw: str | None) -> str:
    """Compact JSON with sorted keys when the arguments are JSON; else the string, trimmed."""
    if raw is None:
        return ""
    try:
        return canonical_json(loads_untrusted(raw)).decode()
    except ValueError:  # not JSON, or JSON whose text is not Unicode (a lone surrogate)
        return raw.strip()


def load_steps(con: duckdb.DuckDBPyConnection, run_id: str) -> list[Step]:
    rows = con.execute(
        """SELECT source, seq, ts_ns, coalesce(TRY_CAST(payload->>'$.ok' AS BOOLEAN), true),
                  payload->>'$.error',
                  CAST(coalesce(payload->'$.message.tool_calls', '[]') AS VARCHAR),
                  left(coalesce(payload->>'$.message.text', ''), 400),
                  coalesce(TRY_CAST(payload->>'$.usage.input_total' AS BIGINT), 0),
                  coalesce(TRY_CAST(payload->>'$.usage.output' AS BIGINT), 0),
                  TRY_CAST(payload->>'$.latency_ms' AS DOUBLE)
           FROM events WHERE run_id = ? AND kind = 'model_call.completed' ORDER BY ts_ns, source, seq""",
        [run_id],
    ).fetchall()
    steps = []
    for i, (source, seq, ts, ok, error, calls, text, tin, tout, lat) in enumerate(rows):
        tools = tuple(
            (str(c.get("name", "")), normalise_arguments(c.get("arguments")))
            for c in _json_list(calls)
            if isinstance(c, dict)
        )
        steps.append(
            Step(i, f"{source}:{seq}", int(ts), bool(ok), error, tools, text, int(tin), int(tout), lat)
        )
    return steps


class Change(msgspec.Struct):
    """A top-level argument field that differs (None: the arguments are not both JSON objects)."""

    field: str | None
    a: str | None
    """Its JSON text in run a (capped); None where it is absent."""
    b: str | None
    lines: list[str] | UnsetType = UNSET
    """Multi-line text (code): the changed lines, as a unified diff."""


class ToolChange(msgspec.Struct):
    tool: int
    """Its place in the reply's tool calls."""
    name_a: str
    name_b: str
    fields: list[Change]


class DiffSide(msgspec.Struct):
    index: int
    key: str
    tools: str
    ok: bool
    error: str | None
    tokens: tuple[int, int]
    latency_ms: float | None
    text: str


Op = Literal["same", "changed", "deleted", "inserted"]
State = Literal["same", "differs", "only_a", "only_b"]


class DiffRow(msgspec.Struct):
    """An aligned pair of steps: ``same``, ``changed`` (same step, other arguments or tools),
    ``deleted`` (only in a), ``inserted`` (only in b)."""

    row: int
    op: Op
    a: DiffSide | None
    b: DiffSide | None
    d_tokens_in: int | UnsetType = UNSET
    d_tokens_out: int | UnsetType = UNSET
    d_latency_ms: float | UnsetType = UNSET
    changes: list[ToolChange] | UnsetType = UNSET
    text_changed: bool | UnsetType = UNSET


class DiffSummary(msgspec.Struct):
    steps_a: int
    steps_b: int
    counts: dict[str, int]
    identical: bool
    first_divergence: DiffRow | None
    tokens_a: tuple[int, int]
    tokens_b: tuple[int, int]
    latency_ms_a: float
    latency_ms_b: float


class SealedFile(msgspec.Struct):
    path: str
    a: str | None
    b: str | None
    state: State


class Submission(msgspec.Struct):
    a_sealed: bool
    b_sealed: bool
    files: list[SealedFile]


class ScorePair(msgspec.Struct):
    profile: str
    a: Score | None
    b: Score | None


class Outcomes(msgspec.Struct):
    submission: Submission
    scores: list[ScorePair]


class DiffPage(msgspec.Struct):
    """``GET /api/diff``: the summary, the outcomes and one page of aligned rows of runs a and b."""

    summary: DiffSummary
    outcomes: Outcomes
    rows: list[DiffRow]
    from_row: int
    next: str | None
    prev: str | None
    total_rows: int
    a: RunRow
    b: RunRow


def _json_changes(a: str, b: str) -> list[Change]:
    """Which top-level argument fields differ (both sides capped), or the whole strings."""
    try:
        ja, jb = loads_untrusted(a), loads_untrusted(b)
    except ValueError:
        ja = jb = None
    if not (isinstance(ja, dict) and isinstance(jb, dict)):
        return [Change(None, clip(a, ARG_CAP), clip(b, ARG_CAP))]
    out = []
    for k in sorted(set(ja) | set(jb)):
        if ja.get(k) == jb.get(k) and (k in ja) == (k in jb):
            continue
        change = Change(k, _shown(ja, k), _shown(jb, k))
        va, vb = ja.get(k), jb.get(k)
        if isinstance(va, str) and isinstance(vb, str) and ("\n" in va or "\n" in vb):
            lines = list(difflib.unified_diff(va.splitlines(), vb.splitlines(), "a", "b", n=1, lineterm=""))
            change.lines = [clip(line, ARG_CAP) for line in lines[2:LINES_CAP]]
        out.append(change)
    return out


def _shown(args: dict[str, Any], k: str) -> str | None:
    return None if k not in args else clip(json.dumps(args[k], ensure_ascii=False), ARG_CAP)


def _side(s: Step | None) -> DiffSide | None:
    if s is None:
        return None
    tokens = (s.tokens_in, s.tokens_out)
    return DiffSide(s.index, s.key, s.names, s.ok, s.error, tokens, s.latency_ms, clip(s.text[:200], ARG_CAP))


def _pair(op: Op, a: Step | None, b: Step | None) -> DiffRow:
    row = DiffRow(0, op, _side(a), _side(b))
    if a and b:
        row.d_tokens_in = b.tokens_in - a.tokens_in
        row.d_tokens_out = b.tokens_out - a.tokens_out
        if a.latency_ms is not None and b.latency_ms is not None:
            row.d_latency_ms = round(b.latency_ms - a.latency_ms, 3)
        if op == "changed":
            row.changes = [
                ToolChange(i, na, nb, _json_changes(aa, ab))
                for i, ((na, aa), (nb, ab)) in enumerate(zip(a.tools, b.tools, strict=False))
                if na != nb or aa != ab
            ]
            if a.text != b.text:
                row.text_changed = True
    return row


def align(a: list[Step], b: list[Step]) -> list[DiffRow]:
    """The rows of the alignment, numbered."""
    rows: list[DiffRow] = []
    sm = difflib.SequenceMatcher(None, [s.match_key for s in a], [s.match_key for s in b], autojunk=False)
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        if tag == "equal":
            rows += [_pair("same", a[i1 + k], b[j1 + k]) for k in range(i2 - i1)]
            continue
        sa, sb = a[i1:i2], b[j1:j2]
        names = difflib.SequenceMatcher(None, [s.names for s in sa], [s.names for s in sb], autojunk=False)
        for tag2, p1, p2, q1, q2 in names.get_opcodes():
            xa, xb = sa[p1:p2], sb[q1:q2]
            paired = min(len(xa), len(xb)) if tag2 in ("equal", "replace") else 0
            rows += [_pair("changed", xa[k], xb[k]) for k in range(paired)]
            rows += [_pair("deleted", x, None) for x in xa[paired:]]
            rows += [_pair("inserted", None, y) for y in xb[paired:]]
    for i, row in enumerate(rows):
        row.row = i
    return rows


def summarize(rows: list[DiffRow], a: list[Step], b: list[Step]) -> DiffSummary:
    counts = dict.fromkeys(("same", "changed", "deleted", "inserted"), 0)
    for r in rows:
        counts[r.op] += 1
    first = next((r for r in rows if r.op != "same" or r.text_changed is True), None)
    return DiffSummary(
        len(a),
        len(b),
        counts,
        first is None,
        first,
        (sum(s.tokens_in for s in a), sum(s.tokens_out for s in a)),
        (sum(s.tokens_in for s in b), sum(s.tokens_out for s in b)),
        round(sum(s.latency_ms or 0 for s in a), 3),
        round(sum(s.latency_ms or 0 for s in b), 3),
    )


def submission(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[str, str] | None:
    row = con.execute(
        """SELECT CAST(payload->'$.files' AS VARCHAR) FROM events
           WHERE run_id = ? AND kind = 'submission.sealed' ORDER BY ts_ns DESC LIMIT 1""",
        [run_id],
    ).fetchall()
    if not row:
        return None
    return {
        str(f.get("path")): str(f.get("sha256")) for f in _json_list(row[0][0] or "[]") if isinstance(f, dict)
    }


def _json_list(text: str) -> list[Any]:
    """A JSON array a payload holds; empty for anything else (only a hostile spool holds another)."""
    try:
        value = loads_untrusted(text)
    except ValueError:
        return []
    return value if isinstance(value, list) else []


def outcomes(
    sub_a: dict[str, str] | None,
    sub_b: dict[str, str] | None,
    scores_a: dict[str, Score],
    scores_b: dict[str, Score],
) -> Outcomes:
    files = []
    for path in sorted(set(sub_a or {}) | set(sub_b or {})):
        ha, hb = (sub_a or {}).get(path), (sub_b or {}).get(path)
        state: State = (
            "same" if ha == hb else "only_a" if hb is None else "only_b" if ha is None else "differs"
        )
        files.append(SealedFile(path, ha, hb, state))
    profiles = sorted(set(scores_a) | set(scores_b))
    return Outcomes(
        Submission(sub_a is not None, sub_b is not None, files),
        [ScorePair(p, scores_a.get(p), scores_b.get(p)) for p in profiles],
    )


Compared = tuple[list[DiffRow], DiffSummary, Outcomes]
"""The aligned rows of two runs, their summary, and their outcomes."""


def compare(con: duckdb.DuckDBPyConnection, a: RunRow, b: RunRow) -> Compared:
    """Runs ``a`` and ``b`` aligned step by step."""
    sa, sb = load_steps(con, a.run_id), load_steps(con, b.run_id)
    rows = align(sa, sb)
    outcome = outcomes(submission(con, a.run_id), submission(con, b.run_id), a.scores, b.scores)
    return rows, summarize(rows, sa, sb), outcome


def page(
    compared: Compared, a: RunRow, b: RunRow, limit: int, cursor: str | None, at_first: bool
) -> DiffPage:
    """One page of rows. A row number names the aligned pair: rows are computed once per pair of runs
    and kept, so the cursor is the next page's first row."""
    rows, summary, outcome = compared
    start = 0
    if cursor:
        start = decode_cursor(cursor)
        if not isinstance(start, int) or start < 0:
            raise BadRequest("bad diff cursor")
    if at_first and summary.first_divergence is not None:
        start = max(summary.first_divergence.row - 5, 0)
    return DiffPage(
        summary,
        outcome,
        rows[start : start + limit],
        start,
        encode_cursor(start + limit) if start + limit < len(rows) else None,
        encode_cursor(max(start - limit, 0)) if start > 0 else None,
        len(rows),
        a,
        b,
    )
