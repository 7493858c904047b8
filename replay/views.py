"""The typed SQL views over ``events``: one source of truth for their DDL and their documentation.

Each view is a list of columns (name, SQL expression, description) over a FROM clause; ``ddl()``
renders the CREATE VIEW statements (``amb schema --format ddl``) and ``markdown()`` the column table
in the README. Payload fields are read with DuckDB's JSON operators (a typed field ``TRY_CAST``: a
value of another type reads as NULL), or from their typed hot column (``replay.hot``) when the store
has it.
"""

from __future__ import annotations

from typing import NamedTuple

import duckdb

from replay import hot


class Column(NamedTuple):
    name: str
    expr: str
    """The JSON-extracting definition (the views of a store without hot columns)."""
    doc: str
    hot: str | None = None
    """The same value read from a typed hot column of ``events`` (``replay.hot``), if there is one."""


class View(NamedTuple):
    name: str
    doc: str
    source: str
    columns: list[Column]
    hot_source: str | None = None
    """The FROM clause when the hot columns are read (when it differs from ``source``)."""


_HOT = {c.path: c.name for c in hot.HOT_COLUMNS}


def _field(name: str, path: str, doc: str, cast: str | None = None) -> Column:
    """A payload field of ``events``, read from its hot column when it has one."""
    expr = f"payload->>'{path}'" if "." not in path else "payload->>'$." + path + "'"
    return Column(name, f"TRY_CAST({expr} AS {cast})" if cast else expr, doc, _HOT.get(path))


_ENV = [
    Column("run_id", "run_id", "The run."),
    Column("seq", "seq", "Position in its source's chain."),
    Column("ts_ns", "ts_ns", "When it was observed (unix ns)."),
]

_RUNS_SOURCE = """
        (SELECT run_id, count(*) AS n_events,
                min(ts_ns) AS first_ns, max(ts_ns) AS last_ns,
                count(*) FILTER (WHERE kind = 'model_call.completed') AS n_model_calls,
                count(*) FILTER (WHERE kind = 'tool_call.requested') AS n_tool_calls,
                count(*) FILTER (WHERE kind = 'process.exited') AS n_processes,
                count(*) FILTER (WHERE kind = 'file.written') AS n_file_writes
           FROM events GROUP BY run_id) AS c
        LEFT JOIN (SELECT run_id, ts_ns, payload FROM events WHERE kind = 'run.started') AS s USING (run_id)
        LEFT JOIN (SELECT run_id, ts_ns, payload FROM events WHERE kind = 'run.finished') AS f USING (run_id)
        """

VIEWS: list[View] = [
    View(
        "runs",
        "One row per run: header, outcome and counts.",
        _RUNS_SOURCE,
        [
            Column("run_id", "c.run_id", "The run id."),
            Column("task", "s.payload->>'task'", "Task id, if any."),
            Column("tier", "s.payload->>'tier'", "lite or standard."),
            Column("agent", "s.payload->>'agent'", "Agent name."),
            Column(
                "model",
                "s.payload->>'model'",
                "Model named at start (see model_calls for what was called).",
                "s.model",
            ),
            Column("backend", "s.payload->>'backend'", "local, docker or synthetic."),
            Column(
                "status",
                "coalesce(f.payload->>'status', 'unfinished')",
                "completed, failed, timeout, killed, budget_exceeded, recorder_error, unknown (an "
                "import whose source does not say how the run ended), or unfinished (no run.finished).",
            ),
            Column(
                "exit_code",
                "TRY_CAST(f.payload->>'exit_code' AS INTEGER)",
                "The agent's exit code.",
                "f.exit_code",
            ),
            Column("started_ns", "s.ts_ns", "run.started time."),
            Column("duration_s", "TRY_CAST(f.payload->>'duration_s' AS DOUBLE)", "Wall time of the run."),
            Column("labels", "s.payload->'labels'", "JSON object of --label K=V."),
            Column("n_events", "c.n_events", "Events of all sources."),
            Column("n_model_calls", "c.n_model_calls", "model_call.completed events."),
            Column("n_tool_calls", "c.n_tool_calls", "tool_call.requested events."),
            Column("n_processes", "c.n_processes", "process.exited events."),
            Column("n_file_writes", "c.n_file_writes", "file.written events."),
        ],
        _RUNS_SOURCE.replace("ts_ns, payload FROM", "ts_ns, payload, model, exit_code FROM"),
    ),
    View(
        "model_calls",
        "One row per model API call (successful or failed).",
        "events WHERE kind = 'model_call.completed'",
        _ENV
        + [
            _field("call_id", "call_id", "Call id (unique within the run)."),
            _field("provider", "provider", "openai, anthropic or gemini (wire format)."),
            _field(
                "api",
                "api",
                "chat.completions, responses, messages, generateContent, streamGenerateContent, countTokens.",
            ),
            _field(
                "model", "model", "Model that served the call if the response says, else the one asked for."
            ),
            _field(
                "requested_model", "requested_model", "Model named in the request (body, path, deployment)."
            ),
            _field("served_model", "served_model", "Model the response names (a gateway may differ)."),
            _field("upstream", "upstream", "The --upstream it went to (openai, gemini, azure, a named one)."),
            _field("stream", "stream", "Streaming call?", "BOOLEAN"),
            _field("status", "status", "Upstream HTTP status (NULL: no response).", "INTEGER"),
            _field("ok", "ok", "False for failures (see error).", "BOOLEAN"),
            _field("error", "error", "Why it failed."),
            _field("stop_reason", "stop_reason", "finish_reason / stop_reason as sent."),
            # input_tokens, cache_read_tokens, cache_write_tokens, output_tokens, reasoning_tokens
            *(
                _field(c.name, c.path, c.doc, c.sql_type)
                for c in hot.HOT_COLUMNS
                if c.name.endswith("_tokens")
            ),
            _field("usage_reported", "usage.reported", "False: usage estimated.", "BOOLEAN"),
            _field(
                "reported_cost_usd", "cost_usd", "Cost the provider/gateway reported (NULL: none).", "DOUBLE"
            ),
            Column(
                "n_tool_calls", "json_array_length(payload->'$.message.tool_calls')", "Tool calls asked for."
            ),
            _field("text", "message.text", "Reassembled assistant text."),
            _field("ttfb_ms", "ttfb_ms", "Time to first byte.", "DOUBLE"),
            _field("latency_ms", "latency_ms", "Total latency.", "DOUBLE"),
            _field("request_blob", "request.blob", "Request body blob."),
            _field("response_blob", "response.blob", "Response body blob."),
        ],
    ),
    View(
        "tool_calls",
        "One row per tool call asked for by the model, paired by id with its result (if any).",
        """
        (SELECT * FROM events WHERE kind = 'tool_call.requested') AS r
        LEFT JOIN (SELECT run_id, ts_ns, payload FROM events WHERE kind = 'tool_call.result') AS res
          ON res.run_id = r.run_id AND res.payload->>'tool_call_id' = r.payload->>'tool_call_id'
        """,
        [
            Column("run_id", "r.run_id", "The run."),
            Column("seq", "r.seq", "Seq of the request event."),
            Column(
                "tool_call_id", "r.payload->>'tool_call_id'", "Provider's tool call id.", "r.tool_call_id"
            ),
            Column("name", "r.payload->>'name'", "Tool name.", "r.tool_name"),
            Column("arguments", "r.payload->>'arguments'", "Raw argument string."),
            Column("requested_in", "r.payload->>'model_call_id'", "Model call whose response asked."),
            Column("requested_ns", "r.ts_ns", "When it was asked for."),
            Column(
                "answered_in", "res.payload->>'model_call_id'", "Model call whose request carried the result."
            ),
            Column("answered_ns", "res.ts_ns", "When the result was sent (NULL: never)."),
            Column("output", "res.payload->>'output'", "Result text (capped; see the event's output_blob)."),
            Column(
                "is_error", "TRY_CAST(res.payload->>'is_error' AS BOOLEAN)", "Result flagged as an error."
            ),
        ],
        """
        (SELECT * FROM events WHERE kind = 'tool_call.requested') AS r
        LEFT JOIN (SELECT run_id, ts_ns, payload, tool_call_id FROM events
                   WHERE kind = 'tool_call.result') AS res
          ON res.run_id = r.run_id AND res.tool_call_id = r.tool_call_id
        """,
    ),
    View(
        "processes",
        "One row per process observed by the shim (or the agent process itself).",
        "events WHERE kind = 'process.exited'",
        _ENV
        + [
            _field("pid", "pid", "Process id (in its namespace).", "BIGINT"),
            _field("ppid", "ppid", "Parent pid.", "BIGINT"),
            Column("argv", "payload->'argv'", "JSON array of arguments (recorded text: see OS strings)."),
            Column(
                "cmd",
                "array_to_string(TRY_CAST(payload->'argv' AS VARCHAR[]), ' ')",
                "argv joined by spaces.",
            ),
            _field("cwd", "cwd", "Working directory (recorded text)."),
            _field("start_ns", "start_ns", "Start time.", "BIGINT"),
            _field("end_ns", "end_ns", "End time.", "BIGINT"),
            Column(
                "duration_ms",
                "(TRY_CAST(payload->>'end_ns' AS BIGINT) - TRY_CAST(payload->>'start_ns' AS BIGINT)) / 1e6",
                "Run time.",
            ),
            _field("exit_code", "exit_code", "Exit code (NULL: killed or still running).", "INTEGER"),
            _field("signal", "signal", "Terminating signal.", "INTEGER"),
            _field(
                "tracer",
                "tracer",
                "seccomp-notify, strace (its fallback), proc-poll (the last fallback, labelled), "
                "recorder or synthetic.",
            ),
        ],
    ),
    View(
        "file_writes",
        "One row per file created or modified (file.written).",
        "events WHERE kind = 'file.written'",
        _ENV
        + [
            _field("path", "path", "Path relative to the workspace (recorded text)."),
            _field("op", "op", "created or modified."),
            _field("size", "size", "Size in bytes.", "BIGINT"),
            _field("sha256", "sha256", "Content digest."),
            _field("content_blob", "content.blob", "Content blob (NULL above the size cap)."),
        ],
    ),
    View(
        "network_requests",
        "One row per non-model HTTP request or egress attempt.",
        "events WHERE kind = 'network.request'",
        _ENV
        + [
            _field("method", "method", "HTTP method."),
            _field("scheme", "scheme", "http or https."),
            _field("host", "host", "Host name."),
            _field("port", "port", "Port.", "INTEGER"),
            _field("path", "path", "Path and query."),
            _field("status", "status", "HTTP status (NULL: failed).", "INTEGER"),
            _field("request_bytes", "request_bytes", "Request body size.", "BIGINT"),
            _field("response_bytes", "response_bytes", "Response body size.", "BIGINT"),
            _field("duration_ms", "duration_ms", "Duration.", "DOUBLE"),
            _field("error", "error", "Error, if it failed or was blocked."),
            _field("via", "via", "proxy, or shim for a direct attempt."),
            _field("blocked", "blocked", "Why the proxy refused it (NULL: it was carried)."),
        ],
    ),
]


def ddl(typed: bool = True, prefix: str = "") -> list[str]:
    """The CREATE VIEW statements: reading the hot columns, or (``typed=False``) only the JSON payload.

    ``prefix`` names the views differently (the test that compares both definitions)."""
    out = []
    for view in VIEWS:
        cols = ",\n    ".join(f"{(c.hot if typed and c.hot else c.expr)} AS {c.name}" for c in view.columns)
        source = (view.hot_source if typed and view.hot_source else view.source).strip()
        out.append(f"CREATE OR REPLACE VIEW {prefix}{view.name} AS\nSELECT\n    {cols}\nFROM {source}")
    return out


def create_views(con: duckdb.DuckDBPyConnection) -> None:
    """(Re-)create the views; on hot columns once ``events`` has them (any migration may call this)."""
    for statement in ddl(typed=hot.present(con)):
        con.execute(statement)


def markdown() -> str:
    parts = []
    for view in VIEWS:
        parts.append(f"**`{view.name}`**: {view.doc}\n\n| column | meaning |\n|---|---|")
        parts.extend(f"| `{c.name}` | {c.doc} |" for c in view.columns)
        parts.append("")
    return "\n".join(parts)
