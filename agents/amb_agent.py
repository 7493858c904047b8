"""amb-agent: an AutoMedBench-style agent loop, one model and two tools, over any OpenAI-compatible API.

    amb-agent --model M --task-dir WORKSPACE [--brief FILE] [--data DIR] [--max-turns N]
              [--exec-timeout SEC] [--time-limit SEC] [--tier lite|standard]

The harness of the benchmark (reference section 5.1), rebuilt: its prompt, its two tools
``execute_code {language, code}`` and ``submit_results {summary}``, its output cuts and its stop
rules, as docs/agents-and-sweeps.md describes. Exit status: 0 when the results were submitted, 2
when the loop ended without a submission, 1 when the API failed.

The endpoint and key come from the environment (``OPENAI_BASE_URL``, ``OPENAI_API_KEY``), as for any
agent ``amb-record`` wraps; this program knows nothing of the recorder. It imports only the standard
library and ``openai``, so the file can be shipped into a bare agent container as it is
(``python3 -c "$(cat amb_agent.py)" --model ...``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

STDOUT_KEEP = 3000
STDERR_KEEP = 2000
DEFAULT_DATA = "/data/public"
BRIEF_NAMES = ("tier_prompt.txt", "brief.md")

PREAMBLE = """You are an autonomous medical-AI research agent. You work alone in a sandbox: a workspace
directory you can write, the task's input data (read-only), and a Linux shell with Python. Nobody will
answer questions; decide and act with your tools.

Tools:
- execute_code {language: "python" | "bash", code}: the code is saved to a file in the workspace and run
  there; you get back {exit_code, stdout, stderr} (long output is cut to its end).
- submit_results {summary}: hand in the outputs in the workspace. This ends the run.

Work in five stages and label every code execution with its stage in its first line (e.g. "# S3 pilot"):
S1 plan: read the brief and write your plan to plan/plan.md.
S2 setup: prepare the environment and the method; check the inputs (shape, spacing, values).
S3 validate: run the method on ONE case and check its output before anything else.
S4 inference: run the validated pipeline on every case.
S5 submit: check that every case has a well-formed output in the required place, then call submit_results.

Rules: inference only (no training); read inputs only from the task data folder; write only inside the
workspace; never look for reference answers, private data or the benchmark's own code.
"""

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "execute_code",
            "description": "Run Python or bash code in the workspace; returns exit_code, stdout and stderr.",
            "parameters": {
                "type": "object",
                "properties": {
                    "language": {"type": "string", "enum": ["python", "bash"]},
                    "code": {"type": "string", "description": "The program to run."},
                },
                "required": ["language", "code"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "submit_results",
            "description": "Submit the outputs written in the workspace. Ends the task.",
            "parameters": {
                "type": "object",
                "properties": {
                    "summary": {
                        "type": "string",
                        "description": "What was done and what is in the workspace.",
                    }
                },
                "required": [],
            },
        },
    },
]

KICKOFF = "Begin the task now. Work through S1 to S5 and finish with submit_results."
CONTINUE = "Your last reply was cut off (length limit). Continue, and use a tool call."


def system_prompt(brief: str, workspace: str, data: str, tier: str | None) -> str:
    if data.rstrip("/") != DEFAULT_DATA:
        # Briefs are written for the container layout; point them at where the data really is.
        brief = brief.replace(DEFAULT_DATA + "/", data.rstrip("/") + "/").replace(
            DEFAULT_DATA, data.rstrip("/")
        )
    env = [f"Workspace: {workspace}", f"Task data (read-only): {data}"]
    if tier:
        env.append(f"Tier: {tier}")
    return PREAMBLE + "\n## Environment\n\n" + "\n".join(env) + "\n\n## Task\n\n" + brief.strip() + "\n"


def truncate_tail(text: str, keep: int) -> str:
    if len(text) <= keep:
        return text
    return f"[... {len(text) - keep} characters cut ...]\n" + text[-keep:]


def run_code(
    language: str, code: str, workspace: Path, timeout: float, n: int, report_elapsed: bool = False
) -> dict:
    """Run one execute_code call in the workspace; the AutoMedBench result object."""
    if language not in ("python", "bash"):
        return {"exit_code": 2, "stdout": "", "stderr": f"unknown language {language!r}: use python or bash"}
    suffix = ".py" if language == "python" else ".sh"
    script = workspace / f".amb_exec_{n:04d}{suffix}"
    script.write_text(code, encoding="utf-8")
    argv = [sys.executable, script.name] if language == "python" else ["bash", script.name]
    t0 = time.monotonic()
    try:
        proc = subprocess.run(
            argv, cwd=workspace, capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL
        )
        out: dict[str, Any] = {
            "exit_code": proc.returncode,
            "stdout": proc.stdout.decode("utf-8", "replace"),
            "stderr": proc.stderr.decode("utf-8", "replace"),
        }
    except subprocess.TimeoutExpired as e:
        out = {
            "exit_code": 124,
            "stdout": (e.stdout or b"").decode("utf-8", "replace"),
            "stderr": (e.stderr or b"").decode("utf-8", "replace") + f"\nTIMEOUT: killed after {timeout:g}s",
        }
    finally:
        with contextlib.suppress(OSError):
            script.unlink()
    out["stdout"] = truncate_tail(out["stdout"], STDOUT_KEEP)
    out["stderr"] = truncate_tail(out["stderr"], STDERR_KEEP)
    if report_elapsed:
        out["elapsed_s"] = round(time.monotonic() - t0, 2)
    return out


def _assistant_message(msg) -> dict:
    out: dict = {"role": "assistant", "content": msg.content or ""}
    if msg.tool_calls:
        out["tool_calls"] = [
            {
                "id": tc.id,
                "type": "function",
                "function": {"name": tc.function.name, "arguments": tc.function.arguments or ""},
            }
            for tc in msg.tool_calls
        ]
    return out


def _call(client, args, messages, retry_delay: float):
    for attempt in (1, 2):
        try:
            return client.chat.completions.create(
                model=args.model,
                messages=messages,
                tools=TOOLS,
                tool_choice="auto",
                temperature=0.0,
                max_tokens=args.max_tokens,
            )
        except Exception as e:  # the benchmark's harness retries any API error once
            if attempt == 2:
                raise
            log(f"API error ({type(e).__name__}: {e}); retrying in {retry_delay:g}s")
            time.sleep(retry_delay)


def log(text: str) -> None:
    print(f"amb-agent: {text}", file=sys.stderr, flush=True)


def find_brief(workspace: Path, given: str | None) -> str:
    if given:
        return Path(given).read_text(encoding="utf-8")
    for name in BRIEF_NAMES:
        if (workspace / name).is_file():
            return (workspace / name).read_text(encoding="utf-8")
    raise SystemExit(f"amb-agent: error: no brief: give --brief FILE or put {BRIEF_NAMES[0]} in {workspace}")


def find_data(given: str | None) -> str:
    """The task's input folder: --data, else $AMB_DATA (set by ``amb-record --data``), else the
    container's /data/public. A folder that is not there ends the run before its first call: an
    agent that cannot see its inputs has nothing to do, and must not end as if it had done it."""
    data = given or os.environ.get("AMB_DATA") or DEFAULT_DATA
    if not Path(data).is_dir():
        where = "--data" if given else ("$AMB_DATA" if os.environ.get("AMB_DATA") else "the default")
        raise SystemExit(
            f"amb-agent: error: no task data at {data} ({where}): give --data DIR, or record with "
            "amb-record --data DIR (it sets AMB_DATA)"
        )
    return data


def run(args) -> int:
    import openai

    workspace = Path(args.task_dir).resolve()
    if not workspace.is_dir():
        raise SystemExit(f"amb-agent: error: --task-dir {args.task_dir}: not a directory")
    brief = find_brief(workspace, args.brief)
    data = find_data(args.data)
    tier = args.tier or os.environ.get("AMB_TIER")
    messages: list[dict] = [
        {"role": "system", "content": system_prompt(brief, str(workspace), data, tier)},
        {"role": "user", "content": KICKOFF},
    ]
    client = openai.OpenAI(max_retries=0, timeout=args.api_timeout)
    t0 = time.monotonic()
    n_exec = 0
    for turn in range(1, args.max_turns + 1):
        if args.time_limit and time.monotonic() - t0 > args.time_limit:
            log(
                f"time limit of {args.time_limit:g}s reached after {turn - 1} turns; stopping without "
                "a submission"
            )
            return 2
        try:
            resp = _call(client, args, messages, args.retry_delay)
        except Exception as e:
            log(f"API failed twice ({type(e).__name__}: {e}); giving up")
            return 1
        choice = resp.choices[0]
        msg = choice.message
        messages.append(_assistant_message(msg))
        calls = msg.tool_calls or []
        log(
            f"turn {turn}: {', '.join(tc.function.name for tc in calls) or 'no tool call'}"
            + (f" [{choice.finish_reason}]" if choice.finish_reason not in ("tool_calls", "stop") else "")
        )
        if not calls:
            if choice.finish_reason == "length":
                messages.append({"role": "user", "content": CONTINUE})
                continue
            log("the model replied without a tool call; stopping without a submission")
            return 2
        submitted = False
        for tc in calls:
            name = tc.function.name
            try:
                fargs = json.loads(tc.function.arguments or "{}")
                if not isinstance(fargs, dict):
                    raise ValueError("arguments must be a JSON object")
            except ValueError as e:
                result = {"exit_code": 2, "stdout": "", "stderr": f"invalid JSON arguments for {name}: {e}"}
            else:
                if name == "execute_code":
                    n_exec += 1
                    result = run_code(
                        str(fargs.get("language", "python")),
                        str(fargs.get("code", "")),
                        workspace,
                        args.exec_timeout,
                        n_exec,
                        args.report_elapsed,
                    )
                elif name == "submit_results":
                    submitted = True
                    result = {"status": "ACCEPTED", "summary": str(fargs.get("summary", ""))[:2000]}
                else:
                    result = {"exit_code": 2, "stdout": "", "stderr": f"unknown tool {name!r}"}
            messages.append({"role": "tool", "tool_call_id": tc.id, "content": json.dumps(result)})
        if submitted:
            log(f"results submitted after {turn} turns ({n_exec} code executions)")
            return 0
    log(f"turn cap of {args.max_turns} reached without a submission")
    return 2


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="amb-agent", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="Model name sent to the endpoint.")
    p.add_argument(
        "--task-dir", required=True, help="The workspace: code runs here, outputs are written here."
    )
    p.add_argument("--brief", default=None, help="The brief (default: tier_prompt.txt in the workspace).")
    p.add_argument("--data", default=None, help=f"Task inputs (default: $AMB_DATA or {DEFAULT_DATA}).")
    p.add_argument(
        "--tier",
        choices=["lite", "standard"],
        default=None,
        help="Stated in the prompt (default: $AMB_TIER).",
    )
    p.add_argument("--max-turns", type=int, default=150, help="API calls before giving up (default 150).")
    p.add_argument(
        "--exec-timeout", type=float, default=600.0, help="Seconds per execute_code (default 600)."
    )
    p.add_argument(
        "--time-limit", type=float, default=None, help="Stop starting new turns after SEC seconds."
    )
    p.add_argument("--max-tokens", type=int, default=4096)
    p.add_argument("--api-timeout", type=float, default=600.0)
    p.add_argument(
        "--report-elapsed",
        action="store_true",
        help="Add elapsed_s (wall seconds) to each execute_code result, as the enhancement harness does.",
    )
    p.add_argument(
        "--retry-delay", type=float, default=5.0, help="Pause before the one retry of a failed call."
    )
    return p


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    if args.max_turns < 1:
        raise SystemExit("amb-agent: error: --max-turns must be at least 1")
    sys.exit(run(args))


if __name__ == "__main__":
    main()
