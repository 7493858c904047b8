"""The one small HTTP layer of the project's servers: the viewer (``amb serve``), the replay endpoint
(``amb replay serve``) and the baseline model server (``amb baseline serve``).

The standard library's threading server, kept alive (HTTP/1.1), with Nagle off (headers and body
leave in separate writes; without TCP_NODELAY the body waits for the client's delayed ACK, ~40 ms a
response) and quiet (the recorder and the CLI are the logs). A handler answers with ``send`` (a
whole body), ``send_json`` or ``send_chunks`` (a stream, one chunk per write); ``Serving`` runs a
handler on a background thread and stops within ``poll_s``.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    always: dict[str, str] = {}
    """Headers every answer of this server carries."""

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _head(self, status: int, ctype: str, headers: dict[str, str] | None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        for k, v in {**self.always, **(headers or {})}.items():
            self.send_header(k, v)

    def send(self, status: int, body: bytes, ctype: str, headers: dict[str, str] | None = None) -> None:
        """One whole answer (its headers only, to a HEAD)."""
        self._head(status, ctype, headers)
        self.send_header("Content-Length", str(len(body)))
        if self.close_connection:
            self.send_header("Connection", "close")
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

    def read_body(self, limit: int) -> bytes | None:
        """The request's body, or None when its Content-Length is missing, bad or above ``limit``."""
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            return None
        return self.rfile.read(length) if 0 <= length <= limit else None

    def abort(self) -> None:
        """Close the connection where it stands (a recorded reset or a stream cut short)."""
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)


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
        self.server = ThreadingHTTPServer((host, port), type(handler.__name__, (handler,), state))
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
