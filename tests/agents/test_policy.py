"""The scripted policy, driven turn by turn with its code really executed, on real task twins.

The loop here is amb-agent's own (``system_prompt`` and ``run_code``), minus HTTP: each decision's
code runs in a workspace and its result goes back into the conversation, so what is tested is what
the policy decides from what it sees. Outputs are graded by the real grader.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from agents.amb_agent import KICKOFF, run_code, system_prompt
from agents.baseline.policy import FLAWS, PolicyError, decide
from scorer.grader import grade
from tasks.registry import brief, load_spec
from tasks.synth import synth

ONE_PER_TRACK = ["kidney-seg", "ldct-denoising", "vqa-rad", "mimic-cxr-report", "bccd-det"]


@pytest.fixture(scope="module")
def twins(tmp_path_factory):
    root = tmp_path_factory.mktemp("twins")
    for task in ONE_PER_TRACK + ["feta-seg", "mri-sr", "medxpertqa-mm"]:
        synth(load_spec(task), root / task, cases=2, seed=5)
    return root


def drive(task: str, tier: str, data: Path, ws: Path, flaw: str | None = None, max_turns: int = 30):
    """Run the policy to its submission; returns (steps taken, messages)."""
    ws.mkdir(parents=True, exist_ok=True)
    (ws / "tier_prompt.txt").write_text(brief(task, tier))
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": system_prompt(brief(task, tier), str(ws), str(data / "public"), tier)},
        {"role": "user", "content": KICKOFF},
    ]
    steps: list[tuple[str, Any, dict[str, Any]]] = []
    for turn in range(max_turns):
        d = decide(messages, flaw)
        calls: list[dict[str, Any]] = [
            {
                "id": f"c{turn}_{k}",
                "type": "function",
                "function": {"name": tc.name, "arguments": json.dumps(tc.arguments)},
            }
            for k, tc in enumerate(d.tool_calls)
        ]
        messages.append(
            {"role": "assistant", "content": d.content, **({"tool_calls": calls} if calls else {})}
        )
        if not calls:
            break
        for call, tc in zip(calls, d.tool_calls, strict=False):
            if tc.name == "submit_results":
                steps.append(("submit", None, tc.arguments))
                return steps, messages
            result = run_code(tc.arguments["language"], tc.arguments["code"], ws, 120, turn)
            marker = re.match(r"#\s*S\d\s+(\w+)", tc.arguments["code"])
            assert marker is not None, tc.arguments["code"]
            step = marker.group(1)
            steps.append((step, result, tc.arguments))
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": json.dumps(result)})
    raise AssertionError(f"no submission after {max_turns} turns: {[s[0] for s in steps]}")


@pytest.mark.parametrize("task", ONE_PER_TRACK + ["feta-seg", "mri-sr", "medxpertqa-mm"])
def test_clean_policy_does_the_work_and_scores(task, twins, tmp_path):
    steps, _ = drive(task, "lite", twins / task, tmp_path / "ws")
    names = [s[0] for s in steps]
    assert names == [
        "explore",
        "plan",
        "env",
        "setup",
        "inspect",
        "pilot",
        "pilot_check",
        "batch",
        "verify",
        "submit",
    ]
    assert all(r["exit_code"] == 0 for _, r, _ in steps if r is not None), [
        (n, r) for n, r, _ in steps if r and r["exit_code"]
    ]
    assert "CASE " in steps[0][1]["stdout"]
    assert (tmp_path / "ws" / "plan" / "plan.md").is_file()
    result = grade(load_spec(task), tmp_path / "ws", twins / task / "private")
    assert [c.status for c in result.cases] == ["scored", "scored"]
    if load_spec(task).track in ("segmentation", "enhancement", "detection", "report"):
        assert result.score > 0.0, result  # computed from the image: some overlap, similarity or text match


def test_standard_tier_draws_the_plan(twins, tmp_path):
    steps, _ = drive("bccd-det", "standard", twins / "bccd-det", tmp_path / "ws")
    plan = (tmp_path / "ws" / "plan" / "plan.md").read_text()
    assert "| candidate |" in plan and plan.count("\n| ") >= 4
    assert (tmp_path / "ws" / "plan" / "plan.png").read_bytes().startswith(b"\x89PNG")


def test_no_pilot_skips_validation(twins, tmp_path):
    names = [s[0] for s in drive("kidney-seg", "lite", twins / "kidney-seg", tmp_path / "ws", "no-pilot")[0]]
    assert "pilot" not in names and "pilot_check" not in names and "batch" in names


def test_wrong_filename_leaves_every_case_missing(twins, tmp_path):
    drive("bccd-det", "lite", twins / "bccd-det", tmp_path / "ws", "wrong-filename")
    result = grade(load_spec("bccd-det"), tmp_path / "ws", twins / "bccd-det" / "private")
    assert result.score == 0.0 and {c.status for c in result.cases} == {"missing"}
    assert list((tmp_path / "ws" / "agents_outputs").glob("*/pred_prediction.json"))


def test_crash_mid_batch_is_not_recovered(twins, tmp_path):
    steps, _ = drive("ldct-denoising", "lite", twins / "ldct-denoising", tmp_path / "ws", "crash-mid-batch")
    batch = [r for n, r, _ in steps if n == "batch"][0]
    assert batch["exit_code"] != 0 and "Traceback" in batch["stderr"]
    assert "batch_retry" not in [n for n, _, _ in steps]
    result = grade(load_spec("ldct-denoising"), tmp_path / "ws", twins / "ldct-denoising" / "private")
    assert [c.status for c in result.cases] == ["scored", "missing"]


def test_clean_policy_reruns_cases_a_batch_failed(twins, tmp_path):
    # The clean policy, shown a batch that failed on a case, re-runs the missing ones.
    ws = tmp_path / "ws"
    steps, messages = drive("vqa-rad", "lite", twins / "vqa-rad", ws)
    at = next(i for i, m in enumerate(messages) if m["role"] == "assistant" and "S4 batch" in json.dumps(m))
    failed = {
        "exit_code": 0,
        "stdout": 'RESULT {"done": [], "failed": {"vqarad_0001": "OSError: disk"}, "n": 2}',
        "stderr": "",
    }
    convo = messages[: at + 1] + [
        {"role": "tool", "tool_call_id": messages[at]["tool_calls"][0]["id"], "content": json.dumps(failed)}
    ]
    nxt = decide(convo)
    assert nxt.tool_calls and nxt.tool_calls[0].arguments["code"].startswith("# S4 batch_retry")


def test_hand_written_answers_run_no_method(twins, tmp_path):
    steps, _ = drive("vqa-rad", "lite", twins / "vqa-rad", tmp_path / "ws", "hand-written")
    code = "\n".join(a.get("code", "") for _, _, a in steps)
    assert "run_case" not in code and "handwrite" in [n for n, _, _ in steps]  # not even defined
    answers = [json.loads(p.read_text())["predicted_answer"] for p in (tmp_path / "ws").glob("*/answer.json")]
    assert answers == ["yes", "yes"]


def test_private_path_names_the_reference_folder(twins, tmp_path):
    steps, _ = drive("kidney-seg", "lite", twins / "kidney-seg", tmp_path / "ws", "private-path")
    peek = [a["code"] for n, _, a in steps if n == "peek_reference"]
    assert peek and str(twins / "kidney-seg" / "private") in peek[0]


def test_a_failed_step_is_retried_once_then_passed(twins, tmp_path):
    ws = tmp_path / "ws"
    _, messages = drive("kidney-seg", "lite", twins / "kidney-seg", ws)
    at = next(i for i, m in enumerate(messages) if m["role"] == "assistant" and "S2 env" in json.dumps(m))
    bad = json.dumps(
        {"exit_code": 1, "stdout": "", "stderr": "Traceback (most recent call last):\nOSError: no space"}
    )
    convo = messages[: at + 1] + [
        {"role": "tool", "tool_call_id": messages[at]["tool_calls"][0]["id"], "content": bad}
    ]
    again = decide(convo)
    assert again.tool_calls[0].arguments["code"].startswith("# S2 env")
    convo += [
        {
            "role": "assistant",
            "content": again.content,
            "tool_calls": [
                {
                    "id": "x",
                    "type": "function",
                    "function": {
                        "name": "execute_code",
                        "arguments": json.dumps(again.tool_calls[0].arguments),
                    },
                }
            ],
        },
        {"role": "tool", "tool_call_id": "x", "content": bad},
    ]
    assert decide(convo).tool_calls[0].arguments["code"].startswith("# S2 setup")


def test_unknown_brief_and_flaw_are_clear_errors():
    with pytest.raises(PolicyError, match="no task brief"):
        decide([{"role": "system", "content": "Write a poem."}, {"role": "user", "content": "go"}])
    with pytest.raises(PolicyError, match="unknown flaw"):
        decide([{"role": "user", "content": "x"}], "lazy")
    assert len(FLAWS) == 5
