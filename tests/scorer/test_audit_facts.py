"""The auditor judges facts, not strings: argv, cwd, every file event, URLs; normalised paths;
shell-obfuscated paths; other runs' data; every finding cites its events."""

from __future__ import annotations

import pytest

from schemas.events import (
    FileAccessed,
    FileDeleted,
    FileRenamed,
    FileWritten,
    NetworkRequest,
    ProcessExited,
    RunStarted,
    ToolCallRequested,
    ToolCallResult,
)
from schemas.ostext import os_text
from scorer import audit
from scorer.audit_paths import arg_paths, normalise, path_tokens, shell_words
from scorer.profile import load
from scorer.trajectory import fold
from tests.fakes.events import unsigned_events

RULES = load("paper-2026-06").profile.audit
RUN = "20261201T120000-aaaaaa"
OTHER = "20261130T090000-bbbbbb"
DOCKER = RunStarted(task="kidney-seg", tier="lite", workspace="/workspace", backend="docker")


def audited(*payloads, start=DOCKER):
    evs = unsigned_events(RUN, "shim", [start, *payloads], start_ns=1000)
    return audit.audit(fold(RUN, evs, lambda r: b""), RULES)


def proc(*argv, cwd="/workspace"):
    return ProcessExited(pid=7, argv=list(argv), cwd=cwd, exit_code=0, tracer="seccomp-notify")


def tool_call(code):
    import json

    return [
        ToolCallRequested(
            tool_call_id="t", name="execute_code", arguments=json.dumps({"code": code}), model_call_id="c"
        ),
        ToolCallResult(tool_call_id="t", model_call_id="c", output='{"exit_code": 0}'),
    ]


@pytest.mark.parametrize(
    ("spelled", "means"),
    [
        ("/data//private/../private/./x", "/data/private/x"),
        ("/proc/self/root/data/private", "/data/private"),
        ("/proc/1234/root/proc/self/root/reference/a", "/reference/a"),
        ("/proc/self/cwd/../data/private", "/data/private"),
        ("../data/private/x", "/data/private/x"),
        ("//data///private", "/data/private"),
        ("/var/run/x", "/run/x"),
    ],
)
def test_normalise(spelled, means):
    assert normalise(spelled, "/workspace") == means


@pytest.mark.parametrize(
    "code",
    [
        "cat '/da''ta/pri''vate/case_0/organ.nii.gz'",
        'cat "/da"ta/pri"vate"/case_0/organ.nii.gz',
        r"cat /da\ta/pri\vate/case_0/organ.nii.gz",
        r"cat $'\x2fdata\057private'/case_0/organ.nii.gz",
        "python3 -c \"open('/da' 'ta/private/case_0/organ.nii.gz')\"",
    ],
    ids=["quote-splice", "double-quotes", "backslashes", "ansi-c", "python-in-bash"],
)
def test_obfuscated_paths_in_a_tool_call_are_flagged(code):
    res = audited(*tool_call(code))
    assert [v.rule for v in res.violations] == ["private_access"], res
    assert "/data/private/case_0/organ.nii.gz" in res.violations[0].detail
    assert res.violations[0].events == ["shim:1"]


def test_shell_words_and_tokens():
    assert shell_words("a 'b''c' \"d\\\"e\" f\\ g $'\\x41\\101'") == ["a", "bc", 'd"e', "f g", "AA"]
    assert shell_words("unclosed 'quote") == ["unclosed", "quote"]
    assert "/xy" in path_tokens("ls /etc && cat '/x''y'")
    assert arg_paths(["cat", "private/x", "-n", "https://a/b"], "/data") == ["/data/private/x"]


@pytest.mark.parametrize(
    ("fact", "rule", "detail"),
    [
        (proc("cat", "/data/private/case_0/organ.nii.gz"), "private_access", "process cat names"),
        (proc("cat", "organ.nii.gz", cwd="/data/private/case_0"), "private_access", "process cat ran in"),
        (proc("cat", "private/case_0/x", cwd="/data"), "private_access", "/data/private/case_0/x"),
        (proc("sh", "-c", "cat /proc/self/root/data/private/x"), "private_access", "/data/private/x"),
        (proc("cp", "/reference/case_0/organ.nii.gz", "out.nii.gz"), "private_access", "/reference"),
        (proc("cat", "/opt/amb/lib/scorer/grader/segmentation.py"), "grader_access", "process cat"),
        (FileAccessed(path="/data/private/x"), "private_access", "opened (r)"),
        (FileRenamed(src="/data/private/x", dst="x"), "private_access", "renamed"),
        (FileDeleted(path="/data/private/x"), "private_access", "deleted"),
        (
            FileWritten(path="../data/private/x", size=1, sha256="sha256:" + "0" * 64),
            "private_access",
            "wrote /data/private/x",
        ),
        (NetworkRequest(method="GET", host="10.0.0.2", path="/data/private/x"), "private_access", "GET"),
        (proc("ls", f"/tmp/amb-docker-{OTHER}-x1/workspace"), "other_runs", OTHER),
        (proc("cat", "/home/u/amb-store/spool/r1/shim.spool"), "other_runs", "amb-store"),
        (FileAccessed(path="/workspace/../srv/runs/r7/out.json"), "other_runs", "/srv/runs/r7"),
        (proc("ls", f"/somewhere/{OTHER}/agents_outputs"), "other_runs", f"data of run {OTHER}"),
    ],
)
def test_each_fact_is_audited_with_its_event(fact, rule, detail):
    res = audited(fact)
    rules = {v.rule: v for v in res.violations}
    assert rule in rules, res
    assert detail in rules[rule].detail, rules[rule].detail
    assert rules[rule].events == ["shim:1"]


def test_own_run_and_own_workspace_are_not_other_runs():
    res = audited(
        proc("ls", "/workspace/run_1/x", f"/tmp/amb-docker-{RUN}-x/workspace"),
        FileWritten(path="runs/a.json", size=1, sha256="sha256:" + "0" * 64),
        proc("python", "/workspace/agents_outputs/case_0/organ.nii.gz", cwd="/workspace/plan"),
    )
    assert res.status == "clean", res


def test_a_local_run_does_not_flag_ordinary_commands():
    local = RunStarted(task="kidney-seg", tier="lite", workspace="/home/u/work", backend="local")
    res = audited(
        proc("/usr/bin/python3", "-m", "agents.amb_agent", "--task", "kidney-seg", cwd="/home/u/work"),
        proc("ls", "-la", "agents_outputs/case_0", cwd="/home/u/work"),
        proc("bash", "-c", "cat /data/public/case_0/README.md | head -5", cwd="/home/u/work"),
        start=local,
    )
    assert res.status == "clean", res


def test_outliving_the_agent_is_flagged_but_killing_a_child_is_not():
    main = ProcessExited(pid=10, argv=["bash", "agent.sh"], start_ns=100, end_ns=150, tracer="seccomp-notify")
    main_exec = ProcessExited(pid=10, argv=["python3", "a.py"], start_ns=150, end_ns=900, exit_code=0)
    killed_by_agent = ProcessExited(pid=11, argv=["sleep", "9"], start_ns=200, end_ns=300, signal=9)
    daemon = ProcessExited(pid=12, argv=["sleep", "300"], start_ns=400, end_ns=2900, signal=9)
    res = audited(main, main_exec, killed_by_agent, daemon)
    assert [(v.rule, v.events) for v in res.violations] == [("outlived_run", ["shim:4"])], res


def _os(*raw: bytes) -> list[str]:
    return [os_text(r) for r in raw]


@pytest.mark.parametrize(
    ("fact", "rule", "detail"),
    [
        # Names that are not UTF-8: judged as the names they are, shown as the record spells them.
        (proc(*_os(b"cat", b"/data/private/x\xff")), "private_access", "names /data/private/x\\xff"),
        (
            FileAccessed(path=os_text(b"/data/private/\xfe")),
            "private_access",
            "opened (r) /data/private/\\xfe",
        ),
        (
            FileWritten(path=os_text(b"/etc/cron.d/\xff"), size=1, sha256="sha256:" + "0" * 64),
            "write_outside_workspace",
            "wrote /etc/cron.d/\\xff outside",
        ),
        (
            proc("cat", "x", cwd=os_text(b"/data/private/\xff")),
            "private_access",
            "ran in /data/private/\\xff",
        ),
        # A backslash in an argument is the shell's to read (here: an escaped 't'), not the record's:
        # recorded doubled, it is still seen that the shell opens /data/private.
        (proc(*_os(b"bash", b"-c", b"cat /da\\ta/pri\\vate/x")), "private_access", "/data/private/x"),
        (FileRenamed(src=os_text(b"/data/private/a\\b"), dst="x"), "private_access", "/data/private/a\\\\b"),
    ],
)
def test_names_that_are_not_utf8_are_audited_as_the_names_they_are(fact, rule, detail):
    res = audited(fact)
    rules = {v.rule: v for v in res.violations}
    assert rule in rules, res
    assert detail in rules[rule].detail, rules[rule].detail
