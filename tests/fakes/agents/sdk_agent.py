"""A small agent: the openai and anthropic SDKs, configured only by the environment amb-record
gives (OPENAI_BASE_URL, ANTHROPIC_BASE_URL, placeholder keys). Writes what it received to
client.json so the test can compare it with the record. Runs under either openai 2.x or 3.x."""

import json
import os

import anthropic
import openai

calls = []
oai = openai.OpenAI(max_retries=0)
ant = anthropic.Anthropic(max_retries=0)
gz = {"x-fake-encoding": "gzip"}
TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]

# Chat Completions: a tool call, its result in the next turn, then a streamed answer.
msgs = [{"role": "user", "content": "read notes"}]
m = oai.chat.completions.create(model="gpt-test", messages=msgs, tools=TOOLS).choices[0].message
calls.append(
    {
        "api": "chat.completions",
        "text": m.content,
        "tools": [[t.id, t.function.arguments] for t in m.tool_calls],
    }
)
msgs += [
    m.model_dump(exclude_none=True),
    {"role": "tool", "tool_call_id": m.tool_calls[0].id, "content": "notes: ok"},
]
m2 = oai.chat.completions.create(model="gpt-test", messages=msgs, tools=TOOLS).choices[0].message
calls.append({"api": "chat.completions", "text": m2.content, "tools": []})
text = []
for chunk in oai.chat.completions.create(
    model="gpt-test", messages=msgs, stream=True, stream_options={"include_usage": True}, extra_headers=gz
):
    text += [c.delta.content or "" for c in chunk.choices]
calls.append({"api": "chat.completions", "text": "".join(text), "tools": []})

# Responses: non-streaming and streaming, both asking for a tool.
RTOOLS = [{"type": "function", "name": "read_file", "parameters": {"type": "object"}}]
r = oai.responses.create(model="gpt-test", input="hi", tools=RTOOLS)
calls.append(
    {
        "api": "responses",
        "text": r.output_text,
        "tools": [[o.call_id, o.arguments] for o in r.output if o.type == "function_call"],
    }
)
with oai.responses.stream(model="gpt-test", input="hi", tools=RTOOLS, extra_headers=gz) as s:
    for _ in s:
        pass
    r = s.get_final_response()
calls.append(
    {
        "api": "responses",
        "text": r.output_text,
        "tools": [[o.call_id, o.arguments] for o in r.output if o.type == "function_call"],
    }
)

# Anthropic Messages: non-streaming, streaming, then the tool result.
ATOOLS = [{"name": "read_file", "input_schema": {"type": "object"}}]
amsgs = [{"role": "user", "content": "hi"}]
a = ant.messages.create(model="claude-test", max_tokens=64, messages=amsgs, tools=ATOOLS)
calls.append(
    {
        "api": "messages",
        "text": "".join(b.text for b in a.content if b.type == "text"),
        "tools": [[b.id, json.dumps(b.input)] for b in a.content if b.type == "tool_use"],
    }
)
with ant.messages.stream(
    model="claude-test", max_tokens=64, messages=amsgs, tools=ATOOLS, extra_headers=gz
) as s:
    a2 = s.get_final_message()
calls.append(
    {
        "api": "messages",
        "text": "".join(b.text for b in a2.content if b.type == "text"),
        "tools": [[b.id, json.dumps(b.input)] for b in a2.content if b.type == "tool_use"],
    }
)
tool = [b for b in a.content if b.type == "tool_use"][0]
amsgs += [
    {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in a.content]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool.id, "content": "42"}]},
]
a3 = ant.messages.create(model="claude-test", max_tokens=64, messages=amsgs, tools=ATOOLS)
calls.append(
    {"api": "messages", "text": "".join(b.text for b in a3.content if b.type == "text"), "tools": []}
)

with open("client.json", "w") as f:
    json.dump(
        {
            "openai": openai.__version__,
            "anthropic": anthropic.__version__,
            "keys": [os.environ["OPENAI_API_KEY"], os.environ["ANTHROPIC_API_KEY"]],
            "calls": calls,
        },
        f,
    )
