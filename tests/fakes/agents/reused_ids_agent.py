"""An agent on a gateway that gives every tool call the same id: the newest openai SDK (Chat
Completions and Responses) and the anthropic SDK, each holding two conversations that open with the
same message, one streamed and one not, interleaved: both ask the model, each gets a tool call, the
second to ask answers first. Configured only by the environment amb-record gives. Writes each
conversation's call (id, arguments) and the output it sent back to client.json."""

import json

import anthropic
import openai
from sdk_parts import fold_tool_calls

OPENING = [{"role": "user", "content": "read notes.md"}]
CHAT_TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]
RESP_TOOLS = [{"type": "function", "name": "read_file", "parameters": {"type": "object"}}]
ANT_TOOLS = [{"name": "read_file", "input_schema": {"type": "object"}}]
oai, ant = openai.OpenAI(max_retries=0), anthropic.Anthropic(max_retries=0)


def output(args):
    return f"read call {(json.loads(args) if isinstance(args, str) else args)['call']}"


def chat(history, stream):
    """One Chat Completions call: (the assistant message as the next request carries it, its call)."""
    if not stream:
        m = oai.chat.completions.create(model="m", messages=history, tools=CHAT_TOOLS).choices[0].message
        calls = [(t.id, t.function.arguments) for t in m.tool_calls or []]
        return m.model_dump(exclude_none=True), calls
    text, tools = [], {}
    for c in oai.chat.completions.create(model="m", messages=history, tools=CHAT_TOOLS, stream=True):
        for ch in c.choices:
            text.append(ch.delta.content or "")
            fold_tool_calls(tools, ch.delta)
    calls = [tuple(v) for v in tools.values()]
    message = {"role": "assistant", "content": "".join(text)}
    if calls:
        fns = [
            {"id": i, "type": "function", "function": {"name": "read_file", "arguments": a}} for i, a in calls
        ]
        message["tool_calls"] = fns
    return message, calls


def chat_turns():
    (x_msg, [x]), (y_msg, [y]) = chat(OPENING, True), chat(OPENING, False)
    for history, msg, (cid, args), stream in ((OPENING, y_msg, y, False), (OPENING, x_msg, x, True)):
        chat([*history, msg, {"role": "tool", "tool_call_id": cid, "content": output(args)}], stream)
    return x, y


def responses(items, stream):
    if stream:
        with oai.responses.stream(model="m", input=items, tools=RESP_TOOLS) as s:
            out = s.get_final_response().output
    else:
        out = oai.responses.create(model="m", input=items, tools=RESP_TOOLS).output
    calls = [(o.call_id, o.arguments) for o in out if o.type == "function_call"]
    return [o.model_dump(exclude_none=True) for o in out], calls


def responses_turns():
    (x_out, [x]), (y_out, [y]) = responses(OPENING, True), responses(OPENING, False)
    for out, (cid, args), stream in ((y_out, y, False), (x_out, x, True)):
        answer = {"type": "function_call_output", "call_id": cid, "output": output(args)}
        responses([*OPENING, *out, answer], stream)
    return x, y


def messages(history, stream):
    args = {"model": "claude-test", "max_tokens": 64, "messages": history, "tools": ANT_TOOLS}
    if stream:
        with ant.messages.stream(**args) as s:
            m = s.get_final_message()
    else:
        m = ant.messages.create(**args)
    calls = [(b.id, b.input) for b in m.content if b.type == "tool_use"]
    return {"role": "assistant", "content": [b.model_dump() for b in m.content]}, calls


def messages_turns():
    (x_msg, [x]), (y_msg, [y]) = messages(OPENING, True), messages(OPENING, False)
    for msg, (cid, args), stream in ((y_msg, y, False), (x_msg, x, True)):
        result = {"type": "tool_result", "tool_use_id": cid, "content": output(args)}
        messages([*OPENING, msg, {"role": "user", "content": [result]}], stream)
    return x, y


got = {}
for api, turns in (("chat", chat_turns), ("responses", responses_turns), ("messages", messages_turns)):
    x, y = turns()
    got[api] = {name: {"id": c[0], "output": output(c[1])} for name, c in (("x", x), ("y", y))}
json.dump({"conversations": got, "openai": openai.__version__}, open("client.json", "w"))
