"""A small Gemini agent: the google-genai SDK, configured only by the environment amb-record gives
(GOOGLE_GEMINI_BASE_URL, a placeholder GEMINI_API_KEY). Function calling (not streamed, then
streamed over SSE), countTokens, an inline image, and two raw HTTP calls the SDK does not make: the
key as ``?key=`` and the JSON-array stream (no ``alt=sse``). Writes what it received to client.json
so the test can compare it with the record; the key it was given goes there too, or to the file
``GENAI_KEY_OUT`` names (outside the workspace: a replay's workspace then holds the same files)."""

import hashlib
import json
import os
import struct
import urllib.request
import zlib

from google import genai
from google.genai import types
from sdk_parts import genai_tools

MODEL = "gemini-test"
client = genai.Client()
config = genai_tools()
calls = []


def record(api, response_text, function_calls):
    calls.append({"api": api, "text": response_text, "tools": function_calls})


# 1. generateContent: the model asks for a tool.
history = [types.Content(role="user", parts=[types.Part.from_text(text="read notes.md")])]
r = client.models.generate_content(model=MODEL, contents=history, config=config)
fcs = r.function_calls or []
record("generateContent", r.text, [[fc.name, fc.args] for fc in fcs])

# 2. The tool's result goes back; the answer is text.
history.append(r.candidates[0].content)
history.append(
    types.Content(
        role="user",
        parts=[types.Part.from_function_response(name=fcs[0].name, response={"output": "notes: ok"})],
    )
)
r2 = client.models.generate_content(model=MODEL, contents=history, config=config)
record("generateContent", r2.text, [])

# 3. Streamed (SSE), a new conversation that asks for a tool.
text, stream_calls = [], []
for chunk in client.models.generate_content_stream(model=MODEL, contents="list the files", config=config):
    if chunk.candidates and chunk.candidates[0].content and chunk.candidates[0].content.parts:
        for part in chunk.candidates[0].content.parts:
            if part.function_call:
                stream_calls.append([part.function_call.name, part.function_call.args])
            elif part.text and not part.thought:
                text.append(part.text)
record("streamGenerateContent", "".join(text), stream_calls)

# 4. countTokens.
n = client.models.count_tokens(model=MODEL, contents="how many tokens is this").total_tokens
calls.append({"api": "countTokens", "total": n})


# 5. An inline image: a real PNG, stored uncompressed, large enough for the request parse to skim it
# out (the SDK sends it in base64's URL-safe alphabet).
def png(side):
    rows = b"".join(b"\0" + bytes((x * 7 + y * 13) % 256 for x in range(side * 4)) for y in range(side))

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    head = struct.pack(">IIBBBBB", side, side, 8, 6, 0, 0, 0)  # RGBA, 8 bits a channel
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", head)
        + chunk(b"IDAT", zlib.compress(rows, 0))
        + chunk(b"IEND", b"")
    )


picture = png(160)
image = types.Part.from_bytes(data=picture, mime_type="image/png")
r5 = client.models.generate_content(model=MODEL, contents=[image, "describe"])
record("generateContent", r5.text, [])

# 6. Raw HTTP: the key in the query string, and the JSON-array stream.
base = os.environ["GOOGLE_GEMINI_BASE_URL"].rstrip("/")
key = os.environ["GEMINI_API_KEY"]
body = json.dumps({"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}).encode()
req = urllib.request.Request(
    f"{base}/v1beta/models/{MODEL}:generateContent?key={key}", body, {"content-type": "application/json"}
)
with urllib.request.urlopen(req) as resp:
    out = json.load(resp)
record(
    "generateContent",
    "".join(p["text"] for p in out["candidates"][0]["content"]["parts"] if not p.get("thought")),
    [],
)
req = urllib.request.Request(
    f"{base}/v1beta/models/{MODEL}:streamGenerateContent",
    body,
    {"content-type": "application/json", "x-goog-api-key": key},
)
with urllib.request.urlopen(req) as resp:
    arr = json.load(resp)
record(
    "streamGenerateContent",
    "".join(
        p.get("text", "") for c in arr for p in c["candidates"][0]["content"]["parts"] if not p.get("thought")
    ),
    [],
)

facts = {"calls": calls, "image_sha256": hashlib.sha256(picture).hexdigest(), "sdk": genai.__version__}
if os.environ.get("GENAI_KEY_OUT"):
    open(os.environ["GENAI_KEY_OUT"], "w").write(key)
else:
    facts["key"] = key
json.dump(facts, open("client.json", "w"))
