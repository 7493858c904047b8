"""AutoMedBench run folders, built by hand from each branch's writer code (none of it could run here:
the loops need conda, GPUs and OpenRouter). Each writer below follows, record by record, the code
named in its docstring (AutoMedBench, last commit on the mirror ``6f1affc``): the same file names,
keys, key order, rounding and cuts. The agent in every fixture does the same small job: look at the
data, write a plan, write the outputs (a perfect submission from the task's synthetic twin, minus
``drop`` cases), then submit.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from tasks import synth
from tasks.registry import load_spec

TOOLS_SEG = ["execute_code", "submit_results"]


def _dump_lines(path: Path, records: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for r in records:
            f.write(json.dumps(r, default=str) + "\n")


def _dump(path: Path, obj: Any, indent: int | None = 2) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=indent, default=str))


def _dump_process(
    run: Path, conversation: dict[str, Any] | None = None, **logs: list[dict[str, Any]]
) -> None:
    """A run's ``process/`` folder: each log as ``<name>.jsonl`` and ``conversation.json``."""
    for name, records in logs.items():
        _dump_lines(run / "process" / f"{name}.jsonl", records)
    if conversation is not None:
        _dump(run / "process" / "conversation.json", conversation)


def _code_call(call_id: str, content: str, args: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """The assistant's message calling ``execute_code`` once, in the Chat Completions shape."""
    call = {
        "id": call_id,
        "type": "function",
        "function": {"name": "execute_code", "arguments": json.dumps(args)},
    }
    return {"role": "assistant", "content": content, **extra, "tool_calls": [call]}


def twin(task: str, tmp: Path, cases: int = 3) -> Path:
    data = tmp / "data" / task
    if not data.exists():
        synth.synth(load_spec(task), data, cases=cases, seed=7)
    return data


def submission(task: str, data: Path, workspace: Path, drop: int = 0) -> list[str]:
    """The twin's perfect submission in ``workspace``, with the first ``drop`` cases removed."""
    spec = load_spec(task)
    synth.perfect_submission(spec, data, workspace)
    root = workspace / spec.submission.root
    cases = sorted(p.name for p in root.iterdir() if p.is_dir() and p.name not in ("plan",))
    for case in cases[:drop]:
        shutil.rmtree(root / case)
    return cases


class Script:
    """A scripted agent: per turn, (assistant text, [(tool, arguments)], finish_reason)."""

    def __init__(self, turns: list[tuple[str, list[tuple[str, dict[str, Any]]], str]]):
        self.turns = turns


def seg_local(
    out: Path,
    task: str,
    organ: str,
    tmp: Path,
    *,
    det: bool = False,
    drop: int = 0,
    final_answer_without_tools: bool = False,
    tag: str = "260412-3fa9c1",
) -> Path:
    """``eval_seg/benchmark_runner.py`` (and ``eval_det2d``'s copy) ``BenchmarkRunner.run``: run dir
    ``<out>/runs/<tier>/<agent>/<task>/<YYMMDD>-<6hex>``; ``process/trace.jsonl`` via ``_trace`` (ts
    rounded to 2 places), ``process/tool_calls.jsonl`` via ``_log_tool_call``, ``conversation.json``
    with ``indent=2`` and the organ as ``task``; outputs copied to ``outputs/``; ``detail_report.json``.
    """
    run = out / "runs" / "lite" / "opus-4.6" / f"{task}-task" / tag
    data = twin(task, tmp)
    ws = run / "outputs"
    system = f"You are a medical AI agent. ... ## Task\nSegment the {organ} and its tumours. ..."
    kickoff = "Begin. The model architecture has been chosen for you. Work through S1-S5."
    messages: list[dict[str, Any]] = [{"role": "user", "content": kickoff}]
    trace: list[dict[str, Any]] = []
    tools: list[dict[str, Any]] = []
    code_executions: list[dict[str, Any]] = []
    t = 0.0
    total_in = total_out = api_calls = 0
    steps = [
        ("I'll inspect the data.", "bash", "ls /data/public"),
        ("Writing the plan.", "bash", "mkdir -p plan && echo '# Plan' > plan/plan.md"),
        ("Running inference on every case.", "python", "# S4: inference\nrun_all()"),
    ]
    cases = submission(task, data, ws, drop=drop)
    (ws / "plan").mkdir(parents=True, exist_ok=True)
    (ws / "plan" / "plan.md").write_text("# Plan\n1. inspect\n2. infer\n")
    turn = 0
    for turn, (text, lang, code) in enumerate(steps):
        t += 3.21
        api_calls += 1
        tin, tout = 1800 + 700 * turn, 120 + turn
        total_in += tin
        total_out += tout
        trace.append(
            {
                "ts": round(t, 2),
                "type": "api_call",
                "turn": turn + 1,
                "input_tokens": tin,
                "output_tokens": tout,
                "finish_reason": "tool_calls",
                "tool_calls": ["execute_code"],
                "content_preview": text[:300],
            }
        )
        call_id = f"toolu_{turn + 1:02d}"
        args = {"language": lang, "code": code}
        thinking = [{"type": "reasoning.text", "text": f"thinking {turn}"}]
        messages.append(_code_call(call_id, text, args, reasoning_details=thinking))
        stdout = "\n".join(cases) + "\n" if turn == 0 else ""
        result = {"exit_code": 0, "stdout": stdout, "stderr": ""}
        t += 1.04
        exec_time = 1.0
        code_executions.append(
            {
                "turn": turn + 1,
                "language": lang,
                "code": code,
                "exit_code": 0,
                "exec_time_s": exec_time,
                "stdout_preview": stdout[:200],
            }
        )
        trace.append(
            {
                "ts": round(t, 2),
                "type": "code_exec",
                "turn": turn + 1,
                "language": lang,
                "exit_code": 0,
                "exec_time_s": exec_time,
                "code_lines": code.count("\n") + 1,
                "stdout_len": len(stdout),
                "stderr_len": 0,
            }
        )
        tools.append(
            {
                "ts": round(t, 2),
                "turn": turn + 1,
                "tool": "execute_code",
                "arguments": args,
                "result": result,
                "exec_time_s": exec_time,
            }
        )
        messages.append({"role": "tool", "tool_call_id": call_id, "content": json.dumps(result)})
    turn += 1
    t += 2.5
    api_calls += 1
    total_in += 4000
    total_out += 40
    submitted = False
    # The last call: either an answer without tool calls (the loop breaks before appending it: only
    # its preview survives) or the call to submit_results.
    trace.append(
        {
            "ts": round(t, 2),
            "type": "api_call",
            "turn": turn + 1,
            "input_tokens": 4000,
            "output_tokens": 40,
            "finish_reason": "stop" if final_answer_without_tools else "tool_calls",
            "tool_calls": [] if final_answer_without_tools else ["submit_results"],
            "content_preview": "All masks are written. I am done." if final_answer_without_tools else "",
        }
    )
    if not final_answer_without_tools:
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "toolu_99",
                        "type": "function",
                        "function": {"name": "submit_results", "arguments": "{}"},
                    }
                ],
            }
        )
        key = "missing_predictions" if det else "missing_masks"
        check = {key: [], "complete": True}
        trace.append({"ts": round(t, 2), "type": "submit", **check})
        tools.append(
            {"ts": round(t, 2), "turn": turn + 1, "tool": "submit_results", "arguments": {}, "result": check}
        )
        messages.append({"role": "tool", "tool_call_id": "toolu_99", "content": json.dumps(check)})
        submitted = True
    trace.append(
        {
            "ts": round(t + 0.5, 2),
            "type": "run_end",
            "wall_time_s": round(t + 0.5, 2),
            "api_calls": api_calls,
            "total_in": total_in,
            "total_out": total_out,
            "submitted": submitted,
        }
    )
    _dump_process(
        run,
        {
            "agent": "opus-4.6",
            "model": "anthropic/claude-opus-4.6",
            "task": organ,
            "tier": "lite",
            "system_prompt": system,
            "messages": messages,
            "code_executions": code_executions,
            "trace_events": len(trace),
        },
        trace=trace,
        tool_calls=tools,
    )
    # The code's completeness rule (the project's code-2026-04 profile: all or nothing): any
    # missing case zeroes the clinical score.
    score = 0.0 if drop else 1.0
    clinical = (
        {"score": score, "micro_precision": score, "micro_recall": score, "iou_threshold": 0.5}
        if det
        else {"score": score, "organ_dice": score, "lesion_dice": score}
    )
    _dump(
        run / "detail_report.json",
        {
            "header": {
                "agent": "opus-4.6",
                "model": "anthropic/claude-opus-4.6",
                "task": organ,
                "organ": organ,
                "date": "2026-04-12 09:41 UTC",
                "tier": "lite",
            },
            "runtime": {
                "wall_time_s": round(t + 0.5, 2),
                "api_calls": api_calls,
                "input_tokens": total_in,
                "output_tokens": total_out,
                "total_tokens": total_in + total_out,
                "estimated_cost_usd": 0.1,
                "code_executions": len(code_executions),
            },
            "agentic_score": {
                "score": 0.8,
                "step_scores": {"s1": 1.0, "s2": 1.0, "s3": 0.5, "s4": 1.0, "s5": 1.0},
            },
            "clinical_score": clinical,
            "format": {
                "submission_valid": True,
                "csv_valid": True,
                ("predictions_valid" if det else "masks_valid"): True,
            },
        },
    )
    (run / "run.log").write_text("MedAgentsBench — LITE tier\n")
    return run


def seg_docker_breach(out: Path, task: str, tmp: Path, tag: str = "20260412_094100") -> Path:
    """``docker/agent/agent_loop.py`` of ``eval_seg`` when the second violation kills the agent
    (``sys.exit(99)``): ``trace.jsonl`` and ``tool_calls.jsonl`` exist, ``conversation.json`` does
    not; the orchestrator moved them to ``process/`` and left ``outputs/tier_prompt.txt``."""
    run = out / "runs" / "lite" / "opus-4.6" / f"{task}-task" / tag
    trace = [
        {
            "ts": 2.1,
            "type": "api_call",
            "turn": 1,
            "input_tokens": 1500,
            "output_tokens": 80,
            "finish_reason": "tool_calls",
            "tool_calls": ["execute_code"],
            "content_preview": "Looking around.",
        },
        {
            "ts": 2.3,
            "type": "code_exec",
            "turn": 1,
            "language": "bash",
            "exit_code": -1,
            "exec_time_s": 0.0,
            "code_lines": 1,
            "stdout_len": 0,
            "stderr_len": 40,
        },
        {
            "ts": 2.3,
            "type": "violation_warning",
            "turn": 1,
            "warning_number": 1,
            "violation": "BLOCKED: access to /data/private",
        },
        {
            "ts": 4.6,
            "type": "api_call",
            "turn": 2,
            "input_tokens": 1900,
            "output_tokens": 60,
            "finish_reason": "tool_calls",
            "tool_calls": ["execute_code"],
            "content_preview": "Trying again.",
        },
        {
            "ts": 4.7,
            "type": "code_exec",
            "turn": 2,
            "language": "bash",
            "exit_code": -1,
            "exec_time_s": 0.0,
            "code_lines": 1,
            "stdout_len": 0,
            "stderr_len": 40,
        },
        {
            "ts": 4.7,
            "type": "isolation_breach",
            "turn": 2,
            "violation": "BLOCKED: access to /eval",
            "penalty": "zero_all_remaining_scores",
            "prior_warnings": 1,
        },
    ]
    tools = [
        {
            "ts": 2.3,
            "turn": 1,
            "tool": "execute_code",
            "arguments": {"language": "bash", "code": "ls /data/private"},
            "result": {"exit_code": -1, "stdout": "", "stderr": "BLOCKED: access to /data/private"},
            "exec_time_s": 0.0,
        },
        {
            "ts": 4.7,
            "turn": 2,
            "tool": "execute_code",
            "arguments": {"language": "bash", "code": "cat /eval/x"},
            "result": {"exit_code": -1, "stdout": "", "stderr": "BLOCKED: access to /eval"},
            "exec_time_s": 0.0,
        },
    ]
    _dump_process(run, trace=trace, tool_calls=tools)
    (run / "outputs").mkdir(parents=True)
    (run / "outputs" / "tier_prompt.txt").write_text("You are a medical AI agent (docker).")
    return run


def vqa(out: Path, task: str, tmp: Path, *, drop: int = 0) -> Path:
    """``eval_vqa/benchmark_runner.py``: ``--output-dir`` used as is; ``trace.jsonl`` holds only
    ``api_call`` records (ts at 4 places, ``turn`` = len(code_executions)+1, ``tool_calls_recovered``);
    ``conversation.json`` has no system prompt; ``report.json`` wraps ``detail_report``;
    ``outputs/run_summary.json``, ``outputs/<qid>/answer.json``; ``public_data/`` links to the
    question folders (outside the run folder)."""
    run = out / "vqa-run-r01"
    data = twin(task, tmp)
    ws = run / "outputs"
    qids = submission(task, data, ws, drop=drop)
    (run / "public_data").mkdir(parents=True)
    for q in qids:
        (run / "public_data" / q).symlink_to(data / "public" / q)
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "Answer every question with submit_answer."}
    ]
    trace: list[dict[str, Any]] = []
    tools: list[dict[str, Any]] = []
    code_executions: list[dict[str, Any]] = []
    t = 0.0
    for i in range(2):
        t += 1.2345
        code = "from medbench_vqa import submit_answer\nsubmit_answer(...)"
        trace.append(
            {
                "ts": round(t, 4),
                "type": "api_call",
                "turn": len(code_executions) + 1,
                "input_tokens": 900 + i,
                "output_tokens": 50,
                "finish_reason": "tool_calls",
                "tool_calls": ["execute_code"],
                "content_preview": f"step {i}",
                "tool_calls_recovered": False,
            }
        )
        result = {"exit_code": 0, "stdout": "ok\n", "stderr": ""}
        cid = f"call_{i}"
        messages.append(_code_call(cid, f"step {i}", {"language": "python", "code": code}))
        messages.append({"role": "tool", "tool_call_id": cid, "content": json.dumps(result)})
        code_executions.append({"turn": i + 1, "language": "python", "code": code, "exit_code": 0})
        tools.append(
            {
                "ts": round(t, 4),
                "turn": i + 1,
                "tool": "execute_code",
                "arguments": {"language": "python", "code": code},
                "result": result,
                "exec_time_s": 0.4,
            }
        )
    t += 1.0
    trace.append(
        {
            "ts": round(t, 4),
            "type": "api_call",
            "turn": 3,
            "input_tokens": 1200,
            "output_tokens": 20,
            "finish_reason": "stop",
            "tool_calls": [],
            "content_preview": "Done.",
            "tool_calls_recovered": False,
        }
    )
    messages.append({"role": "assistant", "content": "Done."})
    _dump_process(
        run,
        {
            "agent": "gpt-5",
            "model": "openai/gpt-5",
            "task": f"{task}-task",
            "tier": "lite",
            "messages": messages,
            "artifacts_dir": "/workspace/outputs",
            "run_dir": str(run),
            "code_executions": code_executions,
            "trace_events": len(trace),
            "fail_fast_reason": None,
            "api_calls": 3,
            "length_finish_count": 0,
            "length_finish_rate": 0.0,
        },
        trace=trace,
        tool_calls=tools,
    )
    n = len(qids)
    accuracy = (n - drop) / n
    detail = {
        "header": {"agent": "gpt-5", "task": f"{task}-task", "tier": "lite"},
        "task_metrics": {"accuracy": accuracy, "completion_rate": accuracy},
        "task_score": {"score": accuracy},
    }
    _dump(
        run / "report.json",
        {
            "generated_at": "2026-04-12T10:00:00Z",
            "task": f"{task}-task",
            "tier": "lite",
            "agent": "gpt-5",
            "model_name": "openai/gpt-5",
            "question_ids": qids,
            "eval_report": {},
            "detail_report": detail,
        },
    )
    _dump(ws / "run_summary.json", {"started_at": "2026-04-12T10:00:00Z", "ended_at": "2026-04-12T10:00:05Z"})
    _dump_lines(
        ws / "tool_calls.jsonl",
        [
            {
                "ts": 1776002400.1234,
                "tool": "submit_answer",
                "source": "medbench_vqa_helper",
                "arguments": {},
                "result_summary": "ok",
            }
        ],
    )
    return run


def report_gen(out: Path, task: str, tmp: Path, tag: str = "260412-aa11bb") -> Path:
    """``eval_report_gen/benchmark_runner.py``: ``trace.jsonl`` of ``{turn, type, tool_calls,
    finish_reason, content, content_preview(200)}`` (no ts, no tokens); ``api_responses.jsonl`` one
    line per turn with the whole history; ``tool_calls.jsonl`` without ts; conversation without
    system prompt (it is in ``outputs/tier_prompt.txt``); reports under ``outputs/agent_outputs``."""
    run = out / tag
    data = twin(task, tmp)
    ws = run / "outputs"
    submission(task, data, ws)
    (ws / "tier_prompt.txt").parent.mkdir(parents=True, exist_ok=True)
    (ws / "tier_prompt.txt").write_text("You write radiology reports.")
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Write a report per case."}]
    trace, api, tools = [], [], []
    for turn in range(1, 3):
        args = {"language": "python", "code": f"write_reports({turn})"}
        cid = f"c{turn}"
        content = f"Turn {turn}: writing reports."
        api.append(
            {
                "turn": turn,
                "request": {
                    "model": "qwen/qwen3",
                    "base_url": None,
                    "temperature": 0.0,
                    "max_tokens": 4096,
                    "message_count": len(messages) + 1,
                    "messages": list(messages),
                    "tools": [],
                },
                "response": {
                    "content": content,
                    "tool_calls": [{"id": cid, "name": "execute_code", "arguments": args}],
                    "finish_reason": "tool_calls",
                    "input_tokens": 700 * turn,
                    "output_tokens": 30,
                },
            }
        )
        trace.append(
            {
                "turn": turn,
                "type": "api_call",
                "tool_calls": ["execute_code"],
                "finish_reason": "tool_calls",
                "content": content,
                "content_preview": content[:200],
            }
        )
        messages.append(_code_call(cid, content, args))
        result = {"exit_code": 0, "stdout": "x" * 5000, "stderr": ""}  # report-gen does not cut
        tools.append({"turn": turn, "tool": "execute_code", "arguments": args, "result": result})
        messages.append({"role": "tool", "tool_call_id": cid, "content": json.dumps(result)})
    _dump_process(
        run,
        {
            "agent": "qwen3",
            "model": "qwen/qwen3",
            "task": f"{task}-task",
            "tier": "lite",
            "messages": messages,
            "code_executions": [],
            "artifact_paths": [],
        },
        trace=trace,
        api_responses=api,
        tool_calls=tools,
    )
    _dump(
        run / "detail_report.json",
        {
            "header": {
                "agent": "qwen3",
                "task": f"{task}-task",
                "tier": "lite",
                "date": "2026-04-12 10:00 UTC",
            },
            "clinical_score": {"score": 0.71},
            "format": {"submission_valid": True, "reports_valid": True},
        },
    )
    return run


def enhancement(out: Path, task: str, tmp: Path) -> Path:
    """``eval_image_enhancement/docker/agent/agent_loop.py`` + orchestrator: run dir
    ``runs/v5_<task>_<tier>_<agent>_r<k>_<YYYYmmddTHHMMSS>``; ``workspace/process/trace.jsonl`` with
    running-total ``prompt_tokens``/``completion_tokens``, ``tool_log.jsonl``, ``agent_summary.json``,
    ``conversation.json`` as a bare message list; ``process/system_prompt.md``; outputs under
    ``workspace/agents_outputs``; the eval container's ``detail_report.json``."""
    run = out / "runs" / f"v5_{task}-task_lite_gpt-5_r1_20260412T101500"
    data = twin(task, tmp)
    ws = run / "workspace"
    submission(task, data, ws)
    (run / "process").mkdir(parents=True)
    (run / "process" / "system_prompt.md").write_text("# Denoise every case\n")
    (ws / "tier_prompt.txt").write_text("tier prompt")
    (ws / "kickoff.txt").write_text("Begin.")
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Begin."}]
    trace, log = [], []
    run_in = run_out = 0
    t = 0.0
    for turn in range(1, 3):
        run_in += 1000 * turn
        run_out += 50
        t += 4.5
        code = f"denoise_all({turn})"
        cid = f"call_{turn}"
        trace.append(
            {
                "ts": round(t, 2),
                "turn": turn,
                "api_s": 2.5,
                "prompt_tokens": run_in,
                "completion_tokens": run_out,
                "tool_calls": ["execute_code"],
            }
        )
        messages.append(_code_call(cid, "", {"language": "python", "code": code}))
        result = {"exit_code": 0, "stdout": "done\n", "stderr": "", "elapsed_s": 1.5}
        log.append(
            {
                "turn": turn,
                "name": "execute_code",
                "language": "python",
                "code": code,
                "result": result,
                "elapsed_s": 1.5,
            }
        )
        messages.append({"role": "tool", "tool_call_id": cid, "content": json.dumps(result)})
    run_in += 3000
    run_out += 10
    t += 3
    trace.append(
        {
            "ts": round(t, 2),
            "turn": 3,
            "api_s": 1.0,
            "prompt_tokens": run_in,
            "completion_tokens": run_out,
            "tool_calls": ["submit"],
        }
    )
    messages.append(
        {
            "role": "assistant",
            "content": "Submitting.",
            "tool_calls": [
                {"id": "call_s", "type": "function", "function": {"name": "submit", "arguments": "{}"}}
            ],
        }
    )
    log.append(
        {
            "turn": 3,
            "name": "submit",
            "args": {},
            "accepted": True,
            "pre": {"n_valid": 3, "n_patients_expected": 3},
        }
    )
    messages.append({"role": "tool", "tool_call_id": "call_s", "content": "ACCEPTED 3/3"})
    proc = ws / "process"
    _dump_lines(proc / "trace.jsonl", trace)
    _dump_lines(proc / "tool_log.jsonl", log)
    summary = {
        "agent": "gpt-5",
        "model": "openai/gpt-5",
        "task": f"{task}-task",
        "tier": "lite",
        "repeat_idx": 1,
        "turns": 3,
        "elapsed_s": round(t, 2),
        "n_api_calls": 3,
        "prompt_tokens": run_in,
        "completion_tokens": run_out,
        "submitted": True,
        "aborted": False,
    }
    _dump(proc / "agent_summary.json", summary)
    _dump(proc / "conversation.json", messages)
    _dump(
        run / "detail_report.json",
        {
            "agent": "gpt-5",
            "task": f"{task}-task",
            "tier": "lite",
            "scores": {"mean_psnr": 40.0, "mean_ssim": 1.0},
            "agent_summary": summary,
        },
    )
    return run
