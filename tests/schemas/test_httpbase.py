"""The project's HTTP layer (``schemas.httpbase``) against hostile request bodies, over loopback with
a raw socket: a body is read by its Content-Length or chunked, up to a limit; anything else is refused
with its reason, and a body left unread closes the connection, so the bytes an agent put after it
are never answered as a request of their own."""

from __future__ import annotations

import hashlib
import http.client
import io
import json
import socket
import time

import pytest

from schemas import httpbase

LIMIT = 1000
SMUGGLED = b"GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"


class Echo(httpbase.Handler):
    """Answers a POST to /echo with its body's length and digest, any other POST without reading it."""

    def do_POST(self) -> None:
        if self.path != "/echo":
            self.send_json(404, {"error": "no such route"})
            return
        try:
            body = self.read_body(LIMIT)
        except httpbase.BodyRefused as e:
            self.send_json(e.status, {"error": str(e)})
            return
        self.send_json(200, {"n": len(body), "sha": hashlib.sha256(body).hexdigest()})

    def do_GET(self) -> None:
        self.send_json(200, {"path": self.path})


@pytest.fixture(scope="module")
def server():
    with httpbase.Serving(Echo) as s:
        yield s


class _Replies(io.BytesIO):
    """The bytes a server sent, where ``http.client`` reads its responses from, one after another
    (each response closes its file when read: this one stays open for the next)."""

    def makefile(self, *args: object, **kwargs: object) -> io.BytesIO:
        return self

    def close(self) -> None:
        pass


def exchange(server, raw: bytes) -> list[tuple[int, dict, dict]]:
    """Every answer the server sends to ``raw`` before it closes the connection."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        sock.sendall(raw)
        sock.shutdown(socket.SHUT_WR)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    replies = _Replies(data)
    answers = []
    while replies.tell() < len(data):
        r = http.client.HTTPResponse(replies)  # type: ignore[arg-type]
        r.begin()
        answers.append((r.status, {k.lower(): v for k, v in r.getheaders()}, json.loads(r.read())))
    return answers


def post(body_headers: bytes, body: bytes = b"") -> bytes:
    return b"POST /echo HTTP/1.1\r\nHost: x\r\n" + body_headers + b"\r\n" + body


@pytest.mark.parametrize(
    "raw",
    [
        post(b"Content-Length: 5\r\n", b"hello"),
        post(b"Transfer-Encoding: chunked\r\n", b"2;ext=1\r\nhe\r\n3\r\nllo\r\n0\r\nX-Trailer: y\r\n\r\n"),
        post(b"Transfer-Encoding: Chunked\r\n", b"5\r\nhello\r\n0\r\n\r\n"),
    ],
    ids=["content-length", "chunked", "chunked-with-capital"],
)
def test_a_body_is_read_whole_and_the_connection_carries_the_next_request(server, raw):
    answers = exchange(server, raw + b"GET /next HTTP/1.1\r\nHost: x\r\n\r\n")
    assert [a[0] for a in answers] == [200, 200]
    assert answers[0][2] == {"n": 5, "sha": hashlib.sha256(b"hello").hexdigest()}
    assert answers[1][2] == {"path": "/next"}


@pytest.mark.parametrize(
    ("raw", "status", "why"),
    [
        (post(b"Content-Length: 1001\r\n", b"x" * 1001), 413, "1,001 bytes; this server reads 1,000 bytes"),
        (
            post(b"Transfer-Encoding: chunked\r\n", b"3e8\r\n" + b"x" * 1000 + b"\r\n1\r\nx\r\n0\r\n\r\n"),
            413,
            "exceeds",
        ),
        (post(b"Content-Length: -5\r\n"), 400, "bad Content-Length '-5'"),
        (post(b"Content-Length: +5\r\n", b"hello"), 400, "bad Content-Length '+5'"),
        (post(b"Content-Length: 1_0\r\n", b"x" * 10), 400, "bad Content-Length '1_0'"),
        (post("Content-Length: ١\r\n".encode(), b"x"), 400, "bad Content-Length"),
        (post(b"Content-Length: abc\r\n"), 400, "bad Content-Length 'abc'"),
        (post(b"Content-Length: 5\r\nContent-Length: 6\r\n", b"hello!"), 400, "bad Content-Length"),
        (post(b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n", b"0\r\n\r\n"), 400, "both"),
        (post(b"Transfer-Encoding: gzip\r\n", b"x"), 501, "only chunked"),
        (post(b"Transfer-Encoding: chunked\r\n", b"zz\r\nhello\r\n0\r\n\r\n"), 400, "not hexadecimal"),
        (post(b"Transfer-Encoding: chunked\r\n", b"-5\r\nhello\r\n0\r\n\r\n"), 400, "not hexadecimal"),
        (
            post(b"Transfer-Encoding: chunked\r\n", b"2\r\nhello\r\n0\r\n\r\n"),
            400,
            "does not end where its size says",
        ),
        (post(b"Transfer-Encoding: chunked\r\n", b"5\r\nhel"), 400, "does not end where its size says"),
        (post(b"Transfer-Encoding: chunked\r\n", b"1" * 5000 + b"\r\n"), 400, "too long"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_a_body_it_does_not_read_is_refused_and_closes_the_connection(server, raw, status, why):
    """The refusal names the reason and says ``Connection: close``; what follows the refused body
    (here a request of its own) is never answered."""
    answers = exchange(server, raw + SMUGGLED)
    assert len(answers) == 1, answers
    got, headers, body = answers[0]
    assert got == status and why in body["error"], body
    assert headers["connection"] == "close"


def test_an_answer_before_the_body_is_read_closes_the_connection(server):
    """A route that answers without reading the body: the body's bytes are not a next request."""
    raw = b"POST /elsewhere HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(SMUGGLED), SMUGGLED)
    answers = exchange(server, raw)
    assert [(a[0], a[1]["connection"]) for a in answers] == [(404, "close")]
    chunked = b"POST /elsewhere HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    assert [
        a[0] for a in exchange(server, chunked + b"%x\r\n%s\r\n0\r\n\r\n" % (len(SMUGGLED), SMUGGLED))
    ] == [404]


def test_a_request_without_a_body_keeps_the_connection(server):
    answers = exchange(
        server, post(b"") + post(b"Content-Length: 0\r\n") + b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n"
    )
    assert [a[0] for a in answers] == [200, 200, 200] and answers[0][2]["n"] == 0
    assert all("connection" not in a[1] for a in answers)


def test_a_body_shorter_than_its_length_is_refused(server):
    answers = exchange(server, post(b"Content-Length: 10\r\n", b"hello"))
    assert [(a[0], a[1]["connection"]) for a in answers] == [(400, "close")]
    assert "ended after 5 of 10 bytes" in answers[0][2]["error"]


class Failing(httpbase.Handler):
    """Fails as a client can make a handler fail (the connection reset under it), or as a bug does."""

    def do_GET(self) -> None:
        if self.path == "/reset":
            raise ConnectionResetError(104, "Connection reset by peer")
        raise ValueError("a bug in the handler")


def test_a_connection_error_is_quiet_and_a_bug_is_not(capsys):
    with httpbase.Serving(Failing) as s:
        for path in ("/reset", "/bug"):
            with socket.create_connection(("127.0.0.1", s.port), timeout=5) as sock:
                sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
                assert sock.recv(100) == b""  # the server closed it, answering nothing
            if path == "/reset":
                assert "Traceback" not in capsys.readouterr().err
    assert "ValueError: a bug in the handler" in capsys.readouterr().err


def test_a_stalled_connection_is_closed_after_the_timeout():
    # Every server has one, from this layer (the viewer's is shorter); here a short one, given as
    # the servers' state is.
    assert 0 < httpbase.Handler.timeout <= 300
    with httpbase.Serving(Echo, timeout=0.5) as s:
        with socket.create_connection(("127.0.0.1", s.port), timeout=10) as sock:
            sock.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc")
            start = time.monotonic()
            assert sock.recv(100) == b""  # no answer: the body never came
            assert time.monotonic() - start < 5
