"""The shim's host receiver: one connection only, bounded frames, everything spooled."""

from __future__ import annotations

import socket
import struct
from pathlib import Path

import msgspec

from recorder.shim import wire
from recorder.shim.receiver import ShimReceiver
from schemas.events import ProcessExited
from tests.recorder.shim_helpers import payloads, shim_events


def _connect(path: Path) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(str(path))
    return s


def test_one_connection_then_the_socket_is_gone(tmp_path: Path) -> None:
    r = ShimReceiver(tmp_path / "store", "run-r1", tmp_path / "sock").start()
    first = _connect(r.path)
    assert r.connected.wait(5)
    assert not r.path.exists()  # nothing started later (the agent) can add to the stream
    first.sendall(
        wire.encode(wire.Write(path=b"a.txt", op="created", size=2, sha256="sha256:bogus", content=b"hi"))
    )
    first.sendall(wire.encode(wire.Bye(exit_code=0)))
    first.shutdown(socket.SHUT_WR)
    assert first.recv(1) == b""  # the receiver acknowledges the end of the stream by closing
    r.close()
    events = shim_events(tmp_path / "store", "run-r1")
    (w,) = payloads(events, "file.written")
    # The receiver's own digest, not the claimed one.
    assert w.sha256 == "sha256:8f434346648f6b96df89dda901c5176b10a6d83961dd3c1ac88b59b2dc327aa4"
    assert payloads(events, "note")[-1].text == "shim finished"


def test_oversized_frame_is_rejected(tmp_path: Path) -> None:
    r = ShimReceiver(tmp_path / "store", "run-r2", tmp_path / "sock", content_cap=1000).start()
    s = _connect(r.path)
    s.sendall(struct.pack(">I", 1000 + wire.MAX_OVERHEAD + 1) + b"x" * 100)
    assert r.wait(5)
    s.close()
    r.close()
    assert r.error is not None and "frame" in r.error


def test_garbage_is_noted_not_fatal(tmp_path: Path) -> None:
    r = ShimReceiver(tmp_path / "store", "run-r3", tmp_path / "sock").start()
    s = _connect(r.path)
    s.sendall(struct.pack(">I", 3) + b"\xc1\xc1\xc1")
    s.sendall(wire.encode(wire.Delete(path=b"x")))
    s.close()
    assert r.wait(5)
    r.close()
    events = shim_events(tmp_path / "store", "run-r3")
    assert [e.kind for e in events] == ["note", "file.deleted"]
    assert events[0].payload.text == "shim: undecodable message"


SHIM_DOES_NOT_CAPTURE = frozenset({"stdout", "stderr"})
"""``process.exited`` fields the shim has no wire field for (it does not capture process output)."""


def _shape(struct: type, skip: frozenset[str] = frozenset()) -> list[tuple[str, object, object]]:
    """(name, type, default) of each field, a default factory called (``[]`` either way)."""
    out = []
    for f in msgspec.structs.fields(struct):
        default = f.default_factory() if f.default_factory is not msgspec.NODEFAULT else f.default
        if f.name not in skip:
            out.append((f.name, f.type, default))
    return out


def _as_recorded(shape: list[tuple[str, object, object]]) -> list[tuple[str, object, object]]:
    """A wire shape with its OS strings as events hold them: bytes on the wire, recorded text after."""
    as_text = {bytes: str, list[bytes]: list[str], bytes | None: str | None}
    return [(name, as_text.get(type_, type_), default) for name, type_, default in shape]  # type: ignore[call-overload]


def test_the_wire_record_and_process_exited_keep_the_same_fields() -> None:
    # The container side cannot import schemas/: the wire type repeats the event's fields, and
    # this is where the two must agree (names, order, types, defaults).
    assert _as_recorded(_shape(wire.Proc)) == _shape(ProcessExited, skip=SHIM_DOES_NOT_CAPTURE)


def test_every_wire_field_of_a_process_reaches_the_event(tmp_path: Path) -> None:
    # Every field set to a value unlike its default: a field the receiver forgets to copy shows.
    sent = wire.Proc(
        pid=4242,
        ppid=17,
        argv=[b"python3", b"-c", b"print(1)"],
        cwd=b"/workspace/sub",
        start_ns=1_000,
        end_ns=2_000,
        exit_code=None,
        signal=9,
        tracer="seccomp-notify",
    )
    defaults = wire.Proc(pid=0)
    for f in msgspec.structs.fields(wire.Proc):
        if f.name != "exit_code":  # None with a signal: how a killed process is told apart
            assert getattr(sent, f.name) != getattr(defaults, f.name), f.name
    r = ShimReceiver(tmp_path / "store", "run-r4", tmp_path / "sock").start()
    s = _connect(r.path)
    s.sendall(wire.encode(sent) + wire.encode(wire.Proc(pid=5, exit_code=3)) + wire.encode(wire.Bye()))
    s.close()
    assert r.wait(5)
    r.close()
    got = payloads(shim_events(tmp_path / "store", "run-r4"), "process.exited")
    as_recorded = {
        **msgspec.structs.asdict(sent),
        "argv": ["python3", "-c", "print(1)"],
        "cwd": "/workspace/sub",
    }
    assert [{k: getattr(p, k) for k in msgspec.structs.asdict(sent)} for p in got] == [
        as_recorded,
        msgspec.structs.asdict(wire.Proc(pid=5, exit_code=3)),
    ]
    assert all(p.stdout is None and p.stderr is None for p in got)
