"""What the project prints and writes when the agent's text is hostile.

One run written through the real spool path (spool writers, blob store, ingest, `amb score`) whose
every field an agent controls (its model's text and name, tool names, arguments and outputs, argv,
cwd, file paths, hosts, labels) holds terminal escapes (OSC, CSI), a bidi override, NUL and other
C0 controls, CR/LF, markup (HTML, rich's) and template syntax. Every command that shows it on a
terminal prints no character a terminal would obey; the exports stay what a standard reader parses.
"""

from __future__ import annotations

import csv
import io
import json
import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from amb.main import cli
from recorder.spool import SpoolWriter, spool_path
from replay.ingest import ingest
from schemas import events as ev
from schemas.blob import digest
from schemas.blobstore import BlobStore
from schemas.ostext import os_text

RUN = "hostile"
EVIL = (
    "\x1b]0;pwned\x07\x1b[2J\u202eevil\x00\x01\x9b31m\r\n\rEND[red]R[/red]"
    '<script>alert(1)</script></script>"><img src=x onerror=alert(2)>{{7*7}}${7*7}'
)
"""Escapes first: a table clips a long cell, and what is clipped away never reaches the terminal."""

OBEYED = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
"""What a terminal acts on (C0 but tab and newline, DEL, C1) and the bidi overrides and isolates."""


def write_hostile_run(root: Path) -> None:
    blobs = BlobStore(root / "blobs")
    writers = {
        s: SpoolWriter(spool_path(root, RUN, s), RUN, s, sync=False) for s in ("recorder", "proxy", "shim")
    }
    clock = iter(range(1_700_000_000_000_000_000, 1_800_000_000_000_000_000, 1_000_000))

    def emit(source, payload):
        writers[source].append(payload, ts_ns=next(clock))

    emit(
        "recorder",
        ev.RunStarted(
            task="kidney-seg",
            tier="lite",
            agent="a" + EVIL,
            model="m" + EVIL,
            command=["agent", EVIL],
            workspace="/workspace",
            labels={"k" + EVIL: EVIL},
        ),
    )
    request = blobs.put(
        json.dumps({"messages": [{"role": "user", "content": EVIL}]}).encode(), "application/json"
    )
    response = blobs.put(
        json.dumps({"choices": [{"message": {"content": EVIL}}]}).encode(), "application/json"
    )
    args = json.dumps({"code": EVIL})
    message = ev.AssistantMessage(
        text=EVIL,
        reasoning=EVIL,
        tool_calls=[ev.ToolCallPart(id="c1" + EVIL, name="run" + EVIL, arguments=args)],
    )
    emit(
        "proxy",
        ev.ModelCallCompleted(
            call_id="m1" + EVIL,
            provider="openai",
            api="chat.completions",
            model="g" + EVIL,
            url="https://x/" + EVIL,
            status=500,
            ok=False,
            error=EVIL,
            request=request,
            response=response,
            message=message,
            stop_reason=EVIL,
            usage=ev.Usage(input_total=10, output=5),
            latency_ms=3.0,
        ),
    )
    emit(
        "proxy",
        ev.ToolCallRequested(tool_call_id="c1" + EVIL, name="run" + EVIL, arguments=args, model_call_id="m1"),
    )
    emit(
        "proxy",
        ev.ToolCallResult(tool_call_id="c1" + EVIL, model_call_id="m1", name="run" + EVIL, output=EVIL),
    )
    emit(
        "shim",
        ev.ProcessExited(pid=5, ppid=1, argv=[os_text(EVIL), os_text("x\udcff")], cwd=EVIL, exit_code=1),
    )
    content = EVIL.encode()
    path = os_text("out/" + EVIL.replace("\x00", "").replace("/", "") + "\udcfe.txt")
    sha = digest(content)
    emit(
        "shim",
        ev.FileWritten(
            path=path, op="created", size=len(content), sha256=sha, content=blobs.put(content, "text/html")
        ),
    )
    emit(
        "shim",
        ev.NetworkRequest(
            method="GET", scheme="https", host="h" + EVIL, port=443, path="/" + EVIL, error=EVIL
        ),
    )
    emit(
        "recorder",
        ev.SubmissionSealed(
            root="/workspace", files=[ev.SealedFile(path=path, size=len(content), sha256=sha)]
        ),
    )
    counts = {s: w.next_seq for s, w in writers.items()}
    emit("recorder", ev.RunFinished(status="failed", exit_code=1, duration_s=1.0, reason=EVIL, counts=counts))
    for w in writers.values():
        w.close()


def invoke(args: list[str]):
    env = {"AMB_JUDGE_BASE_URL": "", "AMB_JUDGE_MODEL": "", "AMB_STORE": "", "COLUMNS": "200"}
    # color=True: click strips CSI sequences from what it echoes to a pipe, but not on a terminal.
    return CliRunner().invoke(cli, args, env=env, color=True)


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("hostile-output") / "store"
    write_hostile_run(root)
    ingest(root)
    scored = invoke(["score", "--all", "--store", str(root)])
    assert scored.exit_code == 0, scored.output
    return root


TERMINAL_COMMANDS = [
    ["runs"],
    ["show", RUN],
    ["show", RUN, "--events"],
    ["report"],
    ["audit", RUN],
    ["files", RUN],
    ["watch", RUN, "--once"],
    ["score", RUN],
    ["manifest", RUN],
    ["scan", "audit", RUN],
    ["sql", "SELECT * FROM events"],
]


@pytest.mark.parametrize("args", TERMINAL_COMMANDS, ids=lambda a: " ".join(a[:2]))
def test_a_terminal_obeys_nothing_the_agent_wrote(store, args):
    result = invoke([*args, "--store", str(store)])
    assert result.exit_code == 0, result.output
    for stream in (result.stdout, result.stderr):
        found = OBEYED.search(stream)
        assert found is None, (found, stream[max(0, found.start() - 200) : found.end() + 50])


def on_a_terminal(args: list[str]) -> bytes:
    """What `amb ARGS` writes to stdout when stdout is a terminal (a pseudo-terminal's other end)."""
    parent, child = pty.openpty()
    amb = Path(sys.executable).with_name("amb")
    done = subprocess.run([str(amb), *args], stdout=child, stderr=subprocess.PIPE, timeout=120)
    os.close(child)
    assert done.returncode == 0, done.stderr
    out = b""
    while True:
        try:
            chunk = os.read(parent, 1 << 16)
        except OSError:  # EIO: the terminal's other end is closed and everything was read
            break
        if not chunk:
            break
        out += chunk
    os.close(parent)
    return out


def test_sql_csv_is_escaped_on_a_terminal_and_faithful_when_piped(store):
    query = ["sql", "SELECT output FROM tool_calls", "--format", "csv", "--store", str(store)]
    # CSV ends its lines in CRLF, and the terminal adds a CR before each LF.
    shown = re.sub("\r+\n", "\n", on_a_terminal(query).decode())
    found = OBEYED.search(shown)
    assert found is None, shown
    assert "\\x1b]0;pwned\\x07" in shown
    piped = invoke(query)
    assert piped.exit_code == 0
    # (the bytes: click's ``stdout`` folds CRLF, the agent's among them)
    rows = list(csv.reader(io.StringIO(piped.stdout_bytes.decode(), newline="")))
    assert rows == [["output"], [EVIL]]
