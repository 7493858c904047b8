"""A loopback fake of the OpenAI, Anthropic and Gemini HTTP APIs that speaks their real wire formats.

It is a fake of something outside the project (the providers), so tests can drive real SDKs,
curl and node through ``amb-record`` without a network. It serves:

- ``POST …/chat/completions``, ``POST …/responses``, ``POST …/messages``: JSON, or SSE when the
  body says ``"stream": true`` (chat: ``data:`` chunks, tool-call argument deltas by index, the
  usage chunk when ``stream_options.include_usage``, ``[DONE]``; responses: ``event:``/``data:``
  frames with ``sequence_number``, ``function_call_arguments.delta``; messages: ``message_start``
  … ``input_json_delta`` … ``message_stop``, with ``ping``). A tool call is made when the request
  offers tools and does not already carry a tool result.
- ``POST …/models/MODEL:generateContent`` / ``:streamGenerateContent`` / ``:countTokens``: the
  Gemini API (JSON; SSE with ``?alt=sse``, else the JSON-array stream element by element; thought
  parts, function calls, ``usageMetadata``, ``modelVersion``); ``gemini_script`` scripts its calls.
- ``call_id`` gives every tool call of every API the same id (a gateway that reuses ``call_0``), and
  ``numbered_calls`` puts the request's number in each call's arguments (so two calls differ).
- model calls only under ``prefix`` (a gateway's ``/api/v1``), and Azure's deployment paths only
  with ``api-version``: anything else is a 404, so a test sees a path mapped wrong. ``flavour``
  gives Chat Completions a gateway's fields (OpenRouter's served model, reasoning, cache writes and
  cost) or another usage spelling (DeepSeek, Moonshot).
- any other path: ``200 text/plain`` (``GET /bytes/N`` returns N bytes), for ``network.request``.

Knobs are request headers: ``x-fake-chunks`` (text pieces, default 5), ``x-fake-delay-ms``
(pacing between stream chunks), ``x-fake-encoding`` (gzip|deflate|br|zstd, applied when the client
accepts it; streams are flushed per chunk so each chunk is decodable on arrival),
``x-fake-status`` (e.g. 500: an error body), ``x-fake-reset-after`` (send N stream chunks, then
reset the TCP connection), ``x-fake-no-usage`` (omit usage).

Every request is kept in ``FakeUpstream.requests`` (method, path, headers, body) so tests can
check what reached the provider (e.g. the real API key).
"""

from __future__ import annotations

import asyncio
import datetime
import json
import socket
import ssl
import struct
import threading
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import brotli
import zstandard

TOOL_ARGS = {"path": 'notes "draft".md', "text": "line one\nline two 🙂", "n": 3}
TEXT = 'Hello from the fake upstream: quotes " and a newline\n and é, 🙂 done.'
SERVED_MODEL = "fakevendor/fake-model-2026-01-01"
"""The model a gateway flavour says served the call (not the one asked for)."""
GEMINI_THOUGHT = "Let me think about this."
GEMINI_USAGE = {
    "promptTokenCount": 210,
    "cachedContentTokenCount": 150,
    "candidatesTokenCount": 33,
    "thoughtsTokenCount": 11,
    "totalTokenCount": 254,
    "promptTokensDetails": [{"modality": "TEXT", "tokenCount": 210}],
}


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def split(text: str, n: int) -> list[str]:
    n = max(1, min(n, len(text)))
    step = -(-len(text) // n)
    return [text[i : i + step] for i in range(0, len(text), step)]


class _Encoder:
    """Per-chunk flushable content encoder, so a streamed chunk is decodable when it arrives."""

    def __init__(self, coding: str | None):
        self.coding = coding
        self.c: Any  # one of four compressor types, each with its own method names
        if coding == "gzip":
            self.c = zlib.compressobj(6, zlib.DEFLATED, 31)
        elif coding == "deflate":
            self.c = zlib.compressobj(6, zlib.DEFLATED, 15)
        elif coding == "br":
            self.c = brotli.Compressor()
        elif coding == "zstd":
            self.c = zstandard.ZstdCompressor().compressobj()

    def chunk(self, data: bytes) -> bytes:
        if self.coding is None:
            return data
        if self.coding in ("gzip", "deflate"):
            return self.c.compress(data) + self.c.flush(zlib.Z_SYNC_FLUSH)
        if self.coding == "br":
            return self.c.process(data) + self.c.flush()
        return self.c.compress(data) + self.c.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK)

    def end(self) -> bytes:
        if self.coding is None:
            return b""
        if self.coding in ("gzip", "deflate"):
            return self.c.flush(zlib.Z_FINISH)
        if self.coding == "br":
            return self.c.finish()
        return self.c.flush()


class FakeUpstream:
    """Runs the fake on 127.0.0.1 in a background thread (its own event loop)."""

    def __init__(
        self,
        tls_dir: Path | None = None,
        host: str = "127.0.0.1",
        keep_requests: bool = True,
        *,
        prefix: str = "",
        flavour: str = "openai",
        gemini_script: list[dict[str, Any]] | None = None,
        call_id: str | None = None,
        numbered_calls: bool = False,
    ):
        self.host = host
        self.prefix = prefix
        """Model calls are served only under this path (a gateway's ``/api/v1``); others get a 404."""
        self.flavour = flavour
        """The usage spelling and gateway fields of Chat Completions: ``openai``, ``openrouter``
        (reasoning, ``cost``, a served model other than the one asked for), ``deepseek``
        (``prompt_cache_hit_tokens``), ``moonshot`` (top-level ``cached_tokens``)."""
        self.gemini_script = gemini_script
        """Gemini: the function calls to make, one per turn, while the request offers tools; then text."""
        self.call_id = call_id
        """The id of every tool call, as a gateway that reuses ids sends it (None: a new id per call,
        and none for Gemini, as Google sends them)."""
        self.numbered_calls = numbered_calls
        """Tool call arguments carry the request's number (``"call": n``), so calls differ."""
        """127.0.0.2 keeps a test server out of the agent's NO_PROXY list (which names 127.0.0.1)."""
        self.requests: list[Seen] = []
        self.keep_requests = keep_requests
        """False for long-running use (the benchmarks): thousands of 5 MB bodies kept would grow the
        fake by gigabytes, and the page faults of that growth are noise in what is measured."""
        self.ca_file: Path | None = None
        self._ssl: ssl.SSLContext | None = None
        if tls_dir is not None:
            self.ca_file, self._ssl = make_tls(tls_dir, host)
        self._counter = 0
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.base_events.Server | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="fake-upstream", daemon=True)
        self.port = 0

    def _tool_id(self, fresh: str) -> str:
        return fresh if self.call_id is None else self.call_id

    def _tool_args(self, n: int) -> dict[str, Any]:
        return {**TOOL_ARGS, "call": n} if self.numbered_calls else TOOL_ARGS

    def _saw(self, seen: Seen) -> None:
        if self.keep_requests:
            self.requests.append(seen)

    @property
    def url(self) -> str:
        return f"{'https' if self._ssl else 'http'}://{self.host}:{self.port}"

    def start(self) -> FakeUpstream:
        self._thread.start()
        fut = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._serve, self.host, 0, ssl=self._ssl), self._loop
        )
        self._server = fut.result(10)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def stop(self) -> None:
        async def _close() -> None:
            assert self._server is not None
            self._server.close()
            me = asyncio.current_task()
            tasks = [t for t in asyncio.all_tasks() if t is not me]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(_close(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def __enter__(self) -> FakeUpstream:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- HTTP/1.1 --------------------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                if b"upgrade: websocket" in head.lower():
                    await self._websocket(reader, writer, head)
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers: dict[str, str] = {}
                for line in lines[1:]:
                    if ":" in line:
                        k, v = line.split(":", 1)
                        headers[k.strip().lower()] = v.strip()
                body = b""
                if "content-length" in headers:
                    body = await reader.readexactly(int(headers["content-length"]))
                elif headers.get("transfer-encoding", "").lower() == "chunked":
                    body = await _read_chunked(reader)
                self._saw(Seen(method, path, headers, body))
                keep = await self._respond(writer, method, path, headers, body)
                if not keep or headers.get("connection", "").lower() == "close":
                    break
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            try:
                writer.close()
            except Exception:
                pass

    async def _respond(
        self, w: asyncio.StreamWriter, method: str, path: str, h: dict[str, str], body: bytes
    ) -> bool:
        status = int(h.get("x-fake-status", "200"))
        p = path.split("?", 1)[0]
        if status >= 400:
            err: dict[str, Any] = {
                "error": {"message": f"fake upstream failure {status}", "type": "server_error", "code": None}
            }
            if p.endswith("/messages"):
                err = {
                    "type": "error",
                    "error": {"type": "api_error", "message": f"fake upstream failure {status}"},
                }
            self._send_plain(w, status, json.dumps(err).encode(), "application/json", h)
            await w.drain()
            return True
        if method == "POST" and ":" in p.rsplit("/", 1)[-1]:
            if not p.startswith(self.prefix + "/"):
                return await self._not_found(w, p, h)
            self._counter += 1
            return await self._gemini(w, path, json.loads(body or b"{}"), h, self._counter)
        if method == "POST" and (
            p.endswith("/chat/completions") or p.endswith("/responses") or p.endswith("/messages")
        ):
            azure = "/openai/deployments/" in p
            if not p.startswith(self.prefix + "/") or (azure and "api-version=" not in path):
                return await self._not_found(w, p, h)
            try:
                req = json.loads(body or b"{}")
            except (ValueError, RecursionError):  # as a real API does: 400, the body is not JSON
                err = {"error": {"type": "invalid_request_error", "message": "the body is not valid JSON"}}
                self._send_plain(w, 400, json.dumps(err).encode(), "application/json", h)
                await w.drain()
                return True
            self._counter += 1
            api = (
                "chat"
                if p.endswith("/chat/completions")
                else "responses"
                if p.endswith("/responses")
                else "messages"
            )
            return await _API[api](self, w, req, h, self._counter)
        if p.startswith("/bytes/"):
            payload = b"x" * int(p.rsplit("/", 1)[1])
        else:
            payload = f"ok {method} {p} {len(body)}\n".encode()
        self._send_plain(w, 200, payload, "text/plain", h)
        await w.drain()
        return True

    async def _not_found(self, w: asyncio.StreamWriter, p: str, h: dict[str, str]) -> bool:
        err = {"error": {"message": f"no such route: {p}", "type": "invalid_request_error", "code": 404}}
        self._send_plain(w, 404, json.dumps(err).encode(), "application/json", h)
        await w.drain()
        return True

    def _coding(self, h: dict[str, str]) -> str | None:
        want = h.get("x-fake-encoding")
        accepted = [c.split(";")[0].strip() for c in h.get("accept-encoding", "").split(",")]
        return want if want and want in accepted else None

    def _send_plain(
        self, w: asyncio.StreamWriter, status: int, payload: bytes, ctype: str, h: dict[str, str]
    ) -> None:
        coding = self._coding(h) if status < 400 else None
        enc = _Encoder(coding)
        data = enc.chunk(payload) + enc.end() if coding else payload
        extra = f"content-encoding: {coding}\r\n" if coding else ""
        w.write(
            f"HTTP/1.1 {status} {'OK' if status < 400 else 'Error'}\r\ncontent-type: {ctype}\r\n"
            f"content-length: {len(data)}\r\n{extra}x-request-id: req_fake\r\n\r\n".encode()
            + data
        )

    async def _send_stream(
        self,
        w: asyncio.StreamWriter,
        events: list[bytes],
        h: dict[str, str],
        ctype: str = "text/event-stream; charset=utf-8",
    ) -> bool:
        coding = self._coding(h)
        enc = _Encoder(coding)
        delay = float(h.get("x-fake-delay-ms", "0")) / 1000
        reset_after = int(h.get("x-fake-reset-after", "-1"))
        extra = f"content-encoding: {coding}\r\n" if coding else ""
        w.write(
            f"HTTP/1.1 200 OK\r\ncontent-type: {ctype}\r\n"
            f"transfer-encoding: chunked\r\ncache-control: no-cache\r\n{extra}\r\n".encode()
        )
        await w.drain()
        for i, ev in enumerate(events):
            if i == reset_after:
                sock = w.get_extra_info("socket")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                w.transport.abort()
                return False
            data = enc.chunk(ev)
            w.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            await w.drain()
            if delay:
                await asyncio.sleep(delay)
        tail = enc.end()
        if tail:
            w.write(f"{len(tail):x}\r\n".encode() + tail + b"\r\n")
        w.write(b"0\r\n\r\n")
        await w.drain()
        return True

    async def _websocket(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, head: bytes
    ) -> None:
        """The Responses API over a WebSocket: each ``response.create`` text message from the client
        is answered with the stream's events, one JSON text message each (as the Codex CLI uses it)."""
        from wsproto import ConnectionType, WSConnection
        from wsproto.events import AcceptConnection, CloseConnection, Request, TextMessage

        conn = WSConnection(ConnectionType.SERVER)
        conn.receive_data(head)
        headers: dict[str, str] = {}
        text = ""
        while True:
            for event in conn.events():
                if isinstance(event, Request):
                    headers = {k.decode().lower(): v.decode() for k, v in event.extra_headers}
                    self._saw(Seen("GET", event.target, headers, b""))
                    writer.write(conn.send(AcceptConnection()))
                elif isinstance(event, TextMessage):
                    text += event.data
                    if not event.message_finished:
                        continue
                    req, text = json.loads(text), ""
                    self._saw(Seen("WS", "/v1/responses", headers, json.dumps(req).encode()))
                    if req.get("type") == "response.create":
                        self._counter += 1
                        body = req.get("response") if isinstance(req.get("response"), dict) else req
                        parts = self._responses_parts(body, headers, self._counter)
                        delay = float(headers.get("x-fake-delay-ms", "0")) / 1000
                        for e in self._responses_events(body, headers, self._counter, *parts):
                            writer.write(conn.send(TextMessage(data=json.dumps(e))))
                            await writer.drain()
                            if delay:
                                await asyncio.sleep(delay)
                elif isinstance(event, CloseConnection):
                    writer.write(conn.send(event.response()))
                    await writer.drain()
                    return
            await writer.drain()
            data = await reader.read(65536)
            if not data:
                return
            conn.receive_data(data)

    # -- the three APIs --------------------------------------------------------------------------

    async def _chat(self, w: asyncio.StreamWriter, req: dict[str, Any], h: dict[str, str], n: int) -> bool:
        model = req.get("model", "fake-model")
        tools = bool(req.get("tools")) and not any(m.get("role") == "tool" for m in req.get("messages", []))
        pieces = split(TEXT, int(h.get("x-fake-chunks", "5")))
        args = json.dumps(self._tool_args(n), ensure_ascii=False)
        call_id = self._tool_id(f"call_fake_{n}")
        usage = {
            "prompt_tokens": 120,
            "completion_tokens": 30,
            "total_tokens": 150,
            "prompt_tokens_details": {"cached_tokens": 100},
            "completion_tokens_details": {"reasoning_tokens": 7},
        }
        base: dict[str, Any] = {
            "id": f"chatcmpl-{n}",
            "created": 1700000000,
            "model": model,
            "system_fingerprint": "fp_fake",
        }
        reasoning = None
        if self.flavour == "openrouter":
            # OpenRouter: the provider it routed to, the model that served, reasoning text and tokens,
            # cached tokens in OpenAI's spelling plus cache writes, and the call's cost in USD.
            base |= {"model": SERVED_MODEL, "provider": "FakeProvider"}
            reasoning = "Thinking it over."
            usage = {
                "prompt_tokens": 120,
                "completion_tokens": 30,
                "total_tokens": 150,
                "cost": 0.00123,
                "is_byok": False,
                "prompt_tokens_details": {"cached_tokens": 100, "cache_write_tokens": 5},
                "cost_details": {"upstream_inference_cost": None},
                "completion_tokens_details": {"reasoning_tokens": 7},
            }
        elif self.flavour == "deepseek":
            usage = {
                "prompt_tokens": 120,
                "completion_tokens": 30,
                "total_tokens": 150,
                "prompt_cache_hit_tokens": 100,
                "prompt_cache_miss_tokens": 20,
                "completion_tokens_details": {"reasoning_tokens": 7},
            }
        elif self.flavour == "moonshot":
            usage = {"prompt_tokens": 120, "completion_tokens": 30, "total_tokens": 150, "cached_tokens": 100}
        if not req.get("stream"):
            msg: dict[str, Any] = {"role": "assistant", "content": TEXT, "refusal": None}
            if reasoning:
                msg["reasoning"] = reasoning
            if tools:
                msg["tool_calls"] = [
                    {"id": call_id, "type": "function", "function": {"name": "read_file", "arguments": args}}
                ]
            body = {
                **base,
                "object": "chat.completion",
                "choices": [
                    {
                        "index": 0,
                        "message": msg,
                        "finish_reason": "tool_calls" if tools else "stop",
                        "logprobs": None,
                    }
                ],
            }
            if "x-fake-no-usage" not in h:
                body["usage"] = usage
            self._send_plain(w, 200, json.dumps(body).encode(), "application/json", h)
            await w.drain()
            return True
        base = {**base, "object": "chat.completion.chunk"}

        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            c = {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]}
            return b"data: " + json.dumps(c).encode() + b"\n\n"

        events = [chunk({"role": "assistant", "content": ""})]
        if reasoning:
            events.append(chunk({"reasoning": reasoning}))
        events += [chunk({"content": p}) for p in pieces]
        if tools:
            events.append(
                chunk(
                    {
                        "tool_calls": [
                            {
                                "index": 0,
                                "id": call_id,
                                "type": "function",
                                "function": {"name": "read_file", "arguments": ""},
                            }
                        ]
                    }
                )
            )
            events += [
                chunk({"tool_calls": [{"index": 0, "function": {"arguments": a}}]}) for a in split(args, 4)
            ]
        events.append(chunk({}, "tool_calls" if tools else "stop"))
        if (req.get("stream_options") or {}).get("include_usage") and "x-fake-no-usage" not in h:
            events.append(b"data: " + json.dumps({**base, "choices": [], "usage": usage}).encode() + b"\n\n")
        events.append(b"data: [DONE]\n\n")
        return await self._send_stream(w, events, h)

    async def _responses(
        self, w: asyncio.StreamWriter, req: dict[str, Any], h: dict[str, str], n: int
    ) -> bool:
        resp, msg_item, fc_item, tools, pieces, args = self._responses_parts(req, h, n)
        if not req.get("stream"):
            self._send_plain(w, 200, json.dumps(resp).encode(), "application/json", h)
            await w.drain()
            return True

        def sse(event: dict[str, Any]) -> bytes:
            return f"event: {event['type']}\ndata: ".encode() + json.dumps(event).encode() + b"\n\n"

        events = [
            sse(e) for e in self._responses_events(req, h, n, resp, msg_item, fc_item, tools, pieces, args)
        ]
        return await self._send_stream(w, events, h)

    def _responses_parts(self, req: dict[str, Any], h: dict[str, str], n: int) -> tuple:
        model = req.get("model", "fake-model")
        raw_input = req.get("input")
        items = raw_input if isinstance(raw_input, list) else []
        tools = bool(req.get("tools")) and not any(i.get("type") == "function_call_output" for i in items)
        pieces = split(TEXT, int(h.get("x-fake-chunks", "5")))
        args = json.dumps(self._tool_args(n), ensure_ascii=False)
        call_id = self._tool_id(f"call_fake_{n}")
        msg_item = {
            "type": "message",
            "id": f"msg_{n}",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": TEXT, "annotations": []}],
        }
        fc_item = {
            "type": "function_call",
            "id": f"fc_{n}",
            "call_id": call_id,
            "name": "read_file",
            "arguments": args,
            "status": "completed",
        }
        usage = {
            "input_tokens": 200,
            "input_tokens_details": {"cached_tokens": 50},
            "output_tokens": 40,
            "output_tokens_details": {"reasoning_tokens": 12},
            "total_tokens": 240,
        }
        resp: dict[str, Any] = {
            "id": f"resp_{n}",
            "object": "response",
            "created_at": 1700000000,
            "status": "completed",
            "model": model,
            "output": [msg_item] + ([fc_item] if tools else []),
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": req.get("tools") or [],
            "text": {"format": {"type": "text"}},
            "incomplete_details": None,
            "error": None,
            "instructions": req.get("instructions"),
            "metadata": {},
            "temperature": 1.0,
            "top_p": 1.0,
            "usage": None if "x-fake-no-usage" in h else usage,
        }
        return resp, msg_item, fc_item, tools, pieces, args

    def _responses_events(
        self, req, h, n, resp, msg_item, fc_item, tools, pieces, args
    ) -> list[dict[str, Any]]:
        seq = iter(range(10_000))

        def ev(kind: str, **data: Any) -> dict[str, Any]:
            return {"type": kind, "sequence_number": next(seq), **data}

        start = {**resp, "status": "in_progress", "output": [], "usage": None}
        events = [ev("response.created", response=start), ev("response.in_progress", response=start)]
        events.append(
            ev(
                "response.output_item.added",
                output_index=0,
                item={**msg_item, "status": "in_progress", "content": []},
            )
        )
        events.append(
            ev(
                "response.content_part.added",
                item_id=msg_item["id"],
                output_index=0,
                content_index=0,
                part={"type": "output_text", "text": "", "annotations": []},
            )
        )
        events += [
            ev(
                "response.output_text.delta",
                item_id=msg_item["id"],
                output_index=0,
                content_index=0,
                delta=p,
                logprobs=[],
            )
            for p in pieces
        ]
        events.append(
            ev(
                "response.output_text.done",
                item_id=msg_item["id"],
                output_index=0,
                content_index=0,
                text=TEXT,
                logprobs=[],
            )
        )
        events.append(
            ev(
                "response.content_part.done",
                item_id=msg_item["id"],
                output_index=0,
                content_index=0,
                part=msg_item["content"][0],
            )
        )
        events.append(ev("response.output_item.done", output_index=0, item=msg_item))
        if tools:
            events.append(
                ev(
                    "response.output_item.added",
                    output_index=1,
                    item={**fc_item, "arguments": "", "status": "in_progress"},
                )
            )
            events += [
                ev("response.function_call_arguments.delta", item_id=fc_item["id"], output_index=1, delta=a)
                for a in split(args, 4)
            ]
            events.append(
                ev(
                    "response.function_call_arguments.done",
                    item_id=fc_item["id"],
                    output_index=1,
                    arguments=args,
                )
            )
            events.append(ev("response.output_item.done", output_index=1, item=fc_item))
        events.append(ev("response.completed", response=resp))
        return events

    async def _messages(
        self, w: asyncio.StreamWriter, req: dict[str, Any], h: dict[str, str], n: int
    ) -> bool:
        model = req.get("model", "fake-model")
        has_result = any(
            isinstance(m.get("content"), list) and any(b.get("type") == "tool_result" for b in m["content"])
            for m in req.get("messages", [])
        )
        tools = bool(req.get("tools")) and not has_result
        pieces = split(TEXT, int(h.get("x-fake-chunks", "5")))
        args = json.dumps(self._tool_args(n), ensure_ascii=False)
        tool_id = self._tool_id(f"toolu_fake_{n}")
        usage = {
            "input_tokens": 30,
            "output_tokens": 25,
            "cache_read_input_tokens": 400,
            "cache_creation_input_tokens": 70,
        }
        stop = "tool_use" if tools else "end_turn"
        if not req.get("stream"):
            content: list[dict[str, Any]] = [{"type": "text", "text": TEXT}]
            if tools:
                content.append(
                    {"type": "tool_use", "id": tool_id, "name": "read_file", "input": self._tool_args(n)}
                )
            body = {
                "id": f"msg_{n}",
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": content,
                "stop_reason": stop,
                "stop_sequence": None,
                "usage": usage,
            }
            self._send_plain(w, 200, json.dumps(body, ensure_ascii=False).encode(), "application/json", h)
            await w.drain()
            return True

        def ev(kind: str, **data: Any) -> bytes:
            return f"event: {kind}\ndata: ".encode() + json.dumps({"type": kind, **data}).encode() + b"\n\n"

        start_usage = {**usage, "output_tokens": 1}
        events = [
            ev(
                "message_start",
                message={
                    "id": f"msg_{n}",
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": start_usage,
                },
            )
        ]
        events.append(ev("content_block_start", index=0, content_block={"type": "text", "text": ""}))
        events.append(ev("ping"))
        events += [
            ev("content_block_delta", index=0, delta={"type": "text_delta", "text": p}) for p in pieces
        ]
        events.append(ev("content_block_stop", index=0))
        if tools:
            events.append(
                ev(
                    "content_block_start",
                    index=1,
                    content_block={"type": "tool_use", "id": tool_id, "name": "read_file", "input": {}},
                )
            )
            events += [
                ev("content_block_delta", index=1, delta={"type": "input_json_delta", "partial_json": a})
                for a in split(args, 4)
            ]
            events.append(ev("content_block_stop", index=1))
        events.append(
            ev(
                "message_delta",
                delta={"stop_reason": stop, "stop_sequence": None},
                usage={"output_tokens": usage["output_tokens"]},
            )
        )
        events.append(ev("message_stop"))
        return await self._send_stream(w, events, h)

    async def _gemini(
        self, w: asyncio.StreamWriter, path: str, req: dict[str, Any], h: dict[str, str], n: int
    ) -> bool:
        """The Gemini API: ``models/M:generateContent`` (JSON), ``:streamGenerateContent`` (SSE with
        ``?alt=sse``, else a JSON array sent element by element), ``:countTokens``. Thought parts, function
        calls (while ``tools`` are offered: ``gemini_script`` in turn, else one ``read_file`` call until
        the conversation holds a function response), ``usageMetadata`` and ``modelVersion`` as Google
        sends them."""
        p, _, query = path.partition("?")
        model, _, method = p.rsplit("/", 1)[-1].partition(":")
        if method == "countTokens":
            body = {"totalTokens": 42, "promptTokensDetails": [{"modality": "TEXT", "tokenCount": 42}]}
            self._send_plain(w, 200, json.dumps(body).encode(), "application/json", h)
            await w.drain()
            return True
        if method not in ("generateContent", "streamGenerateContent"):
            return await self._not_found(w, p, h)
        contents = req.get("contents") or []
        answered = sum(
            1
            for c in contents
            for part in c.get("parts") or []
            if isinstance(part, dict) and ("functionResponse" in part or "function_response" in part)
        )
        call: dict[str, Any] | None = None
        if req.get("tools"):
            if self.gemini_script is not None:
                turn = sum(
                    1 for c in contents if any("functionCall" in part for part in c.get("parts") or [])
                )
                call = self.gemini_script[turn] if turn < len(self.gemini_script) else None
            elif not answered:
                call = {"name": "read_file", "args": self._tool_args(n)}
            if call is not None and self.call_id is not None:
                call = {**call, "id": self.call_id}
        schema = (req.get("generationConfig") or {}).get("responseMimeType") == "application/json"
        text = _gemini_json_answer(req) if schema else TEXT
        pieces = split(text, int(h.get("x-fake-chunks", "5"))) if not schema else [text]
        base = {"modelVersion": f"{model}-001", "responseId": f"fake-gemini-{n}"}
        usage = {} if "x-fake-no-usage" in h else {"usageMetadata": GEMINI_USAGE}

        def content(parts: list[dict[str, Any]]) -> dict[str, Any]:
            return {"content": {"parts": parts, "role": "model"}, "index": 0}

        final_parts: list[dict[str, Any]] = [] if call is None else [{"functionCall": call}]
        usage_part: dict[str, Any] = usage
        if method == "generateContent":
            parts: list[dict[str, Any]] = [
                {"text": GEMINI_THOUGHT, "thought": True},
                {"text": text},
                *final_parts,
            ]
            finished = {**content(parts), "finishReason": "STOP"}
            body = {"candidates": [finished], **usage_part, **base}
            self._send_plain(w, 200, json.dumps(body, ensure_ascii=False).encode(), "application/json", h)
            await w.drain()
            return True
        chunks = [{"candidates": [content([{"text": GEMINI_THOUGHT, "thought": True}])], **base}]
        chunks += [{"candidates": [content([{"text": piece}])], **base} for piece in pieces]
        last = {**content(final_parts), "finishReason": "STOP"}
        chunks.append({"candidates": [last], **usage_part, **base})
        if "alt=sse" in query:
            events = [b"data: " + json.dumps(c, ensure_ascii=False).encode() + b"\r\n\r\n" for c in chunks]
            return await self._send_stream(w, events, h)
        # No alt=sse: one JSON array, its elements flushed as they are made.
        events = [
            ("[" if i == 0 else ",\r\n").encode() + json.dumps(c).encode() for i, c in enumerate(chunks)
        ]
        events.append(b"]")
        return await self._send_stream(w, events, h, "application/json; charset=UTF-8")


def _gemini_json_answer(req: dict[str, Any]) -> str:
    """A reply for a request that asks for JSON (the Gemini CLI's routing and next-speaker checks):
    an object with every required property of its schema, strings naming the first enum value."""
    config = req.get("generationConfig") or {}
    schema = config.get("responseJsonSchema") or config.get("responseSchema") or {}
    out: dict[str, Any] = {}
    for name, prop in (schema.get("properties") or {}).items():
        if not isinstance(prop, dict):
            continue
        if prop.get("enum"):
            out[name] = prop["enum"][0]
        elif str(prop.get("type", "")).lower() in ("boolean",):
            out[name] = False
        elif str(prop.get("type", "")).lower() in ("number", "integer"):
            out[name] = prop.get("minimum", 1)
        else:
            out[name] = "fake"
    if "next_speaker" in out:
        out["next_speaker"] = "user"  # the turn is over: do not make the CLI go on by itself
    return json.dumps(out)


_API = {"chat": FakeUpstream._chat, "responses": FakeUpstream._responses, "messages": FakeUpstream._messages}


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    out = bytearray()
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
        if size == 0:
            await reader.readuntil(b"\r\n")
            return bytes(out)
        out += await reader.readexactly(size)
        await reader.readexactly(2)


def make_tls(directory: Path, host: str = "127.0.0.1") -> tuple[Path, ssl.SSLContext]:
    """A self-signed certificate for ``localhost`` and ``host``; returns (cert file, server context)."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    directory.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address(host))]
            ),
            False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = directory / "upstream-cert.pem", directory / "upstream-key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert_file, key_file)
    return cert_file, ctx


if __name__ == "__main__":  # manual poking: python tests/fakes/upstream.py
    import time

    with FakeUpstream(keep_requests=False) as fake:
        print(fake.url, flush=True)
        while True:
            time.sleep(3600)
