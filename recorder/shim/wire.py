"""The shim's wire format: length-prefixed msgpack messages over a unix stream socket.

One frame = 4-byte big-endian length + a msgpack-encoded ``Msg``. The receiver turns each message
into a schema event; keeping the wire types separate lets the in-container side depend on msgspec
alone, and lets the receiver validate everything that crosses the container boundary.

OS strings (paths, argv, cwd) cross as the bytes the kernel gave, whatever they are (msgpack's str
holds UTF-8 only, and a Linux name need not be): the receiver turns them into the recorded text of
``schemas.ostext``. The shim side gets them from Python's ``os.fsdecode`` form with ``os.fsencode``.
"""

from __future__ import annotations

import struct

import msgspec

PROTOCOL = 2
HEADER = struct.Struct(">I")
MAX_OVERHEAD = 1 << 20
"""Frame size allowed on top of the per-file content cap (paths, argv, ...)."""


class Hello(msgspec.Struct, tag="hello", kw_only=True):
    protocol: int = PROTOCOL
    tracer: str
    """``strace`` or ``proc-poll`` (the fallback)."""
    workspace: bytes
    pid: int
    content_cap: int
    watched: list[bytes] = []
    detail: str = ""
    """Why the fallback was chosen, when it was."""
    ts_ns: int = 0


class Proc(msgspec.Struct, tag="proc", kw_only=True):
    pid: int
    ppid: int | None = None
    argv: list[bytes] = []
    cwd: bytes | None = None
    start_ns: int = 0
    end_ns: int = 0
    exit_code: int | None = None
    signal: int | None = None
    tracer: str = "strace"


class Write(msgspec.Struct, tag="write", kw_only=True):
    path: bytes
    op: str
    size: int
    sha256: str
    content: bytes | None = None
    """The bytes when ``size`` is within the cap, else None (hash only)."""
    ts_ns: int = 0
    changed_ns: int | None = None
    """When the kernel dated the change (see ``FileWritten.changed_ns``)."""


class Delete(msgspec.Struct, tag="delete", kw_only=True):
    path: bytes
    ts_ns: int = 0
    changed_ns: int | None = None


class Rename(msgspec.Struct, tag="rename", kw_only=True):
    src: bytes
    dst: bytes
    ts_ns: int = 0
    changed_ns: int | None = None


class Access(msgspec.Struct, tag="access", kw_only=True):
    path: bytes
    mode: str = "r"
    pid: int | None = None
    ts_ns: int = 0


class Connect(msgspec.Struct, tag="connect", kw_only=True):
    family: str
    host: str
    port: int | None = None
    error: str | None = None
    """errno name when connect failed (``EINPROGRESS`` means the outcome was not yet known;
    ``unobserved``, that the tracer could not learn it)."""
    pid: int | None = None
    ts_ns: int = 0


class NoteMsg(msgspec.Struct, tag="note", kw_only=True):
    text: str
    data: dict[str, str | int | float | bool | None] = {}
    ts_ns: int = 0
    names: dict[str, bytes] = {}
    """OS strings the note is about (a path, a name): recorded in ``data`` beside the others."""


class Bye(msgspec.Struct, tag="bye", kw_only=True):
    exit_code: int | None = None
    counts: dict[str, int] = {}
    ts_ns: int = 0


Msg = Hello | Proc | Write | Delete | Rename | Access | Connect | NoteMsg | Bye

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Msg)


def encode(msg: Msg) -> bytes:
    body = _encoder.encode(msg)
    return HEADER.pack(len(body)) + body


def encode_or_note(msg: Msg) -> tuple[bytes, bool]:
    """``msg``'s frame, and True; or, when it cannot be encoded, the frame of a note that says which
    fact was lost and why, and False. A fact the shim could not put on the wire must not stop the
    ones after it (nor the thread that found it)."""
    try:
        return encode(msg), True
    except Exception as e:  # noqa: BLE001 - whatever it is, the stream goes on
        note = NoteMsg(
            text="shim: a fact could not be sent",
            data={"fact": type(msg).__name__, "error": describe(e), "detail": ascii(msg)[:4096]},
            ts_ns=getattr(msg, "ts_ns", 0),
        )
        return encode(note), False


def describe(error: BaseException) -> str:
    """``error`` as text that any encoder takes (a message may quote a name the agent chose)."""
    return f"{type(error).__name__}: {error}".encode("utf-8", "backslashreplace").decode("utf-8")[:4096]


def decode(body: bytes | memoryview) -> Msg:
    return _decoder.decode(body)
