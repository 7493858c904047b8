"""Step alignment of two runs (replay/web/diff.py), on hand-built steps with hand-worked answers."""

from __future__ import annotations

import msgspec

from replay.web.diff import Step, align, normalise_arguments, outcomes, summarize
from replay.web.runs import Score


def step(i: int, *tools: tuple[str, str], tokens: tuple[int, int] = (10, 5), latency: float = 100.0) -> Step:
    return Step(
        index=i,
        key=f"proxy:{i}",
        ts_ns=i,
        ok=True,
        error=None,
        tools=tuple((n, normalise_arguments(a)) for n, a in tools),
        text="",
        tokens_in=tokens[0],
        tokens_out=tokens[1],
        latency_ms=latency,
    )


LS = ("bash", '{"cmd": "ls"}')
CAT = ("bash", '{"cmd": "cat a"}')
PY = ("python", '{"code": "print(1)"}')
SUBMIT = ("submit", "{}")


def ops(rows):
    return [(r.op, r.a.index if r.a else None, r.b.index if r.b else None) for r in rows]


def test_arguments_are_normalised_before_matching():
    assert normalise_arguments('{"b": 1,  "a": [1, 2]}') == normalise_arguments('{"a":[1,2],"b":1}')
    assert normalise_arguments("  not json ") == "not json"
    a, b = [step(0, ("bash", '{"cmd": "ls", "t": 1}'))], [step(0, ("bash", '{"t":1,"cmd":"ls"}'))]
    assert ops(align(a, b)) == [("same", 0, 0)]


def test_identical_runs_are_all_same():
    a = [step(0, LS), step(1, PY), step(2, SUBMIT)]
    rows = align(a, a)
    s = summarize(rows, a, a)
    assert ops(rows) == [("same", 0, 0), ("same", 1, 1), ("same", 2, 2)]
    assert s.identical and s.first_divergence is None


def test_insertion_deletion_and_changed_arguments():
    # a: ls, cat, py, submit     b: ls, py', cat, submit   (py' = py with other code)
    # Identical steps align first (ls, cat, submit), wherever they sit; py' then sits before cat
    # and py after it, so neither has a partner: py' is inserted and py deleted.
    a = [step(0, LS), step(1, CAT), step(2, PY), step(3, SUBMIT)]
    b = [step(0, LS), step(1, ("python", '{"code": "print(2)"}')), step(2, CAT), step(3, SUBMIT)]
    rows = align(a, b)
    assert ops(rows) == [
        ("same", 0, 0),
        ("inserted", None, 1),
        ("same", 1, 2),
        ("deleted", 2, None),
        ("same", 3, 3),
    ]
    s = summarize(rows, a, b)
    assert s.counts == {"same": 3, "changed": 0, "deleted": 1, "inserted": 1}
    assert s.first_divergence is not None
    assert s.first_divergence.row == 1 and s.first_divergence.op == "inserted"
    # Same place, same tool, other arguments: one changed step, with the field that changed.
    a = [step(0, LS), step(1, PY), step(2, SUBMIT)]
    b = [step(0, LS), step(1, ("python", '{"code": "print(2)"}')), step(2, SUBMIT)]
    rows = align(a, b)
    assert ops(rows) == [("same", 0, 0), ("changed", 1, 1), ("same", 2, 2)]
    assert msgspec.to_builtins(rows[1].changes) == [
        {
            "tool": 0,
            "name_a": "python",
            "name_b": "python",
            "fields": [{"field": "code", "a": '"print(1)"', "b": '"print(2)"'}],
        }
    ]
    first = summarize(rows, a, b).first_divergence
    assert first is not None and first.row == 1


def test_unmatched_stretches_fall_back_to_order_with_deltas():
    a = [step(0, LS, tokens=(100, 10), latency=50.0), step(1, CAT)]
    b = [step(0, PY, tokens=(130, 4), latency=80.5)]
    rows = align(a, b)
    assert ops(rows) == [("changed", 0, 0), ("deleted", 1, None)]
    assert rows[0].d_tokens_in == 30 and rows[0].d_tokens_out == -6 and rows[0].d_latency_ms == 30.5
    changes = msgspec.to_builtins(rows[0].changes)
    assert changes[0]["name_a"] == "bash" and changes[0]["name_b"] == "python"


def test_outcomes_by_hash():
    score = Score("offline", 1.0, None, None, "completed", [])
    o = outcomes(
        {"a.txt": "h1", "b.txt": "h2"}, {"a.txt": "h1", "b.txt": "h3", "c.txt": "h4"}, {"p": score}, {}
    )
    assert [(f.path, f.state) for f in o.submission.files] == [
        ("a.txt", "same"),
        ("b.txt", "differs"),
        ("c.txt", "only_b"),
    ]
    assert [(s.profile, s.a, s.b) for s in o.scores] == [("p", score, None)]
    assert outcomes(None, {}, {}, {}).submission.a_sealed is False
