"""A demo-like run (amb-agent under `amb-record --shim`, a scripted model on loopback) watched live
with `amb watch --json`, then checked out at every step boundary.

The scripted model is a fake of something outside the project (a provider speaking Chat
Completions). It is also the test's clock: when a request arrives, the agent has sent its last
tool result and waits, so the model snapshots the workspace then: that is the step boundary
`amb checkout --step N` must reproduce byte for byte."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import duckdb
from click.testing import CliRunner

from amb.main import cli

BIN = Path(sys.executable).parent
MODEL = "z-ai/glm-5"
PRICE_IN, PRICE_OUT = 0.72, 2.30
"""USD per million tokens of GLM-5 in the default profile's table (openrouter-2026-05-28)."""

STEPS = [
    "mkdir -p plan && printf '# Plan\\n1. pilot\\n' > plan/plan.md",
    "sleep 0.3; python3 -c \"open('pilot.txt', 'w').write('pilot v1')\"",
    "printf 'pilot v2, rewritten\\n' > pilot.txt",
    "mkdir -p out && mv pilot.txt out/pilot.txt",
    "rm plan/plan.md",
    "sleep 0.3; mkdir -p scratch && echo a > scratch/a.txt && echo b > scratch/b.txt",
    "mv scratch results",
    "python3 -c \"import os; open('results/blob.bin', 'wb').write(bytes(range(256)) * 80)\"",
    "printf 'final\\n' > results/a.txt && rm results/b.txt",
]


def _usage(turn: int) -> tuple[int, int]:
    return 1000 + 137 * turn, 20 + 3 * turn


def snapshot(work: Path) -> dict[str, tuple[bytes, int]]:
    """Every regular file of the workspace: content and ctime (when it was last changed)."""
    out = {}
    for p in work.rglob("*"):
        if p.is_file() and not p.is_symlink():
            out[str(p.relative_to(work))] = (p.read_bytes(), p.stat().st_ctime_ns)
    return out


class ScriptedModel(ThreadingHTTPServer):
    def __init__(self, work: Path):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.work = work
        self.turn = 0
        self.snapshots: list[dict[str, tuple[bytes, int]]] = []
        self.answered_at: list[float] = []
        self.lock = threading.Lock()

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            turn = self.turn
            self.turn += 1
            self.snapshots.append(snapshot(self.work))
        time.sleep(0.2)  # a model takes its time
        if turn < len(STEPS):
            args = json.dumps({"language": "bash", "code": STEPS[turn]})
            call = {
                "id": f"call_{turn}",
                "type": "function",
                "function": {"name": "execute_code", "arguments": args},
            }
        else:
            call = {
                "id": f"call_{turn}",
                "type": "function",
                "function": {"name": "submit_results", "arguments": '{"summary": "done"}'},
            }
        prompt, completion = _usage(turn)
        return {
            "id": f"chatcmpl-{turn}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": MODEL,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": None, "tool_calls": [call]},
                    "finish_reason": "tool_calls",
                }
            ],
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
            },
        }


class _Handler(BaseHTTPRequestHandler):
    server: ScriptedModel
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:  # noqa: N802 (the name http.server dispatches to)
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        data = json.dumps(self.server.answer(body)).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()
        self.server.answered_at.append(time.time())

    def log_message(self, *args: object) -> None:
        pass


def test_watch_live_and_checkout_every_step(tmp_path):
    store, work = tmp_path / "store", tmp_path / "work"
    work.mkdir()
    brief = tmp_path / "brief.md"
    brief.write_text("Make a plan, pilot, then write results.\n")
    model = ScriptedModel(work)
    threading.Thread(target=model.serve_forever, daemon=True).start()
    run_id = "watched"

    watch = subprocess.Popen(
        [str(BIN / "amb"), "watch", run_id, "--json", "--interval", "0.1", "--store", str(store)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen: list[tuple[float, dict[str, Any]]] = []

    def read() -> None:
        assert watch.stdout is not None
        for line in watch.stdout:
            seen.append((time.time(), json.loads(line)))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        rec = subprocess.run(
            [
                str(BIN / "amb-record"),
                "--store",
                str(store),
                "--run-id",
                run_id,
                "--shim",
                "--upstream",
                f"openai=http://127.0.0.1:{model.server_address[1]}/v1",
                "--",
                str(BIN / "amb-agent"),
                "--model",
                MODEL,
                "--task-dir",
                str(work),
                "--brief",
                str(brief),
                "--data",
                str(tmp_path),
            ],
            cwd=work,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert rec.returncode == 0, rec.stderr
        watch.wait(timeout=30)  # it exits once the run has finished
    finally:
        if watch.poll() is None:
            watch.kill()
        model.shutdown()
    reader.join(5)
    assert watch.returncode == 0, watch.stderr.read() if watch.stderr else ""
    n_calls = len(STEPS) + 1
    assert model.turn == n_calls

    # amb watch: every call, its tokens and cost, within a second of the model's answer.
    final = seen[-1][1]
    for k in range(1, n_calls + 1):
        answered = model.answered_at[k - 1]
        first = next((t, v) for t, v in seen if v["model_calls"] >= k)
        assert first[0] - answered < 1.0, (k, first[0] - answered)
        tokens_in = sum(_usage(i)[0] for i in range(k))
        tokens_out = sum(_usage(i)[1] for i in range(k))
        # (Two calls can land in one read under load: then only the later count is shown.)
        for view in [v for _, v in seen if v["model_calls"] == k] or ([final] if k == n_calls else []):
            assert (view["tokens"]["input"], view["tokens"]["output"]) == (tokens_in, tokens_out)
            assert view["cost_usd"] == round((tokens_in * PRICE_IN + tokens_out * PRICE_OUT) / 1e6, 6)
            assert view["last_model_call"]["model"] == MODEL
    assert final["status"] == "completed" and final["last_tool_call"]["name"] == "submit_results"
    assert final["processes_exited"] >= len(STEPS)
    # Every file change (write, rename, deletion), within a second of when the kernel dated it.
    con = duckdb.connect(str(store / "amb.duckdb"), read_only=True)
    changes = con.execute(
        "SELECT seq, kind, payload->>'$.path', payload->>'$.dst', CAST(payload->>'$.changed_ns' AS BIGINT) "
        "FROM events WHERE run_id = ? AND kind IN ('file.written', 'file.deleted', 'file.renamed') "
        "ORDER BY seq",
        [run_id],
    ).fetchall()
    con.close()
    assert {k for _, k, *_ in changes} == {"file.written", "file.deleted", "file.renamed"}
    for n, (seq, kind, path, dst, changed_ns) in enumerate(changes, start=1):
        assert changed_ns is not None, (seq, kind)
        shown = next(
            (t, v) for t, v in seen if v["files_written"] + v["files_deleted"] + v["files_renamed"] >= n
        )
        assert shown[0] - changed_ns / 1e9 < 1.0, (seq, kind, path or dst, shown[0] - changed_ns / 1e9)
    assert final["last_file"]["path"] == changes[-1][2] or final["last_file"]["path"] == changes[-1][3]

    # amb checkout at every step boundary reproduces the snapshot taken then, byte for byte.
    runner = CliRunner()
    for step in range(1, n_calls):
        out = tmp_path / f"step-{step}"
        result = runner.invoke(
            cli, ["checkout", run_id, str(out), "--step", str(step), "--store", str(store)]
        )
        assert result.exit_code == 0, result.output
        got = {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file()}
        want = {path: content for path, (content, _) in model.snapshots[step].items()}
        assert got == want, step
    # And the end of the run, before the submission was sealed, is the workspace as it was left.
    out = tmp_path / "final"
    result = runner.invoke(cli, ["checkout", run_id, str(out), "--before-submit", "--store", str(store)])
    assert result.exit_code == 0, result.output
    left = {path: content for path, (content, _) in snapshot(work).items()}
    assert {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file()} == left
    assert os.listdir(work)  # the run really left files behind
