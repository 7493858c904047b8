"""The one small HTTP layer of the project's servers: the viewer (``amb serve``), the replay endpoint
(``amb replay serve``) and the baseline model server (``amb baseline serve``).

The standard library's threading server, kept alive (HTTP/1.1), with Nagle off (headers and body
leave in separate writes; without TCP_NODELAY the body waits for the client's delayed ACK, ~40 ms a
response) and quiet (the recorder and the CLI are the logs).

Request bodies come from an agent on the same machine, so they are hostile: ``read_body`` is the one
reader, up to a limit, and an answer sent while a request's body is still unread closes the
connection, so its bytes are never parsed as a request. A server bound to loopback answers only a
loopback ``Host`` (``answered_names``), so a web page cannot reach it through DNS rebinding.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import socket
import sys
import threading
import time
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

MAX_LINE = 4096
"""The longest chunk-size or trailer line read."""
MAX_TRAILERS = 64 * 1024
"""The most bytes of trailer lines read after a chunked body."""


class BodyRefused(Exception):
    """A request body the server does not read: ``status`` (400, 413, 501) and why."""

    def __init__(self, status: int, why: str):
        super().__init__(why)
        self.status = status


def is_loopback(host: str) -> bool:
    """Whether a listening address (or a Host header's name) is this machine's loopback."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def host_name(header: str) -> str:
    """The host part of a Host header, lower case (``[::1]:8765`` → ``[::1]``)."""
    header = header.strip().lower()
    if header.startswith("["):
        return header.split("]", 1)[0] + "]"
    return header.rsplit(":", 1)[0]


def answered_names(host: str) -> frozenset[str]:
    """The Host names a server listening on ``host`` answers (``Handler.allowed_hosts``). Bound to
    loopback, only loopback names: a web page on a name that resolves to 127.0.0.1 (DNS
    rebinding) is refused. Bound elsewhere on purpose, any name it is reached by (empty)."""
    if not is_loopback(host):
        return frozenset()
    return frozenset({host.lower(), "localhost", "127.0.0.1", "[::1]"})


def _size(n: int) -> str:
    return f"{n // (1 << 20)} MiB" if n >= 1 << 20 and n % (1 << 20) == 0 else f"{n:,} bytes"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    timeout = 300
    """Seconds a connection may go without sending (a stalled request, an idle keep-alive) or taking
    what is sent to it before it is closed: an agent that opens connections and stalls does not
    hold a thread each for ever. Waits of the server's own (a replayed latency) do not count."""
    always: dict[str, str] = {}
    """Headers every answer of this server carries."""
    body_unread = False
    """The request announced a body that ``read_body`` has not read (yet)."""
    allowed_hosts: frozenset[str] = frozenset()
    """The Host names this server answers (``answered_names``); empty: any."""

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def parse_request(self) -> bool:
        # What an earlier request on this connection left is not taken for this one's (an error in
        # its request line is answered before its own path and headers are read).
        for stale in ("path", "headers"):
            self.__dict__.pop(stale, None)
        ok = super().parse_request()
        self.body_unread = ok and (
            "Transfer-Encoding" in self.headers
            or any(v.strip() != "0" for v in self.headers.get_all("Content-Length") or [])
        )
        allowed = self.allowed_hosts  # checked before any method's handler runs
        if ok and allowed and host_name(self.headers.get("Host") or "") not in allowed:
            self.send_error(421, f"this server answers for {', '.join(sorted(allowed))} only")
            return False
        return ok

    def error_json(self, status: int, message: str) -> Any:
        """The JSON body of an error the HTTP layer answers (``send_error``: a malformed request,
        an unknown method); None for the standard library's HTML page. ``self.path`` and
        ``self.headers`` are there only when the request got that far."""
        return None

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        short = self.responses.get(code, ("",))[0]
        body = self.error_json(code, message or short or f"HTTP {code}")
        if body is None:
            super().send_error(code, message, explain)
            return
        self.close_connection = True
        if self.command is None:
            # The request line could not be read: answered with a status line, not as HTTP/0.9.
            self.request_version = "HTTP/1.1"
        self.send_json(code, body)

    def _head(self, status: int, ctype: str, headers: dict[str, str] | None) -> None:
        if self.body_unread:
            self.close_connection = True  # else the body's bytes would be read as the next request
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        for k, v in {**self.always, **(headers or {})}.items():
            self.send_header(k, v)
        if self.close_connection:
            self.send_header("Connection", "close")

    def send(self, status: int, body: bytes, ctype: str, headers: dict[str, str] | None = None) -> None:
        """One whole answer (its headers only, to a HEAD)."""
        self._head(status, ctype, headers)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def send_json(self, status: int, obj: Any, headers: dict[str, str] | None = None) -> None:
        self.send(status, json.dumps(obj).encode(), "application/json", headers)

    def send_chunks(
        self, status: int, ctype: str, chunks: Iterable[bytes], headers: dict[str, str], gap_s: float = 0
    ) -> None:
        """A chunked answer, each chunk flushed as it is written, ``gap_s`` apart; the closing chunk
        is left to the caller (``end_chunks``), which may instead cut the stream (``abort``)."""
        self._head(status, ctype, {"Cache-Control": "no-cache", "Transfer-Encoding": "chunked", **headers})
        self.end_headers()
        for i, chunk in enumerate(chunks):
            if i and gap_s:
                time.sleep(gap_s)
            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            self.wfile.flush()

    def end_chunks(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def read_body(self, limit: int) -> bytes:
        """The request's body (empty when it announces none), at most ``limit`` bytes, by its
        Content-Length or chunked. ``BodyRefused`` (the connection then closes): 413 above
        ``limit``, 400 for a Content-Length that is not one number in ASCII digits, a body shorter
        than announced, a bad chunk or both headers at once, 501 for another Transfer-Encoding."""
        lengths = {v.strip() for v in self.headers.get_all("Content-Length") or []}
        coding = ",".join(self.headers.get_all("Transfer-Encoding") or []).strip().lower()
        if coding and lengths:
            # Read one way here and the other way by a proxy in front: refuse rather than guess.
            raise BodyRefused(400, "the request has both Content-Length and Transfer-Encoding")
        if coding and coding != "chunked":
            raise BodyRefused(501, f"Transfer-Encoding {coding[:40]!r} is not read here (only chunked)")
        body = self._chunked(limit) if coding else self._sized(lengths, limit)
        self.body_unread = False
        return body

    def _sized(self, lengths: set[str], limit: int) -> bytes:
        if not lengths:
            return b""
        text = lengths.pop()
        # int() alone would take ' 1_0', '+5' and '١'; two different lengths are two requests' worth
        if lengths or not (text.isascii() and text.isdigit()) or len(text) > 18:
            raise BodyRefused(400, f"bad Content-Length {text[:40]!r}: expected one number in ASCII digits")
        length = int(text)
        if length > limit:
            raise BodyRefused(413, f"the request body is {length:,} bytes; this server reads {_size(limit)}")
        body = self.rfile.read(length)
        if len(body) < length:
            raise BodyRefused(400, f"the request body ended after {len(body):,} of {length:,} bytes")
        return body

    def _line(self, what: str) -> bytes:
        line = self.rfile.readline(MAX_LINE + 1)
        if len(line) > MAX_LINE or not line.endswith(b"\n"):
            raise BodyRefused(400, f"bad chunked body: {what} too long or cut short")
        return line.rstrip(b"\r\n")

    def _chunked(self, limit: int) -> bytes:
        out = bytearray()
        while True:
            size = self._line("a chunk-size line").split(b";", 1)[0].strip()  # (extensions ignored)
            if not size or len(size) > 16 or size.strip(b"0123456789abcdefABCDEF"):
                raise BodyRefused(400, f"bad chunked body: chunk size {size[:40]!r} is not hexadecimal")
            n = int(size, 16)
            if n == 0:
                break
            if len(out) + n > limit:
                raise BodyRefused(413, f"the chunked request body exceeds the {_size(limit)} read here")
            chunk = self.rfile.read(n)
            if len(chunk) < n or self._line("a chunk's end"):
                raise BodyRefused(400, "bad chunked body: a chunk does not end where its size says")
            out += chunk
        trailers = 0
        while line := self._line("a trailer line"):  # read and dropped
            trailers += len(line)
            if trailers > MAX_TRAILERS:
                raise BodyRefused(400, "bad chunked body: its trailer lines run on")
        return bytes(out)

    def abort(self) -> None:
        """Close the connection where it stands (a recorded reset or a stream cut short)."""
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that resets, stops reading or goes quiet is the client's doing: the connection
        # closes, and the server's output carries no traceback for it. Anything else is a bug in a
        # handler and is printed as the standard library does.
        if isinstance(sys.exc_info()[1], OSError):
            return
        super().handle_error(request, client_address)


class Serving:
    """``handler`` on ``host:port`` (port 0 picks a free one), served on a thread:
    ``with Serving(...) as s: s.url``. ``state`` becomes class attributes of the handler, which is
    how its request threads reach what they share."""

    def __init__(
        self,
        handler: type[Handler],
        host: str = "127.0.0.1",
        port: int = 0,
        poll_s: float = 0.02,
        **state: Any,
    ):
        self.host = host
        self.poll_s = poll_s
        self.server = _Server((host, port), type(handler.__name__, (handler,), state))
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.serve_forever, name=handler.__name__, daemon=True)

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def serve_forever(self) -> None:
        self.server.serve_forever(self.poll_s)

    def start(self) -> Self:
        self.thread.start()
        return self

    def stop(self) -> None:
        if self.thread.is_alive():
            self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
