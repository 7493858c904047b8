"""Pieces the agents share (run as scripts, they import this from their own folder). The SDKs are
imported where used: an agent loads only its own."""


def genai_tools():
    """google-genai's config for a ``read_file`` function the agent runs itself (no automatic
    function calling: the agent sends the function response, as coding agents do)."""
    from google.genai import types

    read_file = types.FunctionDeclaration(
        name="read_file",
        description="Read a file",
        parameters_json_schema={"type": "object", "properties": {"path": {"type": "string"}}},
    )
    return types.GenerateContentConfig(
        tools=[types.Tool(function_declarations=[read_file])],
        automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True),
    )


def fold_tool_calls(tools, delta):
    """Folds a Chat Completions stream delta's tool calls into ``tools`` (index → [id, arguments])."""
    for t in delta.tool_calls or []:
        entry = tools.setdefault(t.index, ["", ""])
        entry[0] = t.id or entry[0]
        entry[1] += (t.function.arguments or "") if t.function else ""
