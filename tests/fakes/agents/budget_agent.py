"""An agent that keeps calling a model until its calls fail, for the budget tests.

    budget_agent.py PROVIDER API MODE [N]

PROVIDER: openai | anthropic. API: chat | chat-stream | responses-stream | messages | messages-stream.
MODE: ``stop`` (call until the first error, then write budget.json and exit 0, as a careful agent
would), ``forever`` (a hostile agent: catch every error and call again, never ending), ``race``
(N threads call at once, each until its first error). The SDKs come from the environment amb-record
gives; automatic retries are the SDK's default (a refusal must not be retried: it says so).
"""

import importlib
import json
import sys
import threading

provider, api, mode = sys.argv[1:4]
n_threads = int(sys.argv[4]) if len(sys.argv) > 4 else 1
# Only the provider's SDK: the newest anthropic SDK alone takes seconds to import.
sdk = importlib.import_module(provider)
client = sdk.OpenAI() if provider == "openai" else sdk.Anthropic()
MODEL = {"openai": "gpt-5.4", "anthropic": "claude-opus-4.6"}[provider]


def call() -> None:
    msgs = [{"role": "user", "content": "hello"}]
    if api == "chat":
        client.chat.completions.create(model=MODEL, messages=msgs)
    elif api == "chat-stream":
        stream = client.chat.completions.create(
            model=MODEL, messages=msgs, stream=True, stream_options={"include_usage": True}
        )
        for _ in stream:
            pass
    elif api == "responses-stream":
        with client.responses.stream(model=MODEL, input="hello") as s:
            for _ in s:
                pass
    elif api == "messages":
        client.messages.create(model=MODEL, max_tokens=64, messages=msgs)
    elif api == "messages-stream":
        with client.messages.stream(model=MODEL, max_tokens=64, messages=msgs) as s:
            s.get_final_message()
    else:
        raise SystemExit(f"unknown api {api}")


def describe(e: Exception) -> dict:
    body = getattr(e, "body", None)
    return {
        "type": type(e).__name__,
        "module": type(e).__module__.split(".")[0],
        "status": getattr(e, "status_code", None),
        "code": getattr(e, "code", None),
        "message": str(e),
        "body": body if isinstance(body, (dict, str)) else None,
    }


ok = 0
errors: list[dict] = []
lock = threading.Lock()


def worker() -> None:
    global ok
    while True:
        try:
            call()
        except sdk.APIError as e:
            with lock:
                errors.append(describe(e))
                if mode == "forever" and len(errors) == 1:  # it will be killed: say what it saw now
                    print(json.dumps(errors[0]), flush=True)
            if mode != "forever":
                return
            del errors[100:]
            continue
        with lock:
            ok += 1
        if ok > 500:  # a budget that never bites must not hang the test
            return


threads = [threading.Thread(target=worker) for _ in range(n_threads)]
for t in threads:
    t.start()
for t in threads:
    t.join()
with open("budget.json", "w") as f:
    json.dump(
        {
            "ok": ok,
            "errors": errors,
            "sdk": {provider: sdk.__version__},
        },
        f,
    )
