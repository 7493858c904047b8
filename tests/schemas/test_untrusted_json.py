"""JSON an agent or its model wrote (schemas/untrusted_json.py): nesting measured without recursion,
exactly, in linear time on hostile strings; deeper than the limit is a ValueError, never a
RecursionError."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas.untrusted_json import MAX_JSON_DEPTH, json_depth, loads_untrusted


def _depth_by_recursion(value: object) -> int:
    """The independent count: Python's own walk of the decoded value."""
    if isinstance(value, list):
        return 1 + max((_depth_by_recursion(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((_depth_by_recursion(v) for v in value.values()), default=0)
    return 0


@pytest.mark.parametrize(
    "text, depth",
    [
        ("1", 0),
        ("[]", 1),
        ('{"a": [1, {"b": 2}]}', 3),
        ('"[[[[{{"', 0),  # brackets in a string do not nest
        ('["\\"[[[", [[1]]]', 3),  # nor after an escaped quote
        ('["\\\\", [[]]]', 3),  # an escaped backslash ends before the quote
        ("[" * 100_000 + "]" * 100_000, 100_000),
        ("]]]", 0),
    ],
)
def test_json_depth_by_hand(text, depth):
    assert json_depth(text) == depth == json_depth(text.encode())


json_docs = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='[]{}"\\ab,:', max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text('[]{}"\\x', max_size=4), inner, max_size=3)
    ),
    max_leaves=20,
)


@given(json_docs, st.booleans())
def test_json_depth_is_the_decoded_values_depth(value, ascii_only):
    text = json.dumps(value, ensure_ascii=ascii_only)
    assert json_depth(text) == _depth_by_recursion(json.loads(text))


@pytest.mark.parametrize(
    "text",
    [
        '"' + '\\"' * 200_000,  # an unterminated string of escaped quotes: every quote a start
        '"' + "\\" * 200_001,  # ending in a lone backslash
        '""' * 200_000 + "[",
    ],
    ids=["escaped-quotes", "backslashes", "empty-strings"],
)
def test_json_depth_is_linear_on_hostile_strings(text):
    # A quadratic blanking (a regex retried from every quote) would take minutes here.
    assert json_depth(text) <= 1


def test_loads_untrusted_refuses_deep_nesting_with_a_reason():
    with pytest.raises(ValueError, match=f"nested 100000 levels deep; at most {MAX_JSON_DEPTH}"):
        loads_untrusted("[" * 100_000 + "]" * 100_000)
    assert loads_untrusted("[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH) is not None
    with pytest.raises(ValueError):
        loads_untrusted("{not json")
