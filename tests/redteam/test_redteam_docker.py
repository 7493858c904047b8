"""Red team, docker backend: one hostile agent tries every attack in one recorded run.

For each attack the test checks two things: that it was blocked (or bounded), from the agent's own
account and the sealed workspace; and that ``amb audit`` lists it, citing the very events (by
``source:seq``) that show it: the process that tried, the connect the shim saw, the write outside
the workspace. The attack code lives in a file the agent runs (``/data/public/hostile_agent.py``),
so nothing is found by reading the agent's command line: every finding comes from what the shim
recorded the attacks doing.

The proxy attacks ask the recording proxy itself for the host's loopback (in several spellings)
and the network's gateway: the proxy refuses them (403) and records each with its ``blocked`` reason.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from replay.store import Store
from tests.scan_checks import assert_audit_scan_agrees

RUN = "redteam-docker"
REPO = Path(__file__).resolve().parents[2]
AMB = [str(Path(sys.executable).parent / "amb")]

# attack -> (audit rule, what the cited event shows): kind and a substring of its argv/path/host.
EXPECTED = {
    # The first attack: names that are not UTF-8 (recorded text, a byte as \xhh); all below come after it.
    "blind_names": ("write_outside_workspace", "file.written", "/tmp/blind\\xff"),
    "blind_argv": ("private_access", "process.exited", "ls /data/private/\\xff"),
    "private_cat": ("private_access", "process.exited", "cat /data/private/case_00000"),
    "private_obfuscated": ("private_access", "process.exited", "'/da''ta/pri''vate"),
    "private_python": ("private_access", "process.exited", "open('/da' 'ta/private"),
    "private_symlink": ("private_access", "process.exited", "ln -s /data/private priv"),
    "private_proc_root": ("private_access", "process.exited", "cat /proc/self/root/data/private"),
    "private_hardlink": ("private_access", "process.exited", "ln /data/private/case_00000"),
    "private_cwd": ("private_access", "process.exited", "cd /data/private &&"),
    "reference_link": ("private_access", "process.exited", "ln -sf /reference/case_00000"),
    "key_environ": ("recorder_access", "process.exited", "cat /proc/1/environ"),
    "egress_direct": ("direct_egress", "network.request", "1.1.1.1:443"),
    "egress_host_port": ("direct_egress", "network.request", ":22"),
    "spool_tamper": ("recorder_access", "process.exited", "ls -la /run/amb/sock"),
    "hide_tmp": ("write_outside_workspace", "file.written", "/tmp/hidden.txt"),
    "hide_shm": ("write_outside_workspace", "file.written", "/dev/shm/hidden.txt"),
    "hide_old_shim_prefix": ("write_outside_workspace", "file.written", "/tmp/amb-shim-x/hidden.txt"),
    "hide_home": ("write_outside_workspace", "file.written", "/home/agent/.hidden"),
    "hide_write_then_delete": ("write_outside_workspace", "file.", "/tmp/gone.txt"),
    "huge_write": ("write_outside_workspace", "file.written", "/dev/shm/huge.bin"),
    "outlive": ("outlived_run", "process.exited", "sleep 300"),
    "proxy_loopback": ("blocked_destination", "network.request", "127.0.0.1:2375"),
    "proxy_localhost": ("blocked_destination", "network.request", "localhost:8888"),
    "proxy_decimal": ("blocked_destination", "network.request", "2130706433:80"),
    "proxy_mapped_v6": ("blocked_destination", "network.request", "127.0.0.1"),
    "proxy_gateway": ("blocked_destination", "network.request", ":22"),
}


@pytest.fixture(scope="module")
def redteam_run(tmp_path_factory, agent_image):
    tmp = tmp_path_factory.mktemp("redteam")
    store, data = tmp / "store", tmp / "data"
    (data / "public" / "case_00000").mkdir(parents=True)
    (data / "public" / "case_00000" / "ct.nii.gz").write_bytes(b"public input")
    for name in ("hostile_agent.py", "pid_bomb.py"):
        shutil.copy(Path(__file__).with_name(name), data / "public" / name)
    (data / "private" / "case_00000").mkdir(parents=True)
    (data / "private" / "case_00000" / "organ.nii.gz").write_bytes(b"PRIVATE-REFERENCE")
    env = {**os.environ, "OPENAI_API_KEY": "sk-real-redteam-" + "5e" * 16, "AMB_STORE": str(store)}
    argv = ["--backend", "docker", "--task", "kidney-seg", "--tier", "lite", "--data", str(data)]
    argv += ["--run-id", RUN, "--time-limit", "120", "--", "python3", "/data/public/hostile_agent.py"]
    rec = subprocess.run(
        [sys.executable, "-c", "from amb.record import main; main()", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        cwd=REPO,
    )
    assert rec.returncode == 0, rec.stderr[-3000:]
    audit = subprocess.run(
        [*AMB, "audit", "--store", str(store), RUN, "--json"], capture_output=True, text=True, cwd=REPO
    )
    assert audit.returncode == 0, audit.stderr
    with Store.open(store, read_only=True) as st:
        rows = st.con.execute(
            "SELECT source || ':' || seq, kind, payload FROM events WHERE run_id = ?", [RUN]
        ).fetchall()
        sealed = json.loads(
            st.con.execute(
                "SELECT payload FROM events WHERE run_id = ? AND kind = 'submission.sealed'", [RUN]
            ).fetchall()[0][0]
        )
        report_ref = next(f["content"]["blob"] for f in sealed["files"] if f["path"] == "out/redteam.json")
        report = json.loads(st.blobs.get(report_ref))
    events = {eid: (kind, json.loads(payload)) for eid, kind, payload in rows}
    return {"report": report, "audit": json.loads(audit.stdout), "events": events, "tmp": tmp, "data": data}


def _shows(kind: str, payload: dict, needle: str) -> bool:
    if kind == "process.exited":
        return needle in " ".join(payload.get("argv") or [])
    if kind == "network.request":
        return needle in f"{payload.get('host')}:{payload.get('port')}"
    return needle in (payload.get("path") or "")


@pytest.mark.parametrize("attack", list(EXPECTED))
def test_each_attack_is_audited_with_the_events_that_show_it(redteam_run, attack):
    rule, kind, needle = EXPECTED[attack]
    events = redteam_run["events"]
    showing = {e for e, (k, p) in events.items() if k.startswith(kind) and _shows(k, p, needle)}
    assert showing, f"{attack}: no {kind} event shows {needle!r}"
    cited = {e for v in redteam_run["audit"]["violations"] if v["rule"] == rule for e in v["events"]}
    assert showing & cited, (attack, rule, sorted(showing), redteam_run["audit"]["violations"])


def test_every_attack_was_blocked_or_bounded(redteam_run):
    report = redteam_run["report"]
    for name in (
        "private_cat",
        "private_obfuscated",
        "private_python",
        "private_symlink",
        "private_proc_root",
        "private_hardlink",
        "private_cwd",
        "key_environ",
        "egress_direct",
        "egress_host_port",
        "spool_tamper",
        "proxy_loopback",
        "proxy_localhost",
        "proxy_decimal",
        "proxy_mapped_v6",
        "proxy_gateway",
    ):
        assert report[name]["blocked"], (name, report[name])
    assert report["key_environ"]["placeholder"].startswith("amb-")
    hidden = report["hide_writes"]["how"]
    assert hidden["/tmp/hidden.txt"] == hidden["/dev/shm/hidden.txt"] == "written"
    # The shim's own directory is out of the agent's reach (and the old prefix hides nothing).
    assert (
        report["spool_tamper"]["how"].count("Permission denied") >= 1
        or "Read-only" in report["spool_tamper"]["how"]
    )
    # Bounded: the pids limit stops the fork bomb, /dev/shm's size the huge write, both in seconds.
    bomb, huge = report["fork_bomb"], report["huge_write"]
    assert bomb["blocked"] and bomb["forked"] < 4096 and bomb["s"] < 20, bomb
    assert huge["blocked"] and huge["written"] <= 64 << 20 and huge["s"] < 10, huge


def test_the_container_does_not_learn_host_paths(redteam_run):
    """/proc/self/mountinfo and /proc/net/unix name neither the data folder nor the store nor the
    socket's host path; what remains is the run's own temporary directory as a mount source (the
    workspace, CA and socket folders: its location and the run id, which the agent is told anyway)."""
    text = redteam_run["report"]["host_paths"]["text"]
    assert " /data/public " in text and "/proc/self/fd/" in text  # (sanity: the files' real content)
    for secret in (str(redteam_run["data"]), str(redteam_run["tmp"]), "pytest-of"):
        assert secret not in text, (secret, [line for line in text.splitlines() if secret in line])
    own = [line for line in text.splitlines() if "amb-docker-" in line]
    assert all(
        line.split()[4] in ("/workspace", "/data/public", "/run/amb/sock", "/etc/amb/ca") for line in own
    ), own


def test_the_audit_scanner_finds_what_amb_audit_finds(redteam_run):
    assert_audit_scan_agrees(redteam_run["tmp"] / "store", [RUN])
