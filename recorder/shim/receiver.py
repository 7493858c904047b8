"""The host side of the shim: a unix socket whose messages become the run's ``shim`` spool.

It accepts exactly one connection (the shim's) and then stops listening and unlinks the socket, so
nothing that starts later can add to the stream. Each message is validated (msgspec types, size
limits), its file content goes to the blob store, and the event is appended to
``spool/<run>/shim.spool`` as it arrives. The spool is written with group-committed fsyncs: each
batch read from the socket is made durable before the next read blocks.

The shim's process, file and network facts arrive here the moment they happen; the agent inside the
container can neither reach the spool nor take back what was sent. OS strings (paths, argv, cwd)
arrive as bytes and are recorded as the text ``schemas.ostext.os_text`` makes of them, every byte
kept. A message that cannot become an event is recorded as a note saying so, and the stream goes on.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from pathlib import Path

import msgspec

from recorder.backend import media_type
from recorder.shim import wire
from recorder.spool import SpoolWriter, spool_path
from schemas.blobstore import BlobStore
from schemas.errors import AmbError, SpoolError
from schemas.events import (
    FileAccessed,
    FileDeleted,
    FileRenamed,
    FileWritten,
    NetworkRequest,
    Note,
    Payload,
    ProcessExited,
)
from schemas.ostext import os_text

SOCKET_NAME = "shim.sock"


class ShimReceiver:
    def __init__(
        self,
        store: Path,
        run_id: str,
        sock_dir: Path,
        *,
        blobs: BlobStore | None = None,
        content_cap: int = 64 * 1024 * 1024,
    ):
        self.store = Path(store)
        self.run_id = run_id
        self.blobs = blobs or BlobStore(self.store / "blobs")
        self.max_frame = content_cap + wire.MAX_OVERHEAD
        self.path = Path(sock_dir) / SOCKET_NAME
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        _bind_neutral(self._listener, self.path)
        os.chmod(self.path, 0o600)
        self._listener.listen(1)
        self.writer = SpoolWriter(spool_path(self.store, run_id, "shim"), run_id, "shim", sync=False)
        self.counts: dict[str, int] = {}
        self.hello: wire.Hello | None = None
        self.bye: wire.Bye | None = None
        self.error: str | None = None
        self.connected = threading.Event()
        self.done = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="amb-shim-receiver", daemon=True)

    def start(self) -> ShimReceiver:
        self._thread.start()
        return self

    def _serve(self) -> None:
        try:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return  # closed before the shim ever connected
            self._stop_listening()
            self.connected.set()
            with conn:
                self._read(conn)
        except AmbError as e:
            self.error = str(e)
        except Exception as e:  # a bug here must not take the run down silently
            self.error = f"{e.__class__.__name__}: {e}"
        finally:
            try:
                self.writer.flush()
            except SpoolError as e:
                self.error = self.error or str(e)
            self.done.set()

    def _stop_listening(self) -> None:
        try:
            with contextlib.suppress(OSError):  # wakes an accept() blocked in the serving thread
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
        finally:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()

    def _read(self, conn: socket.socket) -> None:
        buf = bytearray()
        header = wire.HEADER.size
        while True:
            chunk = conn.recv(1 << 20)
            if not chunk:
                break
            buf += chunk
            at = 0
            while len(buf) - at >= header:
                (length,) = wire.HEADER.unpack_from(buf, at)
                if length > self.max_frame:
                    raise AmbError(
                        f"shim sent a {length}-byte frame (limit {self.max_frame}); stream rejected"
                    )
                if len(buf) - at - header < length:
                    break
                body = bytes(buf[at + header : at + header + length])
                at += header + length
                try:
                    msg = wire.decode(body)
                except msgspec.DecodeError as e:
                    self._append(Note(text="shim: undecodable message", data={"error": str(e)}))
                    continue
                self._take(msg)
            del buf[:at]
            self.writer.flush()  # everything received so far is durable before we wait again
        if buf:
            self._append(Note(text="shim: stream ended mid-message", data={"bytes": len(buf)}))
        # Tell the shim we have it all: its close() waits for this.
        with contextlib.suppress(OSError):
            conn.shutdown(socket.SHUT_WR)

    def _append(self, payload, ts_ns: int | None = None) -> None:
        self.writer.append(payload, ts_ns=ts_ns or None)
        kind = type(payload).__struct_config__.tag
        self.counts[kind] = self.counts.get(kind, 0) + 1

    def _take(self, msg: wire.Msg) -> None:
        """Record one message; one that cannot be recorded becomes a note that says why."""
        try:
            self._handle(msg)
        except SpoolError:
            raise  # the spool itself failed: nothing more can be recorded
        except Exception as e:  # noqa: BLE001 - one message lost must not lose the stream after it
            self._append(
                Note(
                    text="shim: a message could not be recorded",
                    data={"message": type(msg).__name__, "error": wire.describe(e)},
                ),
                ts_ns=getattr(msg, "ts_ns", 0) or None,
            )

    def _handle(self, msg: wire.Msg) -> None:
        if isinstance(msg, wire.Hello):
            self.hello = msg
        elif isinstance(msg, wire.Bye):
            self.bye = msg
        ts = getattr(msg, "ts_ns", 0) or None
        payload, at = _event(msg, ts, self.blobs)
        self._append(payload, ts_ns=at)

    def wait(self, timeout: float | None = None) -> bool:
        """True once the shim's stream has ended (or it never came and we were closed)."""
        return self.done.wait(timeout)

    def lost(self, where: str = "", timeout: float = 15.0) -> str | None:
        """Why the shim's record of the agent is incomplete, if it is: it never said hello, or its
        stream ended before its final report (the shim died, or was killed: a local agent can kill
        its own process group, the shim included). ``where`` says where the agent ran."""
        if not self.connected.is_set() or self.wait(timeout) and self.hello is None:
            return f"the shim never reported: nothing the agent did{where} was recorded"
        if self.bye is not None:
            return None
        return "the shim ended before its final report: what the agent did after its last record is missing"

    def close(self, timeout: float = 10.0) -> None:
        """Stop: wait a little for a connected shim to finish, then release everything."""
        if not self.connected.is_set():
            self._stop_listening()
        self.done.wait(timeout)
        self.writer.close()


def _bind_neutral(sock: socket.socket, path: Path) -> None:
    """Bind ``sock`` at ``path`` under a name that does not say where ``path`` is.

    A unix socket keeps the name it was bound with, and the connection it accepts carries that name
    into the connecting process's network namespace: the container's ``/proc/net/unix`` would list
    the host's temporary directory. Bound through ``/proc/self/fd/N/``, the name is that string."""
    try:
        dir_fd = os.open(path.parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        sock.bind(str(path))
        return
    try:
        neutral = f"/proc/self/fd/{dir_fd}/{path.name}"
        try:
            sock.bind(neutral)
        except OSError:  # no /proc: the real path then
            sock.bind(str(path))
    finally:
        os.close(dir_fd)


def _changed(changed_ns: int | None, ts_ns: int | None) -> int | None:
    """A change's kernel time, never after its observation (a shim told otherwise is not believed)."""
    if changed_ns is None or changed_ns <= 0:
        return None
    return min(changed_ns, ts_ns) if ts_ns else changed_ns


def _event(msg: wire.Msg, ts: int | None, blobs: BlobStore) -> tuple[Payload, int | None]:
    """The event a message becomes, and its time (``ts``: the message's, None when it has none);
    a file's content goes to ``blobs``."""
    match msg:
        case wire.Proc():  # the same fields, OS strings as the recorded text
            cwd = os_text(msg.cwd) if msg.cwd is not None else None
            seen = msgspec.structs.asdict(msg) | {"argv": [os_text(a) for a in msg.argv], "cwd": cwd}
            return ProcessExited(**seen), msg.end_ns or ts
        case wire.Write():
            path, ref, sha = os_text(msg.path), None, msg.sha256
            if msg.content is not None:
                ref = blobs.put(msg.content, media_type(path), sync=False)
                sha = ref.blob  # the digest we computed, not the one we were told
            changed = _changed(msg.changed_ns, ts)
            return FileWritten(
                path=path, op=msg.op, size=msg.size, sha256=sha, content=ref, changed_ns=changed
            ), ts
        case wire.Delete():
            return FileDeleted(path=os_text(msg.path), changed_ns=_changed(msg.changed_ns, ts)), ts
        case wire.Rename():
            changed = _changed(msg.changed_ns, ts)
            return FileRenamed(src=os_text(msg.src), dst=os_text(msg.dst), changed_ns=changed), ts
        case wire.Access():
            return FileAccessed(path=os_text(msg.path), mode=msg.mode, pid=msg.pid), ts
        case wire.Connect():
            return NetworkRequest(
                scheme=msg.family.partition("/")[2],
                host=msg.host,
                port=msg.port,
                started_ns=msg.ts_ns,
                error=msg.error,
                via="shim",
                method="CONNECT",
            ), ts
        case wire.Hello():
            data = {
                "tracer": msg.tracer,
                "fallback": msg.tracer == "proc-poll",
                "detail": msg.detail,
                "workspace": os_text(msg.workspace),
                "content_cap": msg.content_cap,
                "watched": [os_text(w) for w in msg.watched],
                "protocol": msg.protocol,
            }
            return Note(text="shim started", data=data), ts
        case wire.NoteMsg():
            data = {**msg.data, **{k: os_text(v) for k, v in msg.names.items()}}
            return Note(text=msg.text, data=data), ts
        case wire.Bye():
            return Note(text="shim finished", data={"exit_code": msg.exit_code, **msg.counts}), ts
