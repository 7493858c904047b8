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
from typing import Any

import duckdb

from replay.web.resource import BadRequest, decode_cursor, encode_cursor
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
        """SELECT source, seq, ts_ns, coalesce((payload->>'$.ok')::BOOLEAN, true), payload->>'$.error',
                  CAST(coalesce(payload->'$.message.tool_calls', '[]') AS VARCHAR),
                  left(coalesce(payload->>'$.message.text', ''), 400),
                  coalesce((payload->>'$.usage.input_total')::BIGINT, 0),
                  coalesce((payload->>'$.usage.output')::BIGINT, 0),
                  (payload->>'$.latency_ms')::DOUBLE
           FROM events WHERE run_id = ? AND kind = 'model_call.completed' ORDER BY ts_ns, source, seq""",
        [run_id],
    ).fetchall()
    steps = []
    for i, (source, seq, ts, ok, error, calls, text, tin, tout, lat) in enumerate(rows):
        tools = tuple(
            (str(c.get("name", "")), normalise_arguments(c.get("arguments")))
            for c in json.loads(calls)
            if isinstance(c, dict)
        )
        steps.append(
            Step(i, f"{source}:{seq}", int(ts), bool(ok), error, tools, text, int(tin), int(tout), lat)
        )
    return steps


def _json_changes(a: str, b: str) -> list[dict[str, Any]]:
    """Which top-level argument fields differ (both sides capped), or the whole strings."""
    try:
        ja, jb = loads_untrusted(a), loads_untrusted(b)
    except ValueError:
        ja = jb = None
    if isinstance(ja, dict) and isinstance(jb, dict):
        out = []
        for k in sorted(set(ja) | set(jb)):
            if ja.get(k) != jb.get(k) or (k in ja) != (k in jb):
                change: dict[str, Any] = {
                    "field": k,
                    "a": None if k not in ja else clip(json.dumps(ja[k], ensure_ascii=False), ARG_CAP),
                    "b": None if k not in jb else clip(json.dumps(jb[k], ensure_ascii=False), ARG_CAP),
                }
                va, vb = ja.get(k), jb.get(k)
                if isinstance(va, str) and isinstance(vb, str) and ("\n" in va or "\n" in vb):
                    # Code and other multi-line text: the changed lines, as a unified diff.
                    lines = list(
                        difflib.unified_diff(va.splitlines(), vb.splitlines(), "a", "b", n=1, lineterm="")
                    )
                    change["lines"] = [clip(line, ARG_CAP) for line in lines[2:LINES_CAP]]
                out.append(change)
        return out
    return [{"field": None, "a": clip(a, ARG_CAP), "b": clip(b, ARG_CAP)}]


def _side(s: Step) -> dict[str, Any]:
    return {
        "index": s.index,
        "key": s.key,
        "tools": s.names,
        "ok": s.ok,
        "error": s.error,
        "tokens": [s.tokens_in, s.tokens_out],
        "latency_ms": s.latency_ms,
        "text": clip(s.text[:200], ARG_CAP),
    }


def _pair(op: str, a: Step | None, b: Step | None) -> dict[str, Any]:
    row: dict[str, Any] = {"op": op, "a": _side(a) if a else None, "b": _side(b) if b else None}
    if a and b:
        row["d_tokens_in"] = b.tokens_in - a.tokens_in
        row["d_tokens_out"] = b.tokens_out - a.tokens_out
        if a.latency_ms is not None and b.latency_ms is not None:
            row["d_latency_ms"] = round(b.latency_ms - a.latency_ms, 3)
        if op == "changed":
            changes = []
            for i, ((na, aa), (nb, ab)) in enumerate(zip(a.tools, b.tools, strict=False)):
                if na != nb or aa != ab:
                    changes.append({"tool": i, "name_a": na, "name_b": nb, "fields": _json_changes(aa, ab)})
            row["changes"] = changes
            if a.text != b.text:
                row["text_changed"] = True
    return row


def align(a: list[Step], b: list[Step]) -> list[dict[str, Any]]:
    """Rows of the alignment: ``same``, ``changed`` (same step, other arguments or tools),
    ``deleted`` (only in a), ``inserted`` (only in b)."""
    rows: list[dict[str, Any]] = []
    sm = difflib.SequenceMatcher(None, [s.match_key for s in a], [s.match_key for s in b], autojunk=False)
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        if tag == "equal":
            rows += [_pair("same", a[i1 + k], b[j1 + k]) for k in range(i2 - i1)]
            continue
        sa, sb = a[i1:i2], b[j1:j2]
        names = difflib.SequenceMatcher(None, [s.names for s in sa], [s.names for s in sb], autojunk=False)
        for tag2, p1, p2, q1, q2 in names.get_opcodes():
            xa, xb = sa[p1:p2], sb[q1:q2]
            if tag2 == "equal":
                rows += [_pair("changed", x, y) for x, y in zip(xa, xb, strict=True)]
                continue
            paired = min(len(xa), len(xb)) if tag2 == "replace" else 0
            rows += [_pair("changed", xa[k], xb[k]) for k in range(paired)]
            rows += [_pair("deleted", x, None) for x in xa[paired:]]
            rows += [_pair("inserted", None, y) for y in xb[paired:]]
    return rows


def summarize(rows: list[dict[str, Any]], a: list[Step], b: list[Step]) -> dict[str, Any]:
    counts = {op: 0 for op in ("same", "changed", "deleted", "inserted")}
    for r in rows:
        counts[r["op"]] += 1
    first = next((i for i, r in enumerate(rows) if r["op"] != "same" or r.get("text_changed")), None)
    return {
        "steps_a": len(a),
        "steps_b": len(b),
        "counts": counts,
        "identical": first is None,
        "first_divergence": None if first is None else {"row": first, **rows[first]},
        "tokens_a": [sum(s.tokens_in for s in a), sum(s.tokens_out for s in a)],
        "tokens_b": [sum(s.tokens_in for s in b), sum(s.tokens_out for s in b)],
        "latency_ms_a": round(sum(s.latency_ms or 0 for s in a), 3),
        "latency_ms_b": round(sum(s.latency_ms or 0 for s in b), 3),
    }


def submission(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[str, str] | None:
    row = con.execute(
        """SELECT CAST(payload->'$.files' AS VARCHAR) FROM events
           WHERE run_id = ? AND kind = 'submission.sealed' ORDER BY ts_ns DESC LIMIT 1""",
        [run_id],
    ).fetchall()
    if not row:
        return None
    return {f["path"]: f["sha256"] for f in json.loads(row[0][0] or "[]") if isinstance(f, dict)}


def outcomes(
    sub_a: dict[str, str] | None,
    sub_b: dict[str, str] | None,
    scores_a: dict[str, Any],
    scores_b: dict[str, Any],
) -> dict[str, Any]:
    files = []
    for path in sorted(set(sub_a or {}) | set(sub_b or {})):
        ha, hb = (sub_a or {}).get(path), (sub_b or {}).get(path)
        state = "same" if ha == hb else "only_a" if hb is None else "only_b" if ha is None else "differs"
        files.append({"path": path, "a": ha, "b": hb, "state": state})
    profiles = sorted(set(scores_a) | set(scores_b))
    return {
        "submission": {"a_sealed": sub_a is not None, "b_sealed": sub_b is not None, "files": files},
        "scores": [{"profile": p, "a": scores_a.get(p), "b": scores_b.get(p)} for p in profiles],
    }


Compared = tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any]]
"""The aligned rows of two runs, their summary, and their outcomes."""


def compare(con: duckdb.DuckDBPyConnection, a: str, b: str, scores: dict[str, dict[str, Any]]) -> Compared:
    """Runs ``a`` and ``b`` aligned step by step; ``scores``: each run's scores per profile."""
    sa, sb = load_steps(con, a), load_steps(con, b)
    rows = align(sa, sb)
    outcome = outcomes(submission(con, a), submission(con, b), scores[a], scores[b])
    return rows, summarize(rows, sa, sb), outcome


def page(compared: Compared, limit: int, cursor: str | None, at_first: bool) -> dict[str, Any]:
    """``GET /api/diff``: one page of rows. A row number names the aligned pair: rows are computed
    once per pair of runs and kept, so the cursor is the next page's first row."""
    rows, summary, outcome = compared
    start = 0
    if cursor:
        start = decode_cursor(cursor)
        if not isinstance(start, int) or start < 0:
            raise BadRequest("bad diff cursor")
    if at_first and summary["first_divergence"] is not None:
        start = max(summary["first_divergence"]["row"] - 5, 0)
    shown = [{**row, "row": start + i} for i, row in enumerate(rows[start : start + limit])]
    return {
        "summary": summary,
        "outcomes": outcome,
        "rows": shown,
        "from_row": start,
        "next": encode_cursor(start + limit) if start + limit < len(rows) else None,
        "prev": encode_cursor(max(start - limit, 0)) if start > 0 else None,
        "total_rows": len(rows),
    }
