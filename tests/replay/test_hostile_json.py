"""Replay's readers of JSON the agent (or its model) wrote, given a document nested 100,000 deep:
each treats it as text that is not JSON, as it does any other non-JSON body, instead of raising
RecursionError (schemas/untrusted_json.py). The replay server matches live requests with these, the
viewer's diff and the ATIF export read recorded ones."""

from __future__ import annotations

from replay.export import atif
from replay.replayer import recorded
from replay.web import diff

DEEP = "[" * 100_000 + "]" * 100_000
DEEP_BODY = ('{"model": "m", "messages": ' + DEEP + "}").encode()
BODY = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'


def test_the_replayer_matches_a_deep_body_as_text() -> None:
    assert recorded.canonical_text(DEEP_BODY) == DEEP_BODY.decode()
    assert recorded.similarity(DEEP_BODY.decode(), DEEP_BODY.decode()) == 1.0
    assert recorded.similarity(DEEP_BODY.decode(), BODY.decode()) == 0.0
    assert recorded.first_difference(DEEP_BODY, BODY)  # words the difference, does not raise


def test_the_viewers_diff_shows_deep_arguments_as_text() -> None:
    assert diff.normalise_arguments(DEEP) == DEEP
    changes = diff._json_changes(DEEP, '{"a": 1}')
    assert changes and all(isinstance(c, diff.Change) for c in changes)


def test_the_atif_export_keeps_deep_arguments_out_of_its_objects() -> None:
    assert atif._request("chat.completions", DEEP_BODY) == (None, [], [])
    assert atif._arguments(DEEP) == ({}, False)
