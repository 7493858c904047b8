"""The baseline server speaks the OpenAI chat API: the real ``openai`` client, JSON and SSE."""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request

import openai
import pytest

from agents.amb_agent import KICKOFF, TOOLS, system_prompt
from agents.baseline.server import BaselineServer, model_names
from tasks.registry import brief
from tests.replay.test_replay_http import exchange


@pytest.fixture(scope="module")
def server():
    with BaselineServer() as s:
        yield s


def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def kickoff(task="kidney-seg", tier="lite"):
    return [
        {"role": "system", "content": system_prompt(brief(task, tier), "/workspace", "/data/public", tier)},
        {"role": "user", "content": KICKOFF},
    ]


def test_non_streaming_tool_call(server):
    resp = client(server).chat.completions.create(
        model="baseline", messages=kickoff(), tools=TOOLS, tool_choice="auto"
    )
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    assert call.function.name == "execute_code"
    args = json.loads(call.function.arguments)
    assert args["language"] == "bash" and args["code"].startswith("# S1 explore")
    assert resp.usage.prompt_tokens > 100 and resp.usage.completion_tokens > 0


def test_streaming_reassembles_to_the_same_answer(server):
    c = client(server)
    plain = c.chat.completions.create(model="baseline", messages=kickoff("bccd-det"), tools=TOOLS)
    stream = c.chat.completions.create(
        model="baseline",
        messages=kickoff("bccd-det"),
        tools=TOOLS,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, finish, usage = "", None, None
    args: dict[int, str] = {}
    names: dict[int, str] = {}
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for ch in chunk.choices:
            text += ch.delta.content or ""
            for tc in ch.delta.tool_calls or []:
                if tc.function.name:
                    names[tc.index] = tc.function.name
                args[tc.index] = args.get(tc.index, "") + (tc.function.arguments or "")
            finish = ch.finish_reason or finish
    msg = plain.choices[0].message
    assert text == msg.content and finish == "tool_calls"
    assert names == {0: "execute_code"} and args[0] == msg.tool_calls[0].function.arguments
    assert usage is not None and usage.total_tokens == plain.usage.total_tokens


def test_model_name_selects_the_flaw(server):
    c = client(server)
    assert [m.id for m in c.models.list()] == model_names()
    with pytest.raises(openai.BadRequestError, match="unknown model"):
        c.chat.completions.create(model="gpt-4o", messages=kickoff())


def test_bad_requests_get_openai_style_errors(server):
    req = urllib.request.Request(
        server.url + "/v1/chat/completions",
        data=b"{not json",
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=5)
    assert e.value.code == 400 and "bad request body" in json.loads(e.value.read())["error"]["message"]
    with pytest.raises(openai.BadRequestError, match="no task brief"):
        client(server).chat.completions.create(model="baseline", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(server.url + "/v1/embeddings", timeout=5)
    assert e.value.code == 404


def test_same_request_same_answer(server):
    c = client(server)
    a = c.chat.completions.create(model="baseline+no-pilot", messages=kickoff("vqa-rad"), tools=TOOLS)
    b = c.chat.completions.create(model="baseline+no-pilot", messages=kickoff("vqa-rad"), tools=TOOLS)
    assert (
        a.id == b.id
        and a.choices[0].message.tool_calls[0].function.arguments
        == b.choices[0].message.tool_calls[0].function.arguments
    )


def test_serve_command_writes_its_url_and_stops_on_sigterm(tmp_path):
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    amb = str(Path(sys.executable).with_name("amb"))
    url_file = tmp_path / "url"
    proc = subprocess.Popen(
        [amb, "baseline", "serve", "--url-file", str(url_file), "--flaw", "no-pilot"],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not url_file.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        url = url_file.read_text().strip()
        with urllib.request.urlopen(url + "/v1/models", timeout=5) as r:
            assert [m["id"] for m in json.load(r)["data"]] == model_names()
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=10)
    assert proc.returncode == 0 and "default flaw no-pilot" in err
    bad = subprocess.run(
        [amb, "baseline", "serve", "--flaw", "lazy"], capture_output=True, text=True, timeout=30
    )
    assert bad.returncode != 0 and bad.stderr.strip().startswith("amb: error: unknown flaw 'lazy'")


def post_raw(server, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, str]:
    con = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        con.request("POST", "/v1/chat/completions", body=body, headers=headers or {})
        r = con.getresponse()
        return r.status, json.loads(r.read())["error"]["message"]
    finally:
        con.close()


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b"[" * 100_000, "nested 100000 levels deep"),
        (b'{"messages":' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested 100001 levels deep"),
        (b'{"model":"baseline","messages":[[1]]}', "'messages[0]' must be an object, not an array"),
        (b'{"model":"baseline","messages":["hi"]}', "'messages[0]' must be an object, not a string"),
        (
            b'{"model":"baseline","messages":[{"role":"user"},5]}',
            "'messages[1]' must be an object, not a number",
        ),
        (b'{"model":"baseline","messages":[{}],"stream_options":[1]}', "'stream_options' must be an object"),
    ],
    ids=["deep", "deep-messages", "array", "string", "number", "stream-options"],
)
def test_a_hostile_body_gets_a_400_with_its_reason(server, body, why):
    """Nesting deeper than a decoder recurses and messages that are not objects: a 400 that says
    why, never a RecursionError or a dropped connection; the server answers the next request."""
    status, message = post_raw(server, body)
    assert status == 400 and why in message, message
    assert post_raw(server, b'{"model":"baseline","messages":[]}')[0] == 400


def test_a_body_above_64_mib_is_refused_unread(server):
    status, message = post_raw(server, b"", {"Content-Length": str(64 * 1024 * 1024 + 1)})
    assert status == 413 and "this server reads 64 MiB" in message


@pytest.mark.parametrize("method", ["GET", "POST", "PUT", "DELETE"])
def test_a_host_that_is_not_a_loopback_name_is_refused_in_json(server, method):
    """A page on a rebinding domain reaches 127.0.0.1 with its own name as Host: whatever the method,
    it gets a 421 in the API's error shape, and no answer of the policy."""
    body = json.dumps({"model": "baseline", "messages": kickoff()}).encode()
    raw = b"%s /v1/chat/completions HTTP/1.1\r\nHost: evil.example:80\r\nContent-Length: %d\r\n\r\n%s"
    status, headers, answer = exchange(server, raw % (method.encode(), len(body), body))
    assert status.startswith(b"HTTP/1.1 421 ") and headers["content-type"] == "application/json"
    error = json.loads(answer)["error"]
    assert error["message"] == "this server answers for 127.0.0.1, [::1], localhost only"
    assert error["type"] == "invalid_request_error" and b"choices" not in answer


def test_a_request_line_it_cannot_read_is_answered_in_json(server):
    status, headers, answer = exchange(server, b"GARBAGE\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 400 ") and headers["content-type"] == "application/json"
    assert "Bad request syntax" in json.loads(answer)["error"]["message"]
