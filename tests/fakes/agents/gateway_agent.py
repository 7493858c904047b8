"""An agent on gateways: the newest openai SDK against an OpenRouter-style base URL (a named
upstream, OPENROUTER_BASE_URL / OPENROUTER_API_KEY), the AzureOpenAI client against an Azure
resource (AZURE_OPENAI_ENDPOINT / AZURE_OPENAI_API_KEY: the deployment path and the v1 path), and
the anthropic SDK behind a path prefix (ANTHROPIC_BASE_URL). Writes what it received to client.json."""

import json
import os

import anthropic
import openai
from sdk_parts import fold_tool_calls

TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]
calls = []


def chat(client, model, stream=False):
    msgs = [{"role": "user", "content": "read notes"}]
    if not stream:
        r = client.chat.completions.create(model=model, messages=msgs, tools=TOOLS)
        m = r.choices[0].message
        reasoning = getattr(m, "reasoning", None) or (m.model_extra or {}).get("reasoning")
        usage = r.usage.model_dump() if r.usage else None
        return {
            "text": m.content,
            "tools": [[t.id, t.function.arguments] for t in m.tool_calls or []],
            "model": r.model,
            "reasoning": reasoning,
            "usage": usage,
        }
    text, tools, model_seen, usage = [], {}, None, None
    for c in client.chat.completions.create(
        model=model, messages=msgs, tools=TOOLS, stream=True, stream_options={"include_usage": True}
    ):
        model_seen = c.model
        usage = c.usage.model_dump() if c.usage else usage
        for ch in c.choices:
            text.append(ch.delta.content or "")
            fold_tool_calls(tools, ch.delta)
    return {"text": "".join(text), "tools": list(tools.values()), "model": model_seen, "usage": usage}


router = openai.OpenAI(
    base_url=os.environ["OPENROUTER_BASE_URL"], api_key=os.environ["OPENROUTER_API_KEY"], max_retries=0
)
calls.append({"where": "openrouter", **chat(router, "openai/gpt-4o", stream=False)})
calls.append({"where": "openrouter", **chat(router, "openai/gpt-4o", stream=True)})

azure = openai.AzureOpenAI(
    azure_endpoint=os.environ["AZURE_OPENAI_ENDPOINT"],
    api_key=os.environ["AZURE_OPENAI_API_KEY"],
    api_version="2024-10-21",
    max_retries=0,
)
calls.append({"where": "azure-deployment", **chat(azure, "my-gpt4o-deployment")})
azure_v1 = openai.OpenAI(
    base_url=os.environ["AZURE_OPENAI_ENDPOINT"].rstrip("/") + "/openai/v1",
    api_key=os.environ["AZURE_OPENAI_API_KEY"],
    max_retries=0,
)
calls.append({"where": "azure-v1", **chat(azure_v1, "gpt-4o", stream=True)})

ant = anthropic.Anthropic(max_retries=0)
a = ant.messages.create(
    model="claude-test",
    max_tokens=64,
    messages=[{"role": "user", "content": "hi"}],
    tools=[{"name": "read_file", "input_schema": {"type": "object"}}],
)
calls.append(
    {
        "where": "anthropic",
        "text": "".join(b.text for b in a.content if b.type == "text"),
        "tools": [[b.id, json.dumps(b.input, ensure_ascii=False)] for b in a.content if b.type == "tool_use"],
        "model": a.model,
    }
)

json.dump(
    {
        "calls": calls,
        "keys": [os.environ[k] for k in ("OPENROUTER_API_KEY", "AZURE_OPENAI_API_KEY", "ANTHROPIC_API_KEY")],
        "openai": openai.__version__,
    },
    open("client.json", "w"),
)
