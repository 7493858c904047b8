"""The canonical encoding and the hash chain. THIS MODULE IS A CONTRACT: changing it changes
every hash ever written, so any change needs a new hash prefix and a migration.

An event is stored as its *body*, the canonical JSON of the envelope without its own hash::

    {"kind":K,"payload":P,"prev_hash":H,"run_id":R,"seq":N,"source":S,"ts_ns":T,"v":V}

- Keys in sorted order at every level, no whitespace, UTF-8 with non-ASCII characters kept as they
  are (msgspec's ``order="sorted"`` encoding); integers in decimal.
- ``P`` is the canonical JSON of the payload Struct, including its ``"kind"`` tag.
- ``K``, ``R`` and ``S`` match ``ID_RE``; their JSON form is therefore the plain string in double
  quotes, which is what lets ``replay.verify`` rebuild the body in SQL from the stored columns.
- ``H`` is the hash of the previous event of the same ``(run_id, source)``; ``GENESIS`` for seq 0.
- ``N`` starts at 0 and has no gaps within one ``(run_id, source)``.
- ``hash`` = ``"sha256:"`` + the lowercase hex sha256 of the body bytes.

Reading is envelope-first: ``decode_body`` reads the envelope and leaves the payload raw, so an
unknown kind or a newer version is a clear error (``UnknownEventKind``, ``NewerEventVersion``)
before any payload decoding happens.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from schemas.blob import HASH_PREFIX, digest
from schemas.errors import NewerEventVersion, SchemaError, UnknownEventKind
from schemas.events import KINDS, AnyPayload, Payload, kind_of
from schemas.upcast import upcast

ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}\Z")
"""Run ids, source names and kind tags: no quotes, backslashes or control characters."""

GENESIS = HASH_PREFIX + "0" * 64
"""``prev_hash`` of the first event (seq 0) of every (run, source) chain."""

SOURCES = ("recorder", "proxy", "shim", "import", "synthetic")
"""Known producers. Each owns one spool file per run."""

_encoder = msgspec.json.Encoder(order="sorted")
_payload_decoder = msgspec.json.Decoder(AnyPayload)


class RawEnvelope(msgspec.Struct, frozen=True, kw_only=True):
    """An event body with its payload still undecoded (the first step of every read)."""

    kind: str
    payload: msgspec.Raw
    prev_hash: str
    run_id: str
    seq: int
    source: str
    ts_ns: int
    v: int


_envelope_decoder = msgspec.json.Decoder(RawEnvelope)


class Event(msgspec.Struct, frozen=True, kw_only=True):
    """A stored event, read back: the envelope, the typed payload and the event's hash."""

    run_id: str
    source: str
    seq: int
    ts_ns: int
    kind: str
    v: int
    payload: AnyPayload
    prev_hash: str
    hash: str


def check_id(what: str, value: str) -> str:
    if not ID_RE.match(value):
        raise SchemaError(f"invalid {what} {value!r}: use 1-128 of letters, digits, '.', '_', ':', '-'")
    return value


def encode_payload(payload: Payload) -> bytes:
    """Canonical JSON of a payload (sorted keys, includes the ``kind`` tag)."""
    try:
        return _encoder.encode(payload)
    except UnicodeEncodeError as e:
        # A lone surrogate: Python's form of an OS string's undecodable byte (``os.fsdecode``), which
        # UTF-8 cannot hold. OS strings are recorded through ``schemas.ostext.os_text``.
        raise SchemaError(
            f"a {kind_of(type(payload))} payload holds text that is not UTF-8 "
            f"({e.object[e.start : e.end]!r}); OS strings are recorded with schemas.ostext.os_text"
        ) from None


def canonical_json(value: Any) -> bytes:
    """The canonical JSON of any value, as payloads are encoded; every digest of a value (profile
    ids, score fingerprints, judge and grade cache keys, manifests) is taken over it, so it is part
    of this contract too. ``UnicodeEncodeError`` (a ``ValueError``) for a lone surrogate."""
    return _encoder.encode(value)


def canonical_digest(value: Any) -> str:
    """``sha256:`` and the hex sha256 of ``canonical_json(value)``."""
    return digest(_encoder.encode(value))


_LINE_ENDS = tuple((ch, f"\\u{ord(ch):04x}") for ch in "\x1c\x1d\x1e\x85\u2028\u2029")
"""The line ends of ``str.splitlines()`` (and of JSON-lines readers that split as it does), each
with its ``\\uXXXX`` escape, that JSON may hold raw in a string: U+0085, U+2028 and U+2029. JSON
escapes every control character (``\\n``, ``\\r``, ``\\v``, ``\\f``, U+001C-U+001E), the last three
listed here all the same."""


def json_line(value: Any) -> str:
    """``value`` as one line of a JSON-lines file (no newline): its canonical JSON with every line
    end of ``str.splitlines()`` escaped, so the line stays whole however it is split and parses to
    the same value. (Not part of any hash: the digests above take ``canonical_json``.)"""
    return escape_line_ends(_encoder.encode(value).decode())


def escape_line_ends(text: str) -> str:
    """JSON text with the line ends it may hold raw (``_LINE_ENDS``) escaped: the same value, one line."""
    for raw, escaped in _LINE_ENDS:
        text = text.replace(raw, escaped)
    return text


_BODY = b'{"kind":"%s","payload":%s,"prev_hash":"%s","run_id":"%s","seq":%d,"source":"%s","ts_ns":%d,"v":%d}'


def make_body(
    *, run_id: str, source: str, seq: int, ts_ns: int, kind: str, v: int, payload: bytes, prev_hash: str
) -> bytes:
    """Assemble the canonical body. ``payload`` must already be canonical JSON."""
    fields = (kind.encode(), payload, prev_hash.encode(), run_id.encode(), seq, source.encode(), ts_ns, v)
    return _BODY % fields


def hash_body(body: bytes) -> str:
    return digest(body)


def decode_body(body: bytes | memoryview) -> RawEnvelope:
    """Decode the envelope of a body; the payload stays raw bytes."""
    try:
        return _envelope_decoder.decode(body)
    except (msgspec.DecodeError, RecursionError) as e:  # (a body nested deeper than the stack)
        raise SchemaError(f"malformed event envelope: {e}") from e


def current_version(kind: str) -> int:
    cls = KINDS.get(kind)
    if cls is None:
        raise UnknownEventKind(
            f"unknown event kind {kind!r} (known: {', '.join(sorted(KINDS))}); was it written by a newer amb?"
        )
    return cls.VERSION


def decode_payload(kind: str, v: int, payload: bytes | memoryview) -> Payload:
    """Typed payload of ``kind`` at version ``v``, upcast to the current version if older."""
    target = current_version(kind)
    if v > target:
        raise NewerEventVersion(
            f"event kind {kind!r} has version {v}, but this amb reads up to v{target}; upgrade amb"
        )
    try:
        if v == target:
            decoded = _payload_decoder.decode(payload)
        else:
            old: dict[str, Any] = msgspec.json.decode(payload)
            decoded = msgspec.convert(upcast(kind, v, target, old), AnyPayload)
    except (msgspec.DecodeError, msgspec.ValidationError, KeyError, UnicodeError, RecursionError) as e:
        # (RecursionError: nested deeper than the decoder's stack, which only a hostile spool holds)
        raise SchemaError(f"malformed {kind} v{v} payload: {e}") from e
    if kind_of(type(decoded)) != kind:
        raise SchemaError(f"payload tag {kind_of(type(decoded))!r} does not match envelope kind {kind!r}")
    return decoded


def decode_event(body: bytes | memoryview) -> Event:
    """A full typed event from its body, its hash computed."""
    env = decode_body(body)
    return Event(
        run_id=env.run_id,
        source=env.source,
        seq=env.seq,
        ts_ns=env.ts_ns,
        kind=env.kind,
        v=env.v,
        payload=decode_payload(env.kind, env.v, env.payload),
        prev_hash=env.prev_hash,
        hash=hash_body(bytes(body)),
    )
