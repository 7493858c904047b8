"""A person's labels, and how far a scanner or a judge agrees with them (docs/scanning.md).

A label file (CSV, JSONL or YAML) has one record per judgement: ``run_id``, ``target``
(``scanner:<name>``, ``codes``, ``item:<rubric id>``), ``value`` and optionally ``annotator``. Labels
are appended to the store's ``labels`` table under a set name; the latest import of a (set, run,
target) counts. ``compare`` gives agreement, Cohen's kappa, Krippendorff's alpha, yes/no confusion
tables with precision, recall and F1, seeded bootstrap intervals and the disagreeing runs.
"""

from __future__ import annotations

import csv
import io
import json
import math
import random
import re
import urllib.parse
from collections import Counter
from pathlib import Path
from typing import Any

import duckdb

from schemas.blob import digest
from schemas.codec import canonical_json
from schemas.errors import BadInput, quoted
from schemas.untrusted_json import loads_untrusted
from scorer import ledger
from scorer.judge.parse import CODES
from scorer.judge_stability import krippendorff_alpha_nominal

TARGET = re.compile(r"^(scanner:[^\s]+|codes|item:[A-Za-z0-9_.-]+)$")


def _scalar(text: str) -> Any:
    """A CSV cell as the value it spells: true/false, a number, else the text."""
    low = text.strip().lower()
    if low in ("true", "yes"):
        return True
    if low in ("false", "no"):
        return False
    try:
        return float(text) if re.fullmatch(r"\s*-?\d+(\.\d+)?\s*", text) else text
    except ValueError:
        return text


def _records(path: Path, raw: bytes) -> list[Any]:
    suffix = path.suffix.lower()
    text = raw.decode("utf-8-sig")  # a spreadsheet's CSV may start with a byte order mark
    if suffix == ".csv":
        return [
            {k: _scalar(v) if k == "value" else v for k, v in r.items()}
            for r in csv.DictReader(io.StringIO(text))
        ]
    if suffix == ".jsonl":
        return [loads_untrusted(line) for line in text.splitlines() if line.strip()]
    if suffix in (".yaml", ".yml"):
        from ruamel.yaml import YAML

        data = YAML(typ="safe").load(text)
        return data if isinstance(data, list) else []
    raise BadInput(f"{quoted(str(path))}: labels come as .csv, .jsonl or .yaml")


def _codes(value: Any) -> list[str]:
    items = value if isinstance(value, list) else re.split(r"[;,\s]+", str(value or ""))
    codes = sorted({str(c).strip().upper() for c in items if str(c).strip()})
    bad = [c for c in codes if c not in CODES]
    if bad:
        raise ValueError(f"{bad[0]!r} is not an error code (E1-E5)")
    return codes


def _record(r: Any, seen: dict[tuple[str, str], tuple[int, Any]], n: int) -> dict[str, Any]:
    """Record ``n`` of a label file, checked (``ValueError`` saying what is wrong); ``seen`` holds
    the (run, target) pairs of the records before it, so one file cannot say two things of one."""
    if not isinstance(r, dict) or not isinstance(r.get("run_id"), str) or not r["run_id"]:
        raise ValueError("no run_id")
    target = r.get("target")
    if not isinstance(target, str) or not TARGET.match(target):
        raise ValueError(f"target {target!r} is not scanner:<name>, codes or item:<id>")
    value = _codes(r.get("value")) if target == "codes" else r.get("value")
    if target != "codes" and not isinstance(value, bool | int | float | str):
        what = "missing" if value is None else type(value).__name__
        raise ValueError(f"the value of {target} is {what}, not yes/no, a number or text")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"the value of {target} is {value}, not a finite number")
    annotator = r.get("annotator") or None
    if annotator is not None and not isinstance(annotator, str):
        raise ValueError(f"the annotator is {type(annotator).__name__}, not text")
    try:
        canonical_json([r["run_id"], value, annotator])
    except UnicodeEncodeError:
        raise ValueError("it holds text that is not UTF-8 (a lone surrogate escape)") from None
    key = (r["run_id"], target)
    if key in seen and seen[key][1] != value:
        first, said = seen[key]
        raise ValueError(
            f"run {r['run_id']!r} {target} is labelled {value!r} here and {said!r} in record {first}"
        )
    seen.setdefault(key, (n, value))
    return {"run_id": r["run_id"], "target": target, "value": value, "annotator": annotator}


def read(path: Path) -> tuple[list[dict[str, Any]], str]:
    """The file's label records, checked (one bad record is refused naming its number), and its digest."""
    try:
        raw = path.read_bytes()
        records = _records(path, raw)
    except BadInput:
        raise
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise BadInput(f"cannot read labels from {quoted(str(path))}: {e}") from e
    except Exception as e:  # the YAML reader's own errors
        raise BadInput(f"cannot read labels from {quoted(str(path))}: {type(e).__name__}") from e
    out = []
    seen: dict[tuple[str, str], tuple[int, Any]] = {}
    kinds: dict[str, tuple[str, int]] = {}
    for n, r in enumerate(records, 1):
        try:
            out.append(_record(r, seen, n))
        except ValueError as e:
            raise BadInput(f"{quoted(str(path))} record {n}: {e}") from e
        target, kind = out[-1]["target"], _kind(out[-1]["value"])
        first = kinds.setdefault(target, (kind, n))
        if first[0] != kind:
            raise BadInput(
                f"{quoted(str(path))}: target {target} mixes {first[0]} (record {first[1]}) and {kind} "
                f"(record {n}) labels: {ONE_KIND}"
            )
    if not out:
        raise BadInput(f"{quoted(str(path))} holds no labels (columns: run_id, target, value, annotator)")
    return out, digest(raw)


ONE_KIND = "give one kind of value (yes/no, numbers or text) per target"


def _kind(value: Any) -> str:
    """What a label's value is, as far as comparing it goes: yes/no, a number, text (or codes)."""
    if isinstance(value, bool):
        return "yes/no"
    if isinstance(value, int | float):
        return "number"
    return "codes" if isinstance(value, list) else "text"


def require_one_kind(con: duckdb.DuckDBPyConnection, name: str, records: list[dict[str, Any]]) -> None:
    """``BadInput`` when importing ``records`` into label set ``name`` would leave one of its targets
    with values of two kinds (yes/no beside text, numbers beside text, ...): they would be compared
    as they are, each run's text against another's flag."""
    held = current(con, name)
    new: dict[str, set[str]] = {}
    for r in records:
        new.setdefault(r["target"], set()).add(r["run_id"])
    for target, runs in new.items():
        kind = _kind(next(r["value"] for r in records if r["target"] == target))
        for run, value in sorted(held.get(target, {}).items()):
            if run not in runs and _kind(value) != kind:
                raise BadInput(
                    f"label set {name!r}: target {target} holds {_kind(value)} labels (run {run!r}) and "
                    f"this file gives {kind}: {ONE_KIND}, or import it under another --name"
                )


def append(con: duckdb.DuckDBPyConnection, name: str, records: list[dict[str, Any]], source: str) -> None:
    n = len(records)
    import pyarrow as pa  # here: the report, which reads labels, needs no Arrow

    table = pa.table(
        {
            "label_set": [name] * n,
            "run_id": [r["run_id"] for r in records],
            "target": [r["target"] for r in records],
            "value": [canonical_json(r["value"]).decode() for r in records],
            "annotator": pa.array([r["annotator"] for r in records], pa.string()),
            "source_sha256": [source] * n,
            "imported_at": ledger.now_column(n),
        }
    )
    ledger.insert(con, table, "INSERT INTO labels SELECT * FROM _amb_new")


def current(con: duckdb.DuckDBPyConnection, name: str) -> dict[str, dict[str, Any]]:
    """target -> run -> the latest label of that run in set ``name``."""
    rows = con.execute(
        "SELECT target, run_id, CAST(value AS VARCHAR) FROM labels WHERE label_set = ? QUALIFY row_number() "
        "OVER (PARTITION BY target, run_id ORDER BY imported_at DESC) = 1",
        [name],
    ).fetchall()
    out: dict[str, dict[str, Any]] = {}
    for target, run, value in rows:
        out.setdefault(target, {})[run] = json.loads(value)
    return out


def kappa(pairs: list[tuple[Any, Any]]) -> float | None:
    """Cohen's kappa of (label, predicted) pairs; None when chance agreement is total."""
    n = len(pairs)
    if not n:
        return None
    observed = sum(a == b for a, b in pairs) / n
    la, pb = Counter(a for a, _ in pairs), Counter(b for _, b in pairs)
    expected = sum(la[c] * pb[c] for c in la) / (n * n)
    return None if expected == 1 else (observed - expected) / (1 - expected)


def _binary(pairs: list[tuple[Any, Any]]) -> dict[str, float | None]:
    tp = sum(1 for a, b in pairs if a is True and b is True)
    fp = sum(1 for a, b in pairs if a is False and b is True)
    fn = sum(1 for a, b in pairs if a is True and b is False)
    precision = tp / (tp + fp) if tp + fp else None
    recall = tp / (tp + fn) if tp + fn else None
    f1 = 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else None
    return {"precision": precision, "recall": recall, "f1": f1}


def _stats(pairs: list[tuple[Any, Any]], binary: bool) -> dict[str, Any]:
    keys = {v: i for i, v in enumerate(sorted({json.dumps(v) for p in pairs for v in p}))}
    units = [[float(keys[json.dumps(a)]), float(keys[json.dumps(b)])] for a, b in pairs]
    out = {
        "agreement": sum(a == b for a, b in pairs) / len(pairs) if pairs else None,
        "kappa": kappa(pairs),
        "alpha": krippendorff_alpha_nominal(units),
    }
    return out | _binary(pairs) if binary else out


def _interval(values: list[float | None]) -> list[float] | None:
    got = sorted(v for v in values if v is not None)
    if not got:
        return None
    return [got[int(0.025 * (len(got) - 1))], got[int(0.975 * (len(got) - 1))]]


def compare(
    target: str, labelled: dict[str, Any], predicted: dict[str, Any], link: str = ""
) -> dict[str, Any]:
    """One target's validation: ``labelled`` and ``predicted`` map run -> value (a run missing from
    ``predicted`` was not scanned or scored, and is counted apart)."""
    runs = sorted(r for r in labelled if r in predicted)
    pairs = [(labelled[r], predicted[r]) for r in runs]
    binary = all(isinstance(v, bool) for p in pairs for v in p)
    stats = _stats(pairs, binary)
    rng = random.Random(0)
    boots: dict[str, list[float | None]] = {k: [] for k in stats}
    if len(pairs) > 1:
        for _ in range(1000):
            sample = [pairs[rng.randrange(len(pairs))] for _ in pairs]
            for k, v in _stats(sample, binary).items():
                boots[k].append(v)
    confusion = Counter((json.dumps(a), json.dumps(b)) for a, b in pairs)
    return {
        "target": target,
        "runs": len(pairs),
        "missing": sorted(r for r in labelled if r not in predicted),
        **stats,
        "intervals": {k: _interval(v) for k, v in boots.items()},
        "confusion": [{"label": a, "predicted": b, "runs": n} for (a, b), n in sorted(confusion.items())],
        "disagreements": [
            {
                "run_id": r,
                "label": labelled[r],
                "predicted": predicted[r],
                "link": f"{link.rstrip('/')}/runs/{urllib.parse.quote(r, safe='')}" if link else "",
            }
            for r in runs
            if labelled[r] != predicted[r]
        ],
    }


def scanner_values(con: duckdb.DuckDBPyConnection, scanner: str, as_flag: bool) -> dict[str, Any]:
    """run -> a scanner's current value (its first finding's; a flag when ``as_flag``); errors left out."""
    rows = con.execute(
        "SELECT run_id, n_findings, CAST(value AS VARCHAR) FROM scan_results_current WHERE scanner = ? "
        "AND error IS NULL",
        [scanner],
    ).fetchall()
    values = {run: (n, None if value is None else json.loads(value)) for run, n, value in rows}
    return {run: bool(n and v) if as_flag else v for run, (n, v) in values.items()}


def validate_scanner(
    con: duckdb.DuckDBPyConnection, name: str, scanner: str, link: str = ""
) -> list[dict[str, Any]]:
    labelled = current(con, name).get(f"scanner:{scanner}", {})
    as_flag = all(isinstance(v, bool) for v in labelled.values())
    return [compare(f"scanner:{scanner}", labelled, scanner_values(con, scanner, as_flag), link)]


def validate_judge(
    rows: list[dict[str, Any]], labels: dict[str, dict[str, Any]], link: str = ""
) -> list[dict[str, Any]]:
    """Per error code and per rubric item: a judge's current score rows against the labels."""
    by_run = {r["run_id"]: r for r in rows}
    out = []
    if "codes" in labels:
        for code in CODES:
            has = {run: code in v for run, v in labels["codes"].items()}
            got = {run: code in (by_run[run]["codes"] or []) for run in has if run in by_run}
            out.append(compare(f"code:{code}", has, got, link))
    for target in sorted(t for t in labels if t.startswith("item:")):
        item = target.removeprefix("item:")
        pred: dict[str, Any] = {}
        for run in labels[target]:
            items = {
                i["id"]: i.get("value")
                for i in ((by_run.get(run) or {}).get("details") or {}).get("items", [])
            }
            if items.get(item) is not None:
                pred[run] = float(items[item])
        lab = {
            run: float(v) if isinstance(v, int | float) and not isinstance(v, bool) else v
            for run, v in labels[target].items()
        }
        out.append(compare(target, lab, pred, link))
    return out
