"""Which requests are model calls, and turning one call's bytes into the recorded facts.

What each API's bodies mean is ``schemas.providers``'; what is the proxy's own is here: the parse of
a large request without its inline data (``skim``), and the chaining of its conversation for the
tool-call ledger (``history``).
"""

from __future__ import annotations

import brotli

from recorder.proxy import history
from recorder.proxy.skim import skim
from schemas.providers import Api, classify, classify_websocket, estimate_usage, model_in_path
from schemas.providers import parse_request as parse_request_body
from schemas.providers import parse_response as parse_response_body
from schemas.providers.result import Reassembled, RequestInfo, loads
from schemas.providers.wire import ContentTooLarge, decode_content

__all__ = ["Api", "classify", "classify_websocket", "estimate_usage", "model_in_path"]


MAX_DECODED = 256 * 1024 * 1024
"""The most a body is decoded to. A compression bomb (a request an agent sends: kilobytes on the wire,
gigabytes decoded) would otherwise be held whole by the proxy, beside every other call of the run."""


def decode(raw: bytes, encoding: str | None) -> tuple[bytes, str | None]:
    """A body without its Content-Encoding (``schemas.providers.wire``), brotli included; a body that
    decodes to more than ``MAX_DECODED`` comes back as sent, with the reason."""
    try:
        return decode_content(raw, encoding, brotli, MAX_DECODED)
    except ContentTooLarge as e:
        return raw, f"{e}: kept as sent ({encoding})"


def parse_request(api: Api, body: bytes) -> RequestInfo:
    """The request's facts; a large body is parsed without its inline binary data (``skim``)."""
    if not body:
        return RequestInfo()
    skimmed = skim(body)
    if skimmed is not None:
        doc, marker = skimmed
        parsed = loads(doc)
        if parsed is not None:
            info = parse_request_body(api, parsed)
            if not any(marker in r.output for r in info.tool_results):
                return chain_conversation(api, info, marker)
    return chain_conversation(api, parse_request_body(api, loads(body)), None)


def chain_conversation(api: Api, info: RequestInfo, marker: str | None) -> RequestInfo:
    """``info`` with its conversation chained (``recorder.proxy.history``), its items let go."""
    items, info.items = info.items, None
    if items is not None:
        info.chain = history.chain(items, api.module.VOLATILE, marker)
    return info


def parse_response(
    api: Api, raw: bytes, encoding: str | None, content_type: str
) -> tuple[Reassembled, bytes, str | None]:
    """Reassemble a response from its wire bytes; returns (result, decoded body, decode error)."""
    body, err = decode(raw, encoding)
    return parse_response_body(api, body, content_type), body, err
