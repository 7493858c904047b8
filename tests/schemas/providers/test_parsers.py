"""Provider parsers on hand-written bodies: usage containment, reasoning, error events, and the
stream shapes the fake upstream does not produce."""

from __future__ import annotations

import json

from schemas.providers import (
    CHAT,
    MESSAGES,
    RESPONSES,
    anthropic_messages,
    classify,
    classify_websocket,
    estimate_usage,
    openai_chat,
    openai_responses,
)


def sse(*events: dict, named: bool = False) -> bytes:
    out = []
    for e in events:
        out.append((f"event: {e.get('type')}\n" if named else "") + "data: " + json.dumps(e) + "\n\n")
    return "".join(out).encode()


def test_classify_by_path():
    assert classify("POST", "/v1/chat/completions") is CHAT
    assert classify("POST", "/openai/v1/responses?x=1") is RESPONSES
    assert classify("POST", "/v1/messages") is MESSAGES
    assert classify("POST", "/v1/messages/count_tokens") is None
    assert classify("GET", "/v1/chat/completions") is None
    assert classify_websocket("/v1/responses") is RESPONSES and classify_websocket("/v1/realtime") is None


def test_anthropic_usage_adds_cache_to_input_total():
    r = anthropic_messages.parse_json(
        {
            "content": [],
            "usage": {
                "input_tokens": 10,
                "cache_read_input_tokens": 1000,
                "cache_creation_input_tokens": 200,
                "output_tokens": 5,
            },
        }
    )
    u = r.usage
    assert u is not None
    assert (u.input_total, u.cache_read, u.cache_write, u.output, u.reasoning) == (1210, 1000, 200, 5, 0)


def test_anthropic_stream_usage_is_updated_by_message_delta():
    text = sse(
        {
            "type": "message_start",
            "message": {
                "model": "c",
                "usage": {"input_tokens": 3, "cache_read_input_tokens": 7, "output_tokens": 1},
            },
        },
        {"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "hmm"}},
        {
            "type": "content_block_start",
            "index": 1,
            "content_block": {"type": "tool_use", "id": "t1", "name": "ls", "input": {}},
        },
        {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 42}},
        {"type": "message_stop"},
        named=True,
    )
    r = anthropic_messages.parse_stream(text)
    assert r.usage is not None
    assert (r.usage.input_total, r.usage.cache_read, r.usage.output) == (10, 7, 42)
    assert r.reasoning == ["hmm"] and r.complete and r.stop_reason == "tool_use"
    assert r.message().tool_calls[0].arguments == "{}"  # a tool_use with no input deltas


def test_anthropic_raw_tool_input_is_kept_byte_for_byte():
    raw = b'{"content": [{"type": "tool_use", "id": "t", "name": "f", "input": {"b": 1,  "a": "\\u00e9"}}]}'
    r = anthropic_messages.parse_json(json.loads(raw), raw)
    assert r.message().tool_calls[0].arguments == '{"b": 1,  "a": "\\u00e9"}'


def test_anthropic_error_event_mid_stream():
    r = anthropic_messages.parse_stream(
        sse({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
    )
    assert r.error == "Overloaded"


def test_openai_chat_reasoning_and_usage_containment():
    r = openai_chat.parse_json(
        {
            "model": "o",
            "choices": [{"message": {"content": "a", "reasoning_content": "r"}, "finish_reason": "stop"}],
            "usage": {
                "prompt_tokens": 100,
                "completion_tokens": 50,
                "prompt_tokens_details": {"cached_tokens": 60},
                "completion_tokens_details": {"reasoning_tokens": 20},
            },
        }
    )
    assert r.usage is not None
    assert (r.usage.input_total, r.usage.cache_read, r.usage.output, r.usage.reasoning) == (100, 60, 50, 20)
    assert r.message().reasoning == "r"


def test_openai_chat_parallel_tool_calls_by_index():
    chunks = [
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {
                        "tool_calls": [
                            {"index": 0, "id": "a", "function": {"name": "f", "arguments": '{"x"'}},
                            {"index": 1, "id": "b", "function": {"name": "g", "arguments": ""}},
                        ]
                    },
                }
            ]
        },
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {
                        "tool_calls": [
                            {"index": 1, "function": {"arguments": "{}"}},
                            {"index": 0, "function": {"arguments": ": 1}"}},
                        ]
                    },
                }
            ]
        },
    ]
    r = openai_chat.parse_stream(sse(*chunks))
    assert [(t.id, t.name, t.arguments) for t in r.message().tool_calls] == [
        ("a", "f", '{"x": 1}'),
        ("b", "g", "{}"),
    ]
    assert not r.complete  # no [DONE]


def test_responses_reasoning_and_done_only_arguments():
    text = sse(
        {"type": "response.created", "response": {"model": "gpt"}},
        {"type": "response.reasoning_summary_text.delta", "delta": "think"},
        {
            "type": "response.output_item.added",
            "output_index": 1,
            "item": {"type": "function_call", "call_id": "c", "name": "f"},
        },
        {"type": "response.function_call_arguments.done", "output_index": 1, "arguments": '{"k": 2}'},
        {
            "type": "response.incomplete",
            "response": {
                "status": "incomplete",
                "incomplete_details": {"reason": "max_output_tokens"},
                "usage": {"input_tokens": 5, "output_tokens": 9},
            },
        },
        named=True,
    )
    r = openai_responses.parse_stream(text)
    assert r.message().tool_calls[0].arguments == '{"k": 2}' and r.message().reasoning == "think"
    assert r.usage is not None
    assert r.stop_reason == "max_output_tokens" and r.usage.output == 9 and r.complete


def test_responses_request_tool_outputs_and_websocket_form():
    body = {
        "type": "response.create",
        "model": "m",
        "input": [
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "done"},
        ],
    }
    info = openai_responses.parse_request(body)
    assert info.stream and info.model == "m"
    assert [(t.wire, t.name, t.output) for t in info.tool_results] == [("c1", "f", "done")]
    nested = openai_responses.parse_request(
        {"type": "response.create", "response": {"model": "n", "input": "x"}}
    )
    assert nested.model == "n"


def test_usage_estimate_is_marked():
    info = openai_chat.parse_request({"messages": [{"role": "user", "content": "x" * 40}]})
    r = openai_chat.parse_json({"choices": [{"message": {"content": "y" * 8}}]})
    u = estimate_usage(info, r)
    assert (u.input_total, u.output, u.reported) == (10, 2, False)
