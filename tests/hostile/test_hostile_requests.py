"""Requests an agent on the same machine can send the project's servers: numbers that are digits
only to ``str.isdigit`` and query values that are no number at all. Each gets a 4xx naming what is
wrong, never a traceback or a 500.
"""

from __future__ import annotations

import http.client
import json
from pathlib import Path
from urllib.parse import quote

import pytest

from replay.ingest import ingest
from replay.web.server import Running
from tests.hostile.test_hostile_payloads import _write_spool


@pytest.fixture(scope="module")
def viewer(tmp_path_factory):
    root: Path = tmp_path_factory.mktemp("hostile-requests") / "store"
    _write_spool(
        root, "r", [("run.started", "{}"), ("note", "{}"), ("run.finished", '{"status":"completed"}')]
    )
    ingest(root)
    with Running(root) as running:
        yield running


def get(viewer, path: str) -> tuple[int, dict]:
    con = http.client.HTTPConnection("127.0.0.1", viewer.port, timeout=30)
    try:
        con.request("GET", path)
        r = con.getresponse()
        return r.status, json.loads(r.read())
    finally:
        con.close()


@pytest.mark.parametrize("number", ["²", "١", "1²", "٣٤", "9" * 5000, "99999999999999999999"])
@pytest.mark.parametrize("route", ["events/recorder/{}", "calls/recorder/{}", "calls/recorder/1/images/{}"])
def test_a_path_number_is_ascii_digits_only(viewer, route, number):
    """``str.isdigit`` takes '²' (which ``int`` refuses) and '١' (which ``int`` reads as 1): a path
    number in anything but ASCII digits, or too long for a BIGINT, is a 400 naming it."""
    status, body = get(viewer, "/api/runs/r/" + route.format(quote(number)))
    assert status == 400, body
    assert "ASCII digits" in body["error"]


def test_an_ascii_path_number_still_reaches_the_event(viewer):
    status, body = get(viewer, "/api/runs/r/events/recorder/1")
    assert status == 200 and body["kind"] == "note"
    status, body = get(viewer, "/api/runs/r/events?around=" + quote("recorder:١"))
    assert status == 400 and "ASCII digits" in body["error"]


@pytest.mark.parametrize("step", ["²", "9" * 5000])
def test_a_workspace_step_is_ascii_digits_only(viewer, step):
    status, body = get(viewer, "/api/runs/r/workspace?at=" + quote("step:" + step))
    assert status == 400 and "ASCII digits" in body["error"], body


@pytest.mark.parametrize("param", ["score_min", "score_max"])
@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-inf", "Infinity", "1.5", "-0.1"])
def test_a_score_bound_is_a_number_from_0_to_1(viewer, param, value):
    """NaN compares false with every score, so ``score_min=nan`` kept every run and
    ``score_max=nan`` none, without a word: a bound that is no number from 0 to 1 is a 400."""
    status, body = get(viewer, f"/api/runs?{param}={quote(value)}")
    assert status == 400 and param in body["error"], body


def test_a_score_bound_from_0_to_1_filters(viewer):
    status, body = get(viewer, "/api/runs?score_min=0&score_max=1")
    assert status == 200 and body["runs"] == []  # the one run has no score
    assert get(viewer, "/api/runs")[1]["total"] == 1
