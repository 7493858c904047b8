"""Which profile options changed which numbers: the current rows of two profiles, run by run.

Each profile is flattened, per track, into its resolved options (``stages.null_policy``,
``metrics.completeness``, ``medals.good``, ...): the track overrides applied, the rubric, evidence,
judge and audit tables reduced to a digest each. For every run scored under both profiles (same
judge), every reported number that differs is listed with the options that differ for that run's
track *and* feed that number (``AFFECTS``), so a changed TASK names the metric switches, a changed
AGENTIC the null policy or the weights. A changed number that no differing option feeds is listed
with ``(unexplained)``, which would point at a rescore with a different grade or judge cache.
"""

from __future__ import annotations

from typing import Any

import msgspec

from schemas.codec import canonical_digest
from scorer.profile import Profile

FIELDS = (
    *("s1", "s2", "s3", "s4", "s5", "agentic", "task_score", "overall"),
    *("medal", "rating", "codes", "status", "cost_usd"),
)
_JUDGED = ("s1", "s2", "s3", "agentic", "overall", "codes", "rating", "medal")
AFFECTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # option name prefix -> the row fields it can change (first match wins)
    ("stages.round_digits", ("agentic", "task_score", "overall")),
    ("stages.unscored_item_policy", ("s1", "s2", "s3", "agentic", "overall")),
    ("stages.s4_", ("s4", "agentic", "overall")),
    ("stages.s5_", ("s5", "agentic", "overall")),
    ("stages.", ("agentic", "overall")),
    ("weights.agentic", ("overall",)),
    ("weights.task", ("overall",)),
    ("weights.", ("agentic", "overall")),
    ("metrics.", ("task_score", "overall", "s4", "s5", "agentic", "medal", "rating", "codes", "status")),
    ("medals.", ("medal", "rating", "codes")),
    ("codes.", ("codes",)),
    ("rubric", _JUDGED),
    ("judge.", _JUDGED),
    ("evidence", _JUDGED),
    ("cost.", ("cost_usd",)),
    ("audit", FIELDS),
)


METRIC_TRACKS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # GradeOptions key prefix -> the tracks whose grader reads it (others: every track)
    ("seg_", ("segmentation",)),
    ("vqa_", ("vqa",)),
    ("text_", ("report",)),
    ("ap_", ("detection",)),
    ("det_", ("detection",)),
    ("ssim_", ("enhancement",)),
    ("enh_", ("enhancement",)),
)


def _by_prefix(table: tuple[tuple[str, tuple[str, ...]], ...], key: str) -> tuple[str, ...] | None:
    """The value of the first of ``table``'s prefixes that ``key`` starts with."""
    return next((value for prefix, value in table if key.startswith(prefix)), None)


def _metric_applies(key: str, track: str | None) -> bool:
    tracks = _by_prefix(METRIC_TRACKS, key)
    return tracks is None or track in tracks


def _digest(value: Any) -> str:
    return canonical_digest(value).removeprefix("sha256:")[:12]


def _flat(prefix: str, table: Any) -> dict[str, Any]:
    return {f"{prefix}.{k}": v for k, v in msgspec.to_builtins(table).items()}


def options(p: Profile, track: str | None) -> dict[str, Any]:
    """The resolved options that apply to runs of ``track``, flat."""
    medal = p.medals.get(track or "")
    return {
        **_flat("stages", p.stage_rules(track)),
        **_flat("weights", p.weights),
        # A switch another track's grader reads cannot move this run.
        **_flat("metrics", {k: v for k, v in p.metrics_for(track).items() if _metric_applies(k, track)}),
        **{k: v for k, v in _flat("medals", medal or {}).items() if k != "medals.source"},
        **_flat("codes", p.codes),
        "rubric": _digest([msgspec.to_builtins(i) for i in p.items_for(track, None)]),
        **_flat("judge", p.judge),
        "evidence": _digest(p.evidence),
        "cost.price_table": p.cost.price_table,
        "audit": _digest(p.audit),
    }


def changed_options(a: Profile, b: Profile, track: str | None) -> dict[str, tuple[Any, Any]]:
    oa, ob = options(a, track), options(b, track)
    return {k: (oa.get(k), ob.get(k)) for k in sorted(set(oa) | set(ob)) if oa.get(k) != ob.get(k)}


def _feeds(option: str) -> tuple[str, ...]:
    return _by_prefix(AFFECTS, option) or FIELDS


def _differs(x: Any, y: Any) -> bool:
    if isinstance(x, float) and isinstance(y, float):
        return abs(x - y) > 1e-12
    if isinstance(x, list) and isinstance(y, list):
        return sorted(x) != sorted(y)
    return x != y


def diff_rows(
    a: Profile, b: Profile, rows_a: list[dict[str, Any]], rows_b: list[dict[str, Any]]
) -> dict[str, Any]:
    """Per run and field: the two values and the differing options that feed the field."""
    by_a = {r["run_id"]: r for r in rows_a}
    by_b = {r["run_id"]: r for r in rows_b}
    changes: list[dict[str, Any]] = []
    only = sorted(set(by_a) ^ set(by_b))
    per_track: dict[str, dict[str, tuple[Any, Any]]] = {}
    touched: dict[str, set[str]] = {}
    for run in sorted(set(by_a) & set(by_b)):
        ra, rb = by_a[run], by_b[run]
        track = ra.get("track") or rb.get("track")
        key = track or ""
        if key not in per_track:
            per_track[key] = changed_options(a, b, track)
        opts = per_track[key]
        if str(ra.get("judge", "")).startswith("offline"):
            # The rules judge reads no judge settings: they cannot have moved anything.
            opts = {k: v for k, v in opts.items() if not k.startswith("judge.")}
        for f in FIELDS:
            if not _differs(ra.get(f), rb.get(f)):
                continue
            why = [o for o in opts if f in _feeds(o)]
            for o in why:
                touched.setdefault(o, set()).add(run)
            change = {"run_id": run, "track": track, "field": f, "a": ra.get(f), "b": rb.get(f)}
            changes.append(change | {"options": why or ["(unexplained)"]})
    options_by_track = {
        t or "(unknown)": {k: {"a": v[0], "b": v[1]} for k, v in o.items()} for t, o in per_track.items()
    }
    return {
        "runs_compared": len(set(by_a) & set(by_b)),
        "runs_in_one_only": only,
        "changes": changes,
        "options_by_track": options_by_track,
        "runs_touched_by_option": {k: len(v) for k, v in sorted(touched.items())},
    }
