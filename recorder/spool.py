"""The spool writer: one append-only, hash-chained, checksummed file per (run, source).

Producers never open DuckDB; they append here and ``amb ingest`` bulk-loads later. ``append``
returns only once the frame is on disk (fsync), but concurrent appenders share fsyncs (group
commit): whoever finds no sync in progress syncs everything written so far, the others wait for
it. So under load one fsync acknowledges many frames. An acknowledged frame survives ``kill -9``
of the writer; a frame cut mid-write becomes a torn tail that readers report and skip.

Failing closed: any error while writing raises ``SpoolError``; callers (the proxy) turn it into
an error for the agent rather than letting anything through unrecorded.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import NamedTuple

from schemas.codec import GENESIS, check_id, decode_body, encode_payload, hash_body, make_body
from schemas.errors import SpoolError
from schemas.events import Payload, kind_of
from schemas.frames import MAGIC, Tail, encode_frame, scan


def spool_path(store: str | os.PathLike[str], run_id: str, source: str) -> Path:
    """Where the spool of (run, source) lives inside a store directory."""
    return Path(store) / "spool" / check_id("run id", run_id) / f"{check_id('source', source)}.spool"


class Written(NamedTuple):
    seq: int
    hash: str


class SpoolWriter:
    """Appends events for one (run, source). Thread-safe; one writer per file."""

    def __init__(self, path: str | os.PathLike[str], run_id: str, source: str, *, sync: bool = True):
        self.path = Path(path)
        self.run_id = check_id("run id", run_id)
        self.source = check_id("source", source)
        self.sync = sync
        self.recovered_tail: Tail | None = None
        self._lock = threading.Lock()
        self._synced = threading.Condition(self._lock)
        self._syncing = False
        self._synced_seq = -1
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
            self._next_seq, self._prev_hash = self._resume()
        except OSError as e:
            raise SpoolError(f"cannot open spool {self.path}: {e}") from e
        self._synced_seq = self._next_seq - 1

    def _resume(self) -> tuple[int, str]:
        """Continue an existing spool: truncate a torn tail, pick up seq and the chain."""
        size = os.fstat(self._fd).st_size
        if size == 0:
            os.write(self._fd, MAGIC)
            os.fsync(self._fd)
            return 0, GENESIS
        with open(self.path, "rb") as f:
            result = scan(f.read(), str(self.path))
        if result.tail is not None:
            self.recovered_tail = result.tail
            os.ftruncate(self._fd, result.end)
        if not result.bodies:
            if result.end == 0:
                os.write(self._fd, MAGIC)
            return 0, GENESIS

        last = result.bodies[-1]
        env = decode_body(last)
        if env.run_id != self.run_id or env.source != self.source:
            raise SpoolError(
                f"{self.path} belongs to {env.run_id}/{env.source}, not {self.run_id}/{self.source}"
            )
        return env.seq + 1, hash_body(last)

    def append(self, payload: Payload, *, ts_ns: int | None = None) -> Written:
        """Append one event and return once it is durable (unless the writer has sync=False)."""
        return self.append_encoded(
            kind_of(type(payload)), type(payload).VERSION, encode_payload(payload), ts_ns=ts_ns
        )

    def append_encoded(self, kind: str, v: int, payload: bytes, *, ts_ns: int | None = None) -> Written:
        """Append an already-canonical payload (imports, golden logs of old versions)."""
        ts = time.time_ns() if ts_ns is None else ts_ns
        with self._lock:
            seq = self._next_seq
            body = make_body(
                run_id=self.run_id,
                source=self.source,
                seq=seq,
                ts_ns=ts,
                kind=kind,
                v=v,
                payload=payload,
                prev_hash=self._prev_hash,
            )
            digest = hash_body(body)
            frame = encode_frame(body, digest[len("sha256:") :])
            try:
                os.write(self._fd, frame)
            except OSError as e:
                raise SpoolError(f"cannot append to spool {self.path}: {e}") from e
            self._next_seq = seq + 1
            self._prev_hash = digest
        if self.sync:
            self._sync_through(seq)
        return Written(seq, digest)

    def _sync_through(self, seq: int) -> None:
        with self._synced:
            while self._synced_seq < seq:
                if self._syncing:
                    self._synced.wait()
                    continue
                self._syncing = True
                target = self._next_seq - 1
                self._lock.release()
                try:
                    os.fsync(self._fd)
                except OSError as e:
                    raise SpoolError(f"cannot fsync spool {self.path}: {e}") from e
                finally:
                    self._lock.acquire()
                    self._syncing = False
                    self._synced.notify_all()
                self._synced_seq = max(self._synced_seq, target)

    def flush(self) -> None:
        """Make everything appended so far durable (for writers created with sync=False)."""
        with self._lock:
            last = self._next_seq - 1
        self._sync_through(last)

    @property
    def next_seq(self) -> int:
        return self._next_seq

    def close(self) -> None:
        if self._fd >= 0:
            self.flush()
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> SpoolWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
