"""A model call (``/api/runs/RUN/calls/SOURCE/SEQ``): its messages as the provider layer reads
them from the request, its reply, the raw bodies (capped), and the request's inline images."""

from __future__ import annotations

import base64
import binascii
from typing import Any

import duckdb
import msgspec
from msgspec import UNSET, UnsetType

from replay.store import first
from replay.web.resource import IMAGE_CAP, RAW_CAP, TEXT_CAP, BadRequest, NotFound, one_line
from schemas import providers
from schemas.blobstore import BlobStore
from schemas.errors import BlobError, SchemaError
from schemas.providers import render
from schemas.untrusted_json import loads_untrusted

MESSAGES_CAP = 300


def request_messages(api: str, body: Any) -> tuple[list[dict[str, Any]], list[str]]:
    """The conversation a request carried, one entry per message, texts capped; and its inline images."""
    return render.for_person(providers.conversation(api, body), TEXT_CAP, one_line)


CALL_FACTS = "call_id provider api model stream status ok error stop_reason usage ttfb_ms latency_ms".split()
"""The payload's fields a call's detail repeats as they are."""


class RawBody(msgspec.Struct):
    """A request or response body: its first bytes as text, or why it cannot be read."""

    blob: str
    size: int | None
    media_type: str | None | UnsetType = UNSET
    text: str | UnsetType = UNSET
    """The first 64 KiB, decoded as UTF-8 (undecodable bytes replaced)."""
    truncated: bool | UnsetType = UNSET
    error: str | UnsetType = UNSET


class ToolCallShown(msgspec.Struct):
    id: str | None
    name: str | None
    arguments: str


class Reply(msgspec.Struct):
    text: str
    reasoning: str
    tool_calls: list[ToolCallShown]


class CallDetail(msgspec.Struct):
    """``GET /api/runs/RUN/calls/SOURCE/SEQ``: a model call's messages (as the provider layer reads
    them from the request), its reply, and its raw bodies (capped)."""

    key: str
    call_id: str | None
    provider: str | None
    api: str | None
    model: str | None
    stream: bool | None
    status: int | None
    ok: bool | None
    error: str | None
    stop_reason: str | None
    usage: dict[str, Any] | None
    ttfb_ms: float | None
    latency_ms: float | None
    messages: list[dict[str, Any]]
    """Role, text (capped), its other parts (tool calls and results, images by index)."""
    messages_elided: int
    images: int
    """Inline images of the request (``…/images/N``)."""
    reply: Reply
    request_raw: RawBody | None
    response_raw: RawBody | None
    parse_error: str | None


def _raw(blobs: BlobStore, ref: dict[str, Any] | None) -> tuple[bytes | None, RawBody | None]:
    if not ref:
        return None, None
    try:
        data = blobs.get(ref["blob"])
    except BlobError as e:
        return None, RawBody(ref["blob"], ref.get("size"), error=str(e))
    text = data[:RAW_CAP].decode("utf-8", "replace")
    return data, RawBody(ref["blob"], len(data), ref.get("media_type"), text, len(data) > RAW_CAP)


def _call_payload(con: duckdb.DuckDBPyConnection, run_id: str, source: str, seq: int) -> dict[str, Any]:
    row = first(
        con.execute(
            "SELECT kind, CAST(payload AS VARCHAR) FROM events WHERE run_id = ? AND source = ? AND seq = ?",
            [run_id, source, seq],
        )
    )
    if row is None:
        raise NotFound(f"no event {source}:{seq} in run {run_id!r}")
    if row[0] != "model_call.completed":
        raise BadRequest(f"event {source}:{seq} is a {row[0]}, not a model call")
    try:
        payload = loads_untrusted(row[1])
    except ValueError as e:
        raise SchemaError(f"event {source}:{seq}: malformed model_call.completed payload: {e}") from e
    if not isinstance(payload, dict):
        raise SchemaError(f"event {source}:{seq}: malformed model_call.completed payload: not an object")
    return payload


def model_call(
    con: duckdb.DuckDBPyConnection, blobs: BlobStore, run_id: str, source: str, seq: int
) -> CallDetail:
    p = _call_payload(con, run_id, source, seq)
    req, request_raw = _raw(blobs, p.get("request"))
    _, response_raw = _raw(blobs, p.get("response"))
    messages: list[dict[str, Any]] = []
    images: list[str] = []
    parse_error = None
    if req is not None:
        try:
            messages, images = request_messages(p.get("api", ""), loads_untrusted(req))
        except ValueError as e:
            parse_error = f"the request body is not JSON: {e}"
    elided = 0
    if len(messages) > MESSAGES_CAP:
        elided = len(messages) - MESSAGES_CAP
        messages = (
            messages[:20] + [{"role": "elided", "text": f"{elided} messages not shown"}] + messages[-280:]
        )
    msg = p.get("message") or {}
    tool_calls = [
        ToolCallShown(t.get("id"), t.get("name"), one_line(t.get("arguments"), TEXT_CAP))
        for t in msg.get("tool_calls") or []
    ]
    reply = Reply((msg.get("text") or "")[:TEXT_CAP], (msg.get("reasoning") or "")[:TEXT_CAP], tool_calls)
    return CallDetail(
        f"{source}:{seq}",
        **{k: p.get(k) for k in CALL_FACTS},
        messages=messages,
        messages_elided=elided,
        images=len(images),
        reply=reply,
        request_raw=request_raw,
        response_raw=response_raw,
        parse_error=parse_error,
    )


_IMAGE_MAGIC = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
)


def sniff_image(data: bytes) -> str | None:
    """The media type of a PNG, JPEG, GIF or WebP by its magic bytes (never by what a message says)."""
    for magic, media in _IMAGE_MAGIC:
        if data.startswith(magic):
            return media
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return None


def call_image(
    con: duckdb.DuckDBPyConnection, blobs: BlobStore, run_id: str, source: str, seq: int, n: int
) -> tuple[bytes, str]:
    """The ``n``-th inline image of a model call's request, decoded, if it is a real image and small."""
    p = _call_payload(con, run_id, source, seq)
    req, _ = _raw(blobs, p.get("request"))
    if req is None:
        raise NotFound("the call has no request body")
    try:
        _, images = request_messages(p.get("api", ""), loads_untrusted(req))
    except ValueError as e:  # not JSON (or nested past reading): it has no images to show
        raise NotFound(f"the request body is not JSON: {e}") from None
    if not 0 <= n < len(images):
        raise NotFound(f"the request has no image {n}")
    _, _, b64 = images[n].partition(",")
    if len(b64) > IMAGE_CAP * 4 // 3 + 4:
        raise BadRequest(f"image {n} is larger than {IMAGE_CAP} bytes; download the raw request instead")
    try:
        data = base64.b64decode(b64, validate=False)
    except (ValueError, binascii.Error) as e:
        raise BadRequest(f"image {n} is not valid base64: {e}") from None
    media = sniff_image(data)
    if media is None:
        raise BadRequest(f"image {n} is not a PNG, JPEG, GIF or WebP")
    return data, media
