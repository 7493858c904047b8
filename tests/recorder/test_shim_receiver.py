"""The shim's host receiver: one connection only, bounded frames, everything spooled."""

from __future__ import annotations

import socket
import struct
from pathlib import Path

from recorder.shim import wire
from recorder.shim.receiver import ShimReceiver
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
        wire.encode(wire.Write(path="a.txt", op="created", size=2, sha256="sha256:bogus", content=b"hi"))
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
    s.sendall(wire.encode(wire.Delete(path="x")))
    s.close()
    assert r.wait(5)
    r.close()
    events = shim_events(tmp_path / "store", "run-r3")
    assert [e.kind for e in events] == ["note", "file.deleted"]
    assert events[0].payload.text == "shim: undecodable message"
