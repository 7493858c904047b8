"""A loopback OpenAI-compatible ``/v1/chat/completions`` server standing in for an LLM judge.

Real HTTP on 127.0.0.1 (a thread), answered by a ``policy(request_json) -> Reply`` the test supplies,
so tests drive the real ``openai`` client through valid verdicts, malformed JSON, out-of-range
values, refusals, HTTP errors and timeouts. Every request is kept in ``requests`` (the count is what
the cache tests assert on).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, NamedTuple


class Reply(NamedTuple):
    content: str | None = None
    refusal: str | None = None
    finish_reason: str = "stop"
    status: int = 200
    delay_s: float = 0.0
    raw_body: str | None = None
    """Sent as the body verbatim instead of a chat completion (for broken bodies)."""


def verdict(item: str, value: Any, evidence: list[str] | None = None, reason: str = "fake verdict") -> Reply:
    return Reply(
        content=json.dumps({"item": item, "value": value, "evidence": evidence or [], "reason": reason})
    )


def asked_item(request: dict[str, Any]) -> str:
    """The rubric item id a judge request asks about, or ``codes`` for the per-run error-code call."""
    text = user_text(request)
    if text.startswith("Error codes for this run"):
        return "codes"
    return text.split("Rubric item ", 1)[1].split(" ", 1)[0]


def default_policy(request: dict[str, Any]) -> Reply:
    """Every item gets its top offered value; the codes call gets no codes."""
    item = asked_item(request)
    if item == "codes":
        return Reply(content='{"codes": []}')
    offered = user_text(request).split("Offered values: [", 1)[1].split("]", 1)[0]
    return verdict(item, json.loads("[" + offered + "]")[-1])


def user_text(request: dict[str, Any]) -> str:
    content = request["messages"][-1]["content"]
    return content if isinstance(content, str) else content[0]["text"]


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128
    """A judge asked by many threads at once on a loaded machine: the default backlog (5) can
    overflow, and a connection that breaks is one the SDK sends again (a request counted twice)."""


class JudgeServer:
    def __init__(self, policy: Callable[[dict[str, Any]], Reply], *, keep_requests: bool = True):
        self.policy = policy
        self.keep_requests = keep_requests
        """False: count requests only (benchmarks would otherwise hold every prompt in memory)."""
        self.count = 0
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", "0"))
                body = json.loads(self.rfile.read(length) or b"{}")
                with server._lock:
                    server.count += 1
                    if server.keep_requests:
                        server.requests.append(body)
                try:
                    reply = server.policy(body)
                except Exception as e:  # a broken policy is a 500, not a dropped connection
                    reply = Reply(
                        status=500, raw_body=json.dumps({"error": {"message": f"policy failed: {e!r}"}})
                    )
                if reply.delay_s:
                    time.sleep(reply.delay_s)
                if reply.raw_body is not None:
                    payload = reply.raw_body.encode()  # sent with reply.status
                elif reply.status != 200:
                    payload = json.dumps(
                        {"error": {"message": "fake upstream error", "type": "server_error"}}
                    ).encode()
                else:
                    payload = json.dumps(
                        {
                            "id": f"chatcmpl-{server.count}",
                            "object": "chat.completion",
                            "created": 1780000000,
                            "model": body.get("model", "fake-judge"),
                            "choices": [
                                {
                                    "index": 0,
                                    "finish_reason": reply.finish_reason,
                                    "message": {
                                        "role": "assistant",
                                        "content": reply.content,
                                        "refusal": reply.refusal,
                                    },
                                }
                            ],
                            "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120},
                        }
                    ).encode()
                try:
                    self.send_response(reply.status)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout tests)

        self.httpd = _Server(("127.0.0.1", 0), Handler)
        # A short poll: stopping the server then takes milliseconds, not the default 0.5 s.
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.02,), daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self) -> JudgeServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
