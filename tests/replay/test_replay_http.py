"""The replay endpoint as an HTTP server an untrusted client talks to, with the real openai and
anthropic SDKs and raw sockets: a Host that is not a loopback name is refused (DNS rebinding), every
error is JSON in the asking provider's shape (down to a request line it cannot read), and
``GET .../models`` lists the models the recording called."""

from __future__ import annotations

import http.client
import json
import socket
from dataclasses import replace
from pathlib import Path

import anthropic
import openai
import pytest

from replay.replayer.recorded import RecordedCall
from replay.replayer.server import Replayer, ReplayServer
from schemas import httpbase
from schemas.blobstore import BlobStore
from tests.replay.test_replay_hostile import REQUEST, RESPONSE, chat_call

MODELS = {"claude-y": "anthropic", "gemini-z": "gemini", "m": "openai"}


def recorded(blobs: BlobStore) -> list[RecordedCall]:
    """One Chat Completions call (model ``m``, answering ``REQUEST``), and calls naming the other models
    (one twice, one naming none)."""
    call = chat_call(blobs)
    others = [("anthropic", "messages", "claude-y"), ("gemini", "generateContent", "gemini-z")]
    return [
        replace(call, model="m"),
        *(replace(call, index=i, provider=p, api=a, model=m) for i, (p, a, m) in enumerate(others, 1)),
        replace(call, index=3, provider="anthropic", api="messages", model="claude-y"),
        replace(call, index=4, model=None),
    ]


@pytest.fixture
def server(tmp_path: Path):
    blobs = BlobStore(tmp_path / "blobs")
    with ReplayServer(Replayer(recorded(blobs), blobs, "canonical", "fast")) as s:
        yield s


def request(server, method: str, path: str, host: str, body: bytes | None = None, headers=None):
    con = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        con.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        for k, v in {"Host": host, "Content-Length": str(len(body or b"")), **(headers or {})}.items():
            con.putheader(k, v)
        con.endheaders(body)
        r = con.getresponse()
        return r.status, r.getheader("Content-Type"), r.read()
    finally:
        con.close()


def exchange(server, raw: bytes) -> tuple[bytes, dict[str, str], bytes]:
    """What the server answers ``raw`` (all of which it reads) before it closes the connection:
    its status line, headers and body."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(raw)
        got = b"".join(iter(lambda: sock.recv(65536), b""))
    head, _, body = got.partition(b"\r\n\r\n")
    status, *lines = head.split(b"\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.decode().partition(":") for line in lines)}
    return status, headers, body


@pytest.mark.parametrize("host", ["evil.example", "evil.example:80", "127.0.0.1.nip.io", "10.0.0.1", ""])
def test_a_host_that_is_not_a_loopback_name_is_refused(server, host):
    """A page on a rebinding domain reaches 127.0.0.1 with its own name as Host: it reads neither the
    models nor a recorded body, and takes no call from the agent's queue."""
    status, ctype, body = request(server, "GET", "/v1/models", host)
    assert (status, ctype) == (421, "application/json")
    assert "answers for 127.0.0.1, [::1], localhost only" in json.loads(body)["error"]["message"]
    assert b"claude-y" not in body
    status, _, body = request(server, "POST", "/v1/chat/completions", host, REQUEST)
    error = json.loads(body)["error"]
    assert status == 421 and error["code"] == "invalid_request_error" and b"choices" not in body
    status, _, body = request(server, "POST", "/v1/messages", host, REQUEST)
    assert status == 421 and json.loads(body)["type"] == "error"  # Anthropic's shape
    assert server.replayer.matcher.summary()["requests"] == 0
    assert request(server, "POST", "/v1/chat/completions", "127.0.0.1", REQUEST)[::2] == (200, RESPONSE)


@pytest.mark.parametrize("host", ["localhost", "LOCALHOST:1", "127.0.0.1:9", "[::1]:8080", "[::1]"])
def test_loopback_names_are_answered(server, host):
    status, _, body = request(server, "GET", "/v1/models", host)
    assert status == 200 and [m["id"] for m in json.loads(body)["data"]] == list(MODELS)


def test_the_sdks_are_answered_on_localhost_and_refused_on_another_name(server):
    client = openai.OpenAI(base_url=f"http://localhost:{server.port}/v1", api_key="k", max_retries=0)
    reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert reply.id == "x"
    rebound = openai.OpenAI(
        base_url=f"http://localhost:{server.port}/v1",
        api_key="k",
        max_retries=0,
        default_headers={"Host": "rebind.example"},
    )
    with pytest.raises(openai.APIStatusError) as refused:
        rebound.models.list()
    assert refused.value.status_code == 421


def test_a_server_bound_elsewhere_on_purpose_answers_any_name():
    assert httpbase.answered_names("192.0.2.7") == frozenset() == httpbase.answered_names("0.0.0.0")
    assert httpbase.answered_names("::1") == {"::1", "localhost", "127.0.0.1", "[::1]"}
    assert httpbase.answered_names("127.0.0.2") == {"127.0.0.2", "localhost", "127.0.0.1", "[::1]"}


PLAIN = {"message", "type"}
OPENAI_SHAPE = {"message", "type", "param", "code"}
CRLF_HOST = b"\r\nHost: 127.0.0.1\r\n\r\n"


@pytest.mark.parametrize(
    ("raw", "status", "shape", "says"),
    [
        (b"GARBAGE\r\n", 400, "plain", "Bad request syntax ('GARBAGE')"),
        (b"GET /v1/models HTTP/1.1 x\r\n", 400, "plain", "Bad request version ('x')"),
        (b"GET /v1/models HTTP/2.0\r\n", 505, "plain", "Invalid HTTP version (2.0)"),
        (b"GET /v1/models HTTP/1.1\r\n" + b"X-A: b\r\n" * 101, 431, "plain", "Too many headers"),
        (b"PUT /v1/chat/completions HTTP/1.1" + CRLF_HOST, 501, "openai", "Unsupported method ('PUT')"),
        (b"DELETE /v1/messages HTTP/1.1" + CRLF_HOST, 501, "anthropic", "Unsupported method ('DELETE')"),
        (b"PATCH /v1beta/models/g:generateContent HTTP/1.1" + CRLF_HOST, 501, "gemini", "('PATCH')"),
        (b"HEAD /x HTTP/1.1\r\nHost: 127.0.0.1\r\nanthropic-version: 1\r\n\r\n", 501, "anthropic", ""),
        (b"OPTIONS /v1/models HTTP/1.1" + CRLF_HOST, 501, "plain", "Unsupported method ('OPTIONS')"),
    ],
    ids=["no-version", "bad-version", "http2", "headers", "put", "delete", "patch", "head", "options"],
)
def test_a_protocol_error_is_json_in_the_asking_providers_shape(server, raw, status, shape, says):
    """Not the standard library's HTML page: a status line, JSON, and the error shape of the
    provider whose path or headers the request carries (a plain one when it carries neither)."""
    line, headers, body = exchange(server, raw)
    assert line.startswith(b"HTTP/1.1 %d " % status)
    assert headers["content-type"] == "application/json" and headers["connection"] == "close"
    assert b"<" not in body
    if raw.startswith(b"HEAD"):
        assert body == b""
        return
    error = json.loads(body)
    if shape == "anthropic":
        assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    elif shape == "gemini":
        assert error["error"]["code"] == status and "status" in error["error"]
    else:
        assert set(error["error"]) == (PLAIN if shape == "plain" else OPENAI_SHAPE)
    assert says in error["error"]["message"]


def test_an_error_in_a_request_line_is_not_taken_for_the_previous_requests(server):
    """On a kept-alive connection, a request line that cannot be read after an Anthropic request
    is answered in the plain shape: the previous request's path and headers say nothing of it."""
    miss = b"POST /v1/messages HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 2\r\n\r\n{}"
    line, headers, body = exchange(server, miss + b"GARBAGE\r\n")
    first, _, second = body.partition(b"HTTP/1.1 400 ")
    assert json.loads(first)["type"] == "error"  # the miss, in Anthropic's shape
    plain = json.loads(second.partition(b"\r\n\r\n")[2])
    assert plain == {"error": {"message": "Bad request syntax ('GARBAGE')", "type": "invalid_request_error"}}


def test_the_sdks_read_a_protocol_error_as_their_providers_error(server):
    """An unsupported method through each SDK: the SDK parses the JSON body as it parses the
    provider's own errors (an HTML page would reach it as a string)."""
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="k", max_retries=0)
    with pytest.raises(openai.APIStatusError) as oa:
        client.delete("/chat/completions", cast_to=object)
    assert oa.value.status_code == 501 and isinstance(oa.value.body, dict)
    assert oa.value.body["code"] == "invalid_request_error" and "('DELETE')" in oa.value.body["message"]
    claude = anthropic.Anthropic(base_url=server.url, api_key="k", max_retries=0)
    with pytest.raises(anthropic.APIStatusError) as an:
        claude.delete("/v1/messages", cast_to=object)
    assert an.value.status_code == 501 and isinstance(an.value.body, dict)
    assert an.value.body["error"]["type"] == "invalid_request_error"


def test_the_sdks_list_the_models_the_recording_called_then_call_one(server):
    """An OpenAI client and an Anthropic client list the models before calling: each gets every model
    the recording named, in its own provider's shape, and listing takes no recorded call."""
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="k", max_retries=0)
    listed = client.models.list()
    assert [(m.id, m.owned_by) for m in listed.data] == list(MODELS.items())
    assert client.models.retrieve("claude-y").id == "claude-y"
    with pytest.raises(openai.NotFoundError) as missing:
        client.models.retrieve("gpt-4o")
    assert "model 'gpt-4o' is not in this recording (it called: claude-y, gemini-z, m)" in str(missing.value)
    claude = anthropic.Anthropic(base_url=server.url, api_key="k", max_retries=0)
    page = claude.models.list()
    assert [m.id for m in page.data] == list(MODELS) and page.has_more is False
    assert page.first_id == "claude-y" and page.last_id == "m"
    assert claude.models.retrieve("m").display_name == "m"
    with pytest.raises(anthropic.NotFoundError):
        claude.models.retrieve("claude-opus-4")
    assert server.replayer.matcher.summary()["requests"] == 0
    reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert reply.id == "x" and server.replayer.matcher.summary()["served"] == 1


@pytest.mark.parametrize(
    ("path", "headers"),
    [("/v1beta/models", {"x-goog-api-key": "k"}), ("/v1beta/models?key=k&pageSize=50", {})],
    ids=["header", "parameter"],
)
def test_a_gemini_client_gets_the_gemini_model_list(server, path, headers):
    status, _, body = request(server, "GET", path, "127.0.0.1", headers=headers)
    listed = json.loads(body)["models"]
    assert status == 200 and [m["name"] for m in listed] == [f"models/{m}" for m in MODELS]
    assert "generateContent" in listed[0]["supportedGenerationMethods"]
    one = path.replace("/models", "/models/gemini-z")
    status, _, body = request(server, "GET", one, "127.0.0.1", headers=headers)
    assert status == 200 and json.loads(body)["name"] == "models/gemini-z"


def test_a_route_it_does_not_have_is_a_404_in_the_asking_providers_shape(server):
    anthropic_style = {"anthropic-version": "2023-06-01"}
    for method in ("GET", "POST"):
        status, _, body = request(server, method, "/v1/nothing", "127.0.0.1", b"", anthropic_style)
        error = json.loads(body)
        assert status == 404 and error["type"] == "error" and error["error"]["type"] == "not_found_error"
        status, _, body = request(server, method, "/v1/nothing", "127.0.0.1", b"")
        assert status == 404 and json.loads(body)["error"]["code"] == "not_found"
