"""Skimming a large request before its parse: the cut is exactly the payload of a binary string,
and what the parse yields is what the whole body yields (the reference: msgspec on the body)."""

from __future__ import annotations

import base64
import json
import random
from typing import Any

import msgspec
import pytest

from recorder.proxy import calls
from recorder.proxy.skim import MIN_SPAN, STRIDE, skim
from schemas.providers import CHAT, GENERATE, MESSAGES, RESPONSES, Api, parse_request


def b64(n: int, seed: int = 0) -> str:
    return base64.b64encode(random.Random(seed).randbytes(n * 3 // 4 + 3)).decode()[:n]


def full_parse(api: Api, body: bytes):
    """The reference: the whole body decoded, no skimming (its conversation chained as a whole)."""
    try:
        doc = msgspec.json.decode(body)
    except msgspec.DecodeError:
        doc = None
    return calls.chain_conversation(api, parse_request(api, doc), None)


def test_the_cut_is_the_payload_and_nothing_else():
    payload = "data:image/png;base64," + b64(200_000)
    head = (
        '{"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "look"}, '
        '{"type": "image_url", "image_url": {"url": "'
    )
    tail = '", "detail": "high"}}]}]}'
    body = (head + payload + tail).encode()
    skimmed = skim(body)
    assert skimmed is not None
    doc, marker = skimmed
    assert doc == (head + marker + tail).encode()
    info = calls.parse_request(CHAT, body)
    assert (info.model, info.chars, info.tool_results) == ("m", 4, [])


def test_two_payloads_pretty_printed_and_one_at_a_stride_boundary():
    parts = [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(n, n)}}
        for n in (MIN_SPAN + 1, 3 * STRIDE + 7)
    ]
    body = json.dumps(
        {
            "model": "claude",
            "messages": [{"role": "user", "content": [{"type": "text", "text": "two images"}, *parts]}],
        },
        indent=2,
    ).encode()
    skimmed = skim(body)
    assert skimmed is not None
    doc, marker = skimmed
    assert doc.count(marker.encode()) == 2 and len(doc) < 1000
    assert calls.parse_request(MESSAGES, body) == full_parse(MESSAGES, body)


@pytest.mark.parametrize(
    "body",
    [
        # a long text is read by the parsers: never cut
        {"model": "m", "messages": [{"role": "user", "content": "x" * 200_000}]},
        {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": b64(200_000)}]}]},
        # a carrier key inside a string (its quotes escaped) is text, not a key
        {"model": "m", "messages": [{"role": "user", "content": '{"url": "' + b64(200_000) + '"}'}]},
        # a payload with an escape in it (some encoders write "\/"), and one just too short
        {
            "model": "m",
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "image_url", "image_url": {"url": "data:," + "ab\\/" * 60_000}},
                        {"type": "image_url", "image_url": {"url": b64(MIN_SPAN - 1)}},
                    ],
                }
            ],
        },
        # a key that only ends like a carrier (x"url)
        {"model": "m", "messages": [{"role": "user", "content": "x"}], 'x"url': b64(200_000)},
        # a long run with no quotes that is not a string
        {"model": "m", "messages": [{"role": "user", "content": "x"}], "n": list(range(40_000))},
    ],
)
def test_what_is_not_a_binary_payload_is_left_alone(body):
    raw = json.dumps(body).encode()
    assert skim(raw) is None
    assert calls.parse_request(CHAT, raw) == full_parse(CHAT, raw)


def test_a_marker_in_a_tool_result_means_the_whole_body_is_parsed():
    # Non-standard, but the record must not differ: an output given as an object is kept as its
    # JSON text, so a skimmed payload inside it would show up in the tool result.
    data = b64(150_000)
    body = json.dumps(
        {
            "model": "m",
            "input": [
                {"type": "function_call", "call_id": "c1", "name": "shot", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": {"data": data}},
            ],
        }
    ).encode()
    assert skim(body) is not None
    info = calls.parse_request(RESPONSES, body)
    assert info == full_parse(RESPONSES, body)
    assert data in info.tool_results[0].output


def test_invalid_json_is_parsed_whole():
    body = (
        b'{"model": "m", "messages": [{"content": [{"image_url": {"url": "' + b64(100_000).encode() + b'"}}]}'
    )
    assert calls.parse_request(CHAT, body) == full_parse(CHAT, body)


def _random_request(rng: random.Random, api: Api) -> dict:
    def image() -> dict:
        n = rng.choice([1_000, MIN_SPAN - 1, MIN_SPAN + 1, rng.randrange(MIN_SPAN, 400_000)])
        data = b64(n, rng.randrange(1 << 30))
        if api is MESSAGES:
            return {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}
        if api is RESPONSES:
            return rng.choice(
                [
                    {"type": "input_image", "image_url": "data:image/png;base64," + data},
                    {
                        "type": "input_file",
                        "filename": "a.pdf",
                        "file_data": "data:application/pdf;base64," + data,
                    },
                ]
            )
        return rng.choice(
            [
                {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64," + data}},
                {"type": "input_audio", "input_audio": {"data": data, "format": "wav"}},
            ]
        )

    def text() -> dict:
        t = rng.choice(["short", "ü" * rng.randrange(1, 50), "y" * rng.randrange(MIN_SPAN, 150_000)])
        return {"type": "input_text" if api is RESPONSES else "text", "text": t}

    if api is GENERATE:
        return _random_gemini(
            rng, image=lambda: b64(rng.choice([1_000, MIN_SPAN + 1, 300_000]), rng.randrange(99))
        )
    turns: list[dict[str, Any]] = []
    for i in range(rng.randrange(1, 6)):
        parts = [rng.choice([image, text])() for _ in range(rng.randrange(1, 4))]
        cid = f"call_{i}"
        if api is MESSAGES:
            turns.append(
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": cid, "name": "look", "input": {}}],
                }
            )
            turns.append(
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": cid, "content": parts}, text()],
                }
            )
        elif api is RESPONSES:
            turns.append({"type": "function_call", "call_id": cid, "name": "look", "arguments": "{}"})
            turns.append({"type": "function_call_output", "call_id": cid, "output": parts})
            turns.append({"role": "user", "content": [text(), image()]})
        else:
            turns.append(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"id": cid, "type": "function", "function": {"name": "look", "arguments": "{}"}}
                    ],
                }
            )
            turns.append(
                {
                    "role": "tool",
                    "tool_call_id": cid,
                    "content": [p for p in parts if p["type"] == "text"] or "ok",
                }
            )
            turns.append({"role": "user", "content": parts})
    key = "input" if api is RESPONSES else "messages"
    return {"model": "m", "stream": rng.random() < 0.5, key: turns}


def _random_gemini(rng: random.Random, image) -> dict:
    """A Gemini request: inline data (camelCase or snake_case, as clients send either), function
    calls and their responses, some holding data of their own."""

    def inline() -> dict:
        key, mime = rng.choice([("inlineData", "mimeType"), ("inline_data", "mime_type")])
        return {key: {mime: "image/png", "data": image()}}

    def text() -> dict:
        return {"text": rng.choice(["short", "y" * rng.randrange(MIN_SPAN, 120_000)])}

    contents = [{"role": "user", "parts": [text(), inline()]}]
    for i in range(rng.randrange(1, 5)):
        contents.append({"role": "model", "parts": [{"functionCall": {"name": f"f{i}", "args": {"i": i}}}]})
        response = rng.choice([{"output": "done"}, {"output": {"data": image()}}, {"error": "no"}])
        contents.append(
            {"role": "user", "parts": [{"functionResponse": {"name": f"f{i}", "response": response}}]}
        )
        contents.append({"role": "user", "parts": [rng.choice([text, inline])()]})
    return {"contents": contents, "systemInstruction": {"parts": [{"text": "be careful"}]}}


@pytest.mark.parametrize("api", [CHAT, RESPONSES, MESSAGES, GENERATE], ids=lambda a: a.api)
def test_skimmed_parse_equals_the_whole_parse_on_random_requests(api):
    rng = random.Random(f"skim-{api.api}")
    skimmed = 0
    for _ in range(40):
        req = _random_request(rng, api)
        body = json.dumps(req, indent=rng.choice([None, 1]), ensure_ascii=rng.random() < 0.5).encode()
        skimmed += skim(body) is not None
        assert calls.parse_request(api, body) == full_parse(api, body)
    assert skimmed >= 10  # the property was exercised on skimmed bodies, not only on whole ones
