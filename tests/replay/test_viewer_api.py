"""The viewer's JSON API (``amb serve``) over a store of real, synthetic, big and hostile runs."""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import urllib.parse
from urllib.request import urlopen

import pytest

from tests.replay.test_replay_http import exchange
from tests.replay.viewer_store import HOSTILE_PATH, XSS, amb, png


def get(viewer, endpoint: str, **params):
    url = viewer.url + endpoint + ("?" + urllib.parse.urlencode(params) if params else "")
    with urlopen(url, timeout=60) as r:
        return json.loads(r.read())


def status_of(viewer, path: str, method: str = "GET", host: str | None = None) -> tuple[int, dict, bytes]:
    u = urllib.parse.urlsplit(viewer.url)
    con = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    headers = {"Host": host} if host else {}
    con.request(method, path, headers=headers)
    r = con.getresponse()
    return r.status, dict(r.getheaders()), r.read()


def all_runs(viewer, **params) -> list[dict]:
    out, cursor = [], None
    while True:
        page = get(viewer, "/api/runs", limit=7, **params, **({"cursor": cursor} if cursor else {}))
        assert len(page["runs"]) <= 7
        out += page["runs"]
        cursor = page["next"]
        if cursor is None:
            return out


def test_runs_pages_cover_every_run_once_in_order(viewer, viewer_store):
    runs = all_runs(viewer, sort="run", order="asc")
    ids = [r["run_id"] for r in runs]
    expected = sorted(
        [
            viewer_store.clean,
            viewer_store.flawed,
            viewer_store.big,
            viewer_store.hostile,
            *viewer_store.synthetic,
        ]
    )
    assert ids == expected
    desc = [r["run_id"] for r in all_runs(viewer, sort="events", order="desc")]
    assert sorted(desc) == expected and desc[0] == viewer_store.big
    events = [r["n_events"] for r in all_runs(viewer, sort="events", order="desc")]
    assert events == sorted(events, reverse=True)


def test_runs_filters_and_search(viewer, viewer_store):
    bccd = all_runs(viewer, task="bccd-det")
    assert {viewer_store.clean, viewer_store.flawed, viewer_store.hostile} <= {r["run_id"] for r in bccd}
    assert all(r["task"] == "bccd-det" for r in bccd)
    assert [r["run_id"] for r in all_runs(viewer, label="agent=baseline+crash-mid-batch")] == [
        viewer_store.flawed
    ]
    assert [r["run_id"] for r in all_runs(viewer, q="CRASH-mid")] == [viewer_store.flawed]
    scored = all_runs(viewer, score_min="0.0", score_max="1.0")
    assert {r["run_id"] for r in scored} == {viewer_store.clean, viewer_store.flawed, viewer_store.hostile}
    clean = get(viewer, "/api/runs", q=viewer_store.clean)["runs"][0]
    flawed = get(viewer, "/api/runs", q=viewer_store.flawed)["runs"][0]
    (profile,) = clean["scores"]
    hi = clean["scores"][profile]["overall"]
    lo = flawed["scores"][profile]["overall"]
    assert hi > lo  # the injected flaw costs score
    between = all_runs(viewer, score_min=str((hi + lo) / 2), profile=profile)
    assert [r["run_id"] for r in between] == [viewer_store.clean]
    assert clean["tokens_in"] > 0 and clean["track"] == "detection" and clean["status"] == "completed"
    assert "E4" in flawed["scores"][profile]["codes"]


def test_bad_parameters_are_400_with_a_reason(viewer, viewer_store):
    run = f"/api/runs/{viewer_store.clean}"
    for path in (
        # times that are not finite numbers of milliseconds (they once broke the connection)
        f"{run}/events?at_ms=nan",
        f"{run}/events?at_ms=inf",
        f"{run}/timeline?from_ms=-inf",
        f"{run}/timeline?to_ms=1e300",
        f"{run}/files?path=a&seq=-1",
        f"{run}/events?limit=501",
        "/api/runs?limit=0",
        "/api/runs?sort=nope",
        "/api/runs?cursor=%%%",
        # a cursor nested 10,000 deep: measured, not decoded (a RecursionError is no ValueError)
        "/api/runs?cursor=" + base64.urlsafe_b64encode(b"[" * 10_000 + b"]" * 10_000).decode(),
        "/api/runs?score_min=x",
        "/api/runs?label=novalue",
    ):
        status, _, body = status_of(viewer, path)
        assert status == 400, path
        assert json.loads(body)["error"]
    status, _, body = status_of(viewer, "/api/runs/no-such-run/events")
    assert status == 404 and "no-such-run" in json.loads(body)["error"]


def test_deep_link_page_holds_the_event_and_pages_both_ways(viewer, viewer_store):
    big = viewer_store.big
    run = get(viewer, f"/api/runs/{big}")
    assert run["n_events"] >= 100_000
    key = "shim:77777"
    page = get(viewer, f"/api/runs/{big}/events", around=key, limit=100)
    keys = [e["key"] for e in page["events"]]
    assert page["target"] == key and key in keys and len(keys) == 100
    assert keys.index(key) == 50  # half before, half from the event on
    order = [(int(e["ts_ns"]), e["source"], e["seq"]) for e in page["events"]]
    assert order == sorted(order)
    after = get(viewer, f"/api/runs/{big}/events", after=page["next"], limit=100)["events"]
    before = get(viewer, f"/api/runs/{big}/events", before=page["prev"], limit=100)["events"]
    joined = before + page["events"] + after
    ordered = [(int(e["ts_ns"]), e["source"], e["seq"]) for e in joined]
    assert ordered == sorted(ordered) and len(set(ordered)) == 300  # contiguous, no overlap
    body = json.dumps(page).encode()
    assert len(body) < 200_000


def test_every_event_reached_by_paging_a_small_run(viewer, viewer_store):
    run = get(viewer, f"/api/runs/{viewer_store.clean}")
    seen: list[dict] = []
    page = get(viewer, f"/api/runs/{viewer_store.clean}/events", limit=9)
    seen += page["events"]
    while page["next"]:
        page = get(viewer, f"/api/runs/{viewer_store.clean}/events", after=page["next"], limit=9)
        seen += page["events"]
    assert len(seen) == run["n_events"] == len({e["key"] for e in seen})
    filtered = get(viewer, f"/api/runs/{viewer_store.clean}/events", kinds="model_call.completed", limit=500)
    assert len(filtered["events"]) == run["n_model_calls"]
    hits = get(viewer, f"/api/runs/{viewer_store.clean}/events", q="submit_results", limit=500)["events"]
    assert hits and all("submit" in e["summary"] or e["kind"] != "tool_call.requested" for e in hits)


def test_model_call_detail_has_messages_and_raw_bytes(viewer, viewer_store):
    events = get(viewer, f"/api/runs/{viewer_store.clean}/events", kinds="model_call.completed", limit=500)[
        "events"
    ]
    last = events[-1]
    call = get(viewer, f"/api/runs/{viewer_store.clean}/calls/{last['source']}/{last['seq']}")
    roles = [m["role"] for m in call["messages"]]
    assert roles[0] == "system" and "tool" in roles and "assistant" in roles
    assert call["reply"]["tool_calls"][0]["name"] == "submit_results"
    raw = json.loads(call["request_raw"]["text"])
    assert raw["model"] == "baseline" and len(raw["messages"]) == len(call["messages"])
    assert call["request_raw"]["blob"].startswith("sha256:")
    # The raw bytes are exactly the blob's.
    with urlopen(viewer.url + f"/api/blobs/{call['request_raw']['blob']}?download=1") as r:
        assert r.read().decode() == call["request_raw"]["text"]


def test_hostile_content_comes_back_as_data(viewer, viewer_store):
    h = viewer_store.hostile
    events = get(viewer, f"/api/runs/{h}/events", limit=50)["events"]
    call = next(e for e in events if e["kind"] == "model_call.completed")
    detail = get(viewer, f"/api/runs/{h}/calls/{call['source']}/{call['seq']}")
    assert detail["reply"]["text"] == XSS and detail["messages"][0]["text"] == XSS
    assert detail["images"] == 1
    status, headers, body = status_of(viewer, f"/api/runs/{h}/calls/{call['source']}/{call['seq']}/images/0")
    assert status == 200 and headers["Content-Type"] == "image/png" and body == png()
    assert headers["Content-Security-Policy"].startswith("default-src 'none'")
    # The second call's request is JSON nested 100,000 deep: text that is not JSON, with no images.
    deep = [e for e in events if e["kind"] == "model_call.completed"][1]
    detail2 = get(viewer, f"/api/runs/{h}/calls/{deep['source']}/{deep['seq']}")
    assert "nested 100001 levels deep" in detail2["parse_error"] and detail2["images"] == 0
    status, _, body = status_of(viewer, f"/api/runs/{h}/calls/{deep['source']}/{deep['seq']}/images/0")
    assert status == 404 and b"not JSON" in body
    # A blob that is HTML is served as plain text, capped, never as a page.
    resp = detail["response_raw"]
    status, headers, body = status_of(viewer, f"/api/blobs/{resp['blob']}")
    assert (
        status == 200
        and headers["Content-Type"].startswith("text/plain")
        and headers["X-Content-Type-Options"] == "nosniff"
    )
    # A 3 MB file: its content arrives capped.
    files = get(viewer, f"/api/runs/{h}/files", path=HOSTILE_PATH)
    assert files["content"]["kind"] == "text" and files["content"]["truncated"]
    assert len(files["content"]["text"]) <= 64 * 1024
    image = get(viewer, f"/api/runs/{h}/files", path="plots/figure.png")
    assert image["content"]["kind"] == "image" and image["content"]["url"].startswith("/api/blobs/sha256:")


@pytest.mark.parametrize(
    "path",
    [
        "/api/blobs/..%2F..%2Famb.duckdb",
        "/api/blobs/sha256:../../x",
        "/api/blobs/sha256:" + "A" * 64,
        "/api/blobs/" + "0" * 64,
    ],
)
def test_blob_addresses_are_checked(viewer, path):
    status, _, body = status_of(viewer, path)
    assert status in (400, 404) and json.loads(body)["error"]


def test_missing_blob_is_404(viewer):
    status, _, body = status_of(viewer, "/api/blobs/sha256:" + "0" * 64)
    assert status == 404 and "missing" in json.loads(body)["error"]


def test_read_only_and_no_dns_rebinding(viewer):
    for method in ("POST", "PUT", "DELETE"):
        status, _, _ = status_of(viewer, "/api/runs", method=method)
        assert status == 405
    status, _, _ = status_of(viewer, "/api/runs", host="evil.example:80")
    assert status == 421
    for verb in (b"POST", b"PUT", b"DELETE", b"PATCH", b"HEAD"):
        # The Host is checked before the method: a rebinding page learns nothing from a 405 either.
        raw = b"%s /api/runs HTTP/1.1\r\nHost: evil.example:80\r\nContent-Length: 2\r\n\r\n{}" % verb
        status_line, headers, body = exchange(viewer, raw)
        assert status_line.startswith(b"HTTP/1.1 421 ") and headers["content-type"] == "application/json"
        assert verb == b"HEAD" or "answers for 127.0.0.1" in json.loads(body)["error"]
    status, headers, body = status_of(viewer, "/runs/x", host="localhost:1")
    # The page's own script and style are inside it; the policy lets exactly those run (by hash).
    csp = headers["Content-Security-Policy"]
    script = body.decode().split("<script>", 1)[1].split("</script>", 1)[0]
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    assert status == 200 and f"script-src 'sha256-{digest}';" in csp
    assert "unsafe-inline" not in csp and "'self'" not in csp.split("script-src", 1)[1].split(";")[0]


def test_connections_are_kept_alive_but_a_body_closes_them(viewer):
    """The page's calls share a connection; a request with a body (never read) ends its connection."""
    u = urllib.parse.urlsplit(viewer.url)
    con = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    for path in ("/", "/api/runs?limit=1", "/static/app.js"):
        con.request("GET", path)
        r = con.getresponse()
        r.read()
        assert r.status == 200 and r.getheader("Connection") != "close"
    con.request("POST", "/api/runs", body=b"GET /api/runs HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    r = con.getresponse()
    r.read()
    assert r.status == 405 and r.getheader("Connection") == "close"
    con.close()


def test_verify_scores_and_findings_cite_events(viewer, viewer_store):
    v = get(viewer, f"/api/runs/{viewer_store.clean}/verify")
    assert v["ok"] and v["manifest"]["events"] > 0
    assert v["stored_manifest"]["manifest_hash"] == v["manifest"]["manifest_hash"]
    s = get(viewer, f"/api/runs/{viewer_store.hostile}/scores")["scores"][0]
    assert s["audit_status"] == "violation"
    cited = [e for finding in s["details"]["violations"] for e in finding["events"]]
    assert viewer_store.hostile_private_key in cited
    flawed = get(viewer, f"/api/runs/{viewer_store.flawed}/scores")["scores"][0]
    assert "E4" in flawed["codes"]  # the row's codes; its details cite the events of each
    e4 = next(c for c in flawed["details"]["codes"] if c["code"] == "E4")
    for key in e4["events"]:  # every cited event exists and opens
        source, seq = key.split(":")
        assert get(viewer, f"/api/runs/{viewer_store.flawed}/events/{source}/{seq}")["key"] == key


def test_timeline_bins_a_big_run_and_draws_spans_when_zoomed(viewer, viewer_store):
    tl = get(viewer, f"/api/runs/{viewer_store.big}/timeline")
    assert "bins" in tl and tl["count"] == get(viewer, f"/api/runs/{viewer_store.big}")["n_events"]
    assert sum(c for _, _, c in tl["bins"]["rows"]) == tl["count"]
    zoom = get(
        viewer,
        f"/api/runs/{viewer_store.big}/timeline",
        from_ms=tl["to_ms"] / 2,
        to_ms=tl["to_ms"] / 2 + 60_000,
    )
    assert "spans" in zoom and zoom["spans"]
    procs = [s for s in zoom["spans"] if s[0] == "process"]
    assert procs and all(d >= 0 for _, _, d, _, _ in procs) and any(d > 0 for _, _, d, _, _ in procs)
    small = get(viewer, f"/api/runs/{viewer_store.clean}/timeline")
    model = [s for s in small["spans"] if s[0] == "model"]
    assert len(model) == get(viewer, f"/api/runs/{viewer_store.clean}")["n_model_calls"]
    assert all(d > 0 for _, _, d, _, _ in model)  # real durations


def test_diff_of_a_run_with_itself_is_empty(viewer, viewer_store):
    d = get(viewer, "/api/diff", a=viewer_store.clean, b=viewer_store.clean)
    assert d["summary"]["identical"] and d["summary"]["first_divergence"] is None
    assert d["summary"]["counts"]["same"] == d["summary"]["steps_a"] > 0
    assert all(r["op"] == "same" and r["d_tokens_in"] == 0 for r in d["rows"])
    assert all(f["state"] == "same" for f in d["outcomes"]["submission"]["files"])


def test_diff_of_clean_and_flawed_shows_the_first_divergence(viewer, viewer_store):
    d = get(viewer, "/api/diff", a=viewer_store.clean, b=viewer_store.flawed)
    s = d["summary"]
    assert not s["identical"]
    fd = s["first_divergence"]
    # The two agents act alike up to the batch, where the flawed one's code differs.
    assert fd["row"] > 0 and all(r["op"] == "same" for r in d["rows"][: fd["row"]])
    assert fd["op"] == "changed" and fd["changes"] and fd["changes"][0]["name_a"] == "execute_code"
    states = {f["state"] for f in d["outcomes"]["submission"]["files"]}
    assert states - {"same"}  # the flawed run's submission differs by hash
    prof = d["outcomes"]["scores"][0]
    assert prof["a"]["overall"] > prof["b"]["overall"]


def test_grid_of_one_task(viewer, viewer_store):
    g = get(viewer, "/api/grid", task="bccd-det")
    runs = {x["run_id"] for row in g["rows"] for x in row["runs"]}
    assert {viewer_store.clean, viewer_store.flawed, viewer_store.hostile} <= runs


def test_answers_carry_lone_surrogates_escaped():
    """JSON an agent sent may escape a lone surrogate (valid JSON, not encodable as UTF-8): the
    viewer sends it escaped again instead of failing the request."""
    from replay.web.server import json_body

    assert json.loads(json_body({"text": "look \ud800", "n": 1})) == {"text": "look \ud800", "n": 1}
    assert json_body({"text": "é"}) == '{"text":"é"}'.encode()
    # Escaped again, an answer keeps its shape: a field that does not apply is still left out.
    from replay.web.calls import RawBody

    assert json.loads(json_body(RawBody("sha256:x", 3, error="bad \ud800"))) == {
        "blob": "sha256:x",
        "size": 3,
        "error": "bad \ud800",
    }


def test_a_run_ingested_while_the_viewer_runs_is_listed(tmp_path):
    """The run index is kept until the store changes: the next request after an ingest sees the run."""
    from recorder.synthetic import generate_run
    from replay.web.server import Running

    generate_run(tmp_path, "first", seed=1, calls=2)
    amb(tmp_path, "ingest")
    with Running(tmp_path, idle_s=0.1) as viewer:
        assert [r["run_id"] for r in get(viewer, "/api/runs")["runs"]] == ["first"]
        generate_run(tmp_path, "second", seed=2, calls=2)
        amb(tmp_path, "ingest")  # (it waits for the viewer, idle, to let go of the database)
        assert sorted(r["run_id"] for r in get(viewer, "/api/runs")["runs"]) == ["first", "second"]
        assert get(viewer, "/api/runs/second")["n_events"] > 0


def test_the_page_starts_the_run_index_before_the_api_asks(tmp_path):
    """Serving a page builds the run index in the background; the first ``/api/runs`` finds it."""
    import time

    from recorder.synthetic import generate_run
    from replay.web.server import Running

    generate_run(tmp_path, "only", seed=1, calls=2)
    amb(tmp_path, "ingest")
    with Running(tmp_path) as viewer:
        assert viewer.viewer._index is None
        status, _, _ = status_of(viewer, "/runs")
        assert status == 200
        deadline = time.monotonic() + 30
        while viewer.viewer._index is None and time.monotonic() < deadline:
            time.sleep(0.02)
        built = viewer.viewer._index
        assert built is not None and [r.run_id for r in built.rows] == ["only"]
        assert get(viewer, "/api/runs")["total"] == 1
        assert viewer.viewer._index is built  # not built again
