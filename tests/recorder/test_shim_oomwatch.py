"""The shim's OOM watch reads the kernel's OOM kill count of its memory cgroup (v1 and v2 files) and
calls back once, at the first kill after it started. The counter files are written here as the
kernel writes them; the container tests (tests/redteam/test_exhaustion_docker.py) see real kills."""

from __future__ import annotations

import threading
from pathlib import Path

from recorder.shim.oomwatch import OomWatch, oom_kills

V2 = "low 0\nhigh 0\nmax 12\noom {n}\noom_kill {n}\noom_group_kill 0\n"
V1 = "oom_kill_disable 0\nunder_oom 0\noom_kill {n}\n"


def test_the_count_is_read_from_either_cgroup_version(tmp_path: Path) -> None:
    for name, text in (("memory.events", V2), ("memory.oom_control", V1)):
        (tmp_path / name).write_text(text.format(n=7))
        assert oom_kills(str(tmp_path / name)) == 7
    (tmp_path / "garbled").write_text("oom_kill seven\n")
    assert oom_kills(str(tmp_path / "garbled")) is None
    assert oom_kills(str(tmp_path / "absent")) is None


def test_the_first_kill_after_the_start_is_reported_once(tmp_path: Path) -> None:
    counter = tmp_path / "memory.events"
    counter.write_text(V2.format(n=2))  # kills before the shim started are not the agent's
    called = threading.Event()
    calls: list[int] = []

    def on_kill() -> None:
        calls.append(1)
        called.set()

    watch = OomWatch(on_kill, counters=(str(tmp_path / "none"), str(counter)))
    assert watch.path == str(counter)
    watch.start()
    assert not called.wait(0.3)
    counter.write_text(V2.format(n=3))
    assert called.wait(5)
    counter.write_text(V2.format(n=5))
    watch.stop()
    assert (calls, watch.kills) == ([1], 3)


def test_without_a_counter_nothing_is_watched(tmp_path: Path) -> None:
    watch = OomWatch(lambda: None, counters=(str(tmp_path / "none"),)).start()
    watch.stop()
    assert (watch.path, watch.kills) == (None, 0)
