"""A google-genai agent holding two conversations that open with the same message (two sub-agents
handed one instruction), one streamed and one not, interleaved: both ask the model, each gets a
function call, the second to ask answers first. Configured only by the environment amb-record
gives. Writes each conversation's function call and the output it sent back to client.json."""

import json

from google import genai
from google.genai import types
from sdk_parts import genai_tools

MODEL = "gemini-test"
OPENING = "read notes.md and tell me what it says"
client = genai.Client()
config = genai_tools()
streamed, plain = (
    client.chats.create(model=MODEL, config=config),
    client.chats.create(model=MODEL, config=config),
)


def ask_streamed(message):
    calls = []
    for chunk in streamed.send_message_stream(message):
        calls += chunk.function_calls or []
    return calls


def answer(call, output):
    return types.Part.from_function_response(name=call.name, response={"output": output})


(x_call,) = ask_streamed(OPENING)
(y_call,) = plain.send_message(OPENING).function_calls
y_output, x_output = f"y read call {y_call.args['call']}", f"x read call {x_call.args['call']}"
plain.send_message(answer(y_call, y_output))
ask_streamed(answer(x_call, x_output))
json.dump(
    {
        "x": {"args": x_call.args, "output": x_output},
        "y": {"args": y_call.args, "output": y_output},
        "sdk": genai.__version__,
    },
    open("client.json", "w"),
)
